// Building plans as per-rank timelines: groups are appended in the order each rank runs them; a group starts
// when all its ranks are free. to_plan() assigns slots so that the evaluator reproduces the same start times.
#pragma once
#include <functional>
#include <optional>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp {
struct PlanOptions;
}

namespace dynacp::solve {

class TimelineBuilder {
 public:
  TimelineBuilder(const Batch& batch, const Cluster& cluster, const CostModel& cost);

  /// Appends a group; returns its finish time.
  double add(std::vector<int> ranks, std::vector<std::int64_t> ids);
  /// Time the group would take on these ranks (node crossing taken from the ranks).
  double time_of(const std::vector<int>& ranks, const GroupStats& stats) const;

  const std::vector<double>& free() const { return free_; }
  double makespan() const;
  /// Slot of each group = 1 + the latest slot any of its ranks used before it.
  Plan to_plan() const;

 private:
  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  std::vector<Group> groups_;
  std::vector<double> free_;
};

/// Groups in run order laid out in slots: each group's slot is 1 + the latest slot any of its ranks used before it
/// (what TimelineBuilder::to_plan does with the groups it was given).
Plan lay_out_groups(std::vector<Group> groups);

/// Scores a plan with options.score, or the group-timeline step time when that is empty.
double score(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
             const PlanOptions& options);

/// The candidate with the lowest finite score (ties: the earliest); none when every score is infinite (plans the
/// pipeline simulator rejects) or there is no candidate. Used by strategies that keep the best of several
/// constructions.
std::optional<Plan> best_of(std::vector<Plan> candidates, const Batch& batch, const Cluster& cluster,
                            const CostModel& cost, const PlanOptions& options);

/// Runs f(i) for every i in [0, n), possibly on several threads; callers keep each result in its own slot.
using ParallelFor = std::function<void(std::size_t n, const std::function<void(std::size_t)>& f)>;

/// f(i) for every i in [0, n): on `parallel` when one is given, else in index order on this thread.
template <class F>
void run_tasks(const ParallelFor& parallel, std::size_t n, F&& f) {
  if (parallel)
    parallel(n, f);
  else
    for (std::size_t i = 0; i < n; ++i) f(i);
}

}  // namespace dynacp::solve
