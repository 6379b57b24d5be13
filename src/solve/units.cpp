#include "dynacp/solve/units.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/balance.hpp"
#include "dynacp/solve/microbatch.hpp"

namespace dynacp::solve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kTargets = 2;  // the fastest units a move may go to

struct Packed {
  double makespan = kInf;
  std::vector<std::vector<std::int64_t>> microbatches;  // run order, none empty
};

// One unit's sequences (ids, heaviest first) into m microbatches towards the best split's profile.
Packed pack_unit(const Batch& batch, const Cluster& cluster, const CostModel& cost,
                 const std::vector<std::int64_t>& ids, const std::vector<double>& alone, int width, int m, int pp) {
  const double c = cost.group_overhead;
  const std::int64_t room = cost.token_capacity(cluster) * width;
  double S = m * c;
  for (double t : alone) S += t - c;
  const std::vector<double> profile = one_f_one_b_profile(m, pp);
  const auto M = static_cast<std::size_t>(m);
  std::vector<GroupStats> stats(M);
  std::vector<double> time(M, 0.0);
  std::vector<std::vector<std::int64_t>> bins(M);
  for (std::int64_t id : ids) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
    const double eta = cost.eta(batch.mask(static_cast<std::size_t>(id)));
    std::size_t best = M;
    double best_left = 0.0, best_time = 0.0;
    for (std::size_t j = 0; j < M; ++j) {
      if (stats[j].tokens + len > room) continue;
      GroupStats g = stats[j];
      g.add(len, eta);
      const double t = cost.time(g, width, false, cluster);
      const double left = profile[j] * S / m - t;
      if (best == M || left > best_left) best = j, best_left = left, best_time = t;
    }
    if (best == M) return {};
    stats[best].add(len, eta);
    time[best] = best_time;
    bins[best].push_back(id);
  }
  Packed out;
  std::vector<double> times;
  for (std::size_t j = 0; j < M; ++j)
    if (!bins[j].empty()) {
      std::sort(bins[j].begin(), bins[j].end());
      out.microbatches.push_back(std::move(bins[j]));
      times.push_back(time[j]);
    }
  out.makespan = one_f_one_b_makespan(times, pp);
  return out;
}

}  // namespace

Plan profile_units(const Batch& batch, const Cluster& cluster, const CostModel& cost, int width, int pp,
                   bool equal_counts) {
  if (width < 1 || pp < 1) invalid("profile_units: width and pp must be >= 1, got ", width, " and ", pp);
  Plan plan;
  plan.strategy = "dynacp";
  plan.num_ranks = cluster.num_ranks;
  const int P = cluster.num_ranks;
  if (width > cluster.ranks_per_node || cluster.ranks_per_node % width != 0) return plan;
  const std::int64_t room = cost.token_capacity(cluster) * width;
  const std::size_t n = batch.size();
  std::vector<double> alone(n), weight(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (batch.lengths[i] > room) return plan;
    GroupStats g;
    g.add(batch.lengths[i], cost.eta(batch.mask(i)));
    alone[i] = cost.time(g, width, false, cluster);
    weight[i] = (alone[i] - cost.group_overhead) * width;
  }
  const int units = P / width;
  const Parts parts = balance(weight, units);
  const int m_max = std::min(32, 8 * pp);
  auto heavier = [&](std::int64_t x, std::int64_t y) {
    const double tx = alone[static_cast<std::size_t>(x)], ty = alone[static_cast<std::size_t>(y)];
    return tx > ty || (tx == ty && x < y);
  };
  // The packing of one unit's sequences (heaviest first) for every m in [lo, hi] (capped by their number).
  auto pack_all = [&](const std::vector<std::int64_t>& ids, int lo, int hi) {
    std::vector<double> t;
    for (std::int64_t id : ids) t.push_back(alone[static_cast<std::size_t>(id)]);
    std::vector<Packed> row(static_cast<std::size_t>(m_max));
    for (int m = std::max(lo, 1); m <= std::min<int>(hi, static_cast<int>(ids.size())); ++m)
      row[static_cast<std::size_t>(m - 1)] = pack_unit(batch, cluster, cost, ids, t, width, m, pp);
    return row;
  };
  auto best_m = [](const std::vector<Packed>& row) {  // 0 when no m fits
    int m = 0;
    double best = kInf;
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k].makespan < best) best = row[k].makespan, m = static_cast<int>(k) + 1;
    return m;
  };
  std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(units));
  std::vector<std::vector<Packed>> packs(static_cast<std::size_t>(units));
  for (std::size_t u = 0; u < ids.size(); ++u) {
    ids[u].assign(parts[u].begin(), parts[u].end());
    std::stable_sort(ids[u].begin(), ids[u].end(), heavier);
    packs[u] = pack_all(ids[u], 1, m_max);
  }
  // the m each unit runs (0: no sequences)
  std::vector<int> chosen(static_cast<std::size_t>(units), 0);
  if (equal_counts) {
    double best = kInf;
    int common = 0;
    for (int m = 1; m <= m_max; ++m) {
      double worst = 0.0;
      for (const auto& row : packs) {
        const Packed& p = row[static_cast<std::size_t>(m - 1)];
        worst = std::max(worst, static_cast<int>(p.microbatches.size()) == m ? p.makespan : kInf);
      }
      if (worst < best) best = worst, common = m;
    }
    if (common == 0) return plan;
    std::fill(chosen.begin(), chosen.end(), common);
  } else {
    for (std::size_t u = 0; u < packs.size(); ++u) {
      chosen[u] = best_m(packs[u]);
      if (!ids[u].empty() && chosen[u] == 0) return plan;  // no m fits the unit's tokens
    }
    // Balance: move one sequence from the slowest unit to one of the kTargets fastest, the move that lowers the
    // slower of the two the most (each re-packed for m within 1 of its count), while one helps, at most `units` times.
    auto span_of = [&](std::size_t u) {
      return chosen[u] ? packs[u][static_cast<std::size_t>(chosen[u] - 1)].makespan : 0.0;
    };
    for (int round = 0; round < units; ++round) {
      std::vector<std::size_t> by_span(packs.size());
      std::iota(by_span.begin(), by_span.end(), 0);
      std::stable_sort(by_span.begin(), by_span.end(),
                       [&](std::size_t x, std::size_t y) { return span_of(x) < span_of(y); });
      const std::size_t hi = by_span.back();
      double best = span_of(hi);
      std::size_t pick = ids[hi].size(), to = hi;
      std::vector<Packed> best_hi, best_lo;
      for (std::size_t r = 0; r < std::min<std::size_t>(kTargets, by_span.size() - 1); ++r) {
        const std::size_t lo = by_span[r];
        for (std::size_t k = 0; k < ids[hi].size(); ++k) {
          std::vector<std::int64_t> a = ids[hi], b = ids[lo];
          const std::int64_t s = a[k];
          a.erase(a.begin() + static_cast<std::ptrdiff_t>(k));
          b.insert(std::upper_bound(b.begin(), b.end(), s, heavier), s);
          auto ra = pack_all(a, chosen[hi] - 1, chosen[hi] + 1), rb = pack_all(b, chosen[lo] - 1, chosen[lo] + 1);
          const int ma = best_m(ra), mb = best_m(rb);
          if ((!a.empty() && ma == 0) || mb == 0) continue;
          const double t = std::max(ma ? ra[static_cast<std::size_t>(ma - 1)].makespan : 0.0,
                                    rb[static_cast<std::size_t>(mb - 1)].makespan);
          if (t < best - 1e-12) best = t, pick = k, to = lo, best_hi = std::move(ra), best_lo = std::move(rb);
        }
      }
      if (pick == ids[hi].size()) break;
      const std::size_t lo = to;
      const std::int64_t s = ids[hi][pick];
      ids[hi].erase(ids[hi].begin() + static_cast<std::ptrdiff_t>(pick));
      ids[lo].insert(std::upper_bound(ids[lo].begin(), ids[lo].end(), s, heavier), s);
      packs[hi] = std::move(best_hi), packs[lo] = std::move(best_lo);
      chosen[hi] = best_m(packs[hi]), chosen[lo] = best_m(packs[lo]);
    }
  }
  for (int u = 0; u < units; ++u) {
    const int m = chosen[static_cast<std::size_t>(u)];
    if (m == 0) continue;
    auto& mbs = packs[static_cast<std::size_t>(u)][static_cast<std::size_t>(m - 1)].microbatches;
    if (plan.microbatches.size() < mbs.size()) plan.microbatches.resize(mbs.size());
    std::vector<int> ranks(static_cast<std::size_t>(width));
    std::iota(ranks.begin(), ranks.end(), u * width);
    for (std::size_t j = 0; j < mbs.size(); ++j) plan.microbatches[j].push_back({ranks, std::move(mbs[j])});
  }
  return plan;
}

}  // namespace dynacp::solve
