// Static shapes (PlanOptions::static_shapes) inside the solver: the sequence cap as a plan transform that dynacp
// applies to every candidate before it scores it (as RingSet::project for a ring set), so the search chooses among
// plans that meet it; the degree, capacity and slot caps are met while building or rejected by the scorer.
#pragma once
#include <span>

#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"

namespace dynacp::solve {

/// `plan` with every group of more than shapes.max_sequences sequences split into ceil(n / max_sequences) groups on
/// the same ranks (largest padded rows first onto the part with the fewest rows, ties: the earlier part; each part
/// at most max_sequences); the extra parts run in a slot of their own right after their group's slot. Sequences
/// only leave a group, so every part still fits. Identity when max_sequences is 0 or every group meets it.
Plan split_sequences(Plan plan, const Batch& batch, const Cluster& cluster, const StaticShapes& shapes);

/// `plan` with groups that waste much of their bucket split onto the same ranks into parts that fill smaller
/// buckets: from a group's sequences (largest padded rows first) parts are carved first-fit up to the largest bucket
/// below the remainder's bucket, and the number of carved parts with the least summed priced time
/// (StaticShapes::group_time; the parts run one after another on the group's ranks) is kept, never more than the
/// ranks' max_microbatches slots nor max_sequences sequences a part allow. The carved parts run in slots of their own
/// right after their group's slot. Identity without buckets. `single`: single_stats of the batch.
Plan fit_buckets(Plan plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                 const StaticShapes& shapes, std::span<const GroupStats> single);

/// A plan within `shapes` built without search (dynacp's fallback when no candidate meets them): each sequence,
/// longest first, on the smallest allowed degree that holds it within the largest bucket, first-fit into an open
/// group of that degree (rows and max_sequences permitting); the groups, slowest first, each in a slot of its own on
/// the aligned block of d consecutive ranks (from a multiple of d) with the least loaded busiest rank among those
/// whose ranks have slots left. Empty when some group finds no block.
Plan shape_slots(const Batch& batch, const Cluster& cluster, const CostModel& cost, const StaticShapes& shapes);

}  // namespace dynacp::solve
