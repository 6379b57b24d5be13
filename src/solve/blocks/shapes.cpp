#include "dynacp/solve/blocks/shapes.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace dynacp::solve {

namespace {
/// The parts of one group's sequences: LPT by padded rows onto ceil(n / cap) parts of at most cap sequences each.
std::vector<std::vector<std::int64_t>> parts_of(const Group& g, const Batch& batch, const Cluster& cluster,
                                                std::size_t cap) {
  const std::size_t n = g.sequences.size(), k = (n + cap - 1) / cap;
  std::vector<std::size_t> by(n);
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::vector<std::int64_t> rows(n);
  for (std::size_t i = 0; i < n; ++i)
    rows[i] = cluster.padded_rows(batch.lengths[static_cast<std::size_t>(g.sequences[i])], g.degree());
  std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) { return rows[x] > rows[y]; });
  std::vector<std::vector<std::int64_t>> parts(k);
  std::vector<std::int64_t> load(k, 0);
  for (std::size_t i : by) {
    std::size_t best = k;
    for (std::size_t p = 0; p < k; ++p)
      if (parts[p].size() < cap && (best == k || load[p] < load[best])) best = p;
    parts[best].push_back(g.sequences[i]);
    load[best] += rows[i];
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}
/// The rows per rank of `ids` on d ranks.
std::int64_t rows_of(const std::vector<std::int64_t>& ids, const Batch& batch, const Cluster& cluster, int d) {
  std::int64_t r = 0;
  for (auto id : ids) r += cluster.padded_rows(batch.lengths[static_cast<std::size_t>(id)], d);
  return r;
}

/// The parts of group `g` (fit_buckets): the carved parts first, the remainder last; at most `max_parts` parts.
std::vector<std::vector<std::int64_t>> bucket_parts(const Group& g, const Batch& batch, const Cluster& cluster,
                                                    const CostModel& cost, const StaticShapes& shapes,
                                                    std::span<const GroupStats> single, int max_parts) {
  const auto& buckets = shapes.token_buckets;
  const int d = g.degree();
  auto time_of = [&](const std::vector<std::int64_t>& ids) {
    return shapes.group_time(cost, Group{g.ranks, ids}, single, batch, cluster);
  };
  std::vector<std::int64_t> rest = g.sequences;
  std::stable_sort(rest.begin(), rest.end(), [&](std::int64_t x, std::int64_t y) {
    return batch.lengths[static_cast<std::size_t>(x)] > batch.lengths[static_cast<std::size_t>(y)];
  });
  std::vector<std::vector<std::int64_t>> carved, best_parts;
  double carved_time = 0.0, best = time_of(g.sequences);
  const auto cap = shapes.max_sequences > 0 ? static_cast<std::size_t>(shapes.max_sequences) : rest.size();
  while (static_cast<int>(carved.size()) + 2 <= max_parts && rest.size() > 1) {
    const std::int64_t rows = rows_of(rest, batch, cluster, d);
    const auto hi = std::lower_bound(buckets.begin(), buckets.end(), rows);
    if (hi == buckets.begin() || hi == buckets.end()) break;
    const std::int64_t target = *(hi - 1);
    std::vector<std::int64_t> part, left;
    std::int64_t filled = 0;
    for (auto id : rest) {
      const std::int64_t r = cluster.padded_rows(batch.lengths[static_cast<std::size_t>(id)], d);
      if (filled + r <= target && part.size() < cap)
        part.push_back(id), filled += r;
      else
        left.push_back(id);
    }
    if (part.empty() || left.empty()) break;
    carved_time += time_of(part);
    carved.push_back(std::move(part));
    rest = std::move(left);
    if (const double t = carved_time + time_of(rest); t < best) {
      best = t;
      best_parts = carved;
      best_parts.push_back(rest);
    }
  }
  for (auto& p : best_parts) std::sort(p.begin(), p.end());
  return best_parts;  // empty: keep the group whole
}
}  // namespace

Plan fit_buckets(Plan plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                 const StaticShapes& shapes, std::span<const GroupStats> single) {
  if (shapes.token_buckets.size() < 2) return plan;
  std::vector<int> slots = plan.microbatch_counts(cluster.num_ranks);
  std::vector<std::vector<Group>> out;
  for (auto& slot : plan.microbatches) {
    std::vector<std::vector<Group>> extra;  // extra[j]: the (j+1)-th carved parts of this slot's groups
    for (auto& g : slot) {
      int room = std::numeric_limits<int>::max();
      if (shapes.max_microbatches > 0)
        for (int r : g.ranks) room = std::min(room, shapes.max_microbatches - slots[static_cast<std::size_t>(r)]);
      if (room <= 0) continue;
      auto parts = bucket_parts(g, batch, cluster, cost, shapes, single,
                                room == std::numeric_limits<int>::max() ? room : room + 1);
      if (parts.empty()) continue;
      for (int r : g.ranks) slots[static_cast<std::size_t>(r)] += static_cast<int>(parts.size()) - 1;
      g.sequences = std::move(parts.back());
      for (std::size_t j = 0; j + 1 < parts.size(); ++j) {
        if (extra.size() <= j) extra.emplace_back();
        extra[j].push_back(Group{g.ranks, std::move(parts[j])});
      }
    }
    out.push_back(std::move(slot));
    for (auto& e : extra) out.push_back(std::move(e));
  }
  plan.microbatches = std::move(out);
  return plan;
}

Plan split_sequences(Plan plan, const Batch& batch, const Cluster& cluster, const StaticShapes& shapes) {
  if (shapes.max_sequences <= 0) return plan;
  const auto cap = static_cast<std::size_t>(shapes.max_sequences);
  bool any = false;
  for (const auto& slot : plan.microbatches)
    for (const auto& g : slot) any = any || g.sequences.size() > cap;
  if (!any) return plan;
  std::vector<std::vector<Group>> out;
  for (auto& slot : plan.microbatches) {
    std::vector<std::vector<Group>> extra;  // extra[j]: the (j+2)-th parts of this slot's split groups
    for (auto& g : slot) {
      if (g.sequences.size() <= cap) continue;
      auto parts = parts_of(g, batch, cluster, cap);
      g.sequences = std::move(parts[0]);
      for (std::size_t j = 1; j < parts.size(); ++j) {
        if (extra.size() < j) extra.emplace_back();
        extra[j - 1].push_back(Group{g.ranks, std::move(parts[j])});
      }
    }
    out.push_back(std::move(slot));
    for (auto& e : extra) out.push_back(std::move(e));
  }
  plan.microbatches = std::move(out);
  return plan;
}

namespace {
/// shape_slots' groups (ranks empty): first-fit of the sequences, longest first, at their least allowed degree.
std::vector<Group> first_fit_groups(const Batch& batch, const Cluster& cluster, const CostModel& cost,
                                    const StaticShapes& shapes, bool& ok) {
  const std::int64_t cap = shapes.max_bucket(cost.token_capacity(cluster));
  const auto per = shapes.max_sequences > 0 ? static_cast<std::size_t>(shapes.max_sequences) : batch.size();
  std::vector<std::int64_t> ids(batch.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t x, std::int64_t y) {
    return batch.lengths[static_cast<std::size_t>(x)] > batch.lengths[static_cast<std::size_t>(y)];
  });
  std::vector<Group> groups;
  std::vector<std::int64_t> rows;
  std::vector<int> degree;
  for (auto id : ids) {
    const std::int64_t len = batch.lengths[static_cast<std::size_t>(id)];
    int d = 0;
    for (int x = 1; x <= cluster.num_ranks && d == 0; ++x)
      if (shapes.allows_degree(x) && cluster.num_ranks % x == 0 && cluster.padded_rows(len, x) <= cap) d = x;
    if (d == 0) return ok = false, groups;
    const std::int64_t r = cluster.padded_rows(len, d);
    std::size_t g = 0;
    while (g < groups.size() && !(degree[g] == d && rows[g] + r <= cap && groups[g].sequences.size() < per)) ++g;
    if (g == groups.size()) groups.emplace_back(), rows.push_back(0), degree.push_back(d);
    groups[g].sequences.push_back(id), rows[g] += r;
    groups[g].ranks.assign(static_cast<std::size_t>(d), -1);
  }
  return ok = true, groups;
}
}  // namespace

Plan shape_slots(const Batch& batch, const Cluster& cluster, const CostModel& cost, const StaticShapes& shapes) {
  bool ok = false;
  std::vector<Group> groups = first_fit_groups(batch, cluster, cost, shapes, ok);
  Plan plan;
  plan.num_ranks = cluster.num_ranks;
  if (!ok) return plan;
  const std::vector<GroupStats> single = single_stats(batch, cost);
  std::vector<double> time(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (int j = 0; j < groups[g].degree(); ++j) groups[g].ranks[static_cast<std::size_t>(j)] = j;
    time[g] = shapes.group_time(cost, groups[g], single, batch, cluster);
  }
  std::vector<std::size_t> order(groups.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return time[x] > time[y]; });
  std::vector<double> load(static_cast<std::size_t>(cluster.num_ranks), 0.0);
  std::vector<int> slots(static_cast<std::size_t>(cluster.num_ranks), 0);
  for (std::size_t g : order) {
    const int d = groups[g].degree();
    int best = -1;
    double best_load = 0.0;
    for (int start = 0; start + d <= cluster.num_ranks; start += d) {
      double busiest = 0.0;
      bool room = true;
      for (int r = start; r < start + d; ++r) {
        busiest = std::max(busiest, load[static_cast<std::size_t>(r)]);
        room = room && (shapes.max_microbatches <= 0 || slots[static_cast<std::size_t>(r)] < shapes.max_microbatches);
      }
      if (room && (best < 0 || busiest < best_load)) best = start, best_load = busiest;
    }
    if (best < 0) return Plan{};
    for (int j = 0; j < d; ++j) {
      const auto r = static_cast<std::size_t>(best + j);
      groups[g].ranks[static_cast<std::size_t>(j)] = best + j;
      load[r] = best_load + time[g], ++slots[r];
    }
    plan.microbatches.push_back({groups[g]});
  }
  return plan;
}

}  // namespace dynacp::solve
