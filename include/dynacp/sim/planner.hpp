// The public planning entry point: validate inputs, run a strategy, predict its timeline, validate the plan.
#pragma once
#include "dynacp/model/plan.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp {

/// Plans one global batch. Throws InvalidArgument for bad inputs (naming them), Error if a strategy produced a
/// plan that breaks the invariants (a bug).
Plan plan(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options = {});

/// Re-predicts `plan` (timelines, bubbles, lower bound) under the given model and options.
Predicted predict(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options = {});

}  // namespace dynacp
