// Plan evaluation without pipelines: per-rank timelines where a group starts when all its ranks are free.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

/// The pp = 1 group timeline, the one place its rule is written: groups run in plan order, each starting once all of
/// its ranks are free and holding them for time_of(g) seconds; visit(g, t) sees every group with its time. Returns
/// the step time, when the last of `num_ranks` ranks is free (0 with no ranks).
template <class TimeOf, class Visit>
double group_timeline(const Plan& plan, int num_ranks, TimeOf&& time_of, Visit&& visit) {
  std::vector<double> free(static_cast<std::size_t>(num_ranks), 0.0);
  for (const auto& slot : plan.microbatches)
    for (const Group& g : slot) {
      double start = 0.0;
      for (int r : g.ranks) start = std::max(start, free[static_cast<std::size_t>(r)]);
      const double t = time_of(g);
      for (int r : g.ranks) free[static_cast<std::size_t>(r)] = start + t;
      visit(g, t);
    }
  double last = 0.0;
  for (double f : free) last = std::max(last, f);
  return last;
}

/// Predicted step time, busy time per rank, peak tokens per rank and bubble fraction of `plan`; the lower bound
/// is filled from lower_bound().
Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost);

/// max(sum of work / P + c, the best time of the hardest sequence alone on any feasible degree, the summed work of
/// the sequences that need more than half the pool / P + c).
/// No plan can be faster under `cost`.
double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost);

/// The lower bound with pipelines of `pp` stages and `vpp` virtual chunks (1F1B, interleaved when vpp > 1):
/// max(single, wide / pp, (sum work / P + c) / pp + (pp - 1)(c + w_min / P) / (pp vpp)), and for vpp = 1 also the
/// best split of the mean work into microbatches (one_f_one_b_floor) and the hardest sequence's microbatch with the
/// other work its ranks must run, the hardest few sequences either on disjoint rings or two meeting on a rank, and
/// the chains of the hardest five (six when the sixth needs more than a node) along the ranks their rings share (the
/// cover term, left out when `with_cover` is false: the slowest term, which no strategy reads); equals lower_bound()
/// for pp = 1. See docs/cost_model.md for the proofs.
double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp = 1,
                   bool with_cover = true);

struct PipelinedBoundTerms {
  double single = 0.0;    ///< best time of the hardest sequence alone (its microbatch crosses every stage)
  double wide = 0.0;      ///< wide sequences' work / P + c, over pp
  double average = 0.0;   ///< the mean work in microbatches: drain term, and for vpp = 1 the best split
  double critical = 0.0;  ///< vpp = 1: the hardest sequence's microbatch with the other work of its ranks
  double shared = 0.0;    ///< vpp = 1: the hardest sequences on disjoint rings, or two of them meeting on a rank
  double cover = 0.0;     ///< vpp = 1: the hardest few sequences' rings, chained along the ranks they share
};
/// The terms of the pipelined lower_bound (which is their maximum); pp = 1 gives the plain terms, critical, shared
/// and cover 0. with_cover = false leaves out the cover term (0), the costliest (up to about a second at P = 64).
PipelinedBoundTerms pipelined_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                          int vpp = 1, bool with_cover = true);

struct LowerBoundTerms {
  double average = 0.0;    ///< sum of work / P + c (every rank in use pays one group overhead)
  double single = 0.0;     ///< best time of the hardest sequence alone
  double wide = 0.0;       ///< sequences needing more than P/2 ranks run one after another: their work / P + c
  double wide_work = 0.0;  ///< the summed work of those sequences
  std::vector<std::pair<std::int64_t, Mask>> longest;  ///< the longest sequence of each mask kind present
};
/// The terms of lower_bound (which is their maximum).
LowerBoundTerms lower_bound_terms(const Batch& batch, const Cluster& cluster, const CostModel& cost);

}  // namespace dynacp::solve
