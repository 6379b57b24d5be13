// The execution plan of one global batch: the one type every strategy returns.
//
// microbatches[m] is slot m, run in this order by every rank listed in it. Each slot holds CP groups; a group
// is a ring of ranks (its size is its CP degree, any integer >= 1) over a THD pack of sequence ids.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dynacp/model/batch.hpp"
#include "dynacp/model/cluster.hpp"
#include "dynacp/model/cost.hpp"

namespace dynacp {

struct Group {
  std::vector<int> ranks;               ///< ring order; size() is the CP degree
  std::vector<std::int64_t> sequences;  ///< input ids packed into this group
  int degree() const { return static_cast<int>(ranks.size()); }
  bool operator==(const Group&) const = default;
};

struct Predicted {
  double step_time = 0.0;                 ///< seconds until the last rank finishes
  double lower_bound = 0.0;               ///< no plan of this batch can be faster (seconds)
  std::vector<double> per_rank_time;      ///< busy seconds per rank
  std::int64_t peak_tokens_per_rank = 0;  ///< most rows (tokens and their padding) a rank holds in any group
  // Extensions (later format additions never remove fields above).
  double bubble_fraction = 0.0;  ///< idle share of step_time x P (pipeline bubbles + imbalance)
  /// CUDA-graph mode (PlanOptions::static_shapes): padded rows the token buckets add / all rows the ranks hold, over
  /// every group; 0 when off.
  double padding_fraction = 0.0;
  bool operator==(const Predicted&) const = default;
};

struct Plan {
  static constexpr int kVersion = 1;
  int version = kVersion;
  std::string strategy;
  int num_ranks = 0;
  double solve_ms = 0.0;
  std::vector<std::vector<Group>> microbatches;
  Predicted predicted;
  /// Metadata (not part of the digest): the dynacp candidate family that produced the plan (empty for the other
  /// strategies), and whether the solve stopped at its time limit with the best plan found so far.
  std::string family;
  bool partial = false;

  /// Number of slots rank r takes part in.
  int microbatches_of(int rank) const;
  /// microbatches_of every rank in [0, num_ranks), in one pass.
  std::vector<int> microbatch_counts(int num_ranks) const;
  /// Checks the invariants; throws InvalidArgument describing the first violation:
  /// every id in [0, n) exactly once, ranks in [0, P) and at most once per slot, no empty group, and every
  /// group's padded rows per rank, sum of k * ceil(s / (k d)) (Cluster::padded_rows), within the token capacity.
  void validate(const Batch& batch, const Cluster& cluster, const CostModel& cost) const;
  /// A stable 64-bit FNV-1a digest of the assignment (strategy, ranks, slots, groups); excludes timings.
  std::uint64_t digest() const;
  /// A 128-bit key of the assignment alone (slots, groups, ranks, sequences; not strategy or metadata) from two
  /// independent 64-bit hashes, for memoising per-plan results within one process (dynacp's scorer). Not stable
  /// across versions; digest() is the stable one.
  std::pair<std::uint64_t, std::uint64_t> fingerprint() const;
};

}  // namespace dynacp
