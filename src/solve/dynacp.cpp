// The `dynacp` strategy: time-driven joint choice of CP degree, packing, placement and DP assignment.
//
// For a target makespan tau:
//   1. "ring" sequences (longer than one rank holds, or slower than tau alone) get the smallest degree d with
//      T({s}, d) <= tau (their best degree if none), and are placed longest-area first on the d ranks that free
//      up earliest, inside one node when d fits in a node;
//   2. the other sequences are dealt longest-work first to the rank that finishes earliest, packed into
//      per-rank groups of at most the token capacity (a new group pays the fixed overhead c);
//   3. a local search moves and swaps sequences between the slowest and the fastest ranks.
// tau is scanned over a geometric grid between the lower bound and the slowest single-rank sequence, then
// refined around the best. With pipelines (pp > 1) dynacp adds slotted plans and per-rank microbatch lists built
// against the 1F1B estimate (S + (pp - 1) M) / pp (Builder::pipelined), among them lists whose giants run in shelves
// side by side (Builder::pipelined_shelves), every one scored by the pipeline simulator.
// The other strategies' plans are candidates too, so dynacp is never worse. See docs/strategies.md.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/evaluate.hpp"
#include "dynacp/solve/local_search.hpp"
#include "dynacp/solve/microbatch.hpp"
#include "dynacp/solve/partitions.hpp"
#include "dynacp/solve/placement.hpp"
#include "dynacp/solve/strategies.hpp"
#include "dynacp/solve/timeline.hpp"
#include "dynacp/solve/units.hpp"

namespace dynacp::solve {
namespace {

struct Seq {
  std::int64_t id;
  std::int64_t len;
  double eta;
  double work;  // eta*a*s^2 + b*s
  int dmin;
  std::int64_t rows1 = 0;  // padded rows when it runs alone on one rank (Cluster::padded_rows(len, 1))
  double t1 = 0.0;         // T(s, 1)
  // T(s, d) on the pieces [lo[0], rpn] (ring inside a node) and [lo[1], P] (across nodes): arg[k] is the
  // minimiser of piece k (CostModel::piece_minima; 0 when the piece is empty).
  int lo[2] = {0, 0}, arg[2] = {0, 0};
};

struct Bin {                      // one group of short sequences on one rank
  std::vector<std::size_t> seqs;  // indices into the Seq array
  std::int64_t rows = 0;          // padded rows on its rank: the sum of its sequences' rows1
  double work = 0.0;
};

// Finds the d ranks that free up earliest, inside one node when d fits a node (else a window of whole nodes),
// in O(rpn log nodes) per update: for each k, a set of (k-th smallest free time of a node, node).
class NodePicker {
 public:
  NodePicker(int P, int rpn)
      : rpn_(rpn), nodes_(P / rpn), sorted_(static_cast<std::size_t>(P / rpn)), kth_(static_cast<std::size_t>(rpn)) {
    for (int n = 0; n < nodes_; ++n) {
      for (int j = 0; j < rpn; ++j) sorted_[static_cast<std::size_t>(n)].push_back({0.0, n * rpn + j});
      for (int k = 0; k < rpn; ++k) kth_[static_cast<std::size_t>(k)].insert({0.0, n});
    }
  }

  std::vector<int> pick(int d, const std::vector<double>& free) const {
    std::vector<int> out;
    if (d <= rpn_) {
      const int node = kth_[static_cast<std::size_t>(d - 1)].begin()->second;
      for (int j = 0; j < d; ++j)
        out.push_back(sorted_[static_cast<std::size_t>(node)][static_cast<std::size_t>(j)].second);
    } else {
      const int k = std::min(nodes_, (d + rpn_ - 1) / rpn_);
      int best = 0;
      double best_t = 0;
      std::vector<double> window;
      for (int first = 0; first + k <= nodes_; ++first) {  // window start time = its d-th earliest free rank
        window.clear();
        for (int n = first; n < first + k; ++n)
          for (const auto& [t, r] : sorted_[static_cast<std::size_t>(n)]) window.push_back(t);
        std::nth_element(window.begin(), window.begin() + (d - 1), window.end());
        const double t = window[static_cast<std::size_t>(d - 1)];
        if (first == 0 || t < best_t) best = first, best_t = t;
      }
      std::vector<std::pair<double, int>> cand;
      for (int r = best * rpn_; r < (best + k) * rpn_; ++r) cand.push_back({free[static_cast<std::size_t>(r)], r});
      if (static_cast<int>(cand.size()) < d)
        for (int r = 0; r < static_cast<int>(free.size()); ++r)
          if (r < best * rpn_ || r >= (best + k) * rpn_) cand.push_back({free[static_cast<std::size_t>(r)], r});
      std::stable_sort(cand.begin(), cand.end());
      for (int j = 0; j < d; ++j) out.push_back(cand[static_cast<std::size_t>(j)].second);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  void update(int node, const std::vector<double>& free) {
    auto& s = sorted_[static_cast<std::size_t>(node)];
    for (int k = 0; k < rpn_; ++k)
      kth_[static_cast<std::size_t>(k)].erase({s[static_cast<std::size_t>(k)].first, node});
    for (auto& [t, r] : s) t = free[static_cast<std::size_t>(r)];
    std::sort(s.begin(), s.end());
    for (int k = 0; k < rpn_; ++k)
      kth_[static_cast<std::size_t>(k)].insert({s[static_cast<std::size_t>(k)].first, node});
  }

 private:
  int rpn_, nodes_;
  std::vector<std::vector<std::pair<double, int>>> sorted_;
  std::vector<std::set<std::pair<double, int>>> kth_;
};

// Indices of `w` in the shape of the best split of a pipeline's work into microbatches (the linear program of
// tools/gen_pipeline_bound.py): the q = min(pp - 1, n / 4) lightest first in rising order, then the rest falling.
std::vector<std::size_t> rise_then_fall(const std::vector<double>& w, int pp) {
  std::vector<std::size_t> by(w.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return w[x] < w[y]; });
  const std::size_t q = std::min<std::size_t>(static_cast<std::size_t>(std::max(pp - 1, 0)), w.size() / 4);
  std::vector<std::size_t> out(by.begin(), by.begin() + static_cast<std::ptrdiff_t>(q));
  for (std::size_t i = by.size(); i > q; --i) out.push_back(by[i - 1]);
  return out;
}

// The order a rank runs its own microbatches in, given their work: 0 heaviest first; 3 rise_then_fall; otherwise
// pyramid (lightest first and last, heaviest in the middle). Ties keep index order (reversed for heaviest first).
std::vector<std::size_t> own_order(const std::vector<double>& w, int order, int pp) {
  if (order == 3) return rise_then_fall(w, pp);
  std::vector<std::size_t> by(w.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return w[x] < w[y]; });
  std::vector<std::size_t> out(by.size());
  if (order == 0) {
    std::reverse_copy(by.begin(), by.end(), out.begin());
  } else {
    std::size_t lo = 0, hi = by.size();
    for (std::size_t i = 0; i < by.size(); ++i) out[i % 2 == 0 ? lo++ : --hi] = by[i];
  }
  return out;
}

class Builder {
 public:
  Builder(const Batch& b, const Cluster& c, const CostModel& m) : batch_(b), cluster_(c), cost_(m) {
    cap_ = cost_.token_capacity(cluster_);
    for (std::size_t i = 0; i < b.size(); ++i) {
      const double eta = cost_.eta(b.mask(i));
      Seq q{static_cast<std::int64_t>(i), b.lengths[i], eta, cost_.work(b.lengths[i], b.mask(i)),
            cost_.min_degree(b.lengths[i], cluster_)};
      q.rows1 = cluster_.padded_rows(q.len, 1);
      q.lo[0] = q.dmin, q.lo[1] = std::max(q.dmin, cluster_.ranks_per_node + 1);
      GroupStats g;
      g.add(q.len, q.eta);
      const auto arg = cost_.piece_minima(g, q.dmin, cluster_);
      q.arg[0] = arg[0], q.arg[1] = arg[1];
      q.t1 = time1(q, 1);
      seqs_.push_back(q);
    }
    order_.resize(seqs_.size());
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    std::stable_sort(order_.begin(), order_.end(), [&](std::size_t x, std::size_t y) {
      return seqs_[x].work != seqs_[y].work ? seqs_[x].work > seqs_[y].work : x < y;
    });
  }

  double time1(const Seq& s, int d) const {
    GroupStats g;
    g.add(s.len, s.eta);
    return cost_.time(g, d, cluster_);
  }

  /// Smallest degree with T(s, d) <= tau (binary search on the decreasing part of each piece), else the best.
  int degree_for(const Seq& s, double tau) const {
    int best = 0;
    for (int k = 0; k < 2; ++k) {
      if (s.arg[k] == 0) continue;
      if (time1(s, s.arg[k]) <= tau) {
        int a = s.lo[k], z = s.arg[k];
        while (a < z) {
          const int m = a + (z - a) / 2;
          if (time1(s, m) <= tau)
            z = m;
          else
            a = m + 1;
        }
        return a;
      }
      if (best == 0 || time1(s, s.arg[k]) < time1(s, best)) best = s.arg[k];
    }
    return best;
  }

  /// The sequence with the most work (ties: the lowest id).
  const Seq& hardest() const { return seqs_[order_.front()]; }

  /// Largest single-rank time among sequences that fit one rank, and the time of the hardest ring sequence.
  double upper_tau() const {
    double t = 0;
    for (const auto& s : seqs_) t = std::max(t, time1(s, s.dmin));
    return t;
  }

  struct Ring {
    std::size_t seq;
    int d;        // the degree that reaches tau (or the fastest)
    double t;     // T(s, d)
    int at = -1;  // first of its d consecutive ranks when fixed (shelves(), pipelined_shelves()), else -1: the
                  // picker chooses
  };

  /// What a build for tau depends on: the ring sequences and their degrees.
  std::vector<std::pair<std::size_t, int>> signature(double tau) const {
    std::vector<std::pair<std::size_t, int>> sig;
    for (std::size_t i = 0; i < seqs_.size(); ++i)
      if (seqs_[i].dmin > 1 || seqs_[i].t1 > tau) sig.push_back({i, degree_for(seqs_[i], tau)});
    return sig;
  }

  /// Splits `ids` (longest work first) into short sequences (one rank, within tau) and rings with their degree
  /// for tau, the rings sorted by `ring_order`: 0 largest area T d, 1 longest, 2 widest.
  void classify(const std::vector<std::size_t>& ids, double tau, int ring_order, std::vector<std::size_t>& shorts,
                std::vector<Ring>& rings) const {
    for (std::size_t i : ids) {
      const Seq& q = seqs_[i];
      if (q.dmin == 1 && q.t1 <= tau) {
        shorts.push_back(i);
      } else {
        const int d = degree_for(q, tau);
        rings.push_back({i, d, time1(q, d)});
      }
    }
    std::stable_sort(rings.begin(), rings.end(), [ring_order](const Ring& a, const Ring& b) {
      if (ring_order == 1) return a.t > b.t;
      if (ring_order == 2) return a.d != b.d ? a.d > b.d : a.t > b.t;
      return a.t * a.d > b.t * b.d;
    });
  }

  /// One exclusive slot (pipelined plans): each rank runs at most one group. Ring sequences take the degree that
  /// reaches tau, shorts go longest-work first to the least-loaded rank with token room, and a rank left empty
  /// takes half of the heaviest multi-sequence group (so counts stay equal where the data allows). Appends the
  /// groups to `tl` and returns the sequences that did not fit (they move to a later slot).
  std::vector<std::size_t> build_slot(const std::vector<std::size_t>& subset, double tau, TimelineBuilder& tl) const {
    const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
    constexpr double kInf = std::numeric_limits<double>::infinity();
    std::vector<double> busy(static_cast<std::size_t>(P), 0.0);  // kInf = taken by a ring
    std::vector<std::size_t> spill, shorts;
    std::vector<Ring> rings;
    classify(subset, tau, 0, shorts, rings);
    NodePicker picker(P, rpn);
    int left = P;
    std::vector<std::pair<std::vector<int>, std::vector<std::int64_t>>> groups;
    for (const auto& ring : rings) {
      if (ring.d > left) {
        spill.push_back(ring.seq);
        continue;
      }
      auto ranks = picker.pick(ring.d, busy);
      for (int r : ranks) busy[static_cast<std::size_t>(r)] = kInf;
      for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker.update(node, busy);
      left -= ring.d;
      groups.push_back({std::move(ranks), {seqs_[ring.seq].id}});
    }
    std::vector<Bin> bins(static_cast<std::size_t>(P));
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
    for (int r = 0; r < P; ++r)
      if (busy[static_cast<std::size_t>(r)] < kInf) heap.push({0.0, r});
    std::vector<Item> popped;
    for (std::size_t i : shorts) {
      const Seq& q = seqs_[i];
      int r = -1;
      while (!heap.empty()) {
        const Item it = heap.top();
        heap.pop();
        if (bins[static_cast<std::size_t>(it.second)].rows + q.rows1 <= cap_) {
          r = it.second;
          break;
        }
        popped.push_back(it);
      }
      for (const auto& it : popped) heap.push(it);
      popped.clear();
      if (r < 0) {
        spill.push_back(i);
        continue;
      }
      auto& b = bins[static_cast<std::size_t>(r)];
      b.seqs.push_back(i), b.rows += q.rows1, b.work += q.work;
      heap.push({b.work, r});
    }
    // empty ranks take half of the heaviest group that has two or more sequences
    for (int e = 0; e < P; ++e) {
      if (busy[static_cast<std::size_t>(e)] == kInf || !bins[static_cast<std::size_t>(e)].seqs.empty()) continue;
      int heavy = -1;
      for (int r = 0; r < P; ++r)
        if (bins[static_cast<std::size_t>(r)].seqs.size() >= 2 &&
            (heavy < 0 || bins[static_cast<std::size_t>(r)].work > bins[static_cast<std::size_t>(heavy)].work))
          heavy = r;
      if (heavy < 0) break;
      auto [a, b] = halve(bins[static_cast<std::size_t>(heavy)]);
      bins[static_cast<std::size_t>(heavy)] = std::move(a);
      bins[static_cast<std::size_t>(e)] = std::move(b);
    }
    for (auto& g : groups) tl.add(std::move(g.first), std::move(g.second));
    for (int r = 0; r < P; ++r) {
      if (bins[static_cast<std::size_t>(r)].seqs.empty()) continue;
      std::vector<std::int64_t> ids;
      for (std::size_t i : bins[static_cast<std::size_t>(r)].seqs) ids.push_back(seqs_[i].id);
      tl.add({r}, std::move(ids));
    }
    return spill;
  }

  /// Splits a group in two by two-way LPT over its sequences, longest work first (ties: lower index).
  std::pair<Bin, Bin> halve(const Bin& all) const {
    std::vector<std::size_t> ids = all.seqs;
    std::stable_sort(ids.begin(), ids.end(), [&](std::size_t x, std::size_t y) {
      return seqs_[x].work != seqs_[y].work ? seqs_[x].work > seqs_[y].work : x < y;
    });
    Bin a, b;
    for (std::size_t i : ids) {
      Bin& to = a.work <= b.work ? a : b;
      to.seqs.push_back(i), to.rows += seqs_[i].rows1, to.work += seqs_[i].work;
    }
    return {std::move(a), std::move(b)};
  }

  double total_work() const {
    double w = 0;
    for (const auto& q : seqs_) w += q.work;
    return w;
  }
  bool has_wide_rings() const {
    for (const auto& q : seqs_)
      if (q.dmin > cluster_.ranks_per_node) return true;
    return false;
  }
  double largest_work() const { return order_.empty() ? 0.0 : seqs_[order_.front()].work; }

  /// A pipelined plan of m exclusive slots (every rank runs one microbatch per slot). Sequences, longest work
  /// first, fill the slots against workload quotas (eqs. 1-3; with `edge` < 1 the first and last slot get a
  /// smaller share), alternating
  /// the blog's two objectives: workload-first (the slot with the least work, when it has token room) and, when
  /// memory binds, memory-first (the slot under quota with the most token room). Each slot then scans a few
  /// targets tau and keeps its fastest layout; what does not fit moves on.
  Plan slotted(int m, double edge) const {
    const int P = cluster_.num_ranks;
    const double slot_cap = static_cast<double>(cap_) * P;
    // Slot weights: the first and last microbatch get `edge` (a light first forward and last backward shorten
    // the pipeline fill and drain), the others 1; the quotas split the total work in proportion.
    std::vector<double> weight(static_cast<std::size_t>(m), 1.0);
    if (m > 2) weight.front() = weight.back() = edge;
    double wsum = 0;
    for (double w : weight) wsum += w;
    std::vector<double> quota;
    for (double w : weight) quota.push_back(total_work() * w / wsum);
    std::vector<std::vector<std::size_t>> slots(static_cast<std::size_t>(m));
    std::vector<double> work(static_cast<std::size_t>(m), 0.0), tokens(static_cast<std::size_t>(m), 0.0);
    for (std::size_t i : order_) {
      const double len = static_cast<double>(seqs_[i].rows1);
      std::size_t best = 0;  // workload-first: the slot furthest below its quota
      for (std::size_t k = 1; k < slots.size(); ++k)
        if (work[k] / weight[k] < work[best] / weight[best]) best = k;
      if (tokens[best] + len > slot_cap) {  // memory binds: the slot under quota with the most token room
        bool found = false;
        for (std::size_t k = 0; k < slots.size(); ++k)
          if (tokens[k] + len <= slot_cap && work[k] < quota[k] && (!found || tokens[k] < tokens[best]))
            best = k, found = true;
        for (std::size_t k = 0; !found && k < slots.size(); ++k)
          if (tokens[k] + len <= slot_cap) best = k, found = true;
      }
      slots[best].push_back(i), work[best] += seqs_[i].work, tokens[best] += len;
    }
    TimelineBuilder tl(batch_, cluster_, cost_);
    std::vector<std::size_t> carry;
    for (std::size_t k = 0; k < slots.size() || !carry.empty(); ++k) {
      std::vector<std::size_t> subset = carry;
      if (k < slots.size()) subset.insert(subset.end(), slots[k].begin(), slots[k].end());
      std::stable_sort(subset.begin(), subset.end(), [&](std::size_t x, std::size_t y) {
        return seqs_[x].work != seqs_[y].work ? seqs_[x].work > seqs_[y].work : x < y;
      });
      double w = 0, top = 0;
      for (std::size_t i : subset) w += seqs_[i].work, top = std::max(top, time1(seqs_[i], seqs_[i].dmin));
      const double lo = std::max(w / P, 1e-12);
      double best_tau = lo, best_t = -1;
      for (int g = 0; g <= 6; ++g) {
        const double tau = lo * std::pow(std::max(top / lo, 1.0), g / 6.0);
        TimelineBuilder trial(batch_, cluster_, cost_);
        const auto sp = build_slot(subset, tau, trial);
        const double t = trial.makespan() * (1.0 + static_cast<double>(sp.size()));  // spills are costly
        if (best_t < 0 || t < best_t) best_t = t, best_tau = tau;
      }
      carry = build_slot(subset, best_tau, tl);
      if (k > 4 * slots.size() + 8) throw Error("dynacp: slot construction did not converge (a bug)");
    }
    return tl.to_plan();
  }

  /// The ring sequences of pipelined(target, mu) with their degrees (the rest go to `shorts`).
  std::vector<Ring> pipelined_rings(double target, double mu, std::vector<std::size_t>& shorts,
                                    bool tile = false) const {
    std::vector<Ring> rings;
    classify(order_, mu, 0, shorts, rings);
    const int rpn = cluster_.ranks_per_node, P = cluster_.num_ranks;
    for (auto& ring : rings) {
      if (ring.t > mu) {  // mu is out of reach: the smallest degree within `target` x its fastest time
        ring.d = degree_for(seqs_[ring.seq], target < 0 ? -target : target * ring.t);
        ring.t = time1(seqs_[ring.seq], ring.d);
      }
      if (tile && ring.d > rpn) {  // tile: a power-of-two number of whole nodes, so wide rings stack without gaps
        int nodes = 1;
        while (nodes * rpn < ring.d) nodes *= 2;
        ring.d = std::min(P, nodes * rpn);
        ring.t = time1(seqs_[ring.seq], ring.d);
      }
    }
    return rings;
  }

  /// How pipelined() builds one plan; each field is described there.
  struct Pipe {
    double target = 1.0;     ///< degree rule for rings that cannot reach mu
    double mu = 0.0;         ///< microbatch target, seconds
    int count = 0;           ///< > 0: microbatches per rank to bring every rank to; < 0: each rank to the
                             ///< nearest multiple of -count (at least -count)
    int order = 0;           ///< order of a rank's own microbatches
    int lead = 0;            ///< lead microbatches
    double lead_frac = 0.5;  ///< their size (< 0: profile lead)
    bool align = false;      ///< rings onto the ranks with the fewest rings first
    bool isolate = false;    ///< the slowest rings keep their ranks from other rings
    bool tile = false;       ///< wide rings on a power-of-two number of whole nodes
    const std::vector<Ring>* fixed = nullptr;  ///< rings placed first, in this order, at their `at` (shelves)
  };

  /// A pipelined plan with per-rank microbatch lists for microbatch target `mu`. Under 1F1B a rank whose
  /// microbatches take S seconds in all (all stages, forward and backward) and M at most finishes after about
  /// (S + (pp - 1) M) / pp (exact for equal microbatches; docs/strategies.md), so:
  ///   1. ring sequences (dmin > 1 or slower than mu on one rank) take the smallest degree that reaches mu (their
  ///      fastest degree, or the one within `target`, if none does) and go, largest area first, onto the
  ///      node-contiguous ranks with the least estimate so far (`align`: with the fewest rings, then the least
  ///      estimate);
  ///   2. the other sequences, longest work first, go to the rank with the least estimate, into its open
  ///      microbatch while that stays within mu and the token capacity, else into a new one;
  ///   3. a local search moves single sequences from the rank with the largest estimate to the smallest.
  /// A ring placed in round k runs at list index k on all its ranks (others run one of their own microbatches
  /// there), and the rank's own microbatches fill the other indices in the given `order`. With `count` < 0 each rank
  /// is brought to the nearest multiple of -count instead (interleaving with variable counts). With `count` > 0 every
  /// rank is then brought to `count` microbatches where the data allows (split the heaviest multi-sequence microbatch,
  /// or merge the two lightest that fit together). `target` > 0: ring sequences that cannot reach mu take the smallest
  /// degree within target x their fastest time; `target` < 0: within -target seconds. `order`: 0 the rank's own
  /// microbatches heaviest first; 1 (or 2) in pyramid order; 3 rise then fall, rounds permuted alike (rise_then_fall).
  /// `lead` > 0: the ranks of each first-round ring first run `lead` microbatches of their own, each packed to
  /// lead_frac x the ring's time / lead (equal prefixes, so they reach the ring together); lead_frac < 0 (profile
  /// lead): every rank first runs `lead` microbatches rising by the ratio -lead_frac towards its first-round ring's
  /// time, else mu. `isolate`: the slowest rings go first and keep their ranks from other rings. `tile`: rings wider
  /// than a node take a power-of-two number of whole nodes (pipelined_rings).
  Plan pipelined(const Pipe& spec, int pp) const {
    const double target = spec.target, mu = spec.mu, lead_frac = spec.lead_frac;
    const int count = spec.count, order = spec.order;
    int lead = spec.lead;
    const bool align = spec.align, isolate = spec.isolate, tile = spec.tile;
    const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
    const double c = cost_.group_overhead;
    std::vector<std::size_t> shorts;
    std::vector<Ring> rings = pipelined_rings(target, mu, shorts, tile);
    if (spec.fixed) {  // their sequences leave the ring and short lists; they go first below
      auto is_fixed = [&](std::size_t seq) {
        return std::any_of(spec.fixed->begin(), spec.fixed->end(), [&](const Ring& f) { return f.seq == seq; });
      };
      std::erase_if(rings, [&](const Ring& r) { return is_fixed(r.seq); });
      std::erase_if(shorts, is_fixed);
    }
    std::stable_sort(rings.begin(), rings.end(), [](const Ring& a, const Ring& b) { return a.t * a.d > b.t * b.d; });
    // isolate: the slowest rings (within kIsolate of the slowest) go first and keep their ranks from other rings
    double slowest = 0.0;
    for (const auto& ring : rings) slowest = std::max(slowest, ring.t);
    auto critical = [&](const Ring& r) { return isolate && r.t >= kIsolate * slowest; };
    std::stable_partition(rings.begin(), rings.end(), critical);
    if (spec.fixed) rings.insert(rings.begin(), spec.fixed->begin(), spec.fixed->end());
    std::vector<double> S(static_cast<std::size_t>(P), 0.0), M(static_cast<std::size_t>(P), 0.0);
    auto est = [&](std::size_t r) { return (S[r] + (pp - 1) * M[r]) / pp; };
    std::vector<double> key(static_cast<std::size_t>(P), 0.0);
    struct Placed {
      std::vector<int> ranks;
      std::int64_t id;
      int round;  // its index in the microbatch list of every rank it runs on
      double t;   // its time
    };
    std::vector<Placed> ring_groups;
    std::vector<int> rings_on(static_cast<std::size_t>(P), 0);
    std::vector<char> reserved(static_cast<std::size_t>(P), 0);
    if (!rings.empty()) {
      NodePicker picker(P, rpn);
      for (const auto& ring : rings) {
        std::vector<int> ranks;
        if (ring.at >= 0)
          for (int r = ring.at; r < ring.at + ring.d; ++r) ranks.push_back(r);
        else
          ranks = picker.pick(ring.d, key);
        int round = 0;
        for (int r : ranks) round = std::max(round, rings_on[static_cast<std::size_t>(r)]);
        for (int r : ranks) {
          const auto u = static_cast<std::size_t>(r);
          S[u] += ring.t, M[u] = std::max(M[u], ring.t);
          rings_on[u] = round + 1;
          // align: ranks with fewer rings first (fewer rounds to fill with their own microbatches)
          if (critical(ring)) reserved[u] = 1;
          key[u] = (align ? 1e6 * rings_on[u] : 0.0) + est(u) + (reserved[u] ? 1e12 : 0.0);
        }
        for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker.update(node, key);
        ring_groups.push_back({std::move(ranks), seqs_[ring.seq].id, round, ring.t});
      }
    }
    std::vector<std::vector<Bin>> bins(static_cast<std::size_t>(P));
    auto bin_time = [&](const Bin& b) { return b.seqs.empty() ? 0.0 : b.work + c; };
    auto refresh = [&](std::size_t r, double ring_s, double ring_m) {
      S[r] = ring_s, M[r] = ring_m;
      for (const auto& b : bins[r]) S[r] += bin_time(b), M[r] = std::max(M[r], bin_time(b));
    };
    const std::vector<double> ring_s = S, ring_m = M;
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
    for (int r = 0; r < P; ++r) heap.push({est(static_cast<std::size_t>(r)), r});
    for (std::size_t i : shorts) {
      const Seq& q = seqs_[i];
      const auto r = static_cast<std::size_t>(heap.top().second);
      heap.pop();
      auto& rb = bins[r];
      if (rb.empty() || rb.back().rows + q.rows1 > cap_ || bin_time(rb.back()) + q.work > mu) rb.emplace_back();
      rb.back().seqs.push_back(i), rb.back().rows += q.rows1, rb.back().work += q.work;
      refresh(r, ring_s[r], ring_m[r]);
      heap.push({est(r), static_cast<int>(r)});
    }
    // local search: move one sequence from the rank with the largest estimate to the rank with the smallest
    for (int round = 0; round < P; ++round) {
      std::size_t hi = 0, lo = 0;
      for (std::size_t r = 1; r < S.size(); ++r) {
        if (est(r) > est(hi)) hi = r;
        if (est(r) < est(lo)) lo = r;
      }
      const double cur = est(hi);
      bool moved = false;
      for (std::size_t bi = 0; bi < bins[hi].size() && !moved; ++bi)
        for (std::size_t k = 0; k < bins[hi][bi].seqs.size() && !moved; ++k) {
          const Seq& q = seqs_[bins[hi][bi].seqs[k]];
          // try the receiver's microbatch with the most room, else a new one
          auto& lb = bins[lo];
          std::size_t into = lb.size();
          for (std::size_t j = 0; j < lb.size(); ++j)
            if (lb[j].rows + q.rows1 <= cap_ && bin_time(lb[j]) + q.work <= mu &&
                (into == lb.size() || lb[j].work < lb[into].work))
              into = j;
          // the estimates after the move, without performing it
          const double old_bt = bin_time(bins[hi][bi]);
          const double new_bt = bins[hi][bi].seqs.size() == 1 ? 0.0 : old_bt - q.work;
          double m_hi = std::max(ring_m[hi], new_bt);
          for (std::size_t j = 0; j < bins[hi].size(); ++j)
            if (j != bi) m_hi = std::max(m_hi, bin_time(bins[hi][j]));
          const double s_hi = S[hi] - old_bt + new_bt;
          const bool fresh = into == lb.size();
          const double into_bt = (fresh ? c : bin_time(lb[into])) + q.work;
          const double s_lo = S[lo] + q.work + (fresh ? c : 0.0);
          const double m_lo = std::max(M[lo], into_bt);
          if (std::max(s_hi + (pp - 1) * m_hi, s_lo + (pp - 1) * m_lo) / pp < cur - 1e-12) {
            if (fresh) lb.emplace_back();
            move_item(bins[hi][bi], k, lb[into]);
            refresh(hi, ring_s[hi], ring_m[hi]);
            refresh(lo, ring_s[lo], ring_m[lo]);
            moved = true;
          }
        }
      if (!moved) break;
      std::erase_if(bins[hi], [](const Bin& b) { return b.seqs.empty(); });
    }
    // Lead microbatches: every rank of a first-round ring runs `lead` microbatches of its own before it, each of
    // about lead_frac x the ring's time / lead, packed (largest first) from the rank's short sequences. The ring then
    // sits inside the rank's list rather than first (a shorter pipeline fill), and its ranks reach it together
    // (equal prefixes, so no rank waits for another).
    std::vector<std::vector<Bin>> pre(static_cast<std::size_t>(P));
    if (lead > 0) {
      // lead_frac > 0: the ranks of first-round rings, `lead` bins of lead_frac x the ring's time / lead each.
      // lead_frac < 0 (profile): every rank, bins rising geometrically by -lead_frac towards the rank's first-round
      // ring time (else mu), the rising start of the best split (tools/gen_pipeline_bound.py); a bin that nothing
      // fits takes the rank's lightest sequence.
      std::vector<double> unit(static_cast<std::size_t>(P), lead_frac < 0 ? mu : -1.0);
      for (const auto& g : ring_groups)
        if (g.round == 0)
          for (int r : g.ranks) unit[static_cast<std::size_t>(r)] = lead_frac < 0 ? g.t : lead_frac * g.t / lead;
      for (int r = 0; r < P; ++r) {
        if (unit[static_cast<std::size_t>(r)] < 0) continue;
        auto& rb = bins[static_cast<std::size_t>(r)];
        std::vector<std::pair<std::size_t, std::size_t>> items;  // (bin, position), largest work first
        for (std::size_t j = 0; j < rb.size(); ++j)
          for (std::size_t k = 0; k < rb[j].seqs.size(); ++k) items.push_back({j, k});
        std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
          return seqs_[rb[x.first].seqs[x.second]].work > seqs_[rb[y.first].seqs[y.second]].work;
        });
        std::vector<char> taken(items.size(), 0);
        const double u = unit[static_cast<std::size_t>(r)];
        for (int l = 0; l < lead; ++l) {
          Bin nb;
          double room = (lead_frac < 0 ? u * std::pow(-lead_frac, lead - l) : u) - c;
          for (std::size_t i = 0; i < items.size(); ++i) {
            const Seq& q = seqs_[rb[items[i].first].seqs[items[i].second]];
            if (taken[i] || q.work > room || nb.rows + q.rows1 > cap_) continue;
            nb.seqs.push_back(rb[items[i].first].seqs[items[i].second]), nb.rows += q.rows1, nb.work += q.work;
            room -= q.work, taken[i] = 1;
          }
          for (std::size_t i = items.size(); lead_frac < 0 && nb.seqs.empty() && i-- > 0;)
            if (!taken[i]) {  // the lightest left (items are heaviest first)
              const std::size_t s = rb[items[i].first].seqs[items[i].second];
              nb.seqs.push_back(s), nb.rows += seqs_[s].rows1, nb.work += seqs_[s].work, taken[i] = 1;
            }
          if (!nb.seqs.empty()) pre[static_cast<std::size_t>(r)].push_back(std::move(nb));
        }
        std::vector<Bin> rest(rb.size());
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (taken[i]) continue;
          const std::size_t s = rb[items[i].first].seqs[items[i].second];
          Bin& b = rest[items[i].first];
          b.seqs.push_back(s), b.rows += seqs_[s].rows1, b.work += seqs_[s].work;
        }
        for (auto& b : rest) std::sort(b.seqs.begin(), b.seqs.end());
        std::erase_if(rest, [](const Bin& b) { return b.seqs.empty(); });
        rb = std::move(rest);
      }
      // the ring moves only if every first-round ring rank got its `lead` microbatches
      bool ok = true;
      for (const auto& g : ring_groups)
        for (int r : g.ranks)
          if (g.round == 0 && static_cast<int>(pre[static_cast<std::size_t>(r)].size()) != lead) ok = false;
      if (!ok) {
        for (int r = 0; r < P; ++r)
          for (auto& b : pre[static_cast<std::size_t>(r)]) bins[static_cast<std::size_t>(r)].push_back(std::move(b));
        for (auto& p : pre) p.clear();
        lead = 0;
      }
    } else {
      lead = 0;
    }
    std::vector<int> fixed = rings_on;
    for (int r = 0; r < P; ++r)
      fixed[static_cast<std::size_t>(r)] += static_cast<int>(pre[static_cast<std::size_t>(r)].size());
    if (count != 0) equalize_counts(bins, fixed, count);
    // Emission in rounds: round k holds the rings placed in it, and every other rank runs one of its own
    // microbatches there, so a ring sits at the same list index on all its ranks (no 1F1B position mismatch between
    // the ranks of a group). Order 3 first permutes the rounds (the same on every rank, so rings stay aligned) into
    // the shape of the best split of a pipeline's work (tools/gen_pipeline_bound.py): light rounds rising, then
    // falling.
    int rounds = 0;
    for (const auto& g : ring_groups) rounds = std::max(rounds, g.round + 1);
    std::vector<int> slot_of(static_cast<std::size_t>(rounds));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    if (order == 3 && lead == 0 && rounds > 1) {
      std::vector<double> weight(static_cast<std::size_t>(rounds), 0.0);
      for (const auto& g : ring_groups)
        weight[static_cast<std::size_t>(g.round)] = std::max(weight[static_cast<std::size_t>(g.round)], g.t);
      const auto seq = rise_then_fall(weight, pp);
      for (std::size_t i = 0; i < seq.size(); ++i) slot_of[seq[i]] = static_cast<int>(i);
    }
    for (auto& g : ring_groups) g.round = slot_of[static_cast<std::size_t>(g.round)];
    // A rank needs one microbatch of its own for every list index before its last ring that holds no ring of it.
    std::vector<int> need(static_cast<std::size_t>(P), 0), last_round(static_cast<std::size_t>(P), -1);
    {
      auto& last = last_round;
      for (const auto& g : ring_groups)
        for (int r : g.ranks) last[static_cast<std::size_t>(r)] = std::max(last[static_cast<std::size_t>(r)], g.round);
      for (int r = 0; r < P; ++r)
        if (last[static_cast<std::size_t>(r)] >= 0)
          need[static_cast<std::size_t>(r)] =
              last[static_cast<std::size_t>(r)] + 1 + lead - static_cast<int>(pre[static_cast<std::size_t>(r)].size());
      for (const auto& g : ring_groups)
        for (int r : g.ranks) --need[static_cast<std::size_t>(r)];
      for (int r = 0; r < P; ++r) {
        auto& rb = bins[static_cast<std::size_t>(r)];
        while (static_cast<int>(rb.size()) < need[static_cast<std::size_t>(r)]) {
          // split off the lightest sequence of a multi-sequence microbatch: this rank's own, else anyone's
          int from = -1;
          std::size_t fb = 0, fk = 0;
          for (int pass = 0; pass < 2 && from < 0; ++pass)
            for (int o = pass ? 0 : r; o < (pass ? P : r + 1); ++o)
              for (std::size_t j = 0; j < bins[static_cast<std::size_t>(o)].size(); ++j) {
                const Bin& b = bins[static_cast<std::size_t>(o)][j];
                if (b.seqs.size() < 2) continue;
                for (std::size_t k = 0; k < b.seqs.size(); ++k)
                  if (from < 0 || seqs_[b.seqs[k]].work < seqs_[bins[static_cast<std::size_t>(from)][fb].seqs[fk]].work)
                    from = o, fb = j, fk = k;
              }
          if (from < 0) {
            // else the lightest microbatch of the rank with the most to spare
            int donor = -1, most = 1;
            for (int o = 0; o < P; ++o) {
              const auto u = static_cast<std::size_t>(o);
              const int spare = static_cast<int>(bins[u].size()) - std::max(need[u], 0);
              if (o != r && spare > most) donor = o, most = spare;
            }
            if (donor < 0) break;
            auto& db = bins[static_cast<std::size_t>(donor)];
            const auto light =
                std::min_element(db.begin(), db.end(), [](const Bin& x, const Bin& y) { return x.work < y.work; });
            rb.push_back(std::move(*light));
            db.erase(light);
            continue;
          }
          Bin fresh;
          move_item(bins[static_cast<std::size_t>(from)][fb], fk, fresh);
          rb.push_back(std::move(fresh));
        }
      }
    }
    // Per-rank lists: a ring of round k sits at index k + lead, the same on all its ranks, so no two ranks of a
    // group reach it at different 1F1B positions; a first-round ring's ranks run their lead microbatches before it.
    // The rank's own microbatches fill the other indices heaviest first (order 0) or in pyramid order - lightest
    // first and last, heaviest in the middle - which shortens the pipeline fill and drain (docs/strategies.md).
    std::vector<std::vector<std::pair<int, std::size_t>>> lists(static_cast<std::size_t>(P));  // (kind, index)
    for (int r = 0; r < P; ++r)
      for (std::size_t j = 0; j < pre[static_cast<std::size_t>(r)].size(); ++j)
        lists[static_cast<std::size_t>(r)].push_back({2, j});
    for (std::size_t g = 0; g < ring_groups.size(); ++g)
      for (int r : ring_groups[g].ranks) {
        auto& l = lists[static_cast<std::size_t>(r)];
        const auto at = static_cast<std::size_t>(ring_groups[g].round + lead);
        if (l.size() <= at) l.resize(at + 1, {-1, 0});
        l[at] = {1, g};
      }
    for (int r = 0; r < P; ++r) {
      std::vector<double> w;
      for (const auto& b : bins[static_cast<std::size_t>(r)]) w.push_back(b.work);
      const std::vector<std::size_t> seq = own_order(w, order, pp);
      auto& l = lists[static_cast<std::size_t>(r)];
      std::size_t k = 0;
      for (auto& slot : l)
        if (slot.first < 0 && k < seq.size()) slot = {0, seq[k++]};
      while (k < seq.size()) l.push_back({0, seq[k++]});
    }
    TimelineBuilder tl(batch_, cluster_, cost_);
    std::size_t longest = 0;
    for (const auto& l : lists) longest = std::max(longest, l.size());
    for (std::size_t at = 0; at < longest; ++at) {
      for (int r = 0; r < P; ++r) {
        const auto& l = lists[static_cast<std::size_t>(r)];
        if (at >= l.size()) continue;
        const auto [kind, index] = l[at];
        if (kind == 0 || kind == 2) {
          std::vector<std::int64_t> ids;
          for (std::size_t i : (kind == 0 ? bins : pre)[static_cast<std::size_t>(r)][index].seqs)
            ids.push_back(seqs_[i].id);
          tl.add({r}, std::move(ids));
        } else if (kind == 1 && ring_groups[index].ranks.front() == r) {
          tl.add(ring_groups[index].ranks, {ring_groups[index].id});
        }
      }
    }
    return tl.to_plan();
  }

  /// Brings every rank's microbatch count (its rings plus its bins) towards `count`: splits the heaviest bin with
  /// two or more sequences (two-way LPT) while below, merges the two lightest bins that fit one rank while above.
  void equalize_counts(std::vector<std::vector<Bin>>& bins, const std::vector<int>& rings_on, int want) const {
    for (std::size_t r = 0; r < bins.size(); ++r) {
      auto& rb = bins[r];
      auto n = [&] { return static_cast<int>(rb.size()) + rings_on[r]; };
      if (n() == 0) continue;  // a rank with nothing to run keeps it that way
      const int step = -want, count = want > 0 ? want : std::max(step, (n() + step / 2) / step * step);
      while (n() < count) {
        std::size_t heavy = rb.size();
        for (std::size_t j = 0; j < rb.size(); ++j)
          if (rb[j].seqs.size() >= 2 && (heavy == rb.size() || rb[j].work > rb[heavy].work)) heavy = j;
        if (heavy == rb.size()) break;
        auto [a, b] = halve(rb[heavy]);
        rb[heavy] = std::move(a);
        rb.push_back(std::move(b));
      }
      while (n() > count && rb.size() >= 2) {
        std::stable_sort(rb.begin(), rb.end(), [](const Bin& a, const Bin& b) { return a.work < b.work; });
        std::size_t x = rb.size(), y = rb.size();
        for (std::size_t i = 0; i < rb.size() && x == rb.size(); ++i)
          for (std::size_t j = i + 1; j < rb.size(); ++j)
            if (rb[i].rows + rb[j].rows <= cap_) {
              x = i, y = j;
              break;
            }
        if (x == rb.size()) break;
        for (std::size_t i : rb[y].seqs) rb[x].seqs.push_back(i);
        rb[x].rows += rb[y].rows, rb[x].work += rb[y].work;
        rb.erase(rb.begin() + static_cast<std::ptrdiff_t>(y));
      }
    }
  }

  /// Rings for shelf packing (pp = 1): the sequences that need a ring at `tau`, largest area first, grouped into
  /// shelves whose minimum degrees fit the pool together; within a shelf every ring gets a degree proportional to its
  /// area (at least its minimum), so the shelf's rings finish together after about sum area / P. Long sequences
  /// whose memory forces wide rings then run side by side instead of in staggered rounds (docs/strategies.md).
  std::vector<Ring> shelves(double tau) const {
    const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
    std::vector<std::size_t> shorts;
    std::vector<Ring> rings;
    classify(order_, tau, 0, shorts, rings);
    std::vector<Ring> out, rest, wide;
    for (const auto& r : rings) (seqs_[r.seq].dmin >= rpn ? wide : rest).push_back(r);
    // Only when the wide rings crowd the pool (their minimum degrees take more than half of it); otherwise the plain
    // build already runs them side by side.
    int crowd = 0;
    for (const auto& r : wide) crowd += seqs_[r.seq].dmin;
    if (wide.size() < 2 || 2 * crowd <= P) return {};
    for (std::size_t a = 0; a < wide.size();) {
      std::size_t z = a;
      int used = 0;
      while (z < wide.size() && used + seqs_[wide[z].seq].dmin <= P) used += seqs_[wide[z].seq].dmin, ++z;
      if (z == a) used = seqs_[wide[z].seq].dmin, ++z;  // cannot happen: dmin <= P (checked by plan())
      std::vector<int> d;
      for (std::size_t i = a; i < z; ++i) d.push_back(seqs_[wide[i].seq].dmin);
      // The spare ranks go one at a time to the ring that takes longest, so the shelf's rings end together, while
      // that costs it at most 2% more rank-time than at its minimum degree (ranks left over run short sequences).
      std::priority_queue<std::pair<double, std::size_t>> slow;  // (time, n - i): ties go to the earlier ring
      for (std::size_t i = 0; i < d.size(); ++i) slow.push({time1(seqs_[wide[a + i].seq], d[i]), d.size() - i});
      while (used < P && !slow.empty()) {
        const std::size_t i = d.size() - slow.top().second;
        slow.pop();
        const Seq& q = seqs_[wide[a + i].seq];
        const double t = time1(q, d[i] + 1);
        if ((d[i] + 1) * t > 1.02 * q.dmin * time1(q, q.dmin)) continue;  // saturated: drop it
        ++d[i], ++used;
        slow.push({t, d.size() - i});
      }
      int at = 0;
      for (std::size_t i = a; i < z; ++i) {
        const int deg = d[i - a];
        out.push_back({wide[i].seq, deg, time1(seqs_[wide[i].seq], deg), at});
        at += deg;
      }
      a = z;
    }
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
  }

  /// Shelf layouts for pipelined plans (pp > 1). The giants - the sequences whose memory needs more than a node, at
  /// most kShelfGiants of them - are split into shelves of one to three rings side by side on consecutive ranks (a
  /// lone ring at its fastest degree; two or three at the degrees, summing to the shelf's width, that make its
  /// slowest ring fastest), and every rank of the shelves' width runs them one after the other. Two shapes:
  ///   - full shelves: every giant in a shelf over the whole pool, when their least degrees sum to more than P;
  ///   - a column: the hardest giant alone on the first w ranks for the whole step (every w from its least degree
  ///     up), the others in shelves over the remaining P - w.
  /// Each rank runs one ring per shelf it is covered in, and the rings' 1F1B chain floor on the rank
  /// (one_f_one_b_chain_floor) is the layout's score there; layouts are ranked by their worst rank, and the best
  /// `keep` (distinct) are returned, each as its rings in run order with their places. Every order of up to
  /// kShelfOrders shelves is tried (more: the rise-then-fall order of their times), with the rings of alternate
  /// shelves placed from either end of their ranks. `drop` > 0 leaves out the `drop` smallest giants (pipelined()
  /// places them like any ring). Empty for fewer than two giants or more than kShelfGiants. Degrees and column widths
  /// step by P / 64 ranks, rounded down (every one below 128 ranks).
  std::vector<std::vector<Ring>> pipelined_shelves(int pp, std::size_t keep, std::size_t drop = 0) const {
    const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
    std::vector<std::size_t> giants;
    for (std::size_t i : order_)
      if (seqs_[i].dmin > rpn) giants.push_back(i);
    if (giants.size() > kShelfGiants) return {};  // more than a layout holds: the plain builds place them
    giants.resize(giants.size() > drop ? giants.size() - drop : 0);
    if (giants.size() < 2) return {};
    // degrees and column widths step by `stride` ranks (1 up to 64 ranks; larger pools are searched coarser)
    const int stride = std::max(1, P / 64);
    const std::size_t n = giants.size();
    auto least = [&](std::size_t g) { return seqs_[giants[g]].dmin; };
    // T(giant, d) for d = 0..P (infinite below its least degree)
    std::vector<std::vector<double>> T(
        n, std::vector<double>(static_cast<std::size_t>(P) + 1, std::numeric_limits<double>::infinity()));
    for (std::size_t g = 0; g < n; ++g)
      for (int d = least(g); d <= P; ++d) T[g][d] = time1(seqs_[giants[g]], d);
    struct Shelf {
      double t = 0.0;
      std::vector<std::pair<std::size_t, int>> rings;  // (giant, degree), widest first
    };
    // the best degrees for a shelf of giants `members` on `width` ranks (false when their least degrees exceed it)
    auto best_shelf = [&](const std::vector<std::size_t>& members, int width, Shelf& out) {
      out = Shelf{std::numeric_limits<double>::infinity(), {}};
      const std::size_t a = members[0];
      if (members.size() == 1) {
        for (int d = least(a); d <= width; d += stride)
          if (T[a][d] < out.t) out = Shelf{T[a][d], {{a, d}}};
      } else if (members.size() == 2) {
        const std::size_t b = members[1];
        for (int d = least(a); d + least(b) <= width; d += stride)
          if (const double t = std::max(T[a][d], T[b][width - d]); t < out.t) out = Shelf{t, {{a, d}, {b, width - d}}};
      } else if (members.size() == 3) {
        const std::size_t b = members[1], c = members[2];
        for (int d = least(a); d + least(b) + least(c) <= width; d += stride)
          for (int e = least(b); d + e + least(c) <= width; e += stride)
            if (const double t = std::max({T[a][d], T[b][e], T[c][width - d - e]}); t < out.t)
              out = Shelf{t, {{a, d}, {b, e}, {c, width - d - e}}};
      }
      std::stable_sort(out.rings.begin(), out.rings.end(),
                       [](const auto& x, const auto& y) { return x.second > y.second; });
      return !out.rings.empty();
    };
    // A layout's score: ranks between consecutive ring edges run the same rings, so one rank of each such run.
    auto score = [&](const std::vector<Ring>& rings) {
      std::vector<int> cuts{0, P};
      for (const auto& r : rings) cuts.push_back(r.at), cuts.push_back(r.at + r.d);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      double worst = 0.0;
      std::vector<double> chain;
      for (std::size_t j = 0; j + 1 < cuts.size(); ++j) {
        chain.clear();
        for (const auto& r : rings)
          if (r.at <= cuts[j] && cuts[j] < r.at + r.d) chain.push_back(r.t);
        if (!chain.empty()) worst = std::max(worst, one_f_one_b_chain_floor(chain, pp));
      }
      return worst;
    };
    std::vector<std::pair<double, std::vector<Ring>>> found;
    // Every order of `shelves` (up to kShelfOrders; more: rise then fall of their times) on the ranks [offset,
    // offset + width), after the rings `before`, alternate shelves placed from either end or all from the start.
    auto lay_out = [&](const std::vector<Shelf>& shelves, int offset, int width, const std::vector<Ring>& before) {
      std::vector<std::size_t> order(shelves.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      const bool all_orders = shelves.size() <= kShelfOrders;
      if (!all_orders) {
        std::vector<double> w;
        for (const auto& sh : shelves) w.push_back(sh.t);
        order = rise_then_fall(w, pp);
      }
      do {
        for (bool alternate : {false, true}) {
          std::vector<Ring> rings = before;
          for (std::size_t k = 0; k < order.size(); ++k) {
            const Shelf& sh = shelves[order[k]];
            int at = offset, used = 0;
            for (const auto& [g, d] : sh.rings) used += d;
            if (alternate && k % 2 == 1) at = offset + width - used;
            for (const auto& [g, d] : sh.rings) rings.push_back({giants[g], d, T[g][d], at}), at += d;
          }
          found.push_back({score(rings), std::move(rings)});
        }
      } while (all_orders && std::next_permutation(order.begin(), order.end()));
    };
    // Every grouping of `members` into shelves (set_partitions) on the ranks [offset, offset + width).
    auto shelve = [&](const std::vector<std::size_t>& members, int offset, int width, const std::vector<Ring>& before) {
      for (const auto& blocks : set_partitions(static_cast<int>(members.size()))) {
        std::vector<Shelf> shelves(blocks.size());
        bool ok = true;
        for (std::size_t b = 0; b < blocks.size() && ok; ++b) {
          std::vector<std::size_t> block;
          for (std::size_t g = 0; g < members.size(); ++g)
            if (blocks[b] >> g & 1) block.push_back(members[g]);
          ok = best_shelf(block, width, shelves[b]);
        }
        if (ok) lay_out(shelves, offset, width, before);
      }
    };
    std::vector<std::size_t> all(n);
    std::iota(all.begin(), all.end(), std::size_t{0});
    int crowd = 0;
    for (std::size_t g = 0; g < n; ++g) crowd += least(g);
    if (crowd > P) shelve(all, 0, P, {});
    const std::vector<std::size_t> rest(all.begin() + 1, all.end());
    int widest = 0;  // beside the column, the others need at least their widest least degree
    for (std::size_t g : rest) widest = std::max(widest, least(g));
    for (int w = least(0); P - w >= widest; w += stride) shelve(rest, w, P - w, {Ring{giants[0], w, T[0][w], 0}});
    std::stable_sort(found.begin(), found.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<std::vector<Ring>> out;
    for (auto& [worst, rings] : found) {
      if (out.size() == keep) break;
      const bool repeat = std::any_of(out.begin(), out.end(), [&](const std::vector<Ring>& o) {
        return std::equal(o.begin(), o.end(), rings.begin(), rings.end(),
                          [](const Ring& x, const Ring& y) { return x.seq == y.seq && x.d == y.d && x.at == y.at; });
      });
      if (!repeat) out.push_back(std::move(rings));
    }
    return out;
  }

  /// Builds the plan for target tau; returns its makespan and, if `out` is given, the plan.
  /// Ring placement orders tried: largest area (T d) first, longest first, widest first.
  static constexpr int kRingOrders = 3;
  static constexpr double kIsolate = 0.75;  // pipelined(isolate): rings this close to the slowest are critical
  /// Pools up to this many nodes get the full search for rings wider than a node (neighbour degrees, orders).
  static constexpr int kWideNodes = 128;
  /// pipelined_shelves: the most giants, and the most shelves whose every order is tried.
  static constexpr std::size_t kShelfGiants = 7;
  static constexpr std::size_t kShelfOrders = 5;

  double build(double tau, int local_search_rounds, Plan* out, int ring_order = 0,
               const std::vector<Ring>* forced = nullptr) const {
    const int P = cluster_.num_ranks;
    const int rpn = cluster_.ranks_per_node;
    // 1. ring sequences
    std::vector<std::size_t> shorts;
    std::vector<Ring> rings;
    if (forced) {  // the rings and their degrees are given (shelves()); everything else is short
      rings = *forced;
      std::vector<char> ring(seqs_.size(), 0);
      for (const auto& r : rings) ring[r.seq] = 1;
      for (std::size_t i : order_)
        if (!ring[i]) shorts.push_back(i);
    } else {
      classify(order_, tau, ring_order, shorts, rings);
    }
    // Rings are placed on a scratch timeline; the idle time a rank spends waiting for a ring's other ranks
    // becomes a gap that short sequences can fill without delaying anything.
    struct Placed {
      std::vector<int> ranks;
      std::int64_t id;
      double start;
    };
    struct Gap {
      int rank;
      double start, room;
      Bin bin;
    };
    std::vector<Placed> placed;
    std::vector<Gap> gaps;
    std::optional<NodePicker> picker;
    if (!rings.empty()) picker.emplace(P, rpn);
    TimelineBuilder scratch(batch_, cluster_, cost_);
    for (const auto& ring : rings) {
      // The degree that reaches tau, or a neighbour that finishes earlier on the ranks free right now.
      std::vector<int> ranks;
      double start = 0.0, finish_at = 0.0;
      const Seq& q = seqs_[ring.seq];
      // (On pools of more than kWideNodes nodes a window search is O(nodes), so rings wider than a node keep d.)
      const int span = forced ? 0 : ring.d <= rpn || P / rpn <= kWideNodes ? 2 : 0;
      for (int d = std::max(q.dmin, ring.d - span); d <= std::min(P, ring.d + span); ++d) {
        std::vector<int> cand;
        if (ring.at >= 0)
          for (int r = ring.at; r < ring.at + d; ++r) cand.push_back(r);
        else
          cand = picker->pick(d, scratch.free());
        double s0 = 0.0;
        for (int r : cand) s0 = std::max(s0, scratch.free()[static_cast<std::size_t>(r)]);
        const double f = s0 + time1(q, d);
        if (ranks.empty() || f < finish_at) ranks = std::move(cand), start = s0, finish_at = f;
      }
      for (int r : ranks) {
        const double idle = start - scratch.free()[static_cast<std::size_t>(r)];
        if (idle > cost_.group_overhead) gaps.push_back({r, scratch.free()[static_cast<std::size_t>(r)], idle, {}});
      }
      scratch.add(ranks, {seqs_[ring.seq].id});
      for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker->update(node, scratch.free());
      placed.push_back({std::move(ranks), seqs_[ring.seq].id, start});
    }

    // 2. shorts: into the tightest gap that holds them, else longest work first onto the rank that finishes first
    std::multiset<std::pair<double, std::size_t>> by_room;
    for (std::size_t g = 0; g < gaps.size(); ++g) by_room.insert({gaps[g].room, g});
    std::vector<double> base = scratch.free();
    std::vector<std::vector<Bin>> bins(static_cast<std::size_t>(P));
    std::vector<double> fin = base;
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
    for (int r = 0; r < P; ++r) heap.push({fin[static_cast<std::size_t>(r)], r});
    for (std::size_t i : shorts) {
      const Seq& s = seqs_[i];
      bool gapped = false;
      int tries = 0;
      for (auto it = by_room.lower_bound({s.work, 0}); it != by_room.end() && tries < 8; ++it, ++tries) {
        Gap& g = gaps[it->second];
        const double need = s.work + (g.bin.seqs.empty() ? cost_.group_overhead : 0.0);
        if (need > g.room || g.bin.rows + s.rows1 > cap_) continue;
        const std::size_t gi = it->second;
        by_room.erase(it);
        g.bin.seqs.push_back(i), g.bin.rows += s.rows1, g.bin.work += s.work;
        g.room -= need;
        by_room.insert({g.room, gi});
        gapped = true;
        break;
      }
      if (gapped) continue;
      const int r = heap.top().second;
      heap.pop();
      auto& rb = bins[static_cast<std::size_t>(r)];
      if (rb.empty() || rb.back().rows + s.rows1 > cap_) rb.emplace_back();
      rb.back().seqs.push_back(i);
      rb.back().rows += s.rows1;
      rb.back().work += s.work;
      fin[static_cast<std::size_t>(r)] = finish(base[static_cast<std::size_t>(r)], rb);
      heap.push({fin[static_cast<std::size_t>(r)], r});
    }
    // 3. local search between the slowest rank and the others
    for (int round = 0; round < local_search_rounds; ++round)
      if (!improve(base, bins, fin)) break;

    const double makespan = *std::max_element(fin.begin(), fin.end());
    if (!out) return makespan;
    // Emit in planned start order (a gap group before the ring it precedes) so every group keeps its start time.
    struct Event {
      double start;
      int kind;  // 0 = gap group, 1 = ring
      std::size_t index;
    };
    std::vector<Event> events;
    for (std::size_t g = 0; g < gaps.size(); ++g)
      if (!gaps[g].bin.seqs.empty()) events.push_back({gaps[g].start, 0, g});
    for (std::size_t k = 0; k < placed.size(); ++k) events.push_back({placed[k].start, 1, k});
    std::stable_sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
      return x.start != y.start ? x.start < y.start : x.kind < y.kind;
    });
    TimelineBuilder tl(batch_, cluster_, cost_);
    auto ids_of = [&](const Bin& b) {
      std::vector<std::int64_t> ids;
      for (std::size_t i : b.seqs) ids.push_back(seqs_[i].id);
      return ids;
    };
    for (const auto& e : events) {
      if (e.kind == 0)
        tl.add({gaps[e.index].rank}, ids_of(gaps[e.index].bin));
      else
        tl.add(placed[e.index].ranks, {placed[e.index].id});
    }
    for (int r = 0; r < P; ++r)
      for (const auto& bn : bins[static_cast<std::size_t>(r)])
        if (!bn.seqs.empty()) tl.add({r}, ids_of(bn));
    *out = tl.to_plan();
    return makespan;
  }

 private:
  double finish(double base, const std::vector<Bin>& rb) const {
    double t = base;
    for (const auto& b : rb)
      if (!b.seqs.empty()) t += b.work + cost_.group_overhead;
    return t;
  }

  // One improving move or swap of a short sequence from the slowest rank; returns false if none helps.
  bool improve(const std::vector<double>& base, std::vector<std::vector<Bin>>& bins, std::vector<double>& fin) const {
    const int P = static_cast<int>(fin.size());
    const int hi = static_cast<int>(std::max_element(fin.begin(), fin.end()) - fin.begin());
    const double cur = fin[static_cast<std::size_t>(hi)];
    auto& hb = bins[static_cast<std::size_t>(hi)];
    // candidate receivers: ranks by finish time, fastest first (a few)
    std::vector<int> recv(static_cast<std::size_t>(P));
    std::iota(recv.begin(), recv.end(), 0);
    const int kRecv = std::min(P, 8);
    std::partial_sort(recv.begin(), recv.begin() + kRecv, recv.end(), [&](int a, int b) {
      return fin[static_cast<std::size_t>(a)] != fin[static_cast<std::size_t>(b)]
                 ? fin[static_cast<std::size_t>(a)] < fin[static_cast<std::size_t>(b)]
                 : a < b;
    });
    // Bounded neighbourhood: at most kItems sequences of the slowest rank, each against at most kItems of a
    // receiver, so one round costs O(kRecv * kItems^2) however many sequences a rank holds.
    constexpr std::size_t kItems = 48;
    std::size_t tried = 0;
    for (std::size_t bi = 0; bi < hb.size() && tried < kItems; ++bi) {
      for (std::size_t k = 0; k < hb[bi].seqs.size() && tried < kItems; ++k, ++tried) {
        const Seq& s = seqs_[hb[bi].seqs[k]];
        const double hi_after =
            fin[static_cast<std::size_t>(hi)] - s.work - (hb[bi].seqs.size() == 1 ? cost_.group_overhead : 0.0);
        for (int q = 0; q < kRecv; ++q) {
          const int lo = recv[static_cast<std::size_t>(q)];
          if (lo == hi) continue;
          auto& lb = bins[static_cast<std::size_t>(lo)];
          // move: into the receiver's last bin if it fits, else a new bin
          const bool fits = !lb.empty() && lb.back().rows + s.rows1 <= cap_;
          const double lo_after = fin[static_cast<std::size_t>(lo)] + s.work + (fits ? 0.0 : cost_.group_overhead);
          if (std::max(hi_after, lo_after) < cur - 1e-12) {
            if (!fits) lb.emplace_back();
            move_item(hb[bi], k, lb.back());
            fin[static_cast<std::size_t>(hi)] = finish(base[static_cast<std::size_t>(hi)], hb);
            fin[static_cast<std::size_t>(lo)] = finish(base[static_cast<std::size_t>(lo)], lb);
            return true;
          }
          // swap with a lighter sequence of the receiver
          std::size_t seen = 0;
          for (auto& rb : lb)
            for (std::size_t j = 0; j < rb.seqs.size() && seen < kItems; ++j, ++seen) {
              const Seq& t = seqs_[rb.seqs[j]];
              if (t.work >= s.work) continue;
              if (hb[bi].rows - s.rows1 + t.rows1 > cap_ || rb.rows - t.rows1 + s.rows1 > cap_) continue;
              const double delta = s.work - t.work;
              if (std::max(cur - delta, fin[static_cast<std::size_t>(lo)] + delta) < cur - 1e-12) {
                std::swap(hb[bi].seqs[k], rb.seqs[j]);
                hb[bi].rows += t.rows1 - s.rows1, hb[bi].work -= delta;
                rb.rows += s.rows1 - t.rows1, rb.work += delta;
                fin[static_cast<std::size_t>(hi)] = finish(base[static_cast<std::size_t>(hi)], hb);
                fin[static_cast<std::size_t>(lo)] = finish(base[static_cast<std::size_t>(lo)], lb);
                return true;
              }
            }
        }
      }
    }
    return false;
  }

  void move_item(Bin& from, std::size_t k, Bin& to) const {
    const Seq& s = seqs_[from.seqs[k]];
    to.seqs.push_back(from.seqs[k]);
    to.rows += s.rows1, to.work += s.work;
    from.seqs.erase(from.seqs.begin() + static_cast<std::ptrdiff_t>(k));
    from.rows -= s.rows1, from.work -= s.work;
  }

  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  std::int64_t cap_ = 0;
  std::vector<Seq> seqs_;
  std::vector<std::size_t> order_;
};

}  // namespace

namespace {

bool counts_ok(const Plan& plan, int P, const PlanOptions& o) {
  const std::vector<int> n = plan.microbatch_counts(P);
  for (int c : n) {
    if (o.count_policy == CountPolicy::Equal && c != n.front()) return false;
    if (o.vpp > 1 && c % o.pp != 0) return false;
  }
  return true;
}

// The fallback when no candidate meets the count policy (few sequences per rank): m exclusive slots, m the largest
// multiple of `multiple` (pp under vpp > 1, else 1) not above the number of sequences, each one group of all P ranks;
// sequences, largest work first, go to the slot with the least work that still has token room. Every rank runs m
// microbatches, so both count rules hold; an empty plan when m = 0 or the tokens do not fit.
Plan pool_slots(const Batch& batch, const Cluster& cluster, const CostModel& cost, int multiple) {
  const auto n = static_cast<std::int64_t>(batch.size());
  const std::int64_t m = n / multiple * multiple, cap = cost.token_capacity(cluster);
  if (m == 0) return {};
  std::vector<std::int64_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  auto work = [&](std::int64_t i) {
    return cost.work(batch.lengths[static_cast<std::size_t>(i)], batch.mask(static_cast<std::size_t>(i)));
  };
  std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) { return work(a) > work(b); });
  std::vector<double> load(static_cast<std::size_t>(m), 0.0);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(m), 0);  // padded rows per rank of each slot's group
  auto rows_of = [&](std::int64_t i) {
    return cluster.padded_rows(batch.lengths[static_cast<std::size_t>(i)], cluster.num_ranks);
  };
  Plan plan;
  plan.microbatches.resize(static_cast<std::size_t>(m));
  std::vector<int> all(static_cast<std::size_t>(cluster.num_ranks));
  std::iota(all.begin(), all.end(), 0);
  for (auto& slot : plan.microbatches) slot.push_back(Group{all, {}});
  for (std::int64_t i : ids) {
    std::size_t best = load.size();
    for (std::size_t k = 0; k < load.size(); ++k)
      if (rows[k] + rows_of(i) <= cap && (best == load.size() || load[k] < load[best])) best = k;
    if (best == load.size()) return {};
    load[best] += work(i), rows[best] += rows_of(i);
    plan.microbatches[best][0].sequences.push_back(i);
  }
  for (auto& slot : plan.microbatches) std::sort(slot[0].sequences.begin(), slot[0].sequences.end());
  return plan;
}

}  // namespace

// Slot order polish for pipelined plans, scored by the simulator: a slot is one list index on every rank it
// touches, so permuting whole slots keeps every ring aligned (a permutation the simulator rejects - some rank skips
// a slot - scores infinity and is dropped). Tries the rise-then-fall shapes of the slots' largest group times for
// q = 0..pp light slots first, then swaps pairs of slots while that helps, within a budget of simulations.
Plan reorder_slots(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options) {
  const std::size_t n = plan.microbatches.size();
  if (n < 2) return plan;
  std::vector<double> weight(n, 0.0);
  for (std::size_t k = 0; k < n; ++k)
    for (const auto& g : plan.microbatches[k]) {
      const GroupStats st = group_stats(batch, cost, g.sequences);
      weight[k] = std::max(weight[k], cost.time(st, g.degree(), crosses_nodes(g.ranks, cluster), cluster));
    }
  std::vector<std::size_t> cur(n);
  std::iota(cur.begin(), cur.end(), std::size_t{0});
  // Scores the slots in `order`: moves them into place and back, so no group is copied.
  std::vector<std::vector<Group>> spare(n);
  auto score_order = [&](const std::vector<std::size_t>& order) {
    for (std::size_t k = 0; k < n; ++k) spare[k] = std::move(plan.microbatches[order[k]]);
    plan.microbatches.swap(spare);
    const double s = score(plan, batch, cluster, cost, options);
    plan.microbatches.swap(spare);
    for (std::size_t k = 0; k < n; ++k) plan.microbatches[order[k]] = std::move(spare[k]);
    return s;
  };
  std::vector<std::size_t> by(n);
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return weight[x] < weight[y]; });
  for (int q = 0; q <= options.pp && static_cast<std::size_t>(q) < n; ++q) {
    std::vector<std::size_t> order(by.begin(), by.begin() + q);
    for (std::size_t i = n; i > static_cast<std::size_t>(q); --i) order.push_back(by[i - 1]);
    const double s = score_order(order);
    if (s < t) t = s, cur = order;
  }
  constexpr int kBudget = 96;
  int spent = 0;
  for (bool better = true; better && spent < kBudget;) {
    better = false;
    for (std::size_t i = 0; i + 1 < n && spent < kBudget; ++i)
      for (std::size_t j = i + 1; j < n && spent < kBudget; ++j)
        for (int move = 0; move < 2 && spent < kBudget; ++move) {
          // swap slots i and j, or move slot j to position i (the slots between shift by one)
          auto order = cur;
          if (move == 0)
            std::swap(order[i], order[j]);
          else if (j > i + 1)
            std::rotate(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(j),
                        order.begin() + static_cast<std::ptrdiff_t>(j) + 1);
          else
            continue;
          ++spent;
          const double s = score_order(order);
          if (s < t - 1e-12) t = s, cur = std::move(order), better = true;
        }
  }
  for (std::size_t k = 0; k < n; ++k) spare[k] = std::move(plan.microbatches[cur[k]]);
  plan.microbatches.swap(spare);
  return plan;
}

Plan dynacp(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  const Builder b(batch, cluster, cost);
  const double lo = std::max(lower_bound(batch, cluster, cost), 1e-12);
  const double hi = std::max(b.upper_tau(), lo);
  constexpr int kGrid = 8;
  constexpr int kLocalSearch = 200;
  std::vector<double> taus;
  for (int k = 0; k <= kGrid; ++k) taus.push_back(lo * std::pow(hi / lo, static_cast<double>(k) / kGrid));
  // Ring placement order matters only when some ring spans more than a node; then all orders are tried.
  const int orders = b.has_wide_rings() && cluster.num_nodes() <= Builder::kWideNodes ? Builder::kRingOrders : 1;
  double best_tau = taus.front(), best_t = -1;
  int best_order = 0;
  // A build depends on tau only through which sequences become rings and their degrees: skip repeats.
  std::set<std::vector<std::pair<std::size_t, int>>> seen;
  auto attempt = [&](double tau) {
    if (!seen.insert(b.signature(tau)).second) return;
    for (int order = 0; order < orders; ++order) {
      const double t = b.build(tau, 0, nullptr, order);
      if (best_t < 0 || t < best_t) best_t = t, best_tau = tau, best_order = order;
    }
  };
  for (double tau : taus) attempt(tau);
  // refine between the neighbours of the best grid point
  const double step = std::pow(hi / lo, 1.0 / kGrid);
  for (int k = 1; k <= 3; ++k) {
    attempt(best_tau * std::pow(step, k / 4.0));
    attempt(best_tau / std::pow(step, k / 4.0));
  }
  std::vector<Plan> candidates(1);
  b.build(best_tau, kLocalSearch, &candidates[0], best_order);
  {
    // shelf packing of the wide rings (side by side, degrees by area) at the best tau
    const auto forced = b.shelves(best_tau);
    if (!forced.empty()) {
      Plan p;
      b.build(best_tau, kLocalSearch, &p, 0, &forced);
      candidates.push_back(std::move(p));
    }
  }
  if (options.pp > 1) {
    // Pipelined: exclusive slots for m on the grid [pp, 4 pp] (multiples of pp), at least as many as memory needs.
    const double need = static_cast<double>(batch.total_tokens()) /
                        (static_cast<double>(cost.token_capacity(cluster)) * cluster.num_ranks);
    const int m_min = std::max(1, static_cast<int>(std::ceil(need)));
    // The knee of the per-microbatch budget curve over m = pp..4 pp (figure 7), and its grid neighbours.
    const int knee = knee_microbatches(b.total_work(), b.largest_work(), cluster.num_ranks, options.pp, 4);
    const int floor_m = (m_min + options.pp - 1) / options.pp * options.pp;
    std::vector<int> grid;
    for (int m : {knee - options.pp, knee, knee + options.pp}) {
      m = std::max({m, options.pp, floor_m});
      if (std::find(grid.begin(), grid.end(), m) == grid.end()) grid.push_back(m);
    }
    for (int m : grid)
      for (double edge : {1.0, 0.3}) candidates.push_back(b.slotted(m, edge));
    // Per-rank microbatch lists for a geometric grid of microbatch targets below the pipelined lower bound.
    // (the grid is scaled by the bound without its critical-sequence and shared terms, which say little about
    // microbatch sizes)
    const auto bt = pipelined_bound_terms(batch, cluster, cost, options.pp, options.vpp, /*with_cover=*/false);
    const double lb_pp = std::max({bt.single, bt.wide, bt.average, 1e-12});
    // With vpp > 1 the grid is walked a second time, scaled by the plain 1F1B terms: the interleaved bound lacks the
    // best-split term, so its grid leans towards microbatches too small for their overhead. Those plans, and those
    // that bring each rank to its own nearest multiple of pp, form a family of their own (kInterleaved).
    double lb_alt = 0.0;
    if (options.vpp > 1) {
      const auto b1 = pipelined_bound_terms(batch, cluster, cost, options.pp, 1, /*with_cover=*/false);
      lb_alt = std::max({b1.single, b1.wide, b1.average, 1e-12});
    }
    const bool fixed_counts = options.count_policy == CountPolicy::Equal || options.vpp > 1;
    constexpr int kMuGrid = 8;
    constexpr int kGiants = 3;
    constexpr std::size_t kShelfLayouts = 8;  // the best shelf layouts built into plans
    // latency targets: f x a ring's fastest time, and f x the bound's scale in seconds
    auto targets_at = [](double scale) {
      std::vector<double> t;
      for (double f : {1.0, 1.05, 1.12, 1.25}) t.push_back(f), t.push_back(-f * scale);
      return t;
    };
    // Extra targets near the whole bound, whose critical and shared terms say how far the hardest rings must widen.
    // Besides fixed fractions of it, the times of the hardest sequence's degrees in that range (breaks): each is the
    // step at which that ring may narrow by one rank. They are tried at the best extra targets' mu (below), as a
    // family of their own (kBreakpoint), so the ring sets tried do not hinge on how tight the bound is.
    std::vector<double> extra_targets, breaks;
    if (const double lb_full = std::max(bt.critical, bt.shared); lb_full > 1.02 * lb_pp) {
      for (double f : {0.9, 0.95, 1.0, 1.05, 1.1, 1.2}) extra_targets.push_back(-f * lb_full);
      const Seq& hard = b.hardest();
      for (int d = hard.dmin; d <= cluster.num_ranks; ++d)
        if (const double t = b.time1(hard, d); t >= 0.9 * lb_full && t <= 1.2 * lb_full) breaks.push_back(-t);
    }
    struct Trial {
      double score;
      Builder::Pipe spec;
    };
    std::vector<Trial> trials;
    // The best few plans that meet the count policy (by score, ties by arrival) go on to the slot-order polish.
    // Each family of candidates has polish places of its own, so no extra family pushes out the plain plans or another.
    enum Family : std::size_t {
      kPlain,
      kProfileLead,
      kIsolated,
      kExtraTarget,
      kBreakpoint,
      kTiled,
      kInterleaved,
      kShelves,
      kShelfLeads,
      kShelfDrops,
      kShelfDropLeads,
      kFamilies
    };
    constexpr std::size_t kPlaces[kFamilies] = {3, 2, 1, 1, 1, 1, 2, 4, 2, 4, 2};
    std::vector<std::vector<std::pair<double, Plan>>> pools(kFamilies);
    auto keep = [&](Plan p, double t, Family family) {
      if (!std::isfinite(t) || !counts_ok(p, cluster.num_ranks, options)) return;
      auto& pool = pools[family];
      const std::size_t room = kPlaces[family];
      if (pool.size() == room && t >= pool.back().first) return;
      auto at = std::upper_bound(pool.begin(), pool.end(), t,
                                 [](double x, const std::pair<double, Plan>& e) { return x < e.first; });
      pool.insert(at, {t, std::move(p)});
      if (pool.size() > room) pool.pop_back();
    };
    // target_family: kPlain, or the family of the extra target that spec comes from
    auto add = [&](const Builder::Pipe& spec, Family target_family = kPlain, bool alt = false) -> double {
      const Family family = alt                       ? kInterleaved
                            : spec.tile               ? kTiled
                            : target_family != kPlain ? target_family
                            : spec.isolate            ? kIsolated
                            : spec.lead_frac < 0      ? kProfileLead
                                                      : kPlain;
      Plan p = b.pipelined(spec, options.pp);
      if (fixed_counts) {
        const int step = options.vpp > 1 ? options.pp : 1;
        std::vector<int> n = p.microbatch_counts(cluster.num_ranks);
        std::sort(n.begin(), n.end());
        std::set<int> counts;
        for (int t : {n[n.size() / 2], n.back()}) counts.insert((t + step - 1) / step * step);
        // interleaving with variable counts: also each rank to its own nearest multiple of pp
        if (options.vpp > 1 && options.count_policy == CountPolicy::Variable) counts.insert(-options.pp);
        for (int t : counts) {
          Builder::Pipe counted = spec;
          counted.count = t;
          Plan q = b.pipelined(counted, options.pp);
          if (counts_ok(q, cluster.num_ranks, options)) {
            const double tq = score(q, batch, cluster, cost, options);
            keep(std::move(q), tq, t < 0 ? kInterleaved : family);
          }
        }
      }
      const double t = score(p, batch, cluster, cost, options);
      if (spec.order == 0 && spec.lead == 0 && family == kPlain) trials.push_back({t, spec});
      keep(std::move(p), t, family);
      return t;
    };
    std::vector<std::pair<double, double>> extra_trials;  // (score, mu) of the extra targets' untiled builds
    // the rings (sequence, degree) that pipelined(target, mu) builds: all a build's target changes
    auto ring_set = [&](double target, double mu, bool tile) {
      std::vector<std::size_t> shorts;
      std::vector<std::pair<std::size_t, int>> sig;
      for (const auto& r : b.pipelined_rings(target, mu, shorts, tile)) sig.push_back({r.seq, r.d});
      return sig;
    };
    // Targets only change the degrees of rings that cannot reach mu: each distinct ring set is built once, with
    // rings placed by estimate and with ranks of fewer rings first (align).
    for (int k = 0; k < (lb_alt > 0 ? 2 : 1) * kMuGrid; ++k) {
      const bool alt = k >= kMuGrid;  // the second walk under vpp > 1
      const double scale = alt ? lb_alt : lb_pp;
      const double mu = scale * std::pow(0.03, static_cast<double>(k % kMuGrid) / (kMuGrid - 1));
      const std::vector<double> targets = targets_at(scale);
      std::set<std::vector<std::pair<std::size_t, int>>> seen[2];
      for (std::size_t i = 0; i < targets.size() + extra_targets.size(); ++i) {
        const bool extra = i >= targets.size();
        const double target = extra ? extra_targets[i - targets.size()] : targets[i];
        for (bool tile : {false, true}) {
          if (!seen[tile ? 1 : 0].insert(ring_set(target, mu, tile)).second)
            continue;  // tiled sets apart, so they take no plain build
          for (bool align : {false, true}) {
            const double t =
                add({.target = target, .mu = mu, .align = align, .tile = tile}, extra ? kExtraTarget : kPlain, alt);
            if (extra && !tile) extra_trials.push_back({t, mu});
          }
        }
      }
    }
    // the breaks at the mu of the best two extra-target builds (untiled: a break moves one ring by one rank)
    std::stable_sort(extra_trials.begin(), extra_trials.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    std::vector<double> break_mus;
    for (const auto& [t, mu] : extra_trials)
      if (break_mus.size() < 2 && std::find(break_mus.begin(), break_mus.end(), mu) == break_mus.end())
        break_mus.push_back(mu);
    for (double mu : break_mus) {
      std::set<std::vector<std::pair<std::size_t, int>>> seen;
      for (double target : breaks) {
        if (!seen.insert(ring_set(target, mu, false)).second) continue;
        for (bool align : {false, true}) add({.target = target, .mu = mu, .align = align}, kBreakpoint);
      }
    }
    // refine mu between the best grid point's neighbours (a third and two thirds of a grid step either way)
    if (!trials.empty()) {
      const Trial best = *std::min_element(trials.begin(), trials.end(),
                                           [](const Trial& x, const Trial& y) { return x.score < y.score; });
      const double step = std::pow(0.03, 1.0 / (kMuGrid - 1));
      for (double f : {-2.0 / 3, -1.0 / 3, 1.0 / 3, 2.0 / 3}) {
        Builder::Pipe spec = best.spec;
        spec.mu *= std::pow(step, f);
        add(spec);
      }
    }
    // the best few again with lead microbatches and other orders
    std::stable_sort(trials.begin(), trials.end(), [](const Trial& x, const Trial& y) { return x.score < y.score; });
    for (std::size_t i = 0; i < std::min<std::size_t>(trials.size(), 4); ++i) {
      const Builder::Pipe& base = trials[i].spec;
      auto with = [&](int order, int lead, double frac) {
        Builder::Pipe spec = base;
        spec.order = order, spec.lead = lead, spec.lead_frac = frac;
        return spec;
      };
      for (int order : {0, 1})
        for (int lead : {1, 2})
          for (double frac : {0.3, 0.6, 1.0}) add(with(order, lead, frac));
      add(with(3, 0, 0.0));
      for (int order : {0, 1})
        for (double ratio : {0.5, 0.75}) add(with(order, options.pp - 1, -ratio));
      Builder::Pipe isolated = base;
      isolated.isolate = true;
      add(isolated);
    }
    // Shelves (pipelined_shelves): giants side by side in shelves that every rank runs in turn, the other sequences
    // packed as in the best plain build (its target, and its mu halved, kept or doubled), with the rank's own
    // microbatches heaviest first or in pyramid order, or a profile lead before the first shelf (kShelves); or one
    // lead microbatch of 0.6 or 0.3 of the first shelf's time (kShelfLeads, a family of their own: they score well
    // before the slot-order polish but gain less from it, so they must not take the others' polish places). The
    // same for layouts of all giants but the two smallest, which the ring picker then places (kShelfDrops,
    // kShelfDropLeads).
    if (options.vpp <= 1 && !trials.empty()) {
      const Builder::Pipe base = trials.front().spec;  // trials are sorted: the best plain build
      for (std::size_t drop : {0, 2}) {
        const auto layouts = b.pipelined_shelves(options.pp, kShelfLayouts, drop);
        for (const auto& rings : layouts)
          for (double f : {0.5, 1.0, 2.0})
            for (int variant = 0; variant < 5; ++variant) {
              Builder::Pipe spec{.target = base.target, .mu = base.mu * f, .fixed = &rings};
              if (variant == 1) spec.order = 1;
              if (variant == 2) spec.lead = options.pp - 1, spec.lead_frac = -0.5;
              if (variant == 3) spec.lead = 1, spec.lead_frac = 0.6;
              if (variant == 4) spec.lead = 1, spec.lead_frac = 0.3;
              const bool lead = variant >= 3;
              add(spec, drop > 0 ? (lead ? kShelfDropLeads : kShelfDrops) : lead ? kShelfLeads : kShelves);
            }
      }
    }
    for (auto& pool : pools)
      for (auto& [t, p] : pool) candidates.push_back(reorder_slots(std::move(p), t, batch, cluster, cost, options));
    // Units: rings of one width per node-aligned unit, microbatches packed towards the best split (units.hpp);
    // giants on blocks of their own only under plain 1F1B (a lone giant's count of 1 cannot interleave).
    {
      const double full = std::max({lb_pp, bt.critical, bt.shared});
      for (int w = 1; w <= cluster.ranks_per_node; ++w)
        for (int giants = 0; giants <= (options.vpp > 1 ? 0 : kGiants); ++giants)
          if (Plan p = profile_units(batch, cluster, cost, w, options.pp, options.count_policy == CountPolicy::Equal,
                                     giants, full, options.vpp);
              !p.microbatches.empty())
            candidates.push_back(std::move(p));
    }
  }
  for (const auto& s : strategies()) {
    if (std::string(s.name) == "dynacp") continue;
    try {
      candidates.push_back(s.fn(batch, cluster, cost, options));
    } catch (const Error&) {  // an anchor that cannot plan this batch (megatron, when its microbatches cannot be
                              // split to a multiple of pp under vpp > 1); bad input (InvalidArgument) still raises
    }
  }
  // The fastest plan that meets the count policy and that the simulator accepts. When none does (few sequences per
  // rank), whole-pool slots: every rank runs every slot, and one group per slot cannot deadlock.
  if (options.pp > 1)
    std::erase_if(candidates, [&](const Plan& p) { return !counts_ok(p, cluster.num_ranks, options); });
  if (auto best = best_of(std::move(candidates), batch, cluster, cost, options)) {
    if (options.pp <= 1) return local_search(std::move(*best), batch, cluster, cost, options);
    double t = score(*best, batch, cluster, cost, options);
    Plan polished = reorder_classes(std::move(*best), &t, batch, cluster, cost, options);
    return local_search(reorder_rings(std::move(polished), t, batch, cluster, cost, options), batch, cluster, cost,
                        options);
  }
  if (options.pp <= 1) throw Error("dynacp: no candidate plan could be scored (a bug)");
  if (Plan p = pool_slots(batch, cluster, cost, options.vpp > 1 ? options.pp : 1); !p.microbatches.empty()) return p;
  invalid("dynacp: no plan meets the count policy (", batch.size(), " sequences on ", cluster.num_ranks,
          " ranks, pp = ", options.pp, ", vpp = ", options.vpp,
          "): interleaving needs every rank's microbatch count divisible by pp and equal counts one count for all; "
          "whole-pool slots need at least pp sequences under vpp > 1, and their tokens must fit");
}

}  // namespace dynacp::solve
