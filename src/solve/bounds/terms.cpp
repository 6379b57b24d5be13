// The lower bound's registry and its terms single, wide, average and critical (shared: shared.cpp, cover: cover.cpp).
// The bound is the maximum of the terms in registry order; docs/cost_model.md gives the proofs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "context.hpp"
#include "dynacp/solve/bounds/lower_bound.hpp"

namespace dynacp::solve {
namespace bounds {

const std::vector<BoundTerm>& bound_terms() {
  static const std::vector<BoundTerm> registry = {
      {"single", &term_single},     {"wide", &term_wide},     {"average", &term_average},
      {"critical", &term_critical}, {"shared", &term_shared}, {"cover", &term_cover},
  };
  return registry;
}

double term_single(const BoundContext& ctx) {
  const Cluster& cluster = ctx.cluster;
  const CostModel& cost = ctx.cost;
  double longest = 0.0;
  for (int k = 0; k < 2; ++k) {
    const std::int64_t len = ctx.totals.longest[k];
    if (len == 0) continue;
    GroupStats g;
    g.add(len, cost.eta(static_cast<Mask>(k)));
    // a full scan (not best_degree's ternary search): a lower bound must hold for any shape of T(d); each degree in
    // its faster layout (a ring of d <= ranks_per_node ranks may span nodes when the inter-node link is the faster)
    const int dmin = cost.min_degree(len, cluster);
    double best = fastest(cost, cluster, g, dmin);
    for (int d = dmin + 1; d <= cluster.num_ranks; ++d) best = std::min(best, fastest(cost, cluster, g, d));
    longest = std::max(longest, best);
  }
  return longest;
}

double term_wide(const BoundContext& ctx) {
  const double wide = ctx.totals.wide_work, c = ctx.cost.group_overhead;
  if (ctx.pp <= 1) return wide > 0 ? wide / ctx.cluster.num_ranks + c : 0.0;
  const double P = ctx.cluster.num_ranks, n = ctx.pp;
  return wide > 0 ? (wide / P + c) / n : 0.0;
}

double term_average(const BoundContext& ctx) {
  // Every rank that runs anything pays at least one group overhead c, and a group's rank-time d T >= its work +
  // c d; so with U ranks in use, step >= (sum work + c |U|) / |U| >= sum work / P + c.
  const double plain = ctx.plain_average();
  if (ctx.pp <= 1) return plain;
  // Every microbatch takes t >= c + w_min / P (a group's time is at least its per-rank work plus c), and one
  // stage-chunk of it t / (3 pp vpp) forward and 2 t / (3 pp vpp) backward. On a rank whose microbatches take S
  // in all, the last stage idles until the first forward has crossed the pp - 1 stages before it, runs S / pp,
  // and after its last op (a backward) that backward still crosses pp - 1 stages: T >= (S + (pp - 1) t_min / vpp)
  // / pp. The ranks in use U have sum S >= sum work + c |U|, so T >= (sum work / P + c) / pp + (pp - 1) t_min /
  // (pp vpp).
  const double P = ctx.cluster.num_ranks, n = ctx.pp, v = std::max(ctx.vpp, 1), c = ctx.cost.group_overhead;
  double average = plain / n + (n - 1) * (c + ctx.totals.min_work / P) / (n * v);
  // Sharper for 1F1B: a rank running m microbatches of S = W_r + m c seconds in all finishes no earlier than
  // h(m, pp) S / pp (one_f_one_b_floor, the optimum over every split of S). G(W) = min_m h(m, pp) (W + m c) / pp
  // grows with W, and some rank has W_r >= sum work / P. Beyond the table (m > 64) the bound above applies with
  // S >= W + 65 c (one_f_one_b_work_floor).
  if (ctx.one_f_one_b) average = std::max(average, ctx.G(plain - c));
  return average;
}

namespace {

// The critical term of one sequence s* (length len, mask) on d ranks at time Td, whose co-members may hide E, with
// W' the other work: min over the mean other work X of its ranks of max(Td + max(0, X - E) / (3 pp),
// G(Td - c - E + X), G((W' - d X) / (P - d))), found by bisection (the first two grow with X, the last falls).
double critical_at(const BoundContext& ctx, int d, double Td, double E, double Wp) {
  const double P = ctx.cluster.num_ranks, n = ctx.pp, c = ctx.cost.group_overhead;
  auto host = [&](double X) { return std::max(Td + std::max(0.0, X - E) / (3 * n), ctx.G(Td - c - E + X)); };
  if (d == ctx.cluster.num_ranks) return host(std::max(0.0, Wp) / P);
  auto rest = [&](double X) { return ctx.G((Wp - d * X) / (P - d)); };
  double lo = 0.0, hi = std::max(0.0, Wp) / d;
  if (rest(lo) <= host(lo)) return host(lo);
  for (int it = 0; it < 50; ++it) {
    const double mid = 0.5 * (lo + hi);
    (host(mid) < rest(mid) ? lo : hi) = mid;
  }
  // The crossing lies in [lo, hi]: left of it max >= rest(lo), right of it >= host(hi), inside it >=
  // max(host(lo), rest(hi)), which is the smallest of the three.
  return std::max(host(lo), rest(hi));
}

}  // namespace

double term_critical(const BoundContext& ctx) {
  if (!ctx.one_f_one_b) return 0.0;
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
  // (d = P: X = W' / P.)
  const Cluster& cluster = ctx.cluster;
  const CostModel& cost = ctx.cost;
  const double P = cluster.num_ranks, c = cost.group_overhead;
  double critical = 0.0;
  for (int k = 0; k < 2; ++k) {
    const std::int64_t len = ctx.totals.longest[k];
    if (len == 0) continue;
    const auto mask = static_cast<Mask>(k);
    GroupStats g;
    g.add(len, cost.eta(mask));
    const double ws = cost.work(len, mask), Wp = std::max(0.0, ctx.plain_average() - c) * P - ws;
    double best = std::numeric_limits<double>::infinity();
    for (int d = cost.min_degree(len, cluster); d <= cluster.num_ranks; ++d) {
      const double Td = fastest(cost, cluster, g, d);  // a ring of d <= ranks_per_node may still span nodes
      if (Td >= best) continue;
      const double E = std::min(std::max(0.0, Td - ws / d - c), ctx.hide()(len, mask, d));
      best = std::min(best, critical_at(ctx, d, Td, E, Wp));
    }
    if (std::isfinite(best)) critical = std::max(critical, best);
  }
  return critical;
}

}  // namespace bounds

std::vector<std::string> bound_term_names() {
  std::vector<std::string> out;
  for (const auto& t : bounds::bound_terms()) out.emplace_back(t.name);
  return out;
}

std::vector<double> bound_term_values(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                      int vpp, bool with_cover) {
  const bounds::BoundContext ctx(batch, cluster, cost, pp, vpp, with_cover);
  std::vector<double> out;
  for (const auto& t : bounds::bound_terms()) out.push_back(t.value(ctx));
  return out;
}

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  return lower_bound(batch, cluster, cost, 1, 1, false);
}

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp,
                   bool with_cover) {
  const std::vector<double> terms = bound_term_values(batch, cluster, cost, pp, vpp, with_cover);
  double bound = terms.front();
  for (double t : terms) bound = std::max(bound, t);
  return bound;
}

PipelinedBoundTerms pipelined_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                          int vpp, bool with_cover) {
  static constexpr std::pair<const char*, double PipelinedBoundTerms::*> kFields[] = {
      {"single", &PipelinedBoundTerms::single},   {"wide", &PipelinedBoundTerms::wide},
      {"average", &PipelinedBoundTerms::average}, {"critical", &PipelinedBoundTerms::critical},
      {"shared", &PipelinedBoundTerms::shared},   {"cover", &PipelinedBoundTerms::cover},
  };
  const std::vector<double> values = bound_term_values(batch, cluster, cost, pp, vpp, with_cover);
  const auto& terms = bounds::bound_terms();
  PipelinedBoundTerms out;
  for (std::size_t i = 0; i < terms.size(); ++i)
    for (const auto& [name, field] : kFields)
      if (std::string_view(name) == terms[i].name) out.*field = values[i];
  return out;
}

LowerBoundTerms lower_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  const bounds::BoundContext ctx(batch, cluster, cost, 1, 1, false);
  LowerBoundTerms t;
  t.average = bounds::term_average(ctx);
  t.single = bounds::term_single(ctx);
  t.wide = bounds::term_wide(ctx);
  t.wide_work = ctx.totals.wide_work;
  for (int k = 0; k < 2; ++k)
    if (ctx.totals.longest[k] > 0) t.longest.push_back({ctx.totals.longest[k], static_cast<Mask>(k)});
  return t;
}

}  // namespace dynacp::solve
