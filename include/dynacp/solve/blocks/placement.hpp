// Placement of CP groups onto ranks, node-contiguous where possible.
#pragma once
#include <vector>

#include "dynacp/model/cluster.hpp"

namespace dynacp::solve {

/// Assigns each group (given by its degree) a ring of ranks. Groups larger than a node take whole nodes
/// from the front and their remainder; the others go best-fit into the node with the least free ranks that
/// still holds them whole; only when no node can, a group spans nodes (fewest nodes first).
/// Result order matches `degrees`; each ring is ascending. Throws InvalidArgument if sum degrees > P.
std::vector<std::vector<int>> place_groups(const std::vector<int>& degrees, const Cluster& cluster);

}  // namespace dynacp::solve
