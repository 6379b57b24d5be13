#include <algorithm>
#include <cmath>
#include <numeric>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/degrees.hpp"
#include "dynacp/solve/blocks/packing.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp {

void PlanOptions::validate() const {
  if (pp < 1) invalid("PlanOptions.pp is ", pp, "; it must be >= 1");
  if (vpp < 1) invalid("PlanOptions.vpp is ", vpp, "; it must be >= 1");
  if (threads < 0) invalid("PlanOptions.threads is ", threads, "; it must be >= 0 (0 = every hardware thread)");
  if (!(time_limit_s >= 0) || !std::isfinite(time_limit_s))
    invalid("PlanOptions.time_limit_s is ", time_limit_s, " s; it must be finite and >= 0 (0 = no limit)");
  tuning.validate();
}

namespace solve {
namespace {

std::vector<std::int64_t> all_ids(const Batch& batch) {
  std::vector<std::int64_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  return ids;
}

}  // namespace

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

Plan fcp(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions&) {
  Plan plan;
  const auto ids = all_ids(batch);
  std::vector<std::vector<AtomicGroup>> packed;  // each wave's atomic groups, from split_waves
  split_waves(batch, cost, cluster, ids, &packed);
  for (const auto& groups : packed) {
    DegreeProblem prob;
    prob.ranks = cluster.num_ranks;
    for (const auto& g : groups) {
      prob.min_degree.push_back(g.min_degree);
      prob.max_degree.push_back(cost.best_degree(g.stats, g.min_degree, cluster));
    }
    prob.time = [&](std::size_t i, int d) { return cost.time(groups[i].stats, d, cluster); };
    const auto alloc = allocate_degrees(prob);
    const auto rings = place_groups(alloc.degrees, cluster);
    std::vector<Group> slot;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      Group g{rings[i], groups[i].ids};
      std::sort(g.sequences.begin(), g.sequences.end());
      slot.push_back(std::move(g));
    }
    plan.microbatches.push_back(std::move(slot));
  }
  return plan;
}

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> registry = {
      {"packing", &packing,
       "static CP (smallest degree that holds the longest sequence), first-fit packs dealt to DP replicas"},
      {"fcp", &fcp, "FCP: memory-aware BFD atomic groups, 2D DP over any-integer CP degrees, waves"},
      {"megatron", &megatron,
       "Megatron-Core packing-aware dynamic CP: power-of-two aligned groups, greedy global-max scoring, equal counts"},
      {"bytescale", &bytescale,
       "ByteScale HDP balance scheduler: any rank count per sequence, FLOP-equal buckets, variable counts"},
      {"dynacp", &dynacp,
       "time-driven joint CP degree, packing and placement with local search; never worse than the others"},
  };
  return registry;
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> out;
  for (const auto& s : strategies()) out.emplace_back(s.name);
  return out;
}

const StrategyInfo& find_strategy(const std::string& name) {
  for (const auto& s : strategies())
    if (name == s.name) return s;
  std::string known;
  for (const auto& s : strategies()) known += (known.empty() ? "" : ", ") + std::string(s.name);
  invalid("unknown strategy '", name, "'; known strategies: ", known);
}

}  // namespace solve
}  // namespace dynacp
