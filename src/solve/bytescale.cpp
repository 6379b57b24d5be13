// `bytescale`: our re-implementation of ByteScale's balance scheduler (arXiv 2502.21231, Algorithm 2) over
// Hybrid Data Parallelism:
//   - a sequence uses the fewest ranks that hold it, any number (data-aware sharding, no offload);
//   - sequences, longest first, are cut into buckets of roughly equal FLOPs;
//   - while buckets remain, the least-loaded rank takes work (ByteScale's "lagging ranks first"): a microbatch
//     packed up to the capacity from the first bucket (DP-Balance, pp = 1) or round-robin across buckets
//     (PP-Balance, pp > 1); a multi-rank sequence takes that many least-loaded ranks at once;
//   - ranks run as many microbatches as they are given (variable counts).
#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <set>

#include "dynacp/solve/strategies.hpp"
#include "dynacp/solve/timeline.hpp"

namespace dynacp::solve {

Plan bytescale(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  const int P = cluster.num_ranks;
  const std::int64_t cap = cost.token_capacity(cluster);
  auto len = [&](std::int64_t id) { return batch.lengths[static_cast<std::size_t>(id)]; };
  std::vector<std::int64_t> order(batch.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return len(a) > len(b); });

  // FLOP-equal buckets: as many as microbatch rounds the pool needs at full memory use.
  double total_work = 0;
  std::int64_t total_tokens = 0;
  for (auto id : order) {
    total_work += cost.work(len(id), batch.mask(static_cast<std::size_t>(id)));
    total_tokens += len(id);
  }
  const std::size_t nb = static_cast<std::size_t>(
      std::clamp<std::int64_t>((total_tokens + cap * P - 1) / (cap * P), 1, static_cast<std::int64_t>(order.size())));
  std::vector<std::deque<std::int64_t>> buckets(nb);
  {
    const double target = total_work / static_cast<double>(nb);
    double acc = 0;
    std::size_t b = 0;
    for (auto id : order) {
      const double w = cost.work(len(id), batch.mask(static_cast<std::size_t>(id)));
      if (acc + w > target * (static_cast<double>(b) + 1) && !buckets[b].empty() && b + 1 < nb) ++b;
      buckets[b].push_back(id);
      acc += w;
    }
  }
  const bool pp_balance = options.pp > 1;
  TimelineBuilder tl(batch, cluster, cost);
  std::size_t rr = 0;  // round-robin bucket cursor for PP-Balance
  auto next_bucket = [&]() -> std::deque<std::int64_t>* {
    for (std::size_t k = 0; k < nb; ++k) {
      const std::size_t b = pp_balance ? (rr + k) % nb : k;
      if (!buckets[b].empty()) {
        if (pp_balance) rr = (b + 1) % nb;
        return &buckets[b];
      }
    }
    return nullptr;
  };
  // ByteScale hands work to the ranks that lag the busiest by more than delta, least loaded first; handing each
  // microbatch to the least-loaded rank is the same order. Ranks ordered by the time they free up (ties by index); kept
  // in step with the timeline.
  std::set<std::pair<double, int>> by_free;
  for (int r = 0; r < P; ++r) by_free.insert({0.0, r});
  auto commit = [&](std::vector<int> ranks, std::vector<std::int64_t> ids) {
    for (int r : ranks) by_free.erase({tl.free()[static_cast<std::size_t>(r)], r});
    tl.add(ranks, std::move(ids));
    for (int r : ranks) by_free.insert({tl.free()[static_cast<std::size_t>(r)], r});
  };
  for (auto* bucket = next_bucket(); bucket; bucket = next_bucket()) {
    const std::int64_t head = bucket->front();
    const int need = cost.min_degree(len(head), cluster);
    if (need > 1) {
      // the `need` least-loaded ranks (lagging ones come first in this order anyway)
      bucket->pop_front();
      std::vector<int> ranks;
      for (auto it = by_free.begin(); static_cast<int>(ranks.size()) < need; ++it) ranks.push_back(it->second);
      std::sort(ranks.begin(), ranks.end());
      commit(std::move(ranks), {head});
      continue;
    }
    // one microbatch for the most lagging rank: best-fit pack single-rank sequences of this bucket
    std::vector<std::int64_t> mb;
    std::int64_t room = cap;  // padded rows left on the rank
    auto rows = [&](std::int64_t id) { return cluster.padded_rows(len(id), 1); };
    for (auto it = bucket->begin(); it != bucket->end();) {
      if (cost.min_degree(len(*it), cluster) == 1 && rows(*it) <= room) {
        room -= rows(*it);
        mb.push_back(*it);
        it = bucket->erase(it);
      } else {
        ++it;
      }
      if (bucket->empty() || room < rows(bucket->back())) break;  // the bucket is sorted longest first
    }
    if (mb.empty()) {  // only multi-rank sequences left behind the head: take the next one
      mb.push_back(bucket->front());
      bucket->pop_front();
    }
    commit({by_free.begin()->second}, std::move(mb));
  }
  return tl.to_plan();
}

}  // namespace dynacp::solve
