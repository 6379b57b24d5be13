// The public front door: plan() validates inputs, runs a strategy, predicts its timeline and validates the plan;
// predict() re-prices any plan; lower_bound() for given options. It sits above the model, solve and sim layers.
#pragma once
#include "dynacp/model/plan.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp {

/// Plans one global batch. Throws InvalidArgument for bad inputs (naming them), Error if a strategy produced a
/// plan that breaks the invariants (a bug).
Plan plan(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options = {});

/// The lower bound for these options: solve::lower_bound for pp = 1; with pipelines, also the per-GPU work plus
/// the smallest possible pipeline fill.
double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options);

/// Re-predicts `plan` (timelines, bubbles, lower bound) under the given model and options: the group timeline
/// evaluator for pp = 1, the pipeline simulator (1F1B, interleaved when vpp > 1) for pp > 1, where a group's
/// time T splits into forward T/(3 pp vpp) and backward 2T/(3 pp vpp) per stage-chunk.
Predicted predict(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options = {});

}  // namespace dynacp
