#include "dynacp/solve/blocks/shapes.hpp"

#include <algorithm>
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
}  // namespace

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

}  // namespace dynacp::solve
