// Static shapes (PlanOptions::static_shapes) inside the solver: the sequence cap as a plan transform that dynacp
// applies to every candidate before it scores it (as RingSet::project for a ring set), so the search chooses among
// plans that meet it; the degree, capacity and slot caps are met while building or rejected by the scorer.
#pragma once
#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"

namespace dynacp::solve {

/// `plan` with every group of more than shapes.max_sequences sequences split into ceil(n / max_sequences) groups on
/// the same ranks (largest padded rows first onto the part with the fewest rows, ties: the earlier part; each part
/// at most max_sequences); the extra parts run in a slot of their own right after their group's slot. Sequences
/// only leave a group, so every part still fits. Identity when max_sequences is 0 or every group meets it.
Plan split_sequences(Plan plan, const Batch& batch, const Cluster& cluster, const StaticShapes& shapes);

}  // namespace dynacp::solve
