#include "dynacp/solve/evaluate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

#include "dynacp/solve/cover.hpp"
#include "dynacp/solve/microbatch.hpp"
#include "dynacp/solve/placement.hpp"

namespace dynacp::solve {

Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  Predicted p;
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  p.per_rank_time.assign(P, 0.0);
  p.step_time = group_timeline(
      plan, cluster.num_ranks, [&](const Group& g) { return cost.group_time(g, batch, cluster); },
      [&](const Group& g, double t) {
        for (int r : g.ranks) p.per_rank_time[static_cast<std::size_t>(r)] += t;
        p.peak_tokens_per_rank = std::max(p.peak_tokens_per_rank, group_rows(batch, cluster, g.sequences, g.degree()));
      });
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
// (d - 1) s kv / (d bw) of communication per rank (bw: the hop bandwidth of a d-rank ring), so it hides at most s / d
// (a eta s - (d - 1) kv / bw) - nothing in a wide inter-node ring unless it is very long. The members fit in the ring's
// memory (sum s <= d cap - L), so the work hidden per rank is at most (d cap - L) / d max(0, max_j a eta_j s_j - (d -
// 1) kv / bw), taking the layout (bandwidth) that hides the most. eta_j s_j is the largest over the batch but for s*
// itself.
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
    layout(cost_.hop_bandwidth(d, true, cluster_));
    if (d <= cluster_.ranks_per_node) layout(cost_.hop_bandwidth(d, false, cluster_));
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

// The k hardest sequences (k = 2..kGiants, by work) either meet - two of them on one rank, as two microbatches
// (pair_floor of their fastest times) or in one group (that group's fastest time) - or run on pairwise disjoint
// rings. In the disjoint case a step S needs degrees d_i with T_i(d_i) <= S and sum d_i <= P, and the other work W'
// (all but theirs) must fit: giant i's ranks take at most min(room(T_i, S) + E_i, C(S) - (T_i - c - E_i)) each
// (ChainRoom, <= 3 pp (S - T_i); E_i capped by HideCap with co-members outside the first k), the other ranks at
// most C(S) = the most work G allows within S. Bounding the capacity by each giant's best degree separately (a
// relaxation, so still a bound), S is infeasible when
//   P C(S) + sum_i max_{d_i} d_i (cap_i(d_i) - C(S)) < W'   or   sum_i (least feasible d_i) > P.
// Feasibility grows with S, so the least feasible S is found by bisection; the term is max_k min(meet_k, that S).
// Also returns the cover term (cover_term, cover.cpp) of the hardest kCoverUnits, priced against the same other work
// (0 unless with_cover).
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
  if (!with_cover) return {out, 0.0};
  // The cover term over the hardest `units` sequences, from step `from` on.
  auto cover_over = [&](std::size_t units, double from) {
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
    return cover_term(cluster, pp, static_cast<int>(units), other, from, fluid_room, shares);
  };
  constexpr std::size_t kCoverUnits = 5;
  double cover = cover_over(std::min(k, kCoverUnits), out);
  // A sixth unit when the sixth hardest sequence needs more than a node's memory too (long-context batches). Its
  // search stops at its budgets elsewhere than the five-unit one, so neither dominates; both bound the step, and the
  // six-unit search starts from the five-unit term (it only says whether some step above it is still infeasible).
  if (k > kCoverUnits && dmin[kCoverUnits] > cluster.ranks_per_node) cover = cover_over(kCoverUnits + 1, cover);
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
  // The 1F1B terms below price the forward : backward split at 1 : 2 (the tables of tools/gen_pipeline_bound.py
  // assume it); another CostModel::backward_ratio keeps only the split-free terms above, still a bound.
  if (vpp <= 1 && cost.backward_ratio == 2.0 && one_f_one_b_floor(2, pp) > 1.0) {
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
        const double Td = fastest(cost, cluster, g, d);  // a ring of d <= ranks_per_node may still span nodes
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
    // a full scan (not best_degree's ternary search): a lower bound must hold for any shape of T(d); each degree in
    // its faster layout (a ring of d <= ranks_per_node ranks may span nodes when the inter-node link is the faster)
    const int dmin = cost.min_degree(max_len[k], cluster);
    double best = fastest(cost, cluster, g, dmin);
    for (int d = dmin + 1; d <= cluster.num_ranks; ++d) best = std::min(best, fastest(cost, cluster, g, d));
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
