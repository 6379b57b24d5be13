// Order polishes of pipelined plans: rings moved in the global group order (reorder_rings) and one permutation of
// list places per class of alike ranks (reorder_classes). The dynacp driver runs both on its chosen plan.
#pragma once
#include "dynacp/model/plan.hpp"
#include "dynacp/solve/blocks/timeline.hpp"

namespace dynacp {
struct PlanOptions;
}

namespace dynacp::solve {

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
