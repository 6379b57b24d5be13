// Strategy registry: name -> solver; every solver returns the same Plan type.
#pragma once
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"
#include "dynacp/solve/strategies/dynacp/tuning.hpp"

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
  /// `dynacp` only: every tuning constant of its search (DynacpTuning); the defaults are the benchmarked ones.
  DynacpTuning tuning;
  /// `dynacp` only: threads that build and score candidates; 0 = the machine's hardware threads. The plan is
  /// bit-identical for every thread count.
  int threads = 0;
  /// `threads`, with 0 resolved to the hardware threads (at least 1): the one place the solver's thread count is read.
  int thread_count() const {
    const int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
    return n > 0 ? n : 1;
  }
  /// `dynacp` only: seconds after which no new candidate is built; the best plan found so far is returned with
  /// Plan::partial set. 0 = no limit.
  double time_limit_s = 0.0;
  /// Rings (pool ranks, ring order; 2 or more ranks each) every group of more than one rank must use: the process
  /// groups a runtime pre-builds (TransformerEngine needs one per ring). `dynacp` picks its rings and degrees from the
  /// set and scores each candidate on the set (solve/blocks/ring_set.hpp), so it chooses among constrained plans; the
  /// other strategies' plans are projected onto the set after their solve (the fallback). Empty = any ring.
  std::vector<std::vector<int>> ring_set;
  /// CUDA-graph mode (model/shapes.hpp): the shapes every group must have. `dynacp` plans under them (degrees from
  /// cp_sizes on a ring set of node-aligned tilings unless ring_set is given, capacity = the largest bucket, the
  /// sequence and slot caps) and scores candidates with their padding; the other strategies raise InvalidArgument.
  /// Empty (the default) = off, and every plan is bit-identical to a solve without the field.
  StaticShapes static_shapes;
  /// Called between candidate builds on the calling thread; may throw to abort the solve (Python's bindings raise
  /// KeyboardInterrupt from it on Ctrl-C). Empty = never.
  std::function<void()> check_interrupt;
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
/// The names of dynacp's candidate families in registry order (the values Plan::family takes, besides
/// "pool-slots", the fallback when no candidate meets the count policy).
std::vector<std::string> dynacp_families();

}  // namespace solve
}  // namespace dynacp
