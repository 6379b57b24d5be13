// Test helper: a cluster of P ranks, rpn per node, whose activation budget holds exactly cap_tokens per rank.
#pragma once
#include <cstdint>

#include "dynacp/model/cluster.hpp"
#include "dynacp/model/cost.hpp"

namespace dynacp::testing {

inline Cluster make_cluster(int P, int rpn, std::int64_t cap_tokens, const CostModel& cost) {
  Cluster c;
  c.num_ranks = P;
  c.ranks_per_node = rpn;
  c.activation_budget = cost.mem_static + static_cast<double>(cap_tokens) * cost.mem_per_token;
  return c;
}

}  // namespace dynacp::testing
