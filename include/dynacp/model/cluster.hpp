// The DP x CP rank pool that a plan schedules onto.
#pragma once
#include <cstdint>
#include <span>
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
  /// k: the runtime pads every sequence of a d-rank ring to a multiple of k * d rows, so each rank holds
  /// k * ceil(s / (k d)) rows of it (docs/runtime.md). 2 for zigzag ring attention; lcm(2, tp) with tensor-parallel
  /// sequence parallelism (each rank's rows must also split evenly over its TP peers).
  int seq_pad_multiple = 2;

  /// Tokens one rank holds in one microbatch: the everyday way to set the budget. 0 (the default) derives it from
  /// activation_budget and the cost model's bytes per token (CostModel::token_capacity); > 0 sets it directly and
  /// activation_budget is not read.
  std::int64_t tokens_per_rank = 0;

  int num_nodes() const { return num_ranks / ranks_per_node; }
  int node_of(int rank) const { return rank / ranks_per_node; }
  /// True when the ranks do not all share one node (a ring over them uses the inter-node link).
  bool crosses_nodes(std::span<const int> ranks) const {
    for (int r : ranks)
      if (node_of(r) != node_of(ranks.front())) return true;
    return false;
  }
  /// Rows each rank of a d-rank ring holds for one sequence of `len` tokens after padding: k * ceil(len / (k d)).
  std::int64_t padded_rows(std::int64_t len, int d) const {
    const std::int64_t unit = static_cast<std::int64_t>(seq_pad_multiple) * d;
    return (len + unit - 1) / unit * seq_pad_multiple;
  }

  /// Throws InvalidArgument naming the bad field (P <= 0, ranks_per_node not dividing P, non-positive budget or
  /// bandwidth, negative tokens_per_rank, negative or NaN latency).
  void validate() const;
  std::string describe() const;
};

}  // namespace dynacp
