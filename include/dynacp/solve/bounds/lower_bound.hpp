// The lower bound on the step time: the maximum of a registry of named terms (src/solve/bounds/terms.cpp), each one
// function with its validity condition in its doc comment (src/solve/bounds/context.hpp declares them). No plan of
// the batch can be faster under the cost model; docs/cost_model.md gives the proofs.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

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

/// The names of the bound's terms in registry order (the order they are evaluated and maximised in): "single",
/// "wide", "average", "critical", "shared", "cover".
std::vector<std::string> bound_term_names();

/// Every term's value on this instance, in the order of bound_term_names(); a term whose validity condition does
/// not hold (e.g. the 1F1B terms under vpp > 1, the cover term with with_cover false) is 0. lower_bound() is their
/// maximum.
std::vector<double> bound_term_values(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp,
                                      int vpp = 1, bool with_cover = true);

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
