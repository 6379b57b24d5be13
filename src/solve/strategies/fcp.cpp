// `fcp`: our re-implementation of FCP's scheduler - memory-aware Best-Fit-Decreasing atomic groups, its 2D dynamic
// program over any-integer CP degrees, node-contiguous placement, in waves that fit the pool.
#include <algorithm>

#include "dynacp/solve/blocks/degrees.hpp"
#include "dynacp/solve/blocks/packing.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

Plan fcp(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions&) {
  Plan plan;
  const auto ids = all_ids(batch);
  std::vector<std::vector<AtomicGroup>> packed;  // each wave's atomic groups, from split_waves
  split_waves(batch, cost, cluster, ids, &packed);
  for (const auto& groups : packed) {
    DegreeProblem prob;
    prob.ranks = cluster.num_ranks;
    for (const auto& g : groups) {
      prob.min_degree.push_back(g.min_degree);
      prob.max_degree.push_back(cost.best_degree(g.stats, g.min_degree, cluster));
    }
    prob.time = [&](std::size_t i, int d) { return cost.time(groups[i].stats, d, cluster); };
    const auto alloc = allocate_degrees(prob);
    const auto rings = place_groups(alloc.degrees, cluster);
    std::vector<Group> slot;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      Group g{rings[i], groups[i].ids};
      std::sort(g.sequences.begin(), g.sequences.end());
      slot.push_back(std::move(g));
    }
    plan.microbatches.push_back(std::move(slot));
  }
  return plan;
}

}  // namespace dynacp::solve
