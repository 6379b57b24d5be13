// The DP x CP rank pool that a plan schedules onto.
#pragma once
#include <cstdint>
#include <string>

namespace dynacp {

struct Cluster {
  int num_ranks = 64;                   ///< P: ranks in the DP x CP pool
  int ranks_per_node = 8;               ///< ranks sharing the fast intra-node fabric; must divide num_ranks
  double activation_budget = 40e9;      ///< bytes of activation memory per rank for one microbatch
  double intra_node_bandwidth = 350e9;  ///< bytes/s per ring hop in a node (H100 NVLink, fitted to nccl-tests)
  double inter_node_bandwidth = 50e9;   ///< bytes/s per ring hop across nodes (400 Gb/s NIC per GPU, nominal)
  double intra_node_latency = 25e-6;    ///< seconds per ring hop inside a node (fitted to nccl-tests)
  double inter_node_latency = 30e-6;    ///< seconds per ring hop across nodes

  /// Tokens one rank holds in one microbatch: the everyday way to set the budget. 0 (the default) derives it from
  /// activation_budget and the cost model's bytes per token (CostModel::token_capacity); > 0 sets it directly and
  /// activation_budget is not read.
  std::int64_t tokens_per_rank = 0;

  int num_nodes() const { return num_ranks / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }

  /// Throws InvalidArgument naming the bad field (P <= 0, ranks_per_node not dividing P, non-positive budget or
  /// bandwidth, negative tokens_per_rank, negative or NaN latency).
  void validate() const;
  std::string describe() const;
};

}  // namespace dynacp
