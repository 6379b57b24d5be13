#include "dynacp/solve/blocks/evaluate.hpp"

#include <algorithm>

#include "dynacp/solve/bounds/lower_bound.hpp"

namespace dynacp::solve {

Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  return evaluate(plan, batch, cluster, cost, StaticShapes{});
}

Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const StaticShapes& shapes) {
  const bool padded = !shapes.token_buckets.empty();
  const std::vector<GroupStats> single = padded ? single_stats(batch, cost) : std::vector<GroupStats>{};
  Predicted p;
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  p.per_rank_time.assign(P, 0.0);
  p.step_time = group_timeline(
      plan, cluster.num_ranks,
      [&](const Group& g) {
        return padded ? shapes.group_time(cost, g, single, batch, cluster) : cost.group_time(g, batch, cluster);
      },
      [&](const Group& g, double t) {
        for (int r : g.ranks) p.per_rank_time[static_cast<std::size_t>(r)] += t;
        const std::int64_t rows = group_rows(batch, cluster, g.sequences, g.degree());
        const std::int64_t held = padded && rows <= shapes.token_buckets.back() ? shapes.bucket_of(rows) : rows;
        p.peak_tokens_per_rank = std::max(p.peak_tokens_per_rank, held);
      });
  double busy = 0.0;
  for (double t : p.per_rank_time) busy += t;
  p.bubble_fraction = p.step_time > 0 ? 1.0 - busy / (p.step_time * static_cast<double>(P)) : 0.0;
  p.lower_bound = lower_bound(batch, cluster, cost);
  p.padding_fraction = shapes.padding_fraction(plan, batch, cluster);
  return p;
}

}  // namespace dynacp::solve
