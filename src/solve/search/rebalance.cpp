#include "dynacp/solve/search/rebalance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

namespace {

// Per rank: its finish time on the group timeline (pp = 1) or its summed group time (pp > 1) over `groups`.
std::vector<double> finish_times(const std::vector<Group>& groups, const Batch& batch, const Cluster& cluster,
                                 const CostModel& cost, int pp) {
  std::vector<double> h(static_cast<std::size_t>(cluster.num_ranks), 0.0);
  for (const Group& g : groups) {
    const double t = cost.group_time(g, batch, cluster);
    double start = 0.0;
    if (pp <= 1)
      for (int r : g.ranks) start = std::max(start, h[static_cast<std::size_t>(r)]);
    for (int r : g.ranks) h[static_cast<std::size_t>(r)] = pp <= 1 ? start + t : h[static_cast<std::size_t>(r)] + t;
  }
  return h;
}

// One rank's new one-rank groups while they are packed: the last one's stats and padded rows.
struct Bins {
  std::vector<Group> groups;
  GroupStats last;
  std::int64_t rows = 0;
};

}  // namespace

Plan rebalance_solos(Plan start, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                     const PlanOptions& options) {
  if (options.pp > 1 && (options.count_policy == CountPolicy::Equal || options.vpp > 1)) return start;
  std::vector<Group> kept;
  std::vector<std::int64_t> solos;
  std::size_t solo_groups = 0;
  for (const auto& slot : start.microbatches)
    for (const Group& g : slot) {
      if (g.degree() != 1) {
        kept.push_back(g);
        continue;
      }
      ++solo_groups;
      solos.insert(solos.end(), g.sequences.begin(), g.sequences.end());
    }
  if (solo_groups < 2) return start;
  const double before = score(start, batch, cluster, cost, options);
  if (!std::isfinite(before)) return start;
  const std::vector<GroupStats> single = single_stats(batch, cost);
  auto work = [&](std::int64_t i) {
    const auto k = static_cast<std::size_t>(i);
    return cost.work(batch.lengths[k], batch.mask(k));
  };
  std::stable_sort(solos.begin(), solos.end(), [&](std::int64_t a, std::int64_t b) {
    const double wa = work(a), wb = work(b);
    return wa != wb ? wa > wb : a < b;
  });
  const std::int64_t cap = cost.token_capacity(cluster);
  std::vector<double> h = finish_times(kept, batch, cluster, cost, options.pp);
  std::vector<Bins> bins(h.size());
  auto solo_time = [&](const GroupStats& g) { return cost.time(g, 1, false, cluster); };
  for (std::int64_t s : solos) {
    const GroupStats& one = single[static_cast<std::size_t>(s)];
    const std::int64_t rows = cluster.padded_rows(batch.lengths[static_cast<std::size_t>(s)], 1);
    std::size_t best = h.size();
    double best_end = 0.0;
    bool best_joins = false;
    for (std::size_t r = 0; r < h.size(); ++r) {
      const Bins& b = bins[r];
      const bool joins = !b.groups.empty() && b.rows + rows <= cap;
      GroupStats both = b.last;
      both.merge(one);
      const double end = joins ? h[r] - solo_time(b.last) + solo_time(both) : h[r] + solo_time(one);
      if (best == h.size() || end < best_end) best = r, best_end = end, best_joins = joins;
    }
    Bins& b = bins[best];
    if (!best_joins) b.groups.push_back(Group{{static_cast<int>(best)}, {}}), b.last = GroupStats{}, b.rows = 0;
    b.groups.back().sequences.push_back(s);
    b.last.merge(one), b.rows += rows, h[best] = best_end;
  }
  for (std::size_t j = 0;; ++j) {  // the ranks' j-th new groups, in rank order
    bool any = false;
    for (Bins& b : bins)
      if (j < b.groups.size()) {
        std::sort(b.groups[j].sequences.begin(), b.groups[j].sequences.end());
        kept.push_back(std::move(b.groups[j])), any = true;
      }
    if (!any) break;
  }
  Plan next = lay_out_groups(std::move(kept));
  next.version = start.version, next.strategy = start.strategy, next.num_ranks = start.num_ranks;
  next.solve_ms = start.solve_ms;
  return score(next, batch, cluster, cost, options) < before ? next : start;
}

}  // namespace dynacp::solve
