#include "dynacp/solve/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dynacp/solve/microbatch.hpp"
#include "dynacp/solve/placement.hpp"

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

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp) {
  const auto b = pipelined_bound_terms(batch, cluster, cost, pp, vpp);
  return std::max({b.single, b.wide, b.average, b.critical});
}

PipelinedBoundTerms pipelined_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                          int vpp, bool with_critical) {
  const auto t = lower_bound_terms(batch, cluster, cost);
  if (pp <= 1) return {t.single, t.wide, t.average, 0.0};
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
  double critical = 0.0;
  if (vpp <= 1 && one_f_one_b_floor(2, pp) > 1.0) {
    // Sharper for 1F1B: a rank running m microbatches of S = W_r + m c seconds in all finishes no earlier than
    // h(m, pp) S / pp (one_f_one_b_floor, the optimum over every split of S). G(W) = min_m h(m, pp) (W + m c) / pp
    // grows with W, and some rank has W_r >= sum work / P. Beyond the table (m > kM) the bound above applies with
    // S >= W + (kM + 1) c.
    constexpr int kM = 64;
    auto G = [&](double W) {
      double g = (W + (kM + n) * c) / n;
      for (int m = 1; m <= kM; ++m) g = std::min(g, one_f_one_b_floor(m, pp) * (W + m * c) / n);
      return g;
    };
    average = std::max(average, G(t.average - c));
    // The hardest sequence s* in a group of degree d: that microbatch J takes t_J >= T(s*, d), and on stage 0 of
    // each of its ranks the ops before F_J, J's round trip through all stages (t_J) and the ops after B_J form a
    // chain; of the rank's other ops only the forwards of the next pp - 1 microbatches (1/3 of their time) and
    // the backwards of the previous pp - 1 (2/3) can overlap the round trip. So a rank running other work X
    // besides J finishes after >= T(s*, d) + max(0, X - E_d) / (3 pp), where E_d = T(s*, d) - w* / d - c is the
    // exposed communication (work grouped with s* in J may hide up to E_d). With X the mean other work of J's d
    // ranks, the other P - d ranks share W' - d X (W' = sum work - w*), and every rank also obeys G:
    //   T >= min_d min_X max(T(s*, d) + max(0, X - E_d) / (3 pp), G(w* / d + X), G((W' - d X) / (P - d))).
    // (d = P: X = W' / P.) The first two terms grow with X and the last falls, so X is found by bisection.
    if (with_critical)
      for (const auto& [len, mask] : t.longest) {
        GroupStats g;
        g.add(len, cost.eta(mask));
        const double ws = cost.work(len, mask), Wp = std::max(0.0, t.average - c) * P - ws;
        double best = std::numeric_limits<double>::infinity();
        for (int d = cost.min_degree(len, cluster); d <= cluster.num_ranks; ++d) {
          const double Td = cost.time(g, d, cluster);
          if (Td >= best) continue;
          const double E = std::max(0.0, Td - ws / d - c);
          auto host = [&](double X) { return std::max(Td + std::max(0.0, X - E) / (3 * n), G(ws / d + X)); };
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
  }
  const double wide = t.wide_work > 0 ? (t.wide_work / P + c) / n : 0.0;
  return {t.single, wide, average, critical};
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
