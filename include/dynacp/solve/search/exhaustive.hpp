// Exhaustive search over every plan of a tiny instance (a few ranks, a few sequences): the reference optimum that
// tests hold the lower bound and dynacp against (tests/cpp/test_exhaustive.cpp, docs/strategies.md).
#pragma once
#include <cstdint>
#include <limits>

#include "dynacp/model/plan.hpp"

namespace dynacp {
struct PlanOptions;
}

namespace dynacp::solve {

struct ExhaustiveLimits {
  /// Complete plans scored at most (each one options.score call when pp > 1); the search stops there and reports
  /// itself incomplete.
  std::int64_t max_leaves = 2'000'000;
  /// Groups appended at most (the search's nodes); beyond, it stops as for max_leaves.
  std::int64_t max_groups = 50'000'000;
  /// Seconds: only plans faster than this are sought (a known plan's score, a little above it to find its equals,
  /// cuts the search). When none is, the result has time +inf and an empty plan.
  double upper = std::numeric_limits<double>::infinity();
};

struct ExhaustiveResult {
  Plan best;                      ///< the fastest plan found (slots laid out as early as each rank allows)
  double time = 0.0;              ///< its score (seconds; +inf when no plan was feasible or beat limits.upper)
  std::int64_t leaves = 0;        ///< complete plans scored
  std::int64_t groups_tried = 0;  ///< groups (sequence set, rank set) appended during the search
  bool complete = true;           ///< false when max_leaves stopped the search (best is then only the best seen)
};

/// The fastest plan of `batch` under score() (timeline.hpp) with `options` (pp, count policy, options.score).
///
/// A plan is a global order of groups (a sequence set on a rank set; the ring order within a group does not change
/// its time), laid out slot by slot as early as each rank allows, so every rank runs its groups in that order. The
/// search appends one group at a time: every nonempty subset of the sequences not yet placed, on every rank set
/// whose padded rows fit the token capacity (group_rows, the Plan::validate rule), of any size and across nodes or
/// not. Two symmetries are broken without losing any plan: ranks no group has used yet are interchangeable within a
/// node, and nodes no group has used are interchangeable (a group takes the lowest unused ranks of a node, and
/// wholly unused nodes in index order); and two consecutive groups on disjoint rank sets commute (they run the
/// same per-rank lists either way), so they are kept only with the lower first sequence id first. Branches are
/// cut by bounds that no completion can beat: for pp = 1 the timeline so far (its latest rank, the rank-time left
/// over the pool, the hardest remaining sequence after the earliest free rank); for pp > 1 a rank's summed group
/// times / pp and the slowest group (a microbatch crosses every stage forward and back). Plans that break the count
/// policy (equal counts, or multiples of pp when vpp > 1) are not scored. Throws InvalidArgument beyond 16 ranks or
/// 16 sequences (the masks are 16 bits; tiny instances are the point).
ExhaustiveResult exhaustive_optimum(const Batch& batch, const Cluster& cluster, const CostModel& cost,
                                    const PlanOptions& options, const ExhaustiveLimits& limits = {});

}  // namespace dynacp::solve
