#include "dynacp/solve/blocks/evaluate.hpp"

#include <algorithm>

#include "dynacp/solve/bounds/lower_bound.hpp"

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

}  // namespace dynacp::solve
