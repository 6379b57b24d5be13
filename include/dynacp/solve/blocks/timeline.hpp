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

/// Ring order polish of a pipelined plan whose score is t. A plan is a global order of its groups (slot by slot),
/// and any global order keeps every two groups in one order on all the ranks they share, so it cannot deadlock;
/// laid out again as early as each rank allows (a group's slot is one past its ranks' last), every rank keeps its
/// list. Unlike whole-slot moves, a ring can so pass the rings of other ranks it shared a slot with (on longcontext
/// and github the two halves of the pool each order their own half-pool rings around the full-pool ones). Moves a
/// ring (degree >= 2) of the rank with the slowest 1F1B list (one_f_one_b_makespan, without ring synchronisation)
/// before another group of that rank, or after its last, where that shortens the rank's list; failing that, a ring
/// that shares ranks with that rank's rings (what they wait for) before another ring on its ranks or after their
/// last. The score decides (first improvement, at most 64 scorings). Returns the plan unchanged (same slots) when no
/// move lowers the score, else the moved order laid out anew. Every rank keeps its groups and its microbatch count.
/// `parallel` (optional) scores the moves as many at a time as the solve has threads; the plan does not depend on it.
Plan reorder_rings(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options, const ParallelFor& parallel = {});

/// Rank-class order polish of a pipelined plan whose score is *t (updated when it improves). Ranks whose lists
/// have one length and the same rings of degree >= 3 at the same places form a class; one permutation of list
/// places applied to every rank of a class keeps those rings aligned. Each class keeps its 6 best permutations by its
/// slowest 1F1B list (one_f_one_b_makespan; every permutation up to 7 places, else first-improvement moves). The
/// lists are merged back into one global order (none when the new lists order two shared groups both ways) and the
/// simulator decides: first every class at its best at once, then one class at a time through its candidates, at
/// most 96 scorings. Every rank keeps its groups and microbatch count. `parallel` (optional) runs the classes'
/// candidate searches, which are independent, on several threads; the plan does not depend on it.
Plan reorder_classes(Plan plan, double* t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                     const PlanOptions& options, const ParallelFor& parallel = {});

}  // namespace dynacp::solve
