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
// refined around the best. The other strategies' plans are candidates too, so dynacp is never worse.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/evaluate.hpp"
#include "dynacp/solve/microbatch.hpp"
#include "dynacp/solve/placement.hpp"
#include "dynacp/solve/strategies.hpp"
#include "dynacp/solve/timeline.hpp"

namespace dynacp::solve {
namespace {

struct Seq {
  std::int64_t id;
  std::int64_t len;
  double eta;
  double work;  // eta*a*s^2 + b*s
  int dmin;
  double t1 = 0.0;  // T(s, 1)
  // T(s, d) on the pieces [lo[0], rpn] (ring inside a node) and [lo[1], P] (across nodes): arg[k] is the
  // minimiser of piece k (CostModel::piece_minima; 0 when the piece is empty).
  int lo[2] = {0, 0}, arg[2] = {0, 0};
};

struct Bin {                      // one group of short sequences on one rank
  std::vector<std::size_t> seqs;  // indices into the Seq array
  std::int64_t tokens = 0;
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

class Builder {
 public:
  Builder(const Batch& b, const Cluster& c, const CostModel& m) : batch_(b), cluster_(c), cost_(m) {
    cap_ = cost_.token_capacity(cluster_);
    for (std::size_t i = 0; i < b.size(); ++i) {
      const double eta = cost_.eta(b.mask(i));
      Seq q{static_cast<std::int64_t>(i), b.lengths[i], eta, cost_.work(b.lengths[i], b.mask(i)),
            cost_.min_degree(b.lengths[i], cluster_)};
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

  /// Largest single-rank time among sequences that fit one rank, and the time of the hardest ring sequence.
  double upper_tau() const {
    double t = 0;
    for (const auto& s : seqs_) t = std::max(t, time1(s, s.dmin));
    return t;
  }

  struct Ring {
    std::size_t seq;
    int d;     // the degree that reaches tau (or the fastest)
    double t;  // T(s, d)
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
        if (bins[static_cast<std::size_t>(it.second)].tokens + q.len <= cap_) {
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
      b.seqs.push_back(i), b.tokens += q.len, b.work += q.work;
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
      Bin all = std::move(bins[static_cast<std::size_t>(heavy)]);
      Bin a, b;
      for (std::size_t i : all.seqs) {  // already longest-work first: two-way LPT
        Bin& to = a.work <= b.work ? a : b;
        to.seqs.push_back(i), to.tokens += seqs_[i].len, to.work += seqs_[i].work;
      }
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
      const double len = static_cast<double>(seqs_[i].len);
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

  /// Builds the plan for target tau; returns its makespan and, if `out` is given, the plan.
  /// Ring placement orders tried: largest area (T d) first, longest first, widest first.
  static constexpr int kRingOrders = 3;
  /// Pools up to this many nodes get the full search for rings wider than a node (neighbour degrees, orders).
  static constexpr int kWideNodes = 128;

  double build(double tau, int local_search_rounds, Plan* out, int ring_order = 0) const {
    const int P = cluster_.num_ranks;
    const int rpn = cluster_.ranks_per_node;
    // 1. ring sequences
    std::vector<std::size_t> shorts;
    std::vector<Ring> rings;
    classify(order_, tau, ring_order, shorts, rings);
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
      const int span = ring.d <= rpn || P / rpn <= kWideNodes ? 2 : 0;
      for (int d = std::max(q.dmin, ring.d - span); d <= std::min(P, ring.d + span); ++d) {
        auto cand = picker->pick(d, scratch.free());
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
        if (need > g.room || g.bin.tokens + s.len > cap_) continue;
        const std::size_t gi = it->second;
        by_room.erase(it);
        g.bin.seqs.push_back(i), g.bin.tokens += s.len, g.bin.work += s.work;
        g.room -= need;
        by_room.insert({g.room, gi});
        gapped = true;
        break;
      }
      if (gapped) continue;
      const int r = heap.top().second;
      heap.pop();
      auto& rb = bins[static_cast<std::size_t>(r)];
      if (rb.empty() || rb.back().tokens + s.len > cap_) rb.emplace_back();
      rb.back().seqs.push_back(i);
      rb.back().tokens += s.len;
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
          const bool fits = !lb.empty() && lb.back().tokens + s.len <= cap_;
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
              if (hb[bi].tokens - s.len + t.len > cap_ || rb.tokens - t.len + s.len > cap_) continue;
              const double delta = s.work - t.work;
              if (std::max(cur - delta, fin[static_cast<std::size_t>(lo)] + delta) < cur - 1e-12) {
                std::swap(hb[bi].seqs[k], rb.seqs[j]);
                hb[bi].tokens += t.len - s.len, hb[bi].work -= delta;
                rb.tokens += s.len - t.len, rb.work += delta;
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
    to.tokens += s.len, to.work += s.work;
    from.seqs.erase(from.seqs.begin() + static_cast<std::ptrdiff_t>(k));
    from.tokens -= s.len, from.work -= s.work;
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
  std::vector<int> n(static_cast<std::size_t>(P), 0);
  for (const auto& slot : plan.microbatches)
    for (const auto& g : slot)
      for (int r : g.ranks) ++n[static_cast<std::size_t>(r)];
  for (int c : n) {
    if (o.count_policy == CountPolicy::Equal && c != n.front()) return false;
    if (o.vpp > 1 && c % o.pp != 0) return false;
  }
  return true;
}

}  // namespace

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
  }
  for (const auto& s : strategies())
    if (std::string(s.name) != "dynacp") candidates.push_back(s.fn(batch, cluster, cost, options));
  if (options.pp > 1) {
    std::vector<Plan> ok;
    for (auto& p : candidates)
      if (counts_ok(p, cluster.num_ranks, options)) ok.push_back(std::move(p));
    if (ok.empty())
      throw InvalidArgument(
          "dynacp: no plan meets the count policy (equal counts need at least one sequence per "
          "rank and microbatch; interleaving needs counts divisible by pp)");
    candidates = std::move(ok);
  }
  return best_of(std::move(candidates), batch, cluster, cost, options);
}

}  // namespace dynacp::solve
