#include "dynacp/sim/planner.hpp"

#include <chrono>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/evaluate.hpp"

namespace dynacp {

Predicted predict(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options) {
  (void)options;  // pipeline-aware prediction (pp > 1) is layered on here
  return solve::evaluate(plan, batch, cluster, cost);
}

Plan plan(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  batch.validate();
  cluster.validate();
  cost.validate();
  options.validate();
  const auto& strategy = solve::find_strategy(options.strategy);
  const std::int64_t cap = cost.token_capacity(cluster);
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (batch.lengths[i] > cap * cluster.num_ranks)
      invalid("sequence ", i, " has ", batch.lengths[i], " tokens but the whole pool of ", cluster.num_ranks,
              " ranks holds at most ", cap * cluster.num_ranks, " (", cap, " per rank)");

  const auto t0 = std::chrono::steady_clock::now();
  Plan out = strategy.fn(batch, cluster, cost, options);
  out.solve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.strategy = strategy.name;
  out.num_ranks = cluster.num_ranks;
  out.version = Plan::kVersion;
  try {
    out.validate(batch, cluster, cost);
  } catch (const InvalidArgument& e) {
    throw Error(std::string("strategy '") + strategy.name + "' produced an invalid plan (a bug): " + e.what());
  }
  out.predicted = predict(out, batch, cluster, cost, options);
  return out;
}

}  // namespace dynacp
