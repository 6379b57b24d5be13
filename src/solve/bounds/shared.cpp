// The shared term of the pipelined lower bound (docs/cost_model.md): the hardest sequences either meet on a rank or
// run on disjoint rings that must leave room for the other work.
//
// The k hardest sequences (k = 2..kGiants, by work) either meet - two of them on one rank, as two microbatches
// (pair_floor of their fastest times) or in one group (that group's fastest time) - or run on pairwise disjoint
// rings. In the disjoint case a step S needs degrees d_i with T_i(d_i) <= S and sum d_i <= P, and the other work W'
// (all but theirs) must fit: giant i's ranks take at most min(room(T_i, S) + E_i, C(S) - (T_i - c - E_i)) each
// (ChainRoom, <= 3 pp (S - T_i); E_i capped by HideCap with co-members outside the first k), the other ranks at
// most C(S) = the most work G allows within S. Bounding the capacity by each giant's best degree separately (a
// relaxation, so still a bound), S is infeasible when
//   P C(S) + sum_i max_{d_i} d_i (cap_i(d_i) - C(S)) < W'   or   sum_i (least feasible d_i) > P.
// Feasibility grows with S, so the least feasible S is found by bisection; the term is max_k min(meet_k, that S).
#include <algorithm>
#include <limits>

#include "context.hpp"

namespace dynacp::solve::bounds {
namespace {

// Two microbatches of times a and b on one 1F1B pipeline of n stages, whatever else it runs: the chain floor
// (one_f_one_b_chain_floor) of the order that gives the smaller one (docs/cost_model.md).
double pair_floor(double a, double b, int n) {
  const double ab[2] = {a, b}, ba[2] = {b, a};
  return std::min(one_f_one_b_chain_floor(ab, n), one_f_one_b_chain_floor(ba, n));
}

// Whether the first m giants fit on disjoint rings with everything done by S.
bool disjoint_fits(const BoundContext& ctx, const Giants& g, std::size_t m, double S) {
  const int P = ctx.cluster.num_ranks;
  const double C = g.capacity(S);
  if (C < 0) return false;
  double rest = g.total_work, cap = P * C;
  long long used = 0;
  for (std::size_t i = 0; i < m; ++i) {
    rest -= g.w[i];
    int least = 0;
    double gain = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < g.time[i].size(); ++j) {
      const double t = g.time[i][j];
      const int d = g.dmin[i] + static_cast<int>(j);
      if (t > S) continue;
      const double r = g.room(i, d, t, S, C, m);
      if (r < 0) continue;
      if (least == 0) least = d;
      gain = std::max(gain, d * (r - C));
    }
    if (least == 0) return false;
    used += least, cap += gain;
  }
  return used <= P && cap >= rest;
}

// Lowers `meet` to the least time at which giant j meets one of the giants before it: the pair floor of their
// fastest times (two microbatches on one rank), or their group's fastest time (both in one group).
void meet_earlier(const BoundContext& ctx, const Giants& g, std::size_t j, double& meet) {
  const Batch& batch = ctx.batch;
  const CostModel& cost = ctx.cost;
  for (std::size_t i = 0; i < j; ++i) {
    meet = std::min(meet, pair_floor(g.best[i], g.best[j], ctx.pp));
    GroupStats both = g.stats[i];
    both.add(batch.lengths[g.ids[j]], cost.eta(batch.mask(g.ids[j])));
    for (int d = cost.min_degree(both.tokens, ctx.cluster); d <= ctx.cluster.num_ranks; ++d)
      meet = std::min(meet, fastest(cost, ctx.cluster, both, d));
  }
}

// A value below which no step fits the first m giants on disjoint rings, or meet when none up to meet does.
double least_disjoint(const BoundContext& ctx, const Giants& g, std::size_t m, double meet) {
  double lo = 0.0;
  for (std::size_t i = 0; i < m; ++i) lo = std::max(lo, g.best[i]);
  if (disjoint_fits(ctx, g, m, lo)) return lo;
  const double hi0 = std::max(meet, lo);
  double hi = hi0;
  if (!disjoint_fits(ctx, g, m, hi)) return hi0;  // nothing up to meet fits, so min(meet, disjoint) = meet
  for (int it = 0; it < 50; ++it) {
    const double mid = 0.5 * (lo + hi);
    (disjoint_fits(ctx, g, m, mid) ? hi : lo) = mid;
  }
  return lo;  // no S <= lo fits (fits grows with S), so the least that does lies above it
}

}  // namespace

double term_shared(const BoundContext& ctx) { return ctx.one_f_one_b ? ctx.shared() : 0.0; }

double shared_floor(const BoundContext& ctx) {
  const Giants& g = ctx.giants();
  if (!g.usable) return 0.0;
  double out = 0.0, meet = std::numeric_limits<double>::infinity();
  for (std::size_t m = 2; m <= g.k; ++m) {
    meet_earlier(ctx, g, m - 1, meet);
    if (meet <= out) break;  // meet only falls with m
    out = std::max(out, std::min(meet, least_disjoint(ctx, g, m, meet)));
  }
  return out;
}

}  // namespace dynacp::solve::bounds
