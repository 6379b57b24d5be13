#include "dynacp/solve/packing.hpp"

#include <algorithm>
#include <numeric>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

std::vector<std::vector<std::int64_t>> first_fit(const Batch& batch, std::span<const std::int64_t> ids,
                                                 const Cluster& cluster, int degree, std::int64_t capacity) {
  std::vector<std::vector<std::int64_t>> packs;
  std::vector<std::int64_t> free;  // rows per rank still free in each pack
  for (auto id : ids) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
    const std::int64_t rows = cluster.padded_rows(len, degree);
    if (rows > capacity)
      invalid("sequence ", id, " has ", len, " tokens (", rows, " padded rows on each of ", degree,
              " ranks); a pack holds at most ", capacity, " rows per rank");
    std::size_t k = 0;
    while (k < packs.size() && free[k] < rows) ++k;
    if (k == packs.size()) {
      packs.emplace_back();
      free.push_back(capacity);
    }
    packs[k].push_back(id);
    free[k] -= rows;
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
  // Best fit by the free room in tokens over the whole ring, (free rows per rank) x (min degree).
  auto room = [&](std::size_t k) { return free[k] * groups[k].min_degree; };
  for (auto id : sorted_by_length_desc(batch, ids)) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
    const double eta = cost.eta(batch.mask(static_cast<std::size_t>(id)));
    const int dmin = cost.min_degree(len, cluster);
    std::size_t best = groups.size();
    if (dmin == 1) {
      for (std::size_t k = 0; k < groups.size(); ++k)
        if (free[k] >= cluster.padded_rows(len, groups[k].min_degree) &&
            (best == groups.size() || room(k) < room(best)))
          best = k;
    }
    if (best == groups.size()) {
      groups.push_back({{}, {}, dmin});
      free.push_back(cap);
    }
    groups[best].ids.push_back(id);
    groups[best].stats.add(len, eta);
    free[best] -= cluster.padded_rows(len, groups[best].min_degree);
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
    std::vector<std::int64_t> load(waves, 0);
    for (auto id : order) {
      const std::size_t w = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      out[w].push_back(id);
      load[w] += batch.lengths[static_cast<std::size_t>(id)];
    }
    if (std::all_of(out.begin(), out.end(), fits)) {
      for (auto& w : out) std::sort(w.begin(), w.end());
      return out;
    }
  }
  throw Error("split_waves: no wave split fits the pool (a sequence needs more ranks than the pool has)");
}

}  // namespace dynacp::solve
