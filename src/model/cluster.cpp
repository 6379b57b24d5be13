#include "dynacp/model/cluster.hpp"

#include <cmath>

#include "dynacp/model/error.hpp"

namespace dynacp {

void Cluster::validate() const {
  if (num_ranks <= 0) invalid("Cluster.num_ranks is ", num_ranks, "; it must be >= 1");
  if (ranks_per_node <= 0) invalid("Cluster.ranks_per_node is ", ranks_per_node, "; it must be >= 1");
  if (num_ranks % ranks_per_node != 0)
    invalid("Cluster.ranks_per_node = ", ranks_per_node, " does not divide num_ranks = ", num_ranks);
  auto positive = [](const char* name, double v) {
    if (!(v > 0) || !std::isfinite(v)) invalid("Cluster.", name, " is ", v, "; it must be a positive number");
  };
  auto nonneg = [](const char* name, double v) {
    if (!(v >= 0) || !std::isfinite(v)) invalid("Cluster.", name, " is ", v, "; it must be >= 0 and finite");
  };
  positive("activation_budget", activation_budget);
  if (tokens_per_rank < 0)
    invalid("Cluster.tokens_per_rank is ", tokens_per_rank,
            "; it must be >= 1 (or 0: derive it from activation_budget)");
  positive("intra_node_bandwidth", intra_node_bandwidth);
  positive("inter_node_bandwidth", inter_node_bandwidth);
  nonneg("intra_node_latency", intra_node_latency);
  nonneg("inter_node_latency", inter_node_latency);
  if (seq_pad_multiple < 1 || seq_pad_multiple > 4096)
    invalid("Cluster.seq_pad_multiple is ", seq_pad_multiple,
            "; it must be in [1, 4096] (2 for zigzag ring attention, lcm(2, tp) with sequence parallelism)");
}

std::string Cluster::describe() const {
  return detail::cat("Cluster(num_ranks=", num_ranks, ", ranks_per_node=", ranks_per_node,
                     ", activation_budget=", activation_budget, ", tokens_per_rank=", tokens_per_rank,
                     ", intra_node_bandwidth=", intra_node_bandwidth, ", inter_node_bandwidth=", inter_node_bandwidth,
                     ", intra_node_latency=", intra_node_latency, ", inter_node_latency=", inter_node_latency,
                     ", seq_pad_multiple=", seq_pad_multiple, ")");
}

}  // namespace dynacp
