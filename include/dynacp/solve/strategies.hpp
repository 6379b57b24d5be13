// Strategy registry: name -> solver; every solver returns the same Plan type.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp {

/// How many microbatches each pipeline runs.
enum class CountPolicy { Equal, Variable };

struct PlanOptions {
  std::string strategy = "fcp";                      ///< registry name, see strategy_names()
  int pp = 1;                                        ///< pipeline stages per rank of the pool
  int vpp = 1;                                       ///< virtual stages per pipeline stage (interleaved 1F1B)
  CountPolicy count_policy = CountPolicy::Variable;  ///< equal or per-rank microbatch counts (pp > 1)
  /// Whether predicted.lower_bound includes the cover term (pp > 1, vpp = 1): the tightest term and by far the
  /// slowest (up to about a second at P = 64, pp = 4). false reports the bound of the other terms, still a bound; the
  /// plan is the same either way (no strategy reads the cover term).
  bool tight_bound = true;
  /// How strategies that weigh several candidate plans score them (lower is better). dynacp::plan sets it to the
  /// full prediction (pipeline simulator when pp > 1); empty means the group-timeline step time.
  std::function<double(const Plan&)> score;
  void validate() const;
};

namespace solve {

/// A strategy fills `microbatches` (and may fill `predicted`); the caller times, evaluates and validates it.
using StrategyFn = Plan (*)(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);

struct StrategyInfo {
  const char* name;
  StrategyFn fn;
  const char* summary;
};

/// All registered strategies in a fixed order.
const std::vector<StrategyInfo>& strategies();
std::vector<std::string> strategy_names();
/// Throws InvalidArgument naming the known strategies if `name` is not registered.
const StrategyInfo& find_strategy(const std::string& name);

Plan packing(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);
Plan fcp(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);
Plan megatron(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);
Plan bytescale(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);
Plan dynacp(const Batch&, const Cluster&, const CostModel&, const PlanOptions&);

}  // namespace solve
}  // namespace dynacp
