// A pool of context-parallel groups built once, so no microbatch pays communicator setup.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "dynacp/runtime/comm.hpp"

namespace dynacp::runtime {

struct CpGroup {
  std::vector<int> ranks;      ///< world ranks in ring order (ascending)
  std::unique_ptr<Comm> comm;  ///< this rank's communicator for the group; null when not a member or size 1
};

/// Pre-builds, for every requested CP size s, a tiling of the P world ranks into floor-ish P/s groups, placed
/// node-contiguously where possible (see tiling()). Each size costs one collective split of the world
/// communicator (on NCCL: one ncclCommSplit, NOCOLOR for ranks left over) followed by a warm-up barrier in every
/// new group. Ring P2P needs no sub-communicator: view() gives a P2P-only group over the world for any rank list.
/// Construction is collective: every world rank must build the same pool.
class CpGroupPool {
 public:
  CpGroupPool(Comm& world, int ranks_per_node, std::vector<int> cp_sizes);

  /// Sizes 1, 2, 4, ... up to `max_size` (the Megatron special case).
  static std::vector<int> power_of_two_sizes(int max_size);

  /// Groups of size s over P ranks: for s < ranks_per_node, floor(R/s) contiguous groups inside each node, then
  /// the leftover ranks of all nodes (ascending) in groups of s that cross nodes; for s >= R, contiguous ranges.
  static std::vector<std::vector<int>> tiling(int num_ranks, int ranks_per_node, int size);

  /// Lookup by (first rank, size) or by the plan's rank list; throws InvalidArgument naming the available groups.
  const CpGroup& find(int first_rank, int size) const;
  const CpGroup& find(std::span<const int> ranks) const;

  /// A P2P-only view over the world for any rank list containing this rank (no new communicator).
  std::unique_ptr<Comm> view(std::vector<int> ranks) const;

  const std::vector<CpGroup>& groups() const { return groups_; }
  const std::vector<int>& sizes() const { return sizes_; }
  /// Sub-communicators this rank holds.
  int num_communicators() const;
  /// Groups of size > 1 in the pool, i.e. communicators over all ranks together.
  int total_communicators() const;

 private:
  Comm& world_;
  std::vector<int> sizes_;
  std::vector<CpGroup> groups_;
};

}  // namespace dynacp::runtime
