// `packing`: the static baseline - the smallest CP degree that holds the longest sequence and divides the pool,
// first-fit packs in arrival order dealt to the DP replicas.
#include "dynacp/solve/blocks/packing.hpp"

#include "dynacp/model/plan.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

Plan packing(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions&) {
  // Smallest static CP degree that holds the longest sequence and divides the pool.
  int cp = cost.min_degree(batch.max_length(), cluster);
  while (cluster.num_ranks % cp != 0) ++cp;
  const int dp = cluster.num_ranks / cp;
  const auto ids = all_ids(batch);
  const auto packs = first_fit(batch, ids, cluster, cp, cost.token_capacity(cluster));
  Plan plan;
  plan.microbatches.resize((packs.size() + static_cast<std::size_t>(dp) - 1) / static_cast<std::size_t>(dp));
  for (std::size_t k = 0; k < packs.size(); ++k) {
    const int replica = static_cast<int>(k % static_cast<std::size_t>(dp));
    Group g;
    for (int j = 0; j < cp; ++j) g.ranks.push_back(replica * cp + j);
    g.sequences = packs[k];
    plan.microbatches[k / static_cast<std::size_t>(dp)].push_back(std::move(g));
  }
  return plan;
}

}  // namespace dynacp::solve
