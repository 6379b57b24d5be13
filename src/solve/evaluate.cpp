#include "dynacp/solve/evaluate.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <utility>

#include "dynacp/solve/microbatch.hpp"
#include "dynacp/solve/placement.hpp"
#include "dynacp/solve/small_lp.hpp"

namespace dynacp::solve {

Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  Predicted p;
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  std::vector<double> free(P, 0.0);
  p.per_rank_time.assign(P, 0.0);
  for (const auto& slot : plan.microbatches) {
    for (const auto& g : slot) {
      const GroupStats st = group_stats(batch, cost, g.sequences);
      const int d = g.degree();
      double start = 0.0;
      for (int r : g.ranks) start = std::max(start, free[static_cast<std::size_t>(r)]);
      const double t = cost.time(st, d, crosses_nodes(g.ranks, cluster), cluster);
      for (int r : g.ranks) {
        free[static_cast<std::size_t>(r)] = start + t;
        p.per_rank_time[static_cast<std::size_t>(r)] += t;
      }
      p.peak_tokens_per_rank = std::max(p.peak_tokens_per_rank, (st.tokens + d - 1) / d);
    }
  }
  p.step_time = *std::max_element(free.begin(), free.end());
  double busy = 0.0;
  for (double t : p.per_rank_time) busy += t;
  p.bubble_fraction = p.step_time > 0 ? 1.0 - busy / (p.step_time * static_cast<double>(P)) : 0.0;
  p.lower_bound = lower_bound(batch, cluster, cost);
  return p;
}

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  const auto t = lower_bound_terms(batch, cluster, cost);
  return std::max({t.average, t.single, t.wide});
}

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp,
                   bool with_cover) {
  const auto b = pipelined_bound_terms(batch, cluster, cost, pp, vpp, with_cover);
  return std::max({b.single, b.wide, b.average, b.critical, b.shared, b.cover});
}

namespace {

// Two microbatches of times a and b on one 1F1B pipeline of n stages, whatever else it runs: the chain floor
// (one_f_one_b_chain_floor) of the order that gives the smaller one (docs/cost_model.md).
double pair_floor(double a, double b, int n) {
  const double ab[2] = {a, b}, ba[2] = {b, a};
  return std::min(one_f_one_b_chain_floor(ab, n), one_f_one_b_chain_floor(ba, n));
}

// Work grouped with a sequence s* (length L) in a ring of d ranks hides in that ring's exposed communication only
// as far as it adds more attention than ring traffic: a member of length s adds a eta s^2 / d of attention and
// (d - 1) s kv / (d bw) of communication per rank, so it hides at most s / d (a eta s - (d - 1) kv / bw) - nothing
// in a wide inter-node ring unless it is very long. The members fit in the ring's memory (sum s <= d cap - L),
// so the work hidden per rank is at most (d cap - L) / d max(0, max_j a eta_j s_j - (d - 1) kv / bw), taking
// the layout (bandwidth) that hides the most. eta_j s_j is the largest over the batch but for s* itself.
class HideCap {
 public:
  HideCap(const Batch& batch, const Cluster& cluster, const CostModel& cost)
      : cluster_(cluster), cost_(cost), cap_(static_cast<double>(cost.token_capacity(cluster))) {
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const double v = cost.eta(batch.mask(i)) * static_cast<double>(batch.lengths[i]);
      if (v > top_[0])
        top_[1] = top_[0], top_[0] = v;
      else
        top_[1] = std::max(top_[1], v);
    }
  }
  // per-rank work that other members of s*'s ring of d ranks can hide (s* = len with mask)
  double operator()(std::int64_t len, Mask mask, int d) const {
    const double own = cost_.eta(mask) * static_cast<double>(len);
    return (*this)(len, d, own >= top_[0] ? top_[1] : top_[0]);  // the best other member
  }
  // the same when no other member has eta s above eta_s
  double operator()(std::int64_t len, int d, double eta_s) const {
    if (d <= 1) return 0.0;
    const double room = std::max(0.0, d * cap_ - static_cast<double>(len)) / d;
    double per_token = -1.0;
    auto layout = [&](double bw) {
      per_token = std::max(per_token, cost_.attn_coef * eta_s - (d - 1) * cost_.kv_bytes_per_token / bw);
    };
    layout(cluster_.inter_node_bandwidth);
    if (d <= cluster_.ranks_per_node) layout(cluster_.intra_node_bandwidth);
    return room * std::max(0.0, per_token);
  }

 private:
  const Cluster& cluster_;
  const CostModel& cost_;
  double cap_;
  double top_[2] = {0.0, 0.0};
};

// The fastest time of group g on d ranks: a ring of d <= ranks_per_node may still span nodes, so the faster layout.
double fastest(const CostModel& cost, const Cluster& cluster, const GroupStats& g, int d) {
  const double t = cost.time(g, d, true, cluster);
  return d <= cluster.ranks_per_node ? std::min(t, cost.time(g, d, false, cluster)) : t;
}

struct SharedTerms {
  double shared = 0.0, cover = 0.0;
};

// Least S in [lo, hi] with feasible(S), for a feasible() that grows with S and holds at hi; returns a value no
// feasible S lies below (lo when it already holds), within 1e-4 hi of the least.
double least_feasible(double lo, double hi, const std::function<bool(double)>& feasible) {
  if (feasible(lo)) return lo;
  for (int it = 0; it < 24 && hi - lo > 1e-4 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (feasible(mid) ? hi : lo) = mid;
  }
  return lo;
}

// What the work beyond the hardest k sequences leaves room for at a step S (the shared term's pricing): budget = P C(S)
// - W' (W' the other work, C(S) the most per-rank work within S; -inf when not even an empty rank finishes), and
// loss[u][d] = the least work capacity below C(S), in all, that a unit u (a mask of the cover sequences in one group)
// takes from its ranks on any degree >= d that finishes within S (infinite when none does); and C(S) itself, for the
// rank-level check.
struct OtherWork {
  double budget = 0.0, capacity = 0.0;
  std::vector<std::vector<double>> loss;
};

// Per unit u (a mask of the cover sequences in one group) and degree d, whatever the step: time[u][d] = t, its
// group's fastest time on exactly d ranks, hid[u][d] = E, the work its other co-members may hide, and load[u][d] =
// t - c - E, the work its microbatch puts on each of its ranks (t and load infinite below its least degree).
struct GiantShares {
  std::vector<std::vector<double>> time, hid, load;
};

// The cover term over the k <= kCoverUnits hardest sequences (docs/cost_model.md, "cover"; their groups' times and
// shares in `shares`, by mask). A plan puts them
// in units (a unit: one group holding one or more of them - a set partition), each on d_u ranks with time >= T_u(d)
// (T_u nonincreasing: the fastest time on at most d ranks). Units sharing a rank run in one order on all the ranks
// they share (the plan's group order is acyclic, or the forwards would deadlock) and a unit's ops are joint nodes of
// all its ranks, so along units u1 < ... < uj of that order with each two consecutive ones sharing a rank, the chain
// of one_f_one_b_chain_floor holds: step >= chain_floor(T_u1, ..., T_uj). And units that pairwise share no rank sit
// on disjoint rings: their degrees sum to <= P. So a step S needs a partition, an order pi and a share graph H with
// every path of H along pi of chain floor <= S and every independent set of H of degrees summing to <= P. Each
// unit's degree is bounded below alone (the others at their fastest times) and above by the independent sets it is
// in; each path is then checked at those upper degrees. The other work must fit too: a rank of unit u runs at most
// C(S) - loss_u of it (the critical-sequence argument, for any microbatch, whatever else the rank runs), so the ranks
// of an independent set lose the sum of their losses. A unit of several sequences is priced by its group's time.
double cover_term(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other, double from,
                  const ChainRoom& fluid_room, const GiantShares& shares) {
  const int P = cluster.num_ranks;
  if (k < 2) return 0.0;
  constexpr long kVisits = 50000;  // share graphs tried per step S, over all partitions and orders
  // time[d] for d = 0..P: the fastest time on at most d ranks (infinite below the least degree)
  auto curve = [&](int members) {
    std::vector<double> t = shares.time[static_cast<std::size_t>(members)];
    for (int d = 1; d <= P; ++d) t[d] = std::min(t[d - 1], t[d]);
    return t;
  };
  // Set partitions of the k sequences (restricted growth strings), as unit member masks.
  std::vector<std::vector<int>> partitions;
  std::vector<int> rgs(static_cast<std::size_t>(k), 0);
  while (true) {
    const int count = *std::max_element(rgs.begin(), rgs.end()) + 1;
    std::vector<int> masks(static_cast<std::size_t>(count), 0);
    for (int i = 0; i < k; ++i) masks[rgs[i]] |= 1 << i;
    partitions.push_back(std::move(masks));
    int i = k - 1;
    for (; i > 0; --i) {
      const int top = *std::max_element(rgs.begin(), rgs.begin() + i);
      if (rgs[i] <= top) break;
    }
    if (i == 0) break;
    ++rgs[i];
    std::fill(rgs.begin() + i + 1, rgs.end(), 0);
  }
  std::vector<std::vector<double>> curves(std::size_t{1} << k);
  for (const auto& part : partitions)
    for (int m : part)
      if (curves[m].empty()) curves[m] = curve(m);
  auto least = [&](const std::vector<double>& t, double S) {  // least d with t[d] <= S, or P + 1
    const auto it = std::partition_point(t.begin(), t.end(), [&](double x) { return x > S; });
    return static_cast<int>(it - t.begin());
  };
  // S-free structure per unit count n: for each order pi and path (a unit mask of >= 2, ordered by pi), the edges
  // it needs (edge ids of its consecutive units) and the index of its ordered unit list (shared across orders).
  struct Shape {
    std::vector<int> edge;                  // [a * n + b] -> edge id
    std::vector<std::vector<int>> need;     // [pi][path] -> edge mask (0: not a path)
    std::vector<std::vector<int>> key;      // [pi][path] -> index of the ordered path
    std::vector<std::vector<int>> ordered;  // [key] -> units in order
    std::vector<int> subsets;               // unit masks of >= 2 units, fewest first
  };
  auto make_shape = [](int n) {
    Shape sh;
    sh.edge.assign(static_cast<std::size_t>(n * n), -1);
    for (int a = 0, e = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) sh.edge[a * n + b] = sh.edge[b * n + a] = e++;
    const int sets = 1 << n;
    for (int c = 2; c <= n; ++c)
      for (int I = 1; I < sets; ++I)
        if (std::popcount(static_cast<unsigned>(I)) == c) sh.subsets.push_back(I);
    std::vector<int> pi(static_cast<std::size_t>(n));
    std::iota(pi.begin(), pi.end(), 0);
    std::map<std::vector<int>, int> keys;
    do {
      std::vector<int> need(static_cast<std::size_t>(sets), 0), key(static_cast<std::size_t>(sets), -1);
      for (int p : sh.subsets) {
        std::vector<int> order;
        for (int u : pi)
          if (p >> u & 1) order.push_back(u);
        for (std::size_t j = 1; j < order.size(); ++j) need[p] |= 1 << sh.edge[order[j - 1] * n + order[j]];
        const auto [it, added] = keys.emplace(order, static_cast<int>(sh.ordered.size()));
        if (added) sh.ordered.push_back(order);
        key[p] = it->second;
      }
      sh.need.push_back(std::move(need));
      sh.key.push_back(std::move(key));
    } while (std::next_permutation(pi.begin(), pi.end()));
    return sh;
  };
  std::vector<Shape> shapes;
  for (int n = 1; n <= k; ++n) shapes.push_back(make_shape(n));
  // Whether some share graph H works for one partition and order: a search that starts from no edges and, while some
  // independent set is too wide for the pool, adds one of its pairs. Any H that works contains the current one and
  // an edge inside that set (its degrees are no lower, so the set would still not fit), so the search misses none.
  // Rank by rank: a rank holding the units Q (a clique of H) runs their microbatches in the order pi, so the other
  // work X on it obeys X - sum E <= ChainRoom(their times, S) (what fits beside them by the chain floor; work in a
  // giant's own group hides at most its E) and X <= C(S) - sum (t - c - E): the rank loses C(S) - room of the
  // capacity the other work needs. A giant u on
  // d_u ranks in [deg_u, upper_u] (its rings' bounds) has some ranks to itself and shares the others, so the pool
  // must hold, within P ranks, every unit's d_u ranks at a total loss <= the budget. An LP relaxes it: the degree
  // range is cut into ranges at equal steps of the unit's time, and each range into pieces [d1, d2] (d_u >= d1
  // ranks, at most d2 of them alone, each losing no less than at the piece's best degree), a convex mix of pieces
  // per giant, and ranks shared by several units priced at their best times (coarse). Where that fits, a fine LP
  // prices each clique at one range per member and counts each range's ranks apart (a ring has one degree); a unit of
  // several sequences keeps its whole degree range. Where the LP fails, any H that works shares more, so the search
  // adds each pair that can chain within S at its best times.
  constexpr int kRanges = 8;                // degree ranges per giant, for the cliques of the fine LP
  constexpr int kPieces = 3;                // pieces per range, for the ranks a giant holds alone
  constexpr long kFits = 300;               // distinct rank LPs of each kind solved per step S
  constexpr std::size_t kFineKinds = 2048;  // the most clique kinds of a fine LP
  struct Range {                            // a giant's degree lies in [d1, d2]
    int unit, d1, d2;
  };
  std::vector<Range> ranges;
  struct Piece {  // a piece [d1, d2] of range `range`: ranks the giant holds alone lose `loss` each
    int unit, d1, d2, range;
    double loss;
  };
  std::vector<Piece> pieces;
  struct Kind {  // ranks that hold the units of Q: one piece alone (piece >= 0), or a clique of H with each single
                 // sequence priced at range ver[x] (fine) or at its whole degree range (coarse, -1)
    int Q;
    std::array<int, 8> ver;
    double loss;
    int piece;
  };
  std::vector<Kind> kinds;
  std::vector<double> lp_a, lp_b, lp_c, chain;
  std::map<std::vector<int>, double> rooms;      // per step S: (unit, from, to) per unit in order -> room
  std::map<std::vector<double>, double> fluids;  // per step S: the times of a chain -> the fluid room beside it
  std::map<std::vector<double>, bool> answers;   // per step S: the LP's data -> fits
  std::map<std::vector<int>, bool> shaped;       // per step S: units, degree ranges and cliques -> fits
  long solved = 0, solved_fine = 0;              // coarse and fine LPs solved at this S
  // Work caps over the whole term (every step S), so that no batch takes long: LP tableau cells (rows x (rows +
  // columns), summed over the LPs solved) and share graphs tried. Past either, every check is granted (a relaxation,
  // still a bound). The 12 wlbllm, github and longcontext benchmark batches stay below both (at most 1.9e8 cells,
  // github 1, and 143,000 share graphs, longcontext 0).
  constexpr double kCells = 2e8;
  constexpr long kAllVisits = 400000;
  double cells = 0.0;
  long all_visits = 0;
  std::vector<int> lone_order[8];  // {x}: a lone unit's order
  for (int x = 0; x < 8; ++x) lone_order[x] = {x};
  int upper[8] = {};
  auto ranks_fit = [&](int n, const std::vector<int>& part, const std::vector<int>& deg_of, const Shape& sh,
                       const std::vector<int>& key, const int* nbr, double S, const OtherWork& work) {
    const double C = work.capacity;
    // the room on a rank holding the units of `order` at degrees in [from[x], to[x]]
    auto room = [&](const std::vector<int>& order, const int* from, const int* to) {
      std::vector<int> id;
      for (int x : order) id.insert(id.end(), {part[x], from[x], to[x]});
      if (const auto it = rooms.find(id); it != rooms.end()) return it->second;
      chain.clear();
      double hidden = 0.0, load = 0.0;
      for (int x : order) {
        const auto m = static_cast<std::size_t>(part[x]);
        chain.push_back(curves[m][to[x]]);
        double E = 0.0, l = std::numeric_limits<double>::infinity();
        for (int d = from[x]; d <= to[x]; ++d) E = std::max(E, shares.hid[m][d]), l = std::min(l, shares.load[m][d]);
        hidden += E, load += l;
      }
      double fluid = 0.0;
      if (!chain.empty()) {  // the room beside a chain depends on its times alone: many ranges share them
        const auto [it, fresh] = fluids.try_emplace(chain, 0.0);
        if (fresh) it->second = fluid_room(chain, S);
        fluid = it->second;
      }
      const double r = chain.empty() ? C : fluid < 0.0 ? -1.0 : std::min(fluid + hidden, C - load);
      rooms.emplace(std::move(id), r);
      return r;
    };
    // The answer follows from the units, their degree ranges and the cliques of H in the order pi: a repeat (another
    // share graph with the same cliques) is answered at once.
    std::vector<int> shape_id(part.begin(), part.end());
    shape_id.push_back(-1);
    for (int x = 0; x < n; ++x) shape_id.insert(shape_id.end(), {deg_of[x], upper[x]});
    std::vector<std::pair<int, const std::vector<int>*>> cliques;  // (Q, its units in the order pi)
    for (int Q = 1; Q < (1 << n); ++Q) {
      bool clique = true;
      for (int x = 0; x < n && clique; ++x) clique = !(Q >> x & 1) || (Q & ~(nbr[x] | 1 << x)) == 0;
      const bool lone = std::popcount(static_cast<unsigned>(Q)) == 1;
      if (!clique ||
          (lone && std::popcount(static_cast<unsigned>(part[std::countr_zero(static_cast<unsigned>(Q))])) == 1))
        continue;
      cliques.push_back({Q, lone ? &lone_order[std::countr_zero(static_cast<unsigned>(Q))] : &sh.ordered[key[Q]]});
      shape_id.push_back(-2);
      shape_id.insert(shape_id.end(), cliques.back().second->begin(), cliques.back().second->end());
    }
    if (const auto it = shaped.find(shape_id); it != shaped.end()) return it->second;
    const auto answer = [&](bool fit) { return shaped[shape_id] = fit; };
    ranges.clear(), pieces.clear();
    std::vector<int> of[8];  // the ranges of each single-sequence unit
    for (int x = 0; x < n; ++x) {
      if (std::popcount(static_cast<unsigned>(part[x])) != 1) continue;
      const int span = upper[x] - deg_of[x] + 1, cuts = std::min(kRanges, span);
      // range bounds at equal steps of the unit's time (it falls fastest near the least degree)
      const auto& tc = curves[part[x]];
      std::vector<int> bound{deg_of[x]};
      for (int j = 1; j < cuts; ++j) {
        const double goal = tc[deg_of[x]] - (tc[deg_of[x]] - tc[upper[x]]) * j / cuts;
        int d = bound.back() + 1;
        while (d <= upper[x] && tc[d] > goal) ++d;
        if (d <= upper[x]) bound.push_back(d);
      }
      bound.push_back(upper[x] + 1);
      for (std::size_t j = 0; j + 1 < bound.size(); ++j) {
        const int d1 = bound[j], len = bound[j + 1] - d1;
        const int range = static_cast<int>(ranges.size()), parts = std::min(kPieces, len);
        const std::size_t before = pieces.size();
        for (int q = 0; q < parts; ++q) {
          int from[8], to[8];
          from[x] = d1 + len * q / parts, to[x] = d1 + len * (q + 1) / parts - 1;
          const std::vector<int> alone{x};
          if (const double r = room(alone, from, to); r >= 0.0) pieces.push_back({x, from[x], to[x], range, C - r});
        }
        if (pieces.size() > before) of[x].push_back(range), ranges.push_back({x, d1, d1 + len - 1});
      }
      if (of[x].empty()) return answer(false);
    }
    // A primal point first: every unit on ranks of its own, each giant at its cheapest piece's least count (no
    // shared ranks); if that fits, so does the LP.
    {
      double ranks = 0.0, loss = 0.0;
      double least[8], d[8];
      std::fill(least, least + 8, std::numeric_limits<double>::infinity());
      for (const Piece& q : pieces)
        if (q.d1 * q.loss < least[q.unit]) least[q.unit] = q.d1 * q.loss, d[q.unit] = q.d1;
      bool ok = true;
      for (int x = 0; x < n && ok; ++x) {
        if (std::popcount(static_cast<unsigned>(part[x])) != 1) {  // a unit of several: deg ranks at its range's loss
          int from[8], to[8];
          from[x] = deg_of[x], to[x] = upper[x];
          const double r = room(lone_order[x], from, to);
          ranks += deg_of[x], loss += deg_of[x] * (C - r), ok = r >= 0.0;
        } else {
          ranks += d[x], loss += least[x];
        }
      }
      if (ok && ranks <= P && loss <= work.budget) return answer(true);
    }
    // The kinds of rank: each piece alone, and each clique. Coarse: a clique's units at their whole degree ranges
    // (ver -1), a unit's ranks counted together. Fine: one kind per range of each single-sequence member, priced at
    // that range, and a range's ranks counted apart (a unit's degree lies in one range).
    auto add_kinds = [&](bool fine) {  // false: more than kFineKinds cliques
      kinds.clear();
      for (std::size_t q = 0; q < pieces.size(); ++q) {
        Kind kd{1 << pieces[q].unit, {}, pieces[q].loss, static_cast<int>(q)};
        kd.ver.fill(-1);
        kinds.push_back(kd);
      }
      const std::size_t lone = kinds.size();
      for (const auto& [Q, order] : cliques) {
        int from[8], to[8];
        std::vector<int> single;  // members that are single sequences
        for (int x : *order) {
          from[x] = deg_of[x], to[x] = upper[x];
          if (std::popcount(static_cast<unsigned>(part[x])) == 1) single.push_back(x);
        }
        std::vector<std::size_t> pick(fine ? single.size() : 0, 0);
        while (true) {
          Kind kd{Q, {}, 0.0, -1};
          kd.ver.fill(-1);
          for (std::size_t j = 0; j < pick.size(); ++j) {
            const int v = of[single[j]][pick[j]];
            from[single[j]] = ranges[v].d1, to[single[j]] = ranges[v].d2, kd.ver[single[j]] = v;
          }
          if (const double r = room(*order, from, to); r >= 0.0) kd.loss = C - r, kinds.push_back(kd);
          if (kinds.size() - lone > kFineKinds) return false;
          std::size_t j = 0;
          while (j < pick.size() && ++pick[j] == of[single[j]].size()) pick[j++] = 0;
          if (j == pick.size()) break;
        }
      }
      return true;
    };
    // Whether the covering LP fits the budget, through its dual: max sum_{x alone} c_x + sum_{x of several} deg_x a_x
    // - P e subject to, per kind K, sum_{x in K} (A_x - B_v) - b_q - e <= loss_K (B_v fine only, v the range x is
    // priced at; b_q for the kind of piece q alone), and per piece q of x in range v, c_x - d1 A_x + d2 (b_q + B_v)
    // <= 0, where A_x is A_v (fine) or the unit's a_x (coarse). Primal: every unit takes a convex mix of pieces, its
    // ranks number at least d1 of the mix (per range, fine), at most d2 of it hold the unit alone in piece q, and at
    // most d2 hold it in range v (fine). Repeats (another order or share graph giving the same LP) are answered at
    // once; past kFits distinct ones per step S of a kind the step is granted (a relaxation, still a bound).
    auto lp_fits = [&](bool fine, long& spent) {
      std::vector<double> id{fine ? 1.0 : 0.0, static_cast<double>(n)};
      for (const Kind& kd : kinds) {
        id.insert(id.end(), {static_cast<double>(kd.Q), kd.loss, static_cast<double>(kd.piece)});
        for (int x = 0; x < n; ++x)
          if (kd.Q >> x & 1) id.push_back(kd.ver[static_cast<std::size_t>(x)]);
      }
      id.push_back(-1.0);
      for (const Piece& q : pieces) id.insert(id.end(), {1.0 * q.unit, 1.0 * q.d1, 1.0 * q.d2, 1.0 * q.range});
      for (int x = 0; x < n; ++x) id.push_back(std::popcount(static_cast<unsigned>(part[x])) == 1 ? -1.0 : deg_of[x]);
      if (const auto it = answers.find(id); it != answers.end()) return it->second;
      if (++spent > kFits) return true;
      // (the sizes below, ahead of the solve)
      const double size =
          static_cast<double>(kinds.size() + pieces.size()) *
          static_cast<double>(kinds.size() + 2 * pieces.size() + 2 * n + (fine ? 2 * ranges.size() : 0) + 1);
      if ((cells += size) > kCells) return true;
      // columns: a_x, c_x (per unit), b_q (per piece), A_v, B_v (per range, fine only), e
      const std::size_t N = static_cast<std::size_t>(n), F = pieces.size(), R = fine ? ranges.size() : 0;
      const std::size_t cols = 2 * N + F + 2 * R + 1, e = cols - 1, rows = kinds.size() + F;
      auto a_col = [&](int x, int v) {
        return fine ? 2 * N + F + static_cast<std::size_t>(v) : static_cast<std::size_t>(x);
      };
      auto big_b = [&](int v) { return 2 * N + F + R + static_cast<std::size_t>(v); };
      lp_a.assign(rows * cols, 0.0), lp_b.assign(rows, 0.0), lp_c.assign(cols, 0.0);
      for (int x = 0; x < n; ++x) {
        if (std::popcount(static_cast<unsigned>(part[x])) == 1)
          lp_c[N + static_cast<std::size_t>(x)] = 1.0;
        else
          lp_c[static_cast<std::size_t>(x)] = deg_of[x];
      }
      lp_c[e] = -static_cast<double>(P);
      std::size_t r = 0;
      for (const Kind& kd : kinds) {
        for (int x = 0; x < n; ++x) {
          if (!(kd.Q >> x & 1)) continue;
          const int v =
              kd.piece >= 0 ? pieces[static_cast<std::size_t>(kd.piece)].range : kd.ver[static_cast<std::size_t>(x)];
          if (fine && v >= 0)
            lp_a[r * cols + a_col(x, v)] = 1.0, lp_a[r * cols + big_b(v)] = -1.0;
          else
            lp_a[r * cols + static_cast<std::size_t>(x)] = 1.0;
        }
        if (kd.piece >= 0) lp_a[r * cols + 2 * N + static_cast<std::size_t>(kd.piece)] = -1.0;
        lp_a[r * cols + e] = -1.0, lp_b[r++] = kd.loss;
      }
      for (std::size_t f = 0; f < F; ++f) {
        const Piece& q = pieces[f];
        lp_a[r * cols + a_col(q.unit, q.range)] = -q.d1;
        lp_a[r * cols + 2 * N + f] = q.d2;
        if (fine) lp_a[r * cols + big_b(q.range)] = q.d2;
        lp_a[r * cols + N + static_cast<std::size_t>(q.unit)] = 1.0, lp_b[r++] = 0.0;
      }
      const bool fit = small_lp_max(lp_a, lp_b, lp_c) <= work.budget + 1e-9 * (1.0 + std::abs(work.budget));
      answers.emplace(std::move(id), fit);
      return fit;
    };
    add_kinds(false);  // a coarse LP has at most 5 x 24 pieces + 26 cliques
    if (!lp_fits(false, solved)) return answer(false);
    // The fine LP only when its kinds stay few (else the coarse answer stands).
    if (!add_kinds(true)) return answer(true);
    return answer(lp_fits(true, solved_fine));
  };
  auto feasible = [&](double S) {
    const OtherWork work = other(S);
    rooms.clear(), fluids.clear();
    answers.clear(), shaped.clear(), solved = solved_fine = 0;
    if (!(work.budget >= 0.0)) return false;
    std::vector<int> lo, deg, req, stack;
    int binding[8] = {};
    std::vector<int> indep;
    long visits = 0;
    std::vector<double> best, times;
    std::vector<char> seen;
    for (const auto& part : partitions) {
      const int n = static_cast<int>(part.size());
      const Shape& sh = shapes[n - 1];
      lo.assign(n, 0), best.assign(n, 0.0);
      bool ok = true;
      for (int u = 0; u < n && ok; ++u) {
        const auto& t = curves[part[u]];
        best[u] = t[P], lo[u] = least(t, S), ok = lo[u] <= P;
      }
      if (!ok) continue;
      // For each ordered path, the least degree of each member with the others at their fastest times (P + 1: the
      // path can never be that short), worked out when a share graph first holds that path.
      req.assign(sh.ordered.size() * static_cast<std::size_t>(n), -1);
      auto path_req = [&](int q) {
        if (req[q * n] >= 0) return;
        const auto& order = sh.ordered[q];
        for (int u = 0; u < n; ++u) req[q * n + u] = 0;
        times.resize(order.size());
        for (std::size_t j = 0; j < order.size(); ++j) {
          for (std::size_t i = 0; i < order.size(); ++i) times[i] = best[order[i]];
          const auto& t = curves[part[order[j]]];
          int a = lo[order[j]], b = P + 1;  // least d in [a, P] with the chain <= S, else P + 1
          while (a < b) {
            const int mid = (a + b) / 2;
            times[j] = t[mid];
            if (one_f_one_b_chain_floor(times, pp) <= S)
              b = mid;
            else
              a = mid + 1;
          }
          req[q * n + order[j]] = a;
        }
      };
      const int edges = n * (n - 1) / 2;
      for (std::size_t o = 0; o < sh.need.size(); ++o) {
        const auto& need = sh.need[o];
        const auto& key = sh.key[o];
        seen.assign(std::size_t{1} << edges, 0);
        stack.assign(1, 0);
        seen[0] = 1;
        while (!stack.empty()) {
          if (++visits > kVisits || ++all_visits > kAllVisits)
            return true;  // search budget spent: granted (a relaxation, still a bound)
          const int H = stack.back();
          stack.pop_back();
          deg = lo;
          bool fine = true;
          for (int p : sh.subsets)
            if ((need[p] & H) == need[p]) {
              path_req(key[p]);
              for (int u = 0; u < n; ++u) deg[u] = std::max(deg[u], req[key[p] * n + u]), fine = fine && deg[u] <= P;
            }
          if (!fine) continue;
          // the independent sets of H (of >= 2 units)
          int nbr[8] = {};
          for (int x = 0; x < n; ++x)
            for (int y = 0; y < n; ++y)
              if (x != y && (H >> sh.edge[x * n + y] & 1)) nbr[x] |= 1 << y;
          indep.clear();
          for (int I : sh.subsets) {
            bool independent = true;
            for (int x = 0; x < n && independent; ++x) independent = !((I >> x & 1) && (nbr[x] & I));
            if (independent) indep.push_back(I);
          }
          auto sum_over = [&](int I, auto&& f) {
            double sum = 0.0;
            for (int x = 0; x < n; ++x)
              if (I >> x & 1) sum += f(x);
            return sum;
          };
          // Sets that any H that works must break (put an edge inside): one too wide for the pool, or whose ranks
          // leave too little for the other work.
          int breaks[8] = {}, nbreaks = 0;
          bool grow = false;  // every H that works adds some edge to this one
          for (int I : indep)
            if (sum_over(I, [&](int x) { return static_cast<double>(deg[x]); }) > P) {
              breaks[nbreaks++] = I;
              break;
            }
          auto loss = [&](int x) {
            const auto m = static_cast<unsigned>(part[x]);
            return work.loss[m][deg[x]];
          };
          if (nbreaks == 0) {
            bool dead = false;
            for (int x = 0; x < n && !dead; ++x) dead = loss(x) > work.budget;
            if (dead) continue;
            for (int I : indep)
              if (sum_over(I, loss) > work.budget) {
                breaks[nbreaks++] = I;
                break;
              }
          }
          if (nbreaks == 0) {
            bool stuck = false;
            // Jointly: a unit in an independent set I has at most P - (the others' degrees in I) ranks, so every
            // path must also hold with its units at their fastest times on that many. Where one does not, any H
            // that works breaks one of the sets that bind its units (else those bounds could only fall).
            for (int x = 0; x < n; ++x) upper[x] = P, binding[x] = 0;
            for (int I : indep)
              for (int x = 0; x < n; ++x)
                if (I >> x & 1) {
                  const int most =
                      P - static_cast<int>(sum_over(I, [&](int y) { return y == x ? 0.0 : 1.0 * deg[y]; }));
                  if (most < upper[x]) upper[x] = most, binding[x] = I;
                }
            for (int q : sh.subsets) {
              if ((need[q] & H) != need[q]) continue;
              const auto& order = sh.ordered[key[q]];
              times.resize(order.size());
              for (std::size_t j = 0; j < order.size(); ++j) times[j] = curves[part[order[j]]][upper[order[j]]];
              if (one_f_one_b_chain_floor(times, pp) > S) {
                stuck = true;
                for (int x : order)
                  if (binding[x] != 0) breaks[nbreaks++] = binding[x];
                break;
              }
            }
            if (!stuck) {
              if (ranks_fit(n, part, deg, sh, key, nbr, S, work)) return true;
              grow = true;
            } else if (nbreaks == 0) {
              continue;  // nothing binds those units: no H above this one helps
            }
          }
          for (int x = 0; x < n; ++x)
            for (int y = x + 1; y < n; ++y) {
              const int e = 1 << sh.edge[x * n + y];
              bool inside = false;
              if (grow) {  // any pair whose chain can hold at their fastest times may be the sharing that helps
                const auto& pair = sh.ordered[key[(1 << x) | (1 << y)]];
                const double two[2] = {best[pair[0]], best[pair[1]]};
                inside = one_f_one_b_chain_floor(two, pp) <= S;
              }
              for (int j = 0; j < nbreaks && !inside; ++j) inside = (breaks[j] >> x & 1) && (breaks[j] >> y & 1);
              if (!inside || (H & e) || seen[H | e]) continue;
              seen[H | e] = 1;
              stack.push_back(H | e);
            }
        }
      }
    }
    return false;
  };
  // All k as single units in one order on every rank meet every bound, so the chain of their fastest times holds.
  std::vector<double> all(static_cast<std::size_t>(k));
  double lo = 0.0;
  for (int i = 0; i < k; ++i) all[i] = curves[1 << i][P], lo = std::max(lo, all[i]);
  lo = std::max(lo, from);
  return least_feasible(lo, std::max(lo, one_f_one_b_chain_floor(all, pp)), feasible);
}

// The k hardest sequences (k = 2..kGiants, by work) either meet - two of them on one rank, as two microbatches
// (pair_floor of their fastest times) or in one group (that group's fastest time) - or run on pairwise disjoint
// rings. In the disjoint case a step S needs degrees d_i with T_i(d_i) <= S and sum d_i <= P, and the other work W'
// (all but theirs) must fit: giant i's ranks take at most min(room(T_i, S) + E_i, C(S) - (T_i - c - E_i)) each
// (ChainRoom, <= 3 pp (S - T_i); E_i capped by HideCap with co-members outside the first k), the other ranks at
// most C(S) = the most work G allows
// within S. Bounding the
// capacity by each giant's best degree separately (a relaxation, so still a bound), S is infeasible when
//   P C(S) + sum_i max_{d_i} d_i (cap_i(d_i) - C(S)) < W'   or   sum_i (least feasible d_i) > P.
// Feasibility grows with S, so the least feasible S is found by bisection; the term is max_k min(meet_k, that S).
// Also returns the cover term (cover_term) of the hardest kCoverUnits, priced against the same other work (0 unless
// with_cover).
SharedTerms shared_term(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, double total_work,
                        const std::function<double(double)>& G, const HideCap& hide, bool with_cover) {
  constexpr std::size_t kGiants = 8;
  const int P = cluster.num_ranks;
  const double n = pp, c = cost.group_overhead;
  const ChainRoom fluid_room(pp);
  std::vector<std::size_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::size_t{0});
  const std::size_t k = std::min(kGiants, ids.size());
  if (k < 2) return {};
  auto work = [&](std::size_t i) { return cost.work(batch.lengths[i], batch.mask(i)); };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](std::size_t x, std::size_t y) { return work(x) > work(y) || (work(x) == work(y) && x < y); });
  // member[m]: the largest eta s outside the first m giants - all a giant's co-members may be when none of the
  // first m shares its group
  auto eta_s = [&](std::size_t i) { return cost.eta(batch.mask(i)) * static_cast<double>(batch.lengths[i]); };
  std::vector<double> member(k + 1, 0.0);
  for (std::size_t j = k; j < ids.size(); ++j) member[k] = std::max(member[k], eta_s(ids[j]));
  for (std::size_t m = k; m-- > 0;) member[m] = std::max(member[m + 1], eta_s(ids[m]));
  std::vector<std::vector<double>> time(k);  // time[i][d - dmin[i]]
  std::vector<int> dmin(k);
  std::vector<double> w(k), best(k, std::numeric_limits<double>::infinity());
  std::vector<GroupStats> stats(k);
  for (std::size_t i = 0; i < k; ++i) {
    stats[i].add(batch.lengths[ids[i]], cost.eta(batch.mask(ids[i])));
    dmin[i] = cost.min_degree(batch.lengths[ids[i]], cluster);
    w[i] = work(ids[i]);
    if (dmin[i] > P) return {};  // plan() rejects the batch
    for (int d = dmin[i]; d <= P; ++d)
      time[i].push_back(fastest(cost, cluster, stats[i], d)), best[i] = std::min(best[i], time[i].back());
  }
  // C(S) rounded up (an upper bound on the work a rank may run within S); < 0 when not even G(0) fits
  auto capacity = [&](double S) {
    if (G(0.0) > S) return -1.0;
    double lo = 0.0, hi = std::max(1e-9, S * n);
    while (G(hi) <= S) hi *= 2;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      (G(mid) <= S ? lo : hi) = mid;
    }
    return hi;
  };
  // The work giant i's co-members on d ranks (time t) may hide, with co-members outside the first m giants.
  // (of a group of `tokens` and `work` in all, alone or with several giants)
  auto hidden_in = [&](double work, std::int64_t tokens, int d, double t, std::size_t m) {
    return std::min(std::max(0.0, t - work / d - c), hide(tokens, d, member[m]));
  };
  // The most other work a rank of a microbatch of time t, whose co-members may hide E, may run within S, C = C(S):
  // the critical-sequence argument; < 0 when the microbatch alone does not fit.
  auto room_beside = [&](double t, double E, double S, double C) {
    const double fluid = fluid_room(t, S);
    return fluid < 0.0 ? -1.0 : std::min(fluid + E, C - (t - c - E));
  };
  // ... of giant i on d ranks (time t), with co-members outside the first m giants
  auto room = [&](std::size_t i, int d, double t, double S, double C, std::size_t m) {
    return room_beside(t, hidden_in(w[i], batch.lengths[ids[i]], d, t, m), S, C);
  };
  auto fits = [&](std::size_t m, double S) {  // the first m giants on disjoint rings, everything done by S
    const double C = capacity(S);
    if (C < 0) return false;
    double rest = total_work, cap = P * C;
    long long used = 0;
    for (std::size_t i = 0; i < m; ++i) {
      rest -= w[i];
      int least = 0;
      double gain = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < time[i].size(); ++j) {
        const double t = time[i][j];
        const int d = dmin[i] + static_cast<int>(j);
        if (t > S) continue;
        const double r = room(i, d, t, S, C, m);
        if (r < 0) continue;
        if (least == 0) least = d;
        gain = std::max(gain, d * (r - C));
      }
      if (least == 0) return false;
      used += least, cap += gain;
    }
    return used <= P && cap >= rest;
  };
  double out = 0.0, meet = std::numeric_limits<double>::infinity();
  for (std::size_t m = 2; m <= k; ++m) {
    const std::size_t j = m - 1;
    for (std::size_t i = 0; i < j; ++i) {
      meet = std::min(meet, pair_floor(best[i], best[j], pp));
      GroupStats both = stats[i];
      both.add(batch.lengths[ids[j]], cost.eta(batch.mask(ids[j])));
      for (int d = cost.min_degree(both.tokens, cluster); d <= P; ++d)
        meet = std::min(meet, fastest(cost, cluster, both, d));
    }
    if (meet <= out) break;  // meet only falls with m
    double lo = 0.0;
    for (std::size_t i = 0; i < m; ++i) lo = std::max(lo, best[i]);
    double disjoint = lo;
    if (!fits(m, lo)) {
      const double hi0 = std::max(meet, lo);
      double hi = hi0;
      if (fits(m, hi)) {
        for (int it = 0; it < 50; ++it) {
          const double mid = 0.5 * (lo + hi);
          (fits(m, mid) ? hi : lo) = mid;
        }
        disjoint = lo;  // no S <= lo fits (fits grows with S), so the least that does lies above it
      } else {
        disjoint = hi0;  // nothing up to meet fits, so min(meet, disjoint) = meet
      }
    }
    out = std::max(out, std::min(meet, disjoint));
  }
  constexpr int kCoverUnits = 5;  // 6 raises longcontext's bounds by under 1 % at 10x the time
  const std::size_t units = std::min<std::size_t>(k, kCoverUnits);
  // Every unit (a group holding some of the cover sequences): its time on exactly d ranks, and what its other
  // co-members (outside the cover sequences) may hide in it - the critical-sequence argument holds for any
  // microbatch, and HideCap for the group's tokens in all.
  const std::size_t masks = std::size_t{1} << units;
  const double inf = std::numeric_limits<double>::infinity();
  GiantShares shares;
  std::vector<int> unit_dmin(masks, P + 1);
  shares.time.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, inf));
  shares.hid.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, 0.0));
  shares.load.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, inf));
  for (std::size_t u = 1; u < masks; ++u) {
    GroupStats g;
    double work_u = 0.0;
    for (std::size_t i = 0; i < units; ++i)
      if (u >> i & 1) g.add(batch.lengths[ids[i]], cost.eta(batch.mask(ids[i]))), work_u += w[i];
    unit_dmin[u] = std::max(1, cost.min_degree(g.tokens, cluster));
    for (int d = unit_dmin[u]; d <= P; ++d) {
      const double t = std::popcount(u) == 1 ? time[std::countr_zero(u)][d - dmin[std::countr_zero(u)]]
                                             : fastest(cost, cluster, g, d);
      const double E = hidden_in(work_u, g.tokens, d, t, units);
      shares.time[u][d] = t, shares.hid[u][d] = E, shares.load[u][d] = t - c - E;
    }
  }
  auto other = [&](double S) {  // as in fits(): each giant's ranks lose C(S) - room of the pool
    OtherWork o;
    const double C = capacity(S);
    if (C < 0) {
      o.budget = -std::numeric_limits<double>::infinity();
      return o;
    }
    double rest = total_work;
    o.capacity = C;
    for (std::size_t i = 0; i < units; ++i) rest -= w[i];
    o.loss.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 2, inf));
    for (std::size_t u = 1; u < masks; ++u)
      for (int d = P; d >= 0; --d) {
        double l = o.loss[u][d + 1];
        if (d >= unit_dmin[u] && shares.time[u][d] <= S)
          if (const double r = room_beside(shares.time[u][d], shares.hid[u][d], S, C); r >= 0)
            l = std::min(l, d * (C - r));
        o.loss[u][d] = l;
      }
    o.budget = P * C - rest;
    return o;
  };
  if (!with_cover) return {out, 0.0};
  const double cover = cover_term(cluster, pp, static_cast<int>(units), other, out, fluid_room, shares);
  return {out, cover};
}

}  // namespace

PipelinedBoundTerms pipelined_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                          int vpp, bool with_cover) {
  const auto t = lower_bound_terms(batch, cluster, cost);
  if (pp <= 1) return {t.single, t.wide, t.average, 0.0, 0.0, 0.0};
  // A microbatch crosses all stages forward and back, so the hardest sequence still takes its whole time.
  // Every microbatch takes t >= c + w_min / P (a group's time is at least its per-rank work plus c), and one
  // stage-chunk of it t / (3 pp vpp) forward and 2 t / (3 pp vpp) backward. On a rank whose microbatches take S
  // in all, the last stage idles until the first forward has crossed the pp - 1 stages before it, runs S / pp,
  // and after its last op (a backward) that backward still crosses pp - 1 stages: T >= (S + (pp - 1) t_min / vpp)
  // / pp. The ranks in use U have sum S >= sum work + c |U|, so T >= (sum work / P + c) / pp + (pp - 1) t_min /
  // (pp vpp). Wide sequences may overlap at different stages, so they only add their per-GPU share.
  double wmin = -1.0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const double w = cost.work(batch.lengths[i], batch.mask(i));
    wmin = wmin < 0 ? w : std::min(wmin, w);
  }
  const double P = cluster.num_ranks, n = pp, v = std::max(vpp, 1), c = cost.group_overhead;
  double average = t.average / n + (n - 1) * (c + wmin / P) / (n * v);
  double critical = 0.0, shared = 0.0, cover = 0.0;
  if (vpp <= 1 && one_f_one_b_floor(2, pp) > 1.0) {
    // Sharper for 1F1B: a rank running m microbatches of S = W_r + m c seconds in all finishes no earlier than
    // h(m, pp) S / pp (one_f_one_b_floor, the optimum over every split of S). G(W) = min_m h(m, pp) (W + m c) / pp
    // grows with W, and some rank has W_r >= sum work / P. Beyond the table (m > 64) the bound above applies with
    // S >= W + 65 c (one_f_one_b_work_floor).
    auto G = [&](double W) { return one_f_one_b_work_floor(W, c, pp); };
    const HideCap hide(batch, cluster, cost);
    average = std::max(average, G(t.average - c));
    // The hardest sequence s* in a group of degree d: that microbatch J takes t_J >= T(s*, d), and on stage 0 of
    // each of its ranks the ops before F_J, J's round trip through all stages (t_J) and the ops after B_J form a
    // chain; of the rank's other ops only the forwards of the next pp - 1 microbatches (1/3 of their time) and
    // the backwards of the previous pp - 1 (2/3) can overlap the round trip. So a rank running other work X
    // besides J finishes after >= T(s*, d) + max(0, X - E_d) / (3 pp), where E_d, what work grouped with s* in J
    // may hide, is the smaller of the exposed communication T(s*, d) - w* / d - c and HideCap. The rank's
    // microbatches add up to >= T(s*, d) - E_d + X + m c. With X the mean other work of J's d ranks, the other
    // P - d ranks share W' - d X (W' = sum work - w*), and every rank also obeys G:
    //   T >= min_d min_X max(T(s*, d) + max(0, X - E_d) / (3 pp), G(T(s*, d) - c - E_d + X),
    //                        G((W' - d X) / (P - d))).
    // (d = P: X = W' / P.) The first two terms grow with X and the last falls, so X is found by bisection.
    for (const auto& [len, mask] : t.longest) {
      GroupStats g;
      g.add(len, cost.eta(mask));
      const double ws = cost.work(len, mask), Wp = std::max(0.0, t.average - c) * P - ws;
      double best = std::numeric_limits<double>::infinity();
      for (int d = cost.min_degree(len, cluster); d <= cluster.num_ranks; ++d) {
        const double Td = cost.time(g, d, cluster);
        if (Td >= best) continue;
        const double E = std::min(std::max(0.0, Td - ws / d - c), hide(len, mask, d));
        auto host = [&](double X) { return std::max(Td + std::max(0.0, X - E) / (3 * n), G(Td - c - E + X)); };
        if (d == cluster.num_ranks) {
          best = std::min(best, host(std::max(0.0, Wp) / P));
          continue;
        }
        auto rest = [&](double X) { return G((Wp - d * X) / (P - d)); };
        double lo = 0.0, hi = std::max(0.0, Wp) / d;
        if (rest(lo) <= host(lo)) {
          best = std::min(best, host(lo));
          continue;
        }
        for (int it = 0; it < 50; ++it) {
          const double mid = 0.5 * (lo + hi);
          (host(mid) < rest(mid) ? lo : hi) = mid;
        }
        // The crossing lies in [lo, hi]: left of it max >= rest(lo), right of it >= host(hi), inside it >=
        // max(host(lo), rest(hi)), which is the smallest of the three.
        best = std::min(best, std::max(host(lo), rest(hi)));
      }
      if (std::isfinite(best)) critical = std::max(critical, best);
    }
    const auto st = shared_term(batch, cluster, cost, pp, std::max(0.0, t.average - c) * P, G, hide, with_cover);
    shared = st.shared, cover = st.cover;
  }
  const double wide = t.wide_work > 0 ? (t.wide_work / P + c) / n : 0.0;
  return {t.single, wide, average, critical, shared, cover};
}

LowerBoundTerms lower_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  // single: the best time of the hardest sequence alone grows with length for a given mask, so only the longest
  //         sequence of each mask kind is tried.
  // wide:   sequences needing more than half the pool can never run side by side (in one group or several), and
  //         any group takes at least its compute time (a eta s^2 + b s) / d + c with d <= P.
  double work = 0.0, longest = 0.0, wide = 0.0;
  std::int64_t max_len[2] = {0, 0};
  const std::int64_t cap = cost.token_capacity(cluster);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const double w = cost.work(batch.lengths[i], batch.mask(i));
    work += w;
    if (2 * ((batch.lengths[i] + cap - 1) / cap) > cluster.num_ranks) wide += w;
    auto& m = max_len[static_cast<int>(batch.mask(i))];
    m = std::max(m, batch.lengths[i]);
  }
  for (int k = 0; k < 2; ++k) {
    if (max_len[k] == 0) continue;
    GroupStats g;
    g.add(max_len[k], cost.eta(static_cast<Mask>(k)));
    // a full scan (not best_degree's ternary search): a lower bound must hold for any shape of T(d)
    const int dmin = cost.min_degree(max_len[k], cluster);
    double best = cost.time(g, dmin, cluster);
    for (int d = dmin + 1; d <= cluster.num_ranks; ++d) best = std::min(best, cost.time(g, d, cluster));
    longest = std::max(longest, best);
  }
  LowerBoundTerms t;
  // Every rank that runs anything pays at least one group overhead c, and a group's rank-time d T >= its work +
  // c d; so with U ranks in use, step >= (sum work + c |U|) / |U| >= sum work / P + c.
  t.average = work / cluster.num_ranks + cost.group_overhead;
  t.single = longest;
  t.wide = wide > 0 ? wide / cluster.num_ranks + cost.group_overhead : 0.0;
  t.wide_work = wide;
  for (int k = 0; k < 2; ++k)
    if (max_len[k] > 0) t.longest.push_back({max_len[k], static_cast<Mask>(k)});
  return t;
}

}  // namespace dynacp::solve
