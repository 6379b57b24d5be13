// Packers: first-fit in arrival order (the static baseline) and memory-aware Best-Fit-Decreasing (FCP).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/model/batch.hpp"
#include "dynacp/model/cluster.hpp"
#include "dynacp/model/cost.hpp"

namespace dynacp::solve {

/// A group of packed sequences that must run as one CP ring of at least `min_degree` ranks (it fits there once
/// padded, and so on any larger ring: padded rows per rank never grow with the degree).
struct AtomicGroup {
  std::vector<std::int64_t> ids;
  GroupStats stats;
  int min_degree = 1;
};

/// `ids` longest first, equal lengths in their order in `ids`: std::stable_sort by length, descending, done as a sort
/// of contiguous (length, position) keys so that no comparison reads the batch (large batches: far fewer cache
/// misses).
std::vector<std::int64_t> longest_first(const Batch& batch, std::span<const std::int64_t> ids);

/// First-fit in the given order into packs for rings of `degree` ranks holding at most `capacity` padded rows per
/// rank (Cluster::padded_rows; a pack is opened when nothing fits). Throws InvalidArgument if one sequence exceeds
/// the capacity.
std::vector<std::vector<std::int64_t>> first_fit(const Batch& batch, std::span<const std::int64_t> ids,
                                                 const Cluster& cluster, int degree, std::int64_t capacity);

/// Memory-aware Best-Fit-Decreasing. Sequences sorted by length (descending, ties by id). A sequence needing
/// d_min = min_degree(s) > 1 ranks opens a group of that degree; others go to the open group with the least
/// remaining room (free padded rows per rank x its degree) that still fits them once padded at its degree (ties:
/// the earliest opened), or open a group of degree 1. Each rank holds at most C padded rows.
std::vector<AtomicGroup> best_fit_decreasing(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                             std::span<const std::int64_t> ids);

/// Splits `ids` into waves whose atomic groups fit the pool (sum of min degrees <= P), balancing tokens across
/// waves (largest first into the lightest wave). Returns the fewest waves found this way (each wave's ids sorted)
/// and, when `groups` is given, each wave's atomic groups (best_fit_decreasing of the wave) there.
std::vector<std::vector<std::int64_t>> split_waves(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                                   std::span<const std::int64_t> ids,
                                                   std::vector<std::vector<AtomicGroup>>* groups = nullptr);

}  // namespace dynacp::solve
