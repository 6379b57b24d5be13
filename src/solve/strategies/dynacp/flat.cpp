// pp = 1 builds for a makespan target tau (docs/strategies.md, "dynacp"):
//   1. "ring" sequences (longer than one rank holds, or slower than tau alone) get the smallest degree d with
//      T({s}, d) <= tau (their best degree if none), and are placed longest-area first on the d ranks that free
//      up earliest, inside one node when d fits in a node;
//   2. the other sequences go into the idle gaps rings leave, else longest work first to the rank that finishes
//      earliest, packed into per-rank groups of at most the token capacity (a new group pays the overhead c);
//   3. a local search moves and swaps sequences between the slowest and the fastest ranks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "builder.hpp"

namespace dynacp::solve::dyn {

/// The state of one flat build: rings placed on a scratch timeline, the gaps they leave, the per-rank bins.
struct FlatBuild {
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
  const Builder& b;
  bool forced;
  std::vector<Placed> placed;
  std::vector<Gap> gaps;
  std::vector<std::vector<Bin>> bins;
  std::vector<double> base, fin;

  // Rings are placed on a scratch timeline; the idle time a rank spends waiting for a ring's other ranks becomes a
  // gap that short sequences can fill without delaying anything.
  void place_rings(const std::vector<Ring>& rings) {
    const int P = b.cluster_.num_ranks, rpn = b.cluster_.ranks_per_node;
    const DynacpTuning& tune = b.tuning_;
    std::optional<NodePicker> picker;
    if (!rings.empty()) picker.emplace(P, rpn, b.rings_);
    TimelineBuilder scratch(b.batch_, b.cluster_, b.cost_);
    for (const auto& ring : rings) {
      // The degree that reaches tau, or a neighbour that finishes earlier on the ranks free right now.
      std::vector<int> ranks;
      double start = 0.0, finish_at = 0.0;
      const Seq& q = b.seqs_[ring.seq];
      // (On pools of more than wide_nodes nodes a window search is O(nodes), so rings wider than a node keep d.)
      const int span = forced ? 0 : ring.d <= rpn || P / rpn <= tune.wide_nodes ? tune.neighbour_degrees : 0;
      for (int d = std::max(q.dmin, ring.d - span); d <= std::min(P, ring.d + span); ++d) {
        if (d != ring.d && !b.degree_allowed(d)) continue;  // (ring sets: only their degrees)
        std::vector<int> cand;
        if (ring.at >= 0)
          for (int r = ring.at; r < ring.at + d; ++r) cand.push_back(r);
        else
          cand = picker->pick(d, scratch.free());
        double s0 = 0.0;
        for (int r : cand) s0 = std::max(s0, scratch.free()[static_cast<std::size_t>(r)]);
        const double f = s0 + b.time1(q, d);
        if (ranks.empty() || f < finish_at) ranks = std::move(cand), start = s0, finish_at = f;
      }
      for (int r : ranks) {
        const double idle = start - scratch.free()[static_cast<std::size_t>(r)];
        if (idle > b.cost_.group_overhead) gaps.push_back({r, scratch.free()[static_cast<std::size_t>(r)], idle, {}});
      }
      scratch.add(ranks, {b.seqs_[ring.seq].id});
      for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker->update(node, scratch.free());
      placed.push_back({std::move(ranks), b.seqs_[ring.seq].id, start});
    }
    base = scratch.free();
  }

  // Shorts: into the tightest gap that holds them, else longest work first onto the rank that finishes first.
  void pack_shorts(const std::vector<std::size_t>& shorts) {
    const int P = b.cluster_.num_ranks;
    std::multiset<std::pair<double, std::size_t>> by_room;
    for (std::size_t g = 0; g < gaps.size(); ++g) by_room.insert({gaps[g].room, g});
    bins.assign(static_cast<std::size_t>(P), {});
    fin = base;
    std::vector<double> closed = base;  // finish() summed up to each rank's open (last) bin, so a short costs O(1)
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
    for (int r = 0; r < P; ++r) heap.push({fin[static_cast<std::size_t>(r)], r});
    for (std::size_t k = 0; k < shorts.size(); ++k) {
      const std::size_t i = shorts[k];
      if (k + Builder::kAhead < shorts.size()) __builtin_prefetch(&b.seqs_[shorts[k + Builder::kAhead]]);
      const Seq& s = b.seqs_[i];
      bool gapped = false;
      int tries = 0;
      for (auto it = by_room.lower_bound({s.work, 0}); it != by_room.end() && tries < b.tuning_.gap_tries;
           ++it, ++tries) {
        Gap& g = gaps[it->second];
        const double need = s.work + (g.bin.seqs.empty() ? b.cost_.group_overhead : 0.0);
        if (need > g.room || g.bin.rows + s.rows1 > b.cap_) continue;
        const std::size_t gi = it->second;
        by_room.erase(it);
        b.add_to(g.bin, i);
        g.room -= need;
        by_room.insert({g.room, gi});
        gapped = true;
        break;
      }
      if (gapped) continue;
      const int r = heap.top().second;
      heap.pop();
      auto& rb = bins[static_cast<std::size_t>(r)];
      if (rb.empty() || rb.back().rows + s.rows1 > b.cap_) {
        if (!rb.empty()) closed[static_cast<std::size_t>(r)] += rb.back().work + b.cost_.group_overhead;
        rb.emplace_back();
      }
      b.add_to(rb.back(), i);
      // = finish(base[r], rb): the same additions in the same order
      fin[static_cast<std::size_t>(r)] =
          closed[static_cast<std::size_t>(r)] + (rb.back().work + b.cost_.group_overhead);
      heap.push({fin[static_cast<std::size_t>(r)], r});
    }
  }

  // Emit in planned start order (a gap group before the ring it precedes) so every group keeps its start time.
  Plan emit() const {
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
    TimelineBuilder tl(b.batch_, b.cluster_, b.cost_);
    for (const auto& e : events) {
      if (e.kind == 0)
        tl.add({gaps[e.index].rank}, b.ids_of(gaps[e.index].bin));
      else
        tl.add(placed[e.index].ranks, {placed[e.index].id});
    }
    for (int r = 0; r < b.cluster_.num_ranks; ++r)
      for (const auto& bn : bins[static_cast<std::size_t>(r)])
        if (!bn.seqs.empty()) tl.add({r}, b.ids_of(bn));
    return tl.to_plan();
  }
};

double Builder::build(double tau, int local_search_rounds, Plan* out, int ring_order,
                      const std::vector<Ring>* forced) const {
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
  FlatBuild fb{*this, forced != nullptr, {}, {}, {}, {}, {}};
  fb.place_rings(rings);
  fb.pack_shorts(shorts);
  for (int round = 0; round < local_search_rounds; ++round)
    if (!improve(fb.base, fb.bins, fb.fin)) break;
  const double makespan = *std::max_element(fb.fin.begin(), fb.fin.end());
  if (out) *out = fb.emit();
  return makespan;
}

double Builder::finish(double base, const std::vector<Bin>& rb) const {
  double t = base;
  for (const auto& b : rb)
    if (!b.seqs.empty()) t += b.work + cost_.group_overhead;
  return t;
}

// One improving move or swap of a short sequence from the slowest rank; returns false if none helps.
bool Builder::improve(const std::vector<double>& base, std::vector<std::vector<Bin>>& bins,
                      std::vector<double>& fin) const {
  const int P = static_cast<int>(fin.size());
  const int hi = static_cast<int>(std::max_element(fin.begin(), fin.end()) - fin.begin());
  const double cur = fin[static_cast<std::size_t>(hi)];
  auto& hb = bins[static_cast<std::size_t>(hi)];
  // candidate receivers: ranks by finish time, fastest first (a few)
  std::vector<int> recv(static_cast<std::size_t>(P));
  std::iota(recv.begin(), recv.end(), 0);
  const int n_recv = std::min(P, tuning_.search_receivers);
  std::partial_sort(recv.begin(), recv.begin() + n_recv, recv.end(), [&](int a, int b) {
    return fin[static_cast<std::size_t>(a)] != fin[static_cast<std::size_t>(b)]
               ? fin[static_cast<std::size_t>(a)] < fin[static_cast<std::size_t>(b)]
               : a < b;
  });
  auto refresh = [&](int r) {
    fin[static_cast<std::size_t>(r)] = finish(base[static_cast<std::size_t>(r)], bins[static_cast<std::size_t>(r)]);
  };
  // Bounded neighbourhood: at most search_items sequences of the slowest rank, each against at most search_items of
  // a receiver, so one round costs O(receivers * items^2) however many sequences a rank holds.
  const auto items = static_cast<std::size_t>(tuning_.search_items);
  std::size_t tried = 0;
  for (std::size_t bi = 0; bi < hb.size() && tried < items; ++bi) {
    for (std::size_t k = 0; k < hb[bi].seqs.size() && tried < items; ++k, ++tried) {
      const Seq& s = seqs_[hb[bi].seqs[k]];
      const double hi_after =
          fin[static_cast<std::size_t>(hi)] - s.work - (hb[bi].seqs.size() == 1 ? cost_.group_overhead : 0.0);
      for (int q = 0; q < n_recv; ++q) {
        const int lo = recv[static_cast<std::size_t>(q)];
        if (lo == hi) continue;
        auto& lb = bins[static_cast<std::size_t>(lo)];
        // move: into the receiver's last bin if it fits, else a new bin
        const bool fits = !lb.empty() && lb.back().rows + s.rows1 <= cap_;
        const double lo_after = fin[static_cast<std::size_t>(lo)] + s.work + (fits ? 0.0 : cost_.group_overhead);
        if (std::max(hi_after, lo_after) < cur - 1e-12) {
          if (!fits) lb.emplace_back();
          move_item(hb[bi], k, lb.back());
          refresh(hi), refresh(lo);
          return true;
        }
        // swap with a lighter sequence of the receiver
        std::size_t seen = 0;
        for (auto& rb : lb)
          for (std::size_t j = 0; j < rb.seqs.size() && seen < items; ++j, ++seen) {
            const Seq& t = seqs_[rb.seqs[j]];
            if (t.work >= s.work) continue;
            if (hb[bi].rows - s.rows1 + t.rows1 > cap_ || rb.rows - t.rows1 + s.rows1 > cap_) continue;
            const double delta = s.work - t.work;
            if (std::max(cur - delta, fin[static_cast<std::size_t>(lo)] + delta) < cur - 1e-12) {
              std::swap(hb[bi].seqs[k], rb.seqs[j]);
              hb[bi].rows += t.rows1 - s.rows1, hb[bi].work -= delta;
              rb.rows += s.rows1 - t.rows1, rb.work += delta;
              refresh(hi), refresh(lo);
              return true;
            }
          }
      }
    }
  }
  return false;
}

// Shelves under a ring set (PlanOptions::ring_set): each ring of a shelf takes a ring of the set on consecutive ranks
// - of an allowed degree at least its least one, widened while that costs it at most shelf_saturation x its least
// allowed rank-time - so that the shelf's slowest ring is fastest (then the fewest ranks); a dynamic program over
// the first free rank, for every order of the shelf's rings when they are few (else largest area first).
struct SetShelf {
  const Builder& b;
  const std::map<int, std::vector<int>>& starts;  // RingSet::consecutive_starts
  static constexpr std::size_t kOrders = 4;       // every order of shelves of at most this many rings

  // The least allowed degree >= dmin (dmin when none: project() then names the missing ring).
  int need(const Seq& q) const {
    const auto it = std::lower_bound(b.allowed_sizes_.begin(), b.allowed_sizes_.end(), q.dmin);
    return it == b.allowed_sizes_.end() ? q.dmin : *it;
  }
  // Lays out `members` (sequence indices, in this order, left to right with gaps allowed) on [0, P): the best
  // (slowest time, ranks used) and the degrees and first ranks; false when the set has no such layout.
  bool lay(const std::vector<std::size_t>& members, std::pair<double, int>& best, std::vector<Ring>& out) const {
    const int P = b.cluster_.num_ranks;
    const std::size_t n = members.size();
    struct Cell {
      std::pair<double, int> v{std::numeric_limits<double>::infinity(), 0};
      int d = 0;  // 0: rank `at` stays free
    };
    std::vector<Cell> f((n + 1) * static_cast<std::size_t>(P + 1));
    auto at = [&](std::size_t i, int r) -> Cell& { return f[i * static_cast<std::size_t>(P + 1) + r]; };
    for (int r = 0; r <= P; ++r) at(n, r).v = {0.0, 0};
    std::vector<std::vector<std::pair<int, double>>> cand(n);  // per member: (degree, time)
    for (std::size_t i = 0; i < n; ++i) {
      const Seq& q = b.seqs_[members[i]];
      const int d0 = need(q);
      const double limit = b.tuning_.shelf_saturation * d0 * b.time1(q, d0);
      for (const auto& [d, firsts] : starts)
        if (d >= d0 && (d == d0 || d * b.time1(q, d) <= limit)) cand[i].push_back({d, b.time1(q, d)});
    }
    for (std::size_t i = n; i-- > 0;)
      for (int r = P - 1; r >= 0; --r) {
        Cell c = at(i, r + 1);
        c.d = 0;
        for (const auto& [d, t] : cand[i]) {
          if (r + d > P || !std::binary_search(starts.at(d).begin(), starts.at(d).end(), r)) continue;
          const auto& rest = at(i + 1, r + d).v;
          const std::pair<double, int> v{std::max(t, rest.first), rest.second + d};
          if (v < c.v) c.v = v, c.d = d;
        }
        at(i, r) = c;
      }
    if (!std::isfinite(at(0, 0).v.first)) return false;
    best = at(0, 0).v;
    out.clear();
    for (std::size_t i = 0, r = 0; i < n; ++r)
      if (const int d = at(i, static_cast<int>(r)).d; d > 0) {
        out.push_back({members[i], d, b.time1(b.seqs_[members[i]], d), static_cast<int>(r)});
        r += static_cast<std::size_t>(d) - 1, ++i;
      }
    return true;
  }
  // The shelf of `wide` (largest area first): appended to `out` in that order; false when the set has no layout.
  bool shelf(const std::vector<Ring>& wide, std::vector<Ring>& out) const {
    std::vector<std::size_t> perm(wide.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::pair<double, int> best{std::numeric_limits<double>::infinity(), 0}, v;
    std::vector<Ring> chosen, laid;
    do {
      std::vector<std::size_t> members;
      for (std::size_t k : perm) members.push_back(wide[k].seq);
      if (lay(members, v, laid) && v < best) best = v, chosen = laid;
    } while (wide.size() <= kOrders && std::next_permutation(perm.begin(), perm.end()));
    if (chosen.empty()) return false;
    for (const auto& w : wide)
      for (const auto& r : chosen)
        if (r.seq == w.seq) out.push_back(r);
    return true;
  }
};

// Rings for shelf packing (pp = 1): the sequences that need a ring at `tau`, largest area first, grouped into
// shelves whose minimum degrees fit the pool together; within a shelf every ring gets a degree proportional to its
// area (at least its minimum), so the shelf's rings finish together after about sum area / P. Long sequences whose
// memory forces wide rings then run side by side instead of in staggered rounds (docs/strategies.md).
std::vector<Ring> Builder::shelves(double tau) const {
  const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
  std::vector<std::size_t> shorts;
  std::vector<Ring> rings;
  classify(order_, tau, 0, shorts, rings);
  std::vector<Ring> out, rest, wide;
  for (const auto& r : rings) (seqs_[r.seq].dmin >= rpn ? wide : rest).push_back(r);
  std::optional<std::map<int, std::vector<int>>> starts;  // under a ring set (SetShelf)
  if (rings_ != nullptr) starts = rings_->consecutive_starts();
  const SetShelf on_set{*this, starts ? *starts : std::map<int, std::vector<int>>{}};
  auto least = [&](const Ring& r) { return starts ? on_set.need(seqs_[r.seq]) : seqs_[r.seq].dmin; };
  // Only when the wide rings crowd the pool (their minimum degrees take more than half of it); otherwise the plain
  // build already runs them side by side.
  int crowd = 0;
  for (const auto& r : wide) crowd += least(r);
  if (wide.size() < 2 || 2 * crowd <= P) return {};
  for (std::size_t a = 0; a < wide.size();) {
    std::size_t z = a;
    int used = 0;
    while (z < wide.size() && used + least(wide[z]) <= P) used += least(wide[z]), ++z;
    if (z == a) used = least(wide[z]), ++z;  // cannot happen: dmin <= P (checked by plan())
    if (starts &&
        on_set.shelf({wide.begin() + static_cast<std::ptrdiff_t>(a), wide.begin() + static_cast<std::ptrdiff_t>(z)},
                     out)) {
      a = z;
      continue;
    }
    used = 0;
    for (std::size_t i = a; i < z; ++i) used += seqs_[wide[i].seq].dmin;
    std::vector<int> d;
    for (std::size_t i = a; i < z; ++i) d.push_back(seqs_[wide[i].seq].dmin);
    // The spare ranks go one at a time to the ring that takes longest, so the shelf's rings end together, while that
    // costs it at most shelf_saturation x its least rank-time (ranks left over run short sequences).
    std::priority_queue<std::pair<double, std::size_t>> slow;  // (time, n - i): ties go to the earlier ring
    for (std::size_t i = 0; i < d.size(); ++i) slow.push({time1(seqs_[wide[a + i].seq], d[i]), d.size() - i});
    while (used < P && !slow.empty()) {
      const std::size_t i = d.size() - slow.top().second;
      slow.pop();
      const Seq& q = seqs_[wide[a + i].seq];
      const double t = time1(q, d[i] + 1);
      if ((d[i] + 1) * t > tuning_.shelf_saturation * q.dmin * time1(q, q.dmin)) continue;  // saturated: drop it
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

}  // namespace dynacp::solve::dyn
