// Plan evaluation without pipelines: per-rank timelines where a group starts when all its ranks are free.
#pragma once
#include <utility>

#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

/// Predicted step time, busy time per rank, peak tokens per rank and bubble fraction of `plan`; the lower bound
/// is filled from lower_bound().
Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost);

/// max(sum of work / P + c, the best time of the hardest sequence alone on any feasible degree, the summed work of
/// the sequences that need more than half the pool / P + c).
/// No plan can be faster under `cost`.
double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost);

/// The lower bound with pipelines of `pp` stages and `vpp` virtual chunks (1F1B, interleaved when vpp > 1):
/// max(single, wide / pp, (sum work / P + c) / pp + (pp - 1)(c + w_min / P) / (pp vpp)); equals lower_bound() for
/// pp = 1. See docs/cost_model.md for the proof.
double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp = 1);

struct LowerBoundTerms {
  double average = 0.0;    ///< sum of work / P + c (every rank in use pays one group overhead)
  double single = 0.0;     ///< best time of the hardest sequence alone
  double wide = 0.0;       ///< sequences needing more than P/2 ranks run one after another: their work / P + c
  double wide_work = 0.0;  ///< the summed work of those sequences
};
/// The terms of lower_bound (which is their maximum).
LowerBoundTerms lower_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost);

}  // namespace dynacp::solve
