// The cover term of the pipelined lower bound (docs/cost_model.md, "cover"): the hardest few sequences' units priced
// per degree (GiantShares) and the other work they leave room for at a step (OtherWork), searched by CoverSearch
// (cover_search.hpp) from the shared term up.
#include "dynacp/solve/bounds/cover.hpp"

#include <algorithm>
#include <bit>
#include <limits>

#include "context.hpp"
#include "cover_search.hpp"

namespace dynacp::solve {

double cover_term(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other, double from,
                  const ChainRoom& fluid_room, const GiantShares& shares) {
  if (k < 2) return 0.0;
  return bounds::CoverSearch(cluster, pp, k, other, fluid_room, shares).solve(from);
}

namespace bounds {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Every unit (a group holding some of the first `units` giants, by mask): its time on exactly d ranks, and what its
// other co-members (outside those giants) may hide in it - the critical-sequence argument holds for any microbatch,
// and HideCap for the group's tokens in all. unit_dmin[u]: the unit's least degree.
GiantShares unit_shares(const BoundContext& ctx, const Giants& g, std::size_t units, std::vector<int>& unit_dmin) {
  const int P = ctx.cluster.num_ranks;
  const std::size_t masks = std::size_t{1} << units;
  GiantShares shares;
  unit_dmin.assign(masks, P + 1);
  shares.time.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, kInf));
  shares.hid.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, 0.0));
  shares.load.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 1, kInf));
  for (std::size_t u = 1; u < masks; ++u) {
    GroupStats gs;
    double work_u = 0.0;
    for (std::size_t i = 0; i < units; ++i)
      if (u >> i & 1) gs.add(ctx.batch.lengths[g.ids[i]], ctx.cost.eta(ctx.batch.mask(g.ids[i]))), work_u += g.w[i];
    unit_dmin[u] = std::max(1, ctx.cost.min_degree(gs.tokens, ctx.cluster));
    for (int d = unit_dmin[u]; d <= P; ++d) {
      const double t = std::popcount(u) == 1 ? g.time[std::countr_zero(u)][d - g.dmin[std::countr_zero(u)]]
                                             : fastest(ctx.cost, ctx.cluster, gs, d);
      const double E = g.hidden_in(work_u, gs.tokens, d, t, units);
      shares.time[u][d] = t, shares.hid[u][d] = E, shares.load[u][d] = t - ctx.cost.group_overhead - E;
    }
  }
  return shares;
}

// The other work at step S, as in the shared term's disjoint check: each giant's ranks lose C(S) - room of the pool.
OtherWork other_work(const BoundContext& ctx, const Giants& g, std::size_t units, const GiantShares& shares,
                     const std::vector<int>& unit_dmin, double S) {
  const int P = ctx.cluster.num_ranks;
  const std::size_t masks = std::size_t{1} << units;
  OtherWork o;
  const double C = g.capacity(S);
  if (C < 0) {
    o.budget = -std::numeric_limits<double>::infinity();
    return o;
  }
  double rest = g.total_work;
  o.capacity = C;
  for (std::size_t i = 0; i < units; ++i) rest -= g.w[i];
  o.loss.assign(masks, std::vector<double>(static_cast<std::size_t>(P) + 2, kInf));
  for (std::size_t u = 1; u < masks; ++u)
    for (int d = P; d >= 0; --d) {
      double l = o.loss[u][d + 1];
      if (d >= unit_dmin[u] && shares.time[u][d] <= S)
        if (const double r = g.room_beside(shares.time[u][d], shares.hid[u][d], S, C); r >= 0)
          l = std::min(l, d * (C - r));
      o.loss[u][d] = l;
    }
  o.budget = P * C - rest;
  return o;
}

// The cover term over the hardest `units` sequences, from step `from` on.
double cover_over(const BoundContext& ctx, const Giants& g, std::size_t units, double from) {
  std::vector<int> unit_dmin;
  const GiantShares shares = unit_shares(ctx, g, units, unit_dmin);
  auto other = [&](double S) { return other_work(ctx, g, units, shares, unit_dmin, S); };
  return cover_term(ctx.cluster, ctx.pp, static_cast<int>(units), other, from, g.fluid_room, shares);
}

}  // namespace

double term_cover(const BoundContext& ctx) {
  if (!ctx.one_f_one_b || !ctx.with_cover) return 0.0;
  const Giants& g = ctx.giants();
  if (!g.usable) return 0.0;
  constexpr std::size_t kCoverUnits = 5;
  double cover = cover_over(ctx, g, std::min(g.k, kCoverUnits), ctx.shared());
  // A sixth unit when the sixth hardest sequence needs more than a node's memory too (long-context batches). Its
  // search stops at its budgets elsewhere than the five-unit one, so neither dominates; both bound the step, and the
  // six-unit search starts from the five-unit term (it only says whether some step above it is still infeasible).
  if (g.k > kCoverUnits && g.dmin[kCoverUnits] > ctx.cluster.ranks_per_node)
    cover = cover_over(ctx, g, kCoverUnits + 1, cover);
  return cover;
}

}  // namespace bounds
}  // namespace dynacp::solve
