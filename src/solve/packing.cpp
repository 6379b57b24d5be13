#include "dynacp/solve/packing.hpp"

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
    for (std::size_t node = leaves_ - 1; node >= 1; --node) tree_[node] = std::max(tree_[2 * node], tree_[2 * node + 1]);
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

namespace {
std::vector<std::int64_t> sorted_by_length_desc(const Batch& batch, std::span<const std::int64_t> ids) {
  std::vector<std::int64_t> order(ids.begin(), ids.end());
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
    const auto lx = batch.lengths[static_cast<std::size_t>(x)], ly = batch.lengths[static_cast<std::size_t>(y)];
    return lx != ly ? lx > ly : x < y;
  });
  return order;
}
}  // namespace

std::vector<AtomicGroup> best_fit_decreasing(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                             std::span<const std::int64_t> ids) {
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
  for (auto id : sorted_by_length_desc(batch, ids)) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
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

std::vector<std::vector<std::int64_t>> split_waves(const Batch& batch, const CostModel& cost, const Cluster& cluster,
                                                   std::span<const std::int64_t> ids) {
  const auto order = sorted_by_length_desc(batch, ids);
  auto fits = [&](const std::vector<std::int64_t>& wave) {
    int total = 0;
    for (const auto& g : best_fit_decreasing(batch, cost, cluster, wave)) total += g.min_degree;
    return total <= cluster.num_ranks;
  };
  std::int64_t dmin_sum = 0;
  for (const auto& g : best_fit_decreasing(batch, cost, cluster, ids)) dmin_sum += g.min_degree;
  std::size_t waves =
      static_cast<std::size_t>(std::max<std::int64_t>(1, (dmin_sum + cluster.num_ranks - 1) / cluster.num_ranks));
  for (; waves <= order.size(); ++waves) {
    std::vector<std::vector<std::int64_t>> out(waves);
    // the lightest wave (ties: the first) from a min-heap of (load, wave): O(n log waves) per try
    std::priority_queue<std::pair<std::int64_t, std::size_t>, std::vector<std::pair<std::int64_t, std::size_t>>,
                        std::greater<>>
        lightest;
    for (std::size_t w = 0; w < waves; ++w) lightest.push({0, w});
    for (auto id : order) {
      const auto [load, w] = lightest.top();
      lightest.pop();
      out[w].push_back(id);
      lightest.push({load + batch.lengths[static_cast<std::size_t>(id)], w});
    }
    if (std::all_of(out.begin(), out.end(), fits)) {
      for (auto& w : out) std::sort(w.begin(), w.end());
      return out;
    }
  }
  throw Error("split_waves: no wave split fits the pool (a sequence needs more ranks than the pool has)");
}

}  // namespace dynacp::solve
