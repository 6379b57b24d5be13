#include "dynacp/solve/blocks/packing.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <queue>
#include <set>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

namespace {

// Max-tree over the packs' free rows: the first pack with at least `need` free rows in O(log packs), so first-fit
// costs O(n log packs) instead of a scan of every earlier pack per sequence (same packs, same order).
class FirstFitTree {
 public:
  /// Index of the first pack with free >= need, or size() when none has.
  std::size_t first_at_least(std::int64_t need) const {
    if (size_ == 0 || tree_[1] < need) return size_;
    std::size_t node = 1;
    while (node < leaves_) node = tree_[2 * node] >= need ? 2 * node : 2 * node + 1;
    return node - leaves_;
  }
  std::size_t size() const { return size_; }
  void push(std::int64_t free) {
    if (size_ == leaves_) grow();
    set(size_++, free);
  }
  void set(std::size_t k, std::int64_t free) {
    std::size_t node = k + leaves_;
    tree_[node] = free;
    for (node /= 2; node >= 1; node /= 2) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  std::int64_t at(std::size_t k) const { return tree_[k + leaves_]; }

 private:
  void grow() {  // doubles the leaves; empty leaves hold -1 (no pack)
    const std::size_t old = leaves_;
    leaves_ = std::max<std::size_t>(1, 2 * leaves_);
    std::vector<std::int64_t> t(2 * leaves_, -1);
    for (std::size_t k = 0; k < size_; ++k) t[leaves_ + k] = tree_[old + k];
    tree_ = std::move(t);
    for (std::size_t node = leaves_ - 1; node >= 1; --node)
      tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
  }
  std::size_t size_ = 0, leaves_ = 0;
  std::vector<std::int64_t> tree_;
};

}  // namespace

std::vector<std::vector<std::int64_t>> first_fit(const Batch& batch, std::span<const std::int64_t> ids,
                                                 const Cluster& cluster, int degree, std::int64_t capacity) {
  std::vector<std::vector<std::int64_t>> packs;
  FirstFitTree free;  // rows per rank still free in each pack
  for (auto id : ids) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
    const std::int64_t rows = cluster.padded_rows(len, degree);
    if (rows > capacity)
      invalid("sequence ", id, " has ", len, " tokens (", rows, " padded rows on each of ", degree,
              " ranks); a pack holds at most ", capacity, " rows per rank");
    const std::size_t k = free.first_at_least(rows);
    if (k == packs.size()) {
      packs.emplace_back();
      free.push(capacity);
    }
    packs[k].push_back(id);
    free.set(k, free.at(k) - rows);
  }
  return packs;
}

std::vector<std::int64_t> longest_first(const Batch& batch, std::span<const std::int64_t> ids) {
  std::vector<std::pair<std::int64_t, std::size_t>> keys;  // (-length, position in ids)
  keys.reserve(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) keys.push_back({-batch.lengths[static_cast<std::size_t>(ids[k])], k});
  std::sort(keys.begin(), keys.end());
  std::vector<std::int64_t> order;
  order.reserve(ids.size());
  for (const auto& k : keys) order.push_back(ids[k.second]);
  return order;
}

namespace {

using LengthKey = std::pair<std::int64_t, std::int64_t>;  // (-length, id): sorted, longest first and ties by id

// The keys of `ids` in that order (a total order), sorted contiguously: no comparison reads the batch.
std::vector<LengthKey> sorted_by_length_desc(const Batch& batch, std::span<const std::int64_t> ids) {
  std::vector<LengthKey> keys;
  keys.reserve(ids.size());
  for (auto id : ids) keys.push_back({-batch.lengths[static_cast<std::size_t>(id)], id});
  std::sort(keys.begin(), keys.end());
  return keys;
}

// best_fit_decreasing over keys already sorted (the lengths travel with them: no read of the batch's lengths).
std::vector<AtomicGroup> best_fit_sorted(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                         std::span<const LengthKey> keys) {
  const std::int64_t cap = cost.token_capacity(cluster);
  std::vector<AtomicGroup> groups;
  std::vector<std::int64_t> free;  // padded rows per rank still free at the group's min degree
  // Best fit by the free room in tokens over the whole ring, (free rows per rank) x (min degree). The open groups
  // of each min degree m sit in a set ordered by (room, index): a sequence fits one of them iff its room is at least
  // m x its padded rows at m, so the best of that degree is one lower_bound, and the best overall (least room, then
  // the earliest opened) the least of those over the few distinct degrees: O(n log n) instead of O(n x groups).
  using Key = std::pair<std::int64_t, std::size_t>;
  std::vector<std::pair<int, std::set<Key>>> by_degree;  // (min degree, its groups), degrees in first-seen order
  std::vector<std::size_t> slot_of;                      // group -> its index in by_degree
  auto room = [&](std::size_t k) { return free[k] * groups[k].min_degree; };
  for (const auto& [neg_len, id] : keys) {
    const std::int64_t len = -neg_len;
    const double eta = cost.eta(batch.mask(static_cast<std::size_t>(id)));
    const int dmin = cost.min_degree(len, cluster);
    std::size_t best = groups.size();
    if (dmin == 1) {
      std::optional<Key> pick;
      for (const auto& [m, set] : by_degree) {
        auto it = set.lower_bound({cluster.padded_rows(len, m) * m, 0});
        if (it != set.end() && (!pick || *it < *pick)) pick = *it;
      }
      if (pick) best = pick->second;
    }
    if (best == groups.size()) {
      groups.push_back({{}, {}, dmin});
      free.push_back(cap);
      std::size_t slot = 0;
      while (slot < by_degree.size() && by_degree[slot].first != dmin) ++slot;
      if (slot == by_degree.size()) by_degree.push_back({dmin, {}});
      slot_of.push_back(slot);
    } else {
      by_degree[slot_of[best]].second.erase({room(best), best});
    }
    groups[best].ids.push_back(id);
    groups[best].stats.add(len, eta);
    free[best] -= cluster.padded_rows(len, groups[best].min_degree);
    by_degree[slot_of[best]].second.insert({room(best), best});
  }
  return groups;
}

}  // namespace

std::vector<AtomicGroup> best_fit_decreasing(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                             std::span<const std::int64_t> ids) {
  return best_fit_sorted(batch, cost, cluster, sorted_by_length_desc(batch, ids));
}

std::vector<std::vector<std::int64_t>> split_waves(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                                   std::span<const std::int64_t> ids,
                                                   std::vector<std::vector<AtomicGroup>>* groups) {
  const auto order = sorted_by_length_desc(batch, ids);
  auto fits = [&](const std::vector<AtomicGroup>& wave) {
    int total = 0;
    for (const auto& g : wave) total += g.min_degree;
    return total <= cluster.num_ranks;
  };
  std::int64_t dmin_sum = 0;
  for (const auto& g : best_fit_sorted(batch, cost, cluster, order)) dmin_sum += g.min_degree;
  std::size_t waves =
      static_cast<std::size_t>(std::max<std::int64_t>(1, (dmin_sum + cluster.num_ranks - 1) / cluster.num_ranks));
  for (; waves <= order.size(); ++waves) {
    // Largest first into the lightest wave (ties: the first), from a min-heap of (tokens, wave): O(n log waves) per
    // try. Each wave gets its keys in the global order, so it is sorted as best_fit_decreasing would sort it.
    std::vector<std::vector<LengthKey>> out(waves);
    std::priority_queue<std::pair<std::int64_t, std::size_t>, std::vector<std::pair<std::int64_t, std::size_t>>,
                        std::greater<>>
        lightest;
    for (std::size_t w = 0; w < waves; ++w) lightest.push({0, w});
    for (const auto& key : order) {
      const auto [load, w] = lightest.top();
      lightest.pop();
      out[w].push_back(key);
      lightest.push({load - key.first, w});
    }
    std::vector<std::vector<AtomicGroup>> packed;
    bool all_fit = true;
    for (std::size_t w = 0; w < out.size() && all_fit; ++w) {
      packed.push_back(best_fit_sorted(batch, cost, cluster, out[w]));
      all_fit = fits(packed.back());
    }
    if (all_fit) {
      std::vector<std::vector<std::int64_t>> ids_out(waves);
      for (std::size_t w = 0; w < waves; ++w) {
        for (const auto& key : out[w]) ids_out[w].push_back(key.second);
        std::sort(ids_out[w].begin(), ids_out[w].end());
      }
      if (groups) *groups = std::move(packed);
      return ids_out;
    }
  }
  throw Error("split_waves: no wave split fits the pool (a sequence needs more ranks than the pool has)");
}

}  // namespace dynacp::solve
