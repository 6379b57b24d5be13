// The cover term's search (cover_search.hpp): the least feasible step, over every set partition of the hardest
// sequences into units, every order of the units and the share graphs that search() grows edge by edge.
#include "cover_search.hpp"

#include <algorithm>
#include <cstddef>
#include <map>
#include <numeric>

#include "dynacp/solve/blocks/partitions.hpp"

namespace dynacp::solve::bounds {
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

// The sum of f(x) over the units x of the mask I (of n units).
template <class F>
double sum_over(int n, int I, F&& f) {
  double sum = 0.0;
  for (int x = 0; x < n; ++x)
    if (I >> x & 1) sum += f(x);
  return sum;
}

}  // namespace

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

CoverSearch::CoverSearch(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other,
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

double CoverSearch::solve(double from) {
  // All k as single units in one order on every rank meet every bound, so the chain of their fastest times holds.
  std::vector<double> all(static_cast<std::size_t>(k_));
  double lo = 0.0;
  for (int i = 0; i < k_; ++i) all[i] = curves_[1 << i][P_], lo = std::max(lo, all[i]);
  lo = std::max(lo, from);
  return least_feasible(lo, std::max(lo, one_f_one_b_chain_floor(all, pp_)), [&](double S) { return feasible(S); });
}

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
  Part p{n, part, shapes_[n - 1], S, work, std::vector<int>(n, 0), std::vector<double>(n, 0.0), {}, {}, {}, {}, {}};
  for (int u = 0; u < n; ++u) {
    const auto& t = curves_[part[u]];
    p.best[u] = t[P], p.lo[u] = least(t, S);
    if (p.lo[u] > P) return false;
  }
  p.req.assign(p.sh.ordered.size() * static_cast<std::size_t>(n), -1);
  const int edges = n * (n - 1) / 2;
  std::vector<int> stack;
  std::vector<char> seen;
  for (std::size_t o = 0; o < p.sh.need.size(); ++o) {
    seen.assign(std::size_t{1} << edges, 0);
    stack.assign(1, 0);
    seen[0] = 1;
    while (!stack.empty()) {
      if (++visits_ > kVisits || ++all_visits_ > kAllVisits) return true;
      const int H = stack.back();
      stack.pop_back();
      Verdict v;
      const Outcome r = examine(p, o, H, v);
      if (r == Outcome::Works) return true;
      if (r == Outcome::Grow) grow_graph(p, o, H, v, seen, stack);
    }
  }
  return false;
}

// For the ordered path q, the least degree of each member with the others at their fastest times (P + 1: the path
// can never be that short), worked out when a share graph first holds that path.
void CoverSearch::path_req(Part& p, int q) {
  const int n = p.n, P = P_;
  auto& req = p.req;
  if (req[q * n] >= 0) return;
  const auto& order = p.sh.ordered[q];
  for (int u = 0; u < n; ++u) req[q * n + u] = 0;
  p.times.resize(order.size());
  for (std::size_t j = 0; j < order.size(); ++j) {
    for (std::size_t i = 0; i < order.size(); ++i) p.times[i] = p.best[order[i]];
    const auto& t = curves_[p.part[order[j]]];
    int a = p.lo[order[j]], b = P + 1;  // least d in [a, P] with the chain <= S, else P + 1
    while (a < b) {
      const int mid = (a + b) / 2;
      p.times[j] = t[mid];
      if (chain_floor(p.times) <= p.S)
        b = mid;
      else
        a = mid + 1;
    }
    req[q * n + order[j]] = a;
  }
}

// Share graph H in order o: its units' least degrees (every path of H must hold), its independent sets, and the sets
// any H that works must break (put an edge inside): one too wide for the pool, or whose ranks leave too little for
// the other work; failing those, the joint check (stuck()) and the rank LP (ranks_fit).
CoverSearch::Outcome CoverSearch::examine(Part& p, std::size_t o, int H, Verdict& v) {
  const int n = p.n, P = P_;
  const Shape& sh = p.sh;
  const auto& need = sh.need[o];
  const auto& key = sh.key[o];
  auto& deg = p.deg;
  deg = p.lo;
  bool fine = true;
  for (int q : sh.subsets)
    if ((need[q] & H) == need[q]) {
      path_req(p, key[q]);
      for (int u = 0; u < n; ++u) deg[u] = std::max(deg[u], p.req[key[q] * n + u]), fine = fine && deg[u] <= P;
    }
  if (!fine) return Outcome::Prune;
  // the independent sets of H (of >= 2 units)
  std::fill(p.nbr, p.nbr + 8, 0);
  for (int x = 0; x < n; ++x)
    for (int y = 0; y < n; ++y)
      if (x != y && (H >> sh.edge[x * n + y] & 1)) p.nbr[x] |= 1 << y;
  p.indep.clear();
  for (int I : sh.subsets) {
    bool independent = true;
    for (int x = 0; x < n && independent; ++x) independent = !((I >> x & 1) && (p.nbr[x] & I));
    if (independent) p.indep.push_back(I);
  }
  for (int I : p.indep)
    if (sum_over(n, I, [&](int x) { return static_cast<double>(deg[x]); }) > P) {
      v.breaks[v.nbreaks++] = I;
      break;
    }
  auto loss = [&](int x) { return p.work.loss[static_cast<unsigned>(p.part[x])][deg[x]]; };
  if (v.nbreaks == 0) {
    bool dead = false;
    for (int x = 0; x < n && !dead; ++x) dead = loss(x) > p.work.budget;
    if (dead) return Outcome::Prune;
    for (int I : p.indep)
      if (sum_over(n, I, loss) > p.work.budget) {
        v.breaks[v.nbreaks++] = I;
        break;
      }
  }
  if (v.nbreaks == 0) {
    if (!stuck(p, o, H, v)) {
      if (ranks_fit(Candidate{n, p.part, deg, sh, key, p.nbr, p.S, p.work})) return Outcome::Works;
      v.grow = true;  // every H that works adds some edge to this one
    } else if (v.nbreaks == 0) {
      return Outcome::Prune;  // nothing binds those units: no H above this one helps
    }
  }
  return Outcome::Grow;
}

// Jointly: a unit in an independent set I has at most P - (the others' degrees in I) ranks (upper_), so every path
// must also hold with its units at their fastest times on that many. Where one does not (true), any H that works
// breaks one of the sets that bind its units (else those bounds could only fall): they go to v.breaks.
bool CoverSearch::stuck(Part& p, std::size_t o, int H, Verdict& v) {
  const int n = p.n, P = P_;
  const Shape& sh = p.sh;
  const auto& need = sh.need[o];
  const auto& key = sh.key[o];
  int binding[8] = {};
  for (int x = 0; x < n; ++x) upper_[x] = P, binding[x] = 0;
  for (int I : p.indep)
    for (int x = 0; x < n; ++x)
      if (I >> x & 1) {
        const int most = P - static_cast<int>(sum_over(n, I, [&](int y) { return y == x ? 0.0 : 1.0 * p.deg[y]; }));
        if (most < upper_[x]) upper_[x] = most, binding[x] = I;
      }
  for (int q : sh.subsets) {
    if ((need[q] & H) != need[q]) continue;
    const auto& order = sh.ordered[key[q]];
    p.times.resize(order.size());
    for (std::size_t j = 0; j < order.size(); ++j) p.times[j] = curves_[p.part[order[j]]][upper_[order[j]]];
    if (chain_floor(p.times) > p.S) {
      for (int x : order)
        if (binding[x] != 0) v.breaks[v.nbreaks++] = binding[x];
      return true;
    }
  }
  return false;
}

// Pushes every graph H + one edge that any H that works may contain: an edge inside one of v.breaks, or with v.grow
// any pair whose chain can hold at their fastest times (it may be the sharing that helps).
void CoverSearch::grow_graph(const Part& p, std::size_t o, int H, const Verdict& v, std::vector<char>& seen,
                             std::vector<int>& stack) const {
  const int n = p.n;
  const Shape& sh = p.sh;
  const auto& key = sh.key[o];
  for (int x = 0; x < n; ++x)
    for (int y = x + 1; y < n; ++y) {
      const int e = 1 << sh.edge[x * n + y];
      bool inside = false;
      if (v.grow) {
        const auto& pair = sh.ordered[key[(1 << x) | (1 << y)]];
        inside = chain_floor({p.best[pair[0]], p.best[pair[1]]}) <= p.S;
      }
      for (int j = 0; j < v.nbreaks && !inside; ++j) inside = (v.breaks[j] >> x & 1) && (v.breaks[j] >> y & 1);
      if (!inside || (H & e) || seen[H | e]) continue;
      seen[H | e] = 1;
      stack.push_back(H | e);
    }
}

}  // namespace dynacp::solve::bounds
