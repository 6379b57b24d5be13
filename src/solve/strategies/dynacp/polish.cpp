// Pool-level helpers of the `dynacp` driver: the count-policy check, the whole-pool fallback and the slot-order
// polish of pipelined candidates.
#include <algorithm>
#include <numeric>

#include "dynacp/solve/blocks/timeline.hpp"
#include "search.hpp"

namespace dynacp::solve::dyn {

bool counts_ok(const Plan& plan, int P, const PlanOptions& o) {
  const std::vector<int> n = plan.microbatch_counts(P);
  for (int c : n) {
    if (o.count_policy == CountPolicy::Equal && c != n.front()) return false;
    if (o.vpp > 1 && c % o.pp != 0) return false;
  }
  return true;
}

// The fallback when no candidate meets the count policy (few sequences per rank): m exclusive slots, m the largest
// multiple of `multiple` (pp under vpp > 1, else 1) not above the number of sequences, each one group of all P ranks;
// sequences, largest work first, go to the slot with the least work that still has token room. Every rank runs m
// microbatches, so both count rules hold; an empty plan when m = 0 or the tokens do not fit.
Plan pool_slots(const Batch& batch, const Cluster& cluster, const CostModel& cost, int multiple) {
  const auto n = static_cast<std::int64_t>(batch.size());
  const std::int64_t m = n / multiple * multiple, cap = cost.token_capacity(cluster);
  if (m == 0) return {};
  std::vector<std::int64_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  auto work = [&](std::int64_t i) {
    return cost.work(batch.lengths[static_cast<std::size_t>(i)], batch.mask(static_cast<std::size_t>(i)));
  };
  std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) { return work(a) > work(b); });
  std::vector<double> load(static_cast<std::size_t>(m), 0.0);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(m), 0);  // padded rows per rank of each slot's group
  auto rows_of = [&](std::int64_t i) {
    return cluster.padded_rows(batch.lengths[static_cast<std::size_t>(i)], cluster.num_ranks);
  };
  Plan plan;
  plan.microbatches.resize(static_cast<std::size_t>(m));
  std::vector<int> all(static_cast<std::size_t>(cluster.num_ranks));
  std::iota(all.begin(), all.end(), 0);
  for (auto& slot : plan.microbatches) slot.push_back(Group{all, {}});
  for (std::int64_t i : ids) {
    std::size_t best = load.size();
    for (std::size_t k = 0; k < load.size(); ++k)
      if (rows[k] + rows_of(i) <= cap && (best == load.size() || load[k] < load[best])) best = k;
    if (best == load.size()) return {};
    load[best] += work(i), rows[best] += rows_of(i);
    plan.microbatches[best][0].sequences.push_back(i);
  }
  for (auto& slot : plan.microbatches) std::sort(slot[0].sequences.begin(), slot[0].sequences.end());
  return plan;
}

// Slot order polish for pipelined plans, scored by the simulator: a slot is one list index on every rank it
// touches, so permuting whole slots keeps every ring aligned (a permutation the simulator rejects - some rank skips
// a slot - scores infinity and is dropped). Tries the rise-then-fall shapes of the slots' largest group times for
// q = 0..pp light slots first, then swaps pairs of slots while that helps, within a budget of simulations.
Plan reorder_slots(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options, int budget) {
  const std::size_t n = plan.microbatches.size();
  if (n < 2) return plan;
  std::vector<double> weight(n, 0.0);
  for (std::size_t k = 0; k < n; ++k)
    for (const auto& g : plan.microbatches[k]) {
      weight[k] = std::max(weight[k], cost.group_time(g, batch, cluster));
    }
  std::vector<std::size_t> cur(n);
  std::iota(cur.begin(), cur.end(), std::size_t{0});
  // Scores the slots in `order`: moves them into place and back, so no group is copied.
  std::vector<std::vector<Group>> spare(n);
  auto score_order = [&](const std::vector<std::size_t>& order) {
    for (std::size_t k = 0; k < n; ++k) spare[k] = std::move(plan.microbatches[order[k]]);
    plan.microbatches.swap(spare);
    const double s = score(plan, batch, cluster, cost, options);
    plan.microbatches.swap(spare);
    for (std::size_t k = 0; k < n; ++k) plan.microbatches[order[k]] = std::move(spare[k]);
    return s;
  };
  std::vector<std::size_t> by(n);
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return weight[x] < weight[y]; });
  for (int q = 0; q <= options.pp && static_cast<std::size_t>(q) < n; ++q) {
    std::vector<std::size_t> order(by.begin(), by.begin() + q);
    for (std::size_t i = n; i > static_cast<std::size_t>(q); --i) order.push_back(by[i - 1]);
    const double s = score_order(order);
    if (s < t) t = s, cur = order;
  }
  int spent = 0;
  for (bool better = true; better && spent < budget;) {
    better = false;
    for (std::size_t i = 0; i + 1 < n && spent < budget; ++i)
      for (std::size_t j = i + 1; j < n && spent < budget; ++j)
        for (int move = 0; move < 2 && spent < budget; ++move) {
          // swap slots i and j, or move slot j to position i (the slots between shift by one)
          auto order = cur;
          if (move == 0)
            std::swap(order[i], order[j]);
          else if (j > i + 1)
            std::rotate(order.begin() + static_cast<std::ptrdiff_t>(i), order.begin() + static_cast<std::ptrdiff_t>(j),
                        order.begin() + static_cast<std::ptrdiff_t>(j) + 1);
          else
            continue;
          ++spent;
          const double s = score_order(order);
          if (s < t - 1e-12) t = s, cur = std::move(order), better = true;
        }
  }
  for (std::size_t k = 0; k < n; ++k) spare[k] = std::move(plan.microbatches[cur[k]]);
  plan.microbatches.swap(spare);
  return plan;
}

}  // namespace dynacp::solve::dyn
