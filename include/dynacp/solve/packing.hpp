// Packers: first-fit in arrival order (the static baseline) and memory-aware Best-Fit-Decreasing (FCP).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/model/batch.hpp"
#include "dynacp/model/cluster.hpp"
#include "dynacp/model/cost.hpp"

namespace dynacp::solve {

/// A group of packed sequences that must run as one CP ring of at least `min_degree` ranks.
struct AtomicGroup {
  std::vector<std::int64_t> ids;
  GroupStats stats;
  int min_degree = 1;
};

/// First-fit in the given order into packs of `capacity` tokens (a pack is opened when nothing fits).
/// Throws InvalidArgument if one sequence exceeds the capacity.
std::vector<std::vector<std::int64_t>> first_fit(const Batch& batch, std::span<const std::int64_t> ids,
                                                 std::int64_t capacity);

/// Memory-aware Best-Fit-Decreasing. Sequences sorted by length (descending, ties by id). A sequence needing
/// d_min = ceil(s / C) > 1 ranks opens a group with budget d_min * C; others go to the open group with the least
/// remaining budget that still fits (ties: the earliest opened), or open a group of budget C.
std::vector<AtomicGroup> best_fit_decreasing(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                             std::span<const std::int64_t> ids);

/// Splits `ids` into waves whose atomic groups fit the pool (sum of min degrees <= P), balancing tokens across
/// waves (largest first into the lightest wave). Returns the fewest waves found this way.
std::vector<std::vector<std::int64_t>> split_waves(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                                   std::span<const std::int64_t> ids);

}  // namespace dynacp::solve
