// The cover term of the pipelined lower bound (docs/cost_model.md, "cover").
//
// A plan puts the k hardest sequences in units (a unit: one group holding one or more of them - a set partition),
// each on d_u ranks with time >= T_u(d) (T_u nonincreasing: the fastest time on at most d ranks). Units sharing a
// rank run in one order on all the ranks they share (the plan's group order is acyclic, or the forwards would
// deadlock) and a unit's ops are joint nodes of all its ranks, so along units u1 < ... < uj of that order with each
// two consecutive ones sharing a rank, the chain of one_f_one_b_chain_floor holds: step >= chain_floor(T_u1, ...,
// T_uj). And units that pairwise share no rank sit on disjoint rings: their degrees sum to <= P. So a step S needs a
// partition, an order pi and a share graph H with every path of H along pi of chain floor <= S and every independent
// set of H of degrees summing to <= P. Each unit's degree is bounded below alone (the others at their fastest times)
// and above by the independent sets it is in; each path is then checked at those upper degrees. The other work must
// fit too: a rank of unit u runs at most C(S) - loss_u of it (the critical-sequence argument, for any microbatch,
// whatever else the rank runs), so the ranks of an independent set lose the sum of their losses, and a linear
// program over the kinds of rank (ranks_fit) prices the ranks each unit holds alone and those it shares. A unit of
// several sequences is priced by its group's time.
#include "dynacp/solve/bounds/cover.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

#include "dynacp/solve/blocks/partitions.hpp"
#include "dynacp/solve/search/small_lp.hpp"

namespace dynacp::solve {
namespace {

// Least S in [lo, hi] with feasible(S), for a feasible() that grows with S and holds at hi; returns a value no
// feasible S lies below (lo when it already holds), within 1e-4 hi of the least.
template <class F>
double least_feasible(double lo, double hi, F&& feasible) {
  if (feasible(lo)) return lo;
  for (int it = 0; it < 24 && hi - lo > 1e-4 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (feasible(mid) ? hi : lo) = mid;
  }
  return lo;
}

// S-free structure for n units: for each order pi and path (a unit mask of >= 2, ordered by pi), the edges it needs
// (edge ids of its consecutive units) and the index of its ordered unit list (shared across orders).
struct Shape {
  std::vector<int> edge;                  // [a * n + b] -> edge id
  std::vector<std::vector<int>> need;     // [pi][path] -> edge mask (0: not a path)
  std::vector<std::vector<int>> key;      // [pi][path] -> index of the ordered path
  std::vector<std::vector<int>> ordered;  // [key] -> units in order
  std::vector<int> subsets;               // unit masks of >= 2 units, fewest first
};

Shape make_shape(int n) {
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
}

int popcount(int mask) { return std::popcount(static_cast<unsigned>(mask)); }

// One search for the least feasible step (one object per cover_term call; not for concurrent use).
class CoverSearch {
 public:
  CoverSearch(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other,
              const ChainRoom& fluid_room, const GiantShares& shares)
      : P_(cluster.num_ranks), pp_(pp), k_(k), other_(other), fluid_room_(fluid_room), shares_(shares) {
    partitions_ = set_partitions(k);
    curves_.resize(std::size_t{1} << k);
    for (const auto& part : partitions_)
      for (int m : part)
        if (curves_[m].empty()) curves_[m] = curve(m);
    for (int n = 1; n <= k; ++n) shapes_.push_back(make_shape(n));
    for (int x = 0; x < 8; ++x) lone_order_[x] = {x};
  }

  double solve(double from) {
    // All k as single units in one order on every rank meet every bound, so the chain of their fastest times holds.
    std::vector<double> all(static_cast<std::size_t>(k_));
    double lo = 0.0;
    for (int i = 0; i < k_; ++i) all[i] = curves_[1 << i][P_], lo = std::max(lo, all[i]);
    lo = std::max(lo, from);
    return least_feasible(lo, std::max(lo, one_f_one_b_chain_floor(all, pp_)), [&](double S) { return feasible(S); });
  }

 private:
  static constexpr long kVisits = 50000;  // share graphs tried per step S, over all partitions and orders
  // The rank LP (ranks_fit): a unit's degree range is cut into up to kRanges ranges at equal steps of its time, each
  // range into up to kPieces pieces for the ranks it holds alone.
  static constexpr int kRanges = 8;                // degree ranges per giant, for the cliques of the fine LP
  static constexpr int kPieces = 3;                // pieces per range, for the ranks a giant holds alone
  static constexpr long kFits = 300;               // distinct rank LPs of each kind solved per step S
  static constexpr std::size_t kFineKinds = 2048;  // the most clique kinds of a fine LP
  // Work caps over the whole term (every step S), so that no batch takes long: LP tableau cells (rows x (rows +
  // columns), summed over the LPs solved) and share graphs tried. Past either, every check is granted (a relaxation,
  // still a bound). The 12 wlbllm, github and longcontext benchmark batches stay below both (at most 1.9e8 cells,
  // github 1, and 143,000 share graphs, longcontext 0).
  static constexpr double kCells = 2e8;
  static constexpr long kAllVisits = 400000;

  struct Range {  // a giant's degree lies in [d1, d2]
    int unit, d1, d2;
  };
  struct Piece {  // a piece [d1, d2] of range `range`: ranks the giant holds alone lose `loss` each
    int unit, d1, d2, range;
    double loss;
  };
  struct Kind {  // ranks that hold the units of Q: one piece alone (piece >= 0), or a clique of H with each single
                 // sequence priced at range ver[x] (fine) or at its whole degree range (coarse, -1)
    int Q;
    std::array<int, 8> ver;
    double loss;
    int piece;
  };
  // A share graph to price at step S: the n units of `part` at degrees [deg[x], upper_[x]], neighbours nbr[x] in H,
  // paths ordered by `key` (one order pi of shape `sh`).
  struct Candidate {
    int n;
    const std::vector<int>& part;
    const std::vector<int>& deg;
    const Shape& sh;
    const std::vector<int>& key;
    const int* nbr;
    double S;
    const OtherWork& work;
    bool single(int x) const { return popcount(part[x]) == 1; }  // a unit of one sequence
  };

  // time[d] for d = 0..P: the fastest time on at most d ranks (infinite below the least degree)
  std::vector<double> curve(int members) const {
    std::vector<double> t = shares_.time[static_cast<std::size_t>(members)];
    for (int d = 1; d <= P_; ++d) t[d] = std::min(t[d - 1], t[d]);
    return t;
  }
  static int least(const std::vector<double>& t, double S) {  // least d with t[d] <= S, or P + 1
    const auto it = std::partition_point(t.begin(), t.end(), [&](double x) { return x > S; });
    return static_cast<int>(it - t.begin());
  }
  double chain_floor(const std::vector<double>& times) const { return one_f_one_b_chain_floor(times, pp_); }

  bool feasible(double S);
  bool search(const std::vector<int>& part, double S, const OtherWork& work);
  bool ranks_fit(const Candidate& c);
  bool price(const Candidate& c);
  double room(const Candidate& c, const std::vector<int>& order, const int* from, const int* to);
  bool cut_ranges(const Candidate& c);
  bool add_kinds(const Candidate& c, bool fine);
  bool lp_fits(const Candidate& c, bool fine, long& spent);

  const int P_, pp_, k_;
  const std::function<OtherWork(double)>& other_;
  const ChainRoom& fluid_room_;
  const GiantShares& shares_;
  std::vector<std::vector<int>> partitions_;
  std::vector<std::vector<double>> curves_;  // [unit mask] -> curve
  std::vector<Shape> shapes_;                // [n - 1]
  std::vector<int> lone_order_[8];           // {x}: a lone unit's order
  // per step S
  std::map<std::vector<int>, double> rooms_;      // (unit, from, to) per unit in order -> room
  std::map<std::vector<double>, double> fluids_;  // the times of a chain -> the fluid room beside it
  std::map<std::vector<double>, bool> answers_;   // the LP's data -> fits
  std::map<std::vector<int>, bool> shaped_;       // units, degree ranges and cliques -> fits
  long solved_ = 0, solved_fine_ = 0;             // coarse and fine LPs solved
  long visits_ = 0;                               // share graphs tried
  // over the whole term
  double cells_ = 0.0;
  long all_visits_ = 0;
  // scratch of the candidate being priced
  int upper_[8] = {};
  std::vector<std::pair<int, const std::vector<int>*>> cliques_;  // (Q, its units in the order pi)
  std::vector<int> of_[8];                                        // the ranges of each single-sequence unit
  std::vector<Range> ranges_;
  std::vector<Piece> pieces_;
  std::vector<Kind> kinds_;
  std::vector<double> lp_a_, lp_b_, lp_c_, chain_;
};

bool CoverSearch::feasible(double S) {
  const OtherWork work = other_(S);
  rooms_.clear(), fluids_.clear();
  answers_.clear(), shaped_.clear(), solved_ = solved_fine_ = visits_ = 0;
  if (!(work.budget >= 0.0)) return false;
  for (const auto& part : partitions_)
    if (search(part, S, work)) return true;
  return false;
}

// Whether some share graph H works for one partition (in some order): a search that starts from no edges and, while
// some independent set is too wide for the pool, adds one of its pairs. Any H that works contains the current one
// and an edge inside that set (its degrees are no lower, so the set would still not fit), so the search misses none.
// True too when the search budget is spent (granted: a relaxation, still a bound).
bool CoverSearch::search(const std::vector<int>& part, double S, const OtherWork& work) {
  const int n = static_cast<int>(part.size()), P = P_;
  const Shape& sh = shapes_[n - 1];
  std::vector<int> lo(n, 0);
  std::vector<double> best(n, 0.0), times;
  for (int u = 0; u < n; ++u) {
    const auto& t = curves_[part[u]];
    best[u] = t[P], lo[u] = least(t, S);
    if (lo[u] > P) return false;
  }
  // For each ordered path, the least degree of each member with the others at their fastest times (P + 1: the path
  // can never be that short), worked out when a share graph first holds that path.
  std::vector<int> req(sh.ordered.size() * static_cast<std::size_t>(n), -1);
  auto path_req = [&](int q) {
    if (req[q * n] >= 0) return;
    const auto& order = sh.ordered[q];
    for (int u = 0; u < n; ++u) req[q * n + u] = 0;
    times.resize(order.size());
    for (std::size_t j = 0; j < order.size(); ++j) {
      for (std::size_t i = 0; i < order.size(); ++i) times[i] = best[order[i]];
      const auto& t = curves_[part[order[j]]];
      int a = lo[order[j]], b = P + 1;  // least d in [a, P] with the chain <= S, else P + 1
      while (a < b) {
        const int mid = (a + b) / 2;
        times[j] = t[mid];
        if (chain_floor(times) <= S)
          b = mid;
        else
          a = mid + 1;
      }
      req[q * n + order[j]] = a;
    }
  };
  auto sum_over = [&](int I, auto&& f) {
    double sum = 0.0;
    for (int x = 0; x < n; ++x)
      if (I >> x & 1) sum += f(x);
    return sum;
  };
  const int edges = n * (n - 1) / 2;
  std::vector<int> deg, stack, indep;
  std::vector<char> seen;
  int binding[8] = {};
  for (std::size_t o = 0; o < sh.need.size(); ++o) {
    const auto& need = sh.need[o];
    const auto& key = sh.key[o];
    seen.assign(std::size_t{1} << edges, 0);
    stack.assign(1, 0);
    seen[0] = 1;
    while (!stack.empty()) {
      if (++visits_ > kVisits || ++all_visits_ > kAllVisits) return true;
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
      // Sets that any H that works must break (put an edge inside): one too wide for the pool, or whose ranks leave
      // too little for the other work.
      int breaks[8] = {}, nbreaks = 0;
      bool grow = false;  // every H that works adds some edge to this one
      for (int I : indep)
        if (sum_over(I, [&](int x) { return static_cast<double>(deg[x]); }) > P) {
          breaks[nbreaks++] = I;
          break;
        }
      auto loss = [&](int x) { return work.loss[static_cast<unsigned>(part[x])][deg[x]]; };
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
        // Jointly: a unit in an independent set I has at most P - (the others' degrees in I) ranks, so every path
        // must also hold with its units at their fastest times on that many. Where one does not, any H that works
        // breaks one of the sets that bind its units (else those bounds could only fall).
        for (int x = 0; x < n; ++x) upper_[x] = P, binding[x] = 0;
        for (int I : indep)
          for (int x = 0; x < n; ++x)
            if (I >> x & 1) {
              const int most = P - static_cast<int>(sum_over(I, [&](int y) { return y == x ? 0.0 : 1.0 * deg[y]; }));
              if (most < upper_[x]) upper_[x] = most, binding[x] = I;
            }
        for (int q : sh.subsets) {
          if ((need[q] & H) != need[q]) continue;
          const auto& order = sh.ordered[key[q]];
          times.resize(order.size());
          for (std::size_t j = 0; j < order.size(); ++j) times[j] = curves_[part[order[j]]][upper_[order[j]]];
          if (chain_floor(times) > S) {
            stuck = true;
            for (int x : order)
              if (binding[x] != 0) breaks[nbreaks++] = binding[x];
            break;
          }
        }
        if (!stuck) {
          if (ranks_fit(Candidate{n, part, deg, sh, key, nbr, S, work})) return true;
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
            inside = chain_floor({best[pair[0]], best[pair[1]]}) <= S;
          }
          for (int j = 0; j < nbreaks && !inside; ++j) inside = (breaks[j] >> x & 1) && (breaks[j] >> y & 1);
          if (!inside || (H & e) || seen[H | e]) continue;
          seen[H | e] = 1;
          stack.push_back(H | e);
        }
    }
  }
  return false;
}

// Rank by rank: a rank holding the units Q (a clique of H) runs their microbatches in the order pi, so the other work
// X on it obeys X - sum E <= ChainRoom(their times, S) (what fits beside them by the chain floor; work in a giant's
// own group hides at most its E) and X <= C(S) - sum (t - c - E): the rank loses C(S) - room of the capacity the
// other work needs. A giant u on d_u ranks in [deg_u, upper_u] (its rings' bounds) has some ranks to itself and
// shares the others, so the pool must hold, within P ranks, every unit's d_u ranks at a total loss <= the budget. The
// answer follows from the units, their degree ranges and the cliques of H in the order pi: a repeat (another share
// graph with the same cliques) is answered at once.
bool CoverSearch::ranks_fit(const Candidate& c) {
  const int n = c.n;
  std::vector<int> shape_id(c.part.begin(), c.part.end());
  shape_id.push_back(-1);
  for (int x = 0; x < n; ++x) shape_id.insert(shape_id.end(), {c.deg[x], upper_[x]});
  cliques_.clear();
  for (int Q = 1; Q < (1 << n); ++Q) {
    bool clique = true;
    for (int x = 0; x < n && clique; ++x) clique = !(Q >> x & 1) || (Q & ~(c.nbr[x] | 1 << x)) == 0;
    const bool lone = popcount(Q) == 1;
    if (!clique || (lone && c.single(std::countr_zero(static_cast<unsigned>(Q))))) continue;
    cliques_.push_back({Q, lone ? &lone_order_[std::countr_zero(static_cast<unsigned>(Q))] : &c.sh.ordered[c.key[Q]]});
    shape_id.push_back(-2);
    shape_id.insert(shape_id.end(), cliques_.back().second->begin(), cliques_.back().second->end());
  }
  if (const auto it = shaped_.find(shape_id); it != shaped_.end()) return it->second;
  const bool fit = price(c);
  shaped_.emplace(std::move(shape_id), fit);
  return fit;
}

// An LP relaxes the rank check: the degree range is cut into ranges at equal steps of the unit's time, and each range
// into pieces [d1, d2] (d_u >= d1 ranks, at most d2 of them alone, each losing no less than at the piece's best
// degree), a convex mix of pieces per giant, and ranks shared by several units priced at their best times (coarse).
// Where that fits, a fine LP prices each clique at one range per member and counts each range's ranks apart (a ring
// has one degree); a unit of several sequences keeps its whole degree range. Where the LP fails, any H that works
// shares more, so the search adds each pair that can chain within S at its best times.
bool CoverSearch::price(const Candidate& c) {
  if (!cut_ranges(c)) return false;
  const double C = c.work.capacity;
  // A primal point first: every unit on ranks of its own, each giant at its cheapest piece's least count (no shared
  // ranks); if that fits, so does the LP.
  {
    double ranks = 0.0, loss = 0.0;
    double least[8], d[8];
    std::fill(least, least + 8, std::numeric_limits<double>::infinity());
    for (const Piece& q : pieces_)
      if (q.d1 * q.loss < least[q.unit]) least[q.unit] = q.d1 * q.loss, d[q.unit] = q.d1;
    bool ok = true;
    for (int x = 0; x < c.n && ok; ++x) {
      if (!c.single(x)) {  // a unit of several: deg ranks at its range's loss
        int from[8], to[8];
        from[x] = c.deg[x], to[x] = upper_[x];
        const double r = room(c, lone_order_[x], from, to);
        ranks += c.deg[x], loss += c.deg[x] * (C - r), ok = r >= 0.0;
      } else {
        ranks += d[x], loss += least[x];
      }
    }
    if (ok && ranks <= P_ && loss <= c.work.budget) return true;
  }
  add_kinds(c, false);  // a coarse LP has at most 5 x 24 pieces + 26 cliques
  if (!lp_fits(c, false, solved_)) return false;
  // The fine LP only when its kinds stay few (else the coarse answer stands).
  if (!add_kinds(c, true)) return true;
  return lp_fits(c, true, solved_fine_);
}

// The room on a rank holding the units of `order` at degrees in [from[x], to[x]]; < 0 when they alone exceed S.
double CoverSearch::room(const Candidate& c, const std::vector<int>& order, const int* from, const int* to) {
  std::vector<int> id;
  for (int x : order) id.insert(id.end(), {c.part[x], from[x], to[x]});
  if (const auto it = rooms_.find(id); it != rooms_.end()) return it->second;
  chain_.clear();
  double hidden = 0.0, load = 0.0;
  for (int x : order) {
    const auto m = static_cast<std::size_t>(c.part[x]);
    chain_.push_back(curves_[m][to[x]]);
    double E = 0.0, l = std::numeric_limits<double>::infinity();
    for (int d = from[x]; d <= to[x]; ++d) E = std::max(E, shares_.hid[m][d]), l = std::min(l, shares_.load[m][d]);
    hidden += E, load += l;
  }
  double fluid = 0.0;
  if (!chain_.empty()) {  // the room beside a chain depends on its times alone: many ranges share them
    const auto [it, fresh] = fluids_.try_emplace(chain_, 0.0);
    if (fresh) it->second = fluid_room_(chain_, c.S);
    fluid = it->second;
  }
  const double C = c.work.capacity;
  const double r = chain_.empty() ? C : fluid < 0.0 ? -1.0 : std::min(fluid + hidden, C - load);
  rooms_.emplace(std::move(id), r);
  return r;
}

// Each single-sequence unit's degree range [deg, upper] cut into up to kRanges ranges at equal steps of its time (it
// falls fastest near the least degree), each into up to kPieces pieces that fit within S alone; false when some unit
// has none.
bool CoverSearch::cut_ranges(const Candidate& c) {
  ranges_.clear(), pieces_.clear();
  const double C = c.work.capacity;
  for (int x = 0; x < c.n; ++x) {
    of_[x].clear();
    if (!c.single(x)) continue;
    const int span = upper_[x] - c.deg[x] + 1, cuts = std::min(kRanges, span);
    const auto& tc = curves_[c.part[x]];
    std::vector<int> bound{c.deg[x]};
    for (int j = 1; j < cuts; ++j) {
      const double goal = tc[c.deg[x]] - (tc[c.deg[x]] - tc[upper_[x]]) * j / cuts;
      int d = bound.back() + 1;
      while (d <= upper_[x] && tc[d] > goal) ++d;
      if (d <= upper_[x]) bound.push_back(d);
    }
    bound.push_back(upper_[x] + 1);
    for (std::size_t j = 0; j + 1 < bound.size(); ++j) {
      const int d1 = bound[j], len = bound[j + 1] - d1;
      const int range = static_cast<int>(ranges_.size()), parts = std::min(kPieces, len);
      const std::size_t before = pieces_.size();
      for (int q = 0; q < parts; ++q) {
        int from[8], to[8];
        from[x] = d1 + len * q / parts, to[x] = d1 + len * (q + 1) / parts - 1;
        if (const double r = room(c, lone_order_[x], from, to); r >= 0.0)
          pieces_.push_back({x, from[x], to[x], range, C - r});
      }
      if (pieces_.size() > before) of_[x].push_back(range), ranges_.push_back({x, d1, d1 + len - 1});
    }
    if (of_[x].empty()) return false;
  }
  return true;
}

// The kinds of rank: each piece alone, and each clique. Coarse: a clique's units at their whole degree ranges (ver
// -1), a unit's ranks counted together. Fine: one kind per range of each single-sequence member, priced at that range,
// and a range's ranks counted apart (a unit's degree lies in one range). False: more than kFineKinds cliques.
bool CoverSearch::add_kinds(const Candidate& c, bool fine) {
  kinds_.clear();
  const double C = c.work.capacity;
  for (std::size_t q = 0; q < pieces_.size(); ++q) {
    Kind kd{1 << pieces_[q].unit, {}, pieces_[q].loss, static_cast<int>(q)};
    kd.ver.fill(-1);
    kinds_.push_back(kd);
  }
  const std::size_t lone = kinds_.size();
  for (const auto& [Q, order] : cliques_) {
    int from[8], to[8];
    std::vector<int> single;  // members that are single sequences
    for (int x : *order) {
      from[x] = c.deg[x], to[x] = upper_[x];
      if (c.single(x)) single.push_back(x);
    }
    std::vector<std::size_t> pick(fine ? single.size() : 0, 0);
    while (true) {
      Kind kd{Q, {}, 0.0, -1};
      kd.ver.fill(-1);
      for (std::size_t j = 0; j < pick.size(); ++j) {
        const int v = of_[single[j]][pick[j]];
        from[single[j]] = ranges_[v].d1, to[single[j]] = ranges_[v].d2, kd.ver[single[j]] = v;
      }
      if (const double r = room(c, *order, from, to); r >= 0.0) kd.loss = C - r, kinds_.push_back(kd);
      if (kinds_.size() - lone > kFineKinds) return false;
      std::size_t j = 0;
      while (j < pick.size() && ++pick[j] == of_[single[j]].size()) pick[j++] = 0;
      if (j == pick.size()) break;
    }
  }
  return true;
}

// Whether the covering LP fits the budget, through its dual: max sum_{x alone} c_x + sum_{x of several} deg_x a_x -
// P e subject to, per kind K, sum_{x in K} (A_x - B_v) - b_q - e <= loss_K (B_v fine only, v the range x is priced
// at; b_q for the kind of piece q alone), and per piece q of x in range v, c_x - d1 A_x + d2 (b_q + B_v) <= 0, where
// A_x is A_v (fine) or the unit's a_x (coarse). Primal: every unit takes a convex mix of pieces, its ranks number at
// least d1 of the mix (per range, fine), at most d2 of it hold the unit alone in piece q, and at most d2 hold it in
// range v (fine). Repeats (another order or share graph giving the same LP) are answered at once; past kFits distinct
// ones per step S of a kind the step is granted (a relaxation, still a bound).
bool CoverSearch::lp_fits(const Candidate& c, bool fine, long& spent) {
  const int n = c.n;
  std::vector<double> id{fine ? 1.0 : 0.0, static_cast<double>(n)};
  for (const Kind& kd : kinds_) {
    id.insert(id.end(), {static_cast<double>(kd.Q), kd.loss, static_cast<double>(kd.piece)});
    for (int x = 0; x < n; ++x)
      if (kd.Q >> x & 1) id.push_back(kd.ver[static_cast<std::size_t>(x)]);
  }
  id.push_back(-1.0);
  for (const Piece& q : pieces_) id.insert(id.end(), {1.0 * q.unit, 1.0 * q.d1, 1.0 * q.d2, 1.0 * q.range});
  for (int x = 0; x < n; ++x) id.push_back(c.single(x) ? -1.0 : c.deg[x]);
  if (const auto it = answers_.find(id); it != answers_.end()) return it->second;
  if (++spent > kFits) return true;
  // (the sizes below, ahead of the solve)
  const double size =
      static_cast<double>(kinds_.size() + pieces_.size()) *
      static_cast<double>(kinds_.size() + 2 * pieces_.size() + 2 * n + (fine ? 2 * ranges_.size() : 0) + 1);
  if ((cells_ += size) > kCells) return true;
  // columns: a_x, c_x (per unit), b_q (per piece), A_v, B_v (per range, fine only), e
  const std::size_t N = static_cast<std::size_t>(n), F = pieces_.size(), R = fine ? ranges_.size() : 0;
  const std::size_t cols = 2 * N + F + 2 * R + 1, e = cols - 1, rows = kinds_.size() + F;
  auto a_col = [&](int x, int v) {
    return fine ? 2 * N + F + static_cast<std::size_t>(v) : static_cast<std::size_t>(x);
  };
  auto big_b = [&](int v) { return 2 * N + F + R + static_cast<std::size_t>(v); };
  lp_a_.assign(rows * cols, 0.0), lp_b_.assign(rows, 0.0), lp_c_.assign(cols, 0.0);
  for (int x = 0; x < n; ++x) {
    if (c.single(x))
      lp_c_[N + static_cast<std::size_t>(x)] = 1.0;
    else
      lp_c_[static_cast<std::size_t>(x)] = c.deg[x];
  }
  lp_c_[e] = -static_cast<double>(P_);
  std::size_t r = 0;
  for (const Kind& kd : kinds_) {
    for (int x = 0; x < n; ++x) {
      if (!(kd.Q >> x & 1)) continue;
      const int v =
          kd.piece >= 0 ? pieces_[static_cast<std::size_t>(kd.piece)].range : kd.ver[static_cast<std::size_t>(x)];
      if (fine && v >= 0)
        lp_a_[r * cols + a_col(x, v)] = 1.0, lp_a_[r * cols + big_b(v)] = -1.0;
      else
        lp_a_[r * cols + static_cast<std::size_t>(x)] = 1.0;
    }
    if (kd.piece >= 0) lp_a_[r * cols + 2 * N + static_cast<std::size_t>(kd.piece)] = -1.0;
    lp_a_[r * cols + e] = -1.0, lp_b_[r++] = kd.loss;
  }
  for (std::size_t f = 0; f < F; ++f) {
    const Piece& q = pieces_[f];
    lp_a_[r * cols + a_col(q.unit, q.range)] = -q.d1;
    lp_a_[r * cols + 2 * N + f] = q.d2;
    if (fine) lp_a_[r * cols + big_b(q.range)] = q.d2;
    lp_a_[r * cols + N + static_cast<std::size_t>(q.unit)] = 1.0, lp_b_[r++] = 0.0;
  }
  const double budget = c.work.budget;
  const bool fit = small_lp_max(lp_a_, lp_b_, lp_c_) <= budget + 1e-9 * (1.0 + std::abs(budget));
  answers_.emplace(std::move(id), fit);
  return fit;
}

}  // namespace

double cover_term(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other, double from,
                  const ChainRoom& fluid_room, const GiantShares& shares) {
  if (k < 2) return 0.0;
  return CoverSearch(cluster, pp, k, other, fluid_room, shares).solve(from);
}

}  // namespace dynacp::solve
