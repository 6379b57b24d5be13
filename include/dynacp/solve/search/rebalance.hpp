// Rebalancing the one-rank work of a plan: every sequence of a one-rank group taken out and packed anew, largest
// first, onto the rank where it finishes earliest, the plan's rings kept as they are. See docs/strategies.md.
#pragma once
#include "dynacp/model/plan.hpp"

namespace dynacp {
struct PlanOptions;
}

namespace dynacp::solve {

/// `start` with its one-rank groups repacked, when that lowers score(); else `start` unchanged. The groups of two or
/// more ranks keep their ranks, sequences and run order; the sequences of the one-rank groups go, largest work
/// (CostModel::work) first, ties by id, to the rank where they finish earliest (its finish time on the group
/// timeline without the one-rank groups for pp = 1, its summed group time for pp > 1, plus what it was given so
/// far; ties: the lower rank): into its last new one-rank group when the padded rows still fit the token capacity,
/// else into a new one. The new groups run after each rank's rings. A plan of many equal hot ranks - a long ring
/// whose ranks each also carry a one-rank group - cannot be improved one move at a time (the step is the slowest
/// rank); this move levels them all at once. Skipped (start returned) under CountPolicy::Equal or vpp > 1, whose
/// microbatch counts a repack would change, and when the plan has fewer than two one-rank groups' worth of
/// sequences to move. Deterministic.
Plan rebalance_solos(Plan start, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                     const PlanOptions& options);

}  // namespace dynacp::solve
