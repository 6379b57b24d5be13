#include "dynacp/solve/blocks/timeline.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

TimelineBuilder::TimelineBuilder(const Batch& batch, const Cluster& cluster, const CostModel& cost)
    : batch_(batch), cluster_(cluster), cost_(cost), free_(static_cast<std::size_t>(cluster.num_ranks), 0.0) {}

double TimelineBuilder::time_of(const std::vector<int>& ranks, const GroupStats& stats) const {
  return cost_.time(stats, static_cast<int>(ranks.size()), cluster_.crosses_nodes(ranks), cluster_);
}

double TimelineBuilder::add(std::vector<int> ranks, std::vector<std::int64_t> ids) {
  const GroupStats st = group_stats(batch_, cost_, ids);
  double start = 0.0;
  for (int r : ranks) start = std::max(start, free_[static_cast<std::size_t>(r)]);
  const double end = start + time_of(ranks, st);
  for (int r : ranks) free_[static_cast<std::size_t>(r)] = end;
  std::sort(ids.begin(), ids.end());
  groups_.push_back({std::move(ranks), std::move(ids)});
  return end;
}

double TimelineBuilder::makespan() const { return *std::max_element(free_.begin(), free_.end()); }

Plan TimelineBuilder::to_plan() const { return lay_out_groups(groups_); }

Plan lay_out_groups(std::vector<Group> groups) {
  Plan plan;
  int ranks = 0;
  for (const auto& g : groups)
    for (int r : g.ranks) ranks = std::max(ranks, r + 1);
  std::vector<int> next(static_cast<std::size_t>(ranks), 0);
  for (auto& g : groups) {
    int slot = 0;
    for (int r : g.ranks) slot = std::max(slot, next[static_cast<std::size_t>(r)]);
    for (int r : g.ranks) next[static_cast<std::size_t>(r)] = slot + 1;
    if (plan.microbatches.size() <= static_cast<std::size_t>(slot))
      plan.microbatches.resize(static_cast<std::size_t>(slot) + 1);
    plan.microbatches[static_cast<std::size_t>(slot)].push_back(std::move(g));
  }
  return plan;
}

double score(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
             const PlanOptions& options) {
  return options.score ? options.score(plan) : evaluate(plan, batch, cluster, cost).step_time;
}

std::optional<Plan> best_of(std::vector<Plan> candidates, const Batch& batch, const Cluster& cluster,
                            const CostModel& cost, const PlanOptions& options) {
  std::size_t best = candidates.size();
  double best_t = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (const double t = score(candidates[i], batch, cluster, cost, options); t < best_t) best = i, best_t = t;
  if (best == candidates.size()) return std::nullopt;
  return std::move(candidates[best]);
}

}  // namespace dynacp::solve
