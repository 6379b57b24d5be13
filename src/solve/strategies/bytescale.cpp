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
#include <numeric>
#include <set>

#include "dynacp/solve/blocks/packing.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {
namespace {

// One FLOP bucket: sequence ids longest first with their padded rows on one rank, and which are still waiting. The
// next waiting one at or after an index is found through "next" links with path halving, and the first one that
// fits a room by binary search (rows do not grow along the bucket), so packing a microbatch costs O(taken log n)
// rather than a scan and a middle erase of every sequence in the bucket.
class Bucket {
 public:
  void push_back(std::int64_t id, std::int64_t rows) {
    ids_.push_back(id), rows_.push_back(rows), next_.push_back(next_.size());
    ++waiting_;
  }
  /// Call once every sequence is in: adds the end sentinel.
  void close() { next_.push_back(next_.size()); }
  bool empty() const { return waiting_ == 0; }
  /// Index of the first waiting sequence at or after `i` (size() when none).
  std::size_t waiting_from(std::size_t i) {
    while (next_[i] != i) next_[i] = next_[next_[i]], i = next_[i];
    return i;
  }
  /// Index of the first waiting sequence at or after `i` whose rows fit `room` (size() when none).
  std::size_t fitting_from(std::size_t i, std::int64_t room) {
    const auto it = std::partition_point(rows_.begin() + static_cast<std::ptrdiff_t>(i), rows_.end(),
                                         [room](std::int64_t r) { return r > room; });
    return waiting_from(static_cast<std::size_t>(it - rows_.begin()));
  }
  std::size_t front() { return waiting_from(0); }
  std::size_t size() const { return ids_.size(); }
  std::int64_t id(std::size_t i) const { return ids_[i]; }
  std::int64_t rows(std::size_t i) const { return rows_[i]; }
  void take(std::size_t i) { next_[i] = i + 1, --waiting_; }

 private:
  std::vector<std::int64_t> ids_, rows_;
  std::vector<std::size_t> next_;
  std::size_t waiting_ = 0;
};

}  // namespace

Plan bytescale(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  const int P = cluster.num_ranks;
  const std::int64_t cap = cost.token_capacity(cluster);
  auto len = [&](std::int64_t id) { return batch.lengths[static_cast<std::size_t>(id)]; };
  std::vector<std::int64_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  const std::vector<std::int64_t> order = longest_first(batch, ids);

  // FLOP-equal buckets: as many as microbatch rounds the pool needs at full memory use.
  double total_work = 0;
  std::int64_t total_tokens = 0;
  for (auto id : order) {
    total_work += cost.work(len(id), batch.mask(static_cast<std::size_t>(id)));
    total_tokens += len(id);
  }
  const std::size_t nb = static_cast<std::size_t>(
      std::clamp<std::int64_t>((total_tokens + cap * P - 1) / (cap * P), 1, static_cast<std::int64_t>(order.size())));
  std::vector<Bucket> buckets(nb);
  {
    const double target = total_work / static_cast<double>(nb);
    double acc = 0;
    std::size_t b = 0;
    for (auto id : order) {
      const double w = cost.work(len(id), batch.mask(static_cast<std::size_t>(id)));
      if (acc + w > target * (static_cast<double>(b) + 1) && !buckets[b].empty() && b + 1 < nb) ++b;
      buckets[b].push_back(id, cluster.padded_rows(len(id), 1));
      acc += w;
    }
    for (auto& bucket : buckets) bucket.close();
  }
  const bool pp_balance = options.pp > 1;
  TimelineBuilder tl(batch, cluster, cost);
  std::size_t rr = 0;  // round-robin bucket cursor for PP-Balance
  auto next_bucket = [&]() -> Bucket* {
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
    const std::size_t head = bucket->front();
    const int need = cost.min_degree(len(bucket->id(head)), cluster);
    if (need > 1) {
      // the `need` least-loaded ranks (lagging ones come first in this order anyway)
      bucket->take(head);
      std::vector<int> ranks;
      for (auto it = by_free.begin(); static_cast<int>(ranks.size()) < need; ++it) ranks.push_back(it->second);
      std::sort(ranks.begin(), ranks.end());
      commit(std::move(ranks), {bucket->id(head)});
      continue;
    }
    // One microbatch for the most lagging rank: first-fit pack this bucket's sequences in order (all of them are
    // single-rank: none is longer than the head). Every waiting sequence at or after the first that fits the room
    // fits too, so each taken one is a binary search away.
    std::vector<std::int64_t> mb;
    std::int64_t room = cap;  // padded rows left on the rank
    for (std::size_t i = bucket->fitting_from(head, room); i < bucket->size(); i = bucket->fitting_from(i, room)) {
      room -= bucket->rows(i);
      mb.push_back(bucket->id(i));
      bucket->take(i);
    }
    if (mb.empty()) {  // nothing fits one rank (cannot happen: the head is single-rank); take the head
      mb.push_back(bucket->id(head));
      bucket->take(head);
    }
    commit({by_free.begin()->second}, std::move(mb));
  }
  return tl.to_plan();
}

}  // namespace dynacp::solve
