// RingSet: the allowed rings, the pick of dynacp's builders and the projection of a plan onto the set.
#include "dynacp/solve/blocks/ring_set.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

RingSet::RingSet(const std::vector<std::vector<int>>& rings, int num_ranks) : num_ranks_(num_ranks) {
  for (std::size_t i = 0; i < rings.size(); ++i) {
    const auto& ring = rings[i];
    if (ring.size() < 2 || static_cast<int>(ring.size()) > num_ranks)
      invalid("ring_set[", i, "] has ", ring.size(), " ranks; a ring has 2..", num_ranks,
              " ranks (single ranks are always allowed)");
    std::vector<int> key = ring;
    std::sort(key.begin(), key.end());
    if (key.front() < 0 || key.back() >= num_ranks)
      invalid("ring_set[", i, "] names rank ", key.front() < 0 ? key.front() : key.back(), " outside the pool of ",
              num_ranks, " ranks");
    if (std::adjacent_find(key.begin(), key.end()) != key.end()) invalid("ring_set[", i, "] names a rank twice");
    if (!members_.emplace(std::move(key), ring).second) invalid("ring_set[", i, "] repeats an earlier ring");
    by_size_[static_cast<int>(ring.size())].push_back(ring);
  }
}

RingSet RingSet::power_of_two_tilings() const {
  std::vector<std::vector<int>> kept;
  for (const auto& [d, rings] : by_size_) {
    if ((d & (d - 1)) != 0) continue;
    for (const auto& ring : rings) {
      bool tiled = ring.front() % d == 0;
      for (int j = 1; j < d && tiled; ++j) tiled = ring[static_cast<std::size_t>(j)] == ring.front() + j;
      if (tiled) kept.push_back(ring);
    }
  }
  return RingSet(kept, num_ranks_);
}

std::vector<int> RingSet::sizes() const {
  std::vector<int> out;
  for (const auto& [d, rings] : by_size_) out.push_back(d);
  return out;
}

std::map<int, std::vector<int>> RingSet::consecutive_starts() const {
  std::map<int, std::vector<int>> out;
  for (const auto& [key, ring] : members_)  // key: the ranks ascending
    if (key.back() - key.front() + 1 == static_cast<int>(key.size()))
      out[static_cast<int>(key.size())].push_back(key.front());
  for (auto& [d, starts] : out) std::sort(starts.begin(), starts.end());
  return out;
}

const std::vector<int>* RingSet::find(const std::vector<int>& ranks) const {
  std::vector<int> key = ranks;
  std::sort(key.begin(), key.end());
  const auto it = members_.find(key);
  return it == members_.end() ? nullptr : &it->second;
}

std::vector<int> RingSet::pick(int d, const std::vector<double>& free) const {
  const auto it = by_size_.find(d);
  if (it == by_size_.end()) return {};
  const std::vector<int>* best = nullptr;
  double best_t = 0.0;
  for (const auto& ring : it->second) {
    double t = -std::numeric_limits<double>::infinity();
    for (int r : ring) t = std::max(t, free[static_cast<std::size_t>(r)]);
    if (best == nullptr || t < best_t) best = &ring, best_t = t;
  }
  if (!std::isfinite(best_t)) return {};  // every ring holds a taken rank (slotted builds mark them infinite)
  std::vector<int> out = *best;
  std::sort(out.begin(), out.end());
  return out;
}

bool RingSet::inside(const Plan& plan) const {
  for (const auto& slot : plan.microbatches)
    for (const Group& g : slot)
      if (g.degree() > 1) {
        const auto* ring = find(g.ranks);
        if (ring == nullptr || *ring != g.ranks) return false;
      }
  return true;
}

namespace {

// One slot of the projection: places groups on rings of the set that are free in the slot. A ring may evict groups
// of one rank (they run right after, in a slot of their own); what finds no ring waits for that slot too.
struct SlotProjection {
  const std::map<int, std::vector<std::vector<int>>>& by_size;
  const std::vector<double>& free;  // the group timeline before this slot
  std::vector<int> holder;          // per rank: the index of the group holding it in this slot, or -1
  const std::vector<Group>& todo;

  double start(const std::vector<int>& ranks) const {
    double t = 0.0;
    for (int r : ranks) t = std::max(t, free[static_cast<std::size_t>(r)]);
    return t;
  }
  // The ring for g: fewest evicted single-rank groups, then the smallest allowed degree >= g's, then the earliest
  // start, then the most of g's ranks, then set order; nullptr when every ring holds a multi-rank group.
  const std::vector<int>* choose(const Group& g) const {
    const std::vector<int>* best = nullptr;
    std::tuple<int, int, double, int> best_key{};
    std::vector<char> mine(holder.size(), 0);
    for (int r : g.ranks) mine[static_cast<std::size_t>(r)] = 1;
    for (auto it = by_size.lower_bound(g.degree()); it != by_size.end(); ++it) {
      for (const auto& ring : it->second) {
        int evicted = 0, shared = 0;
        bool blocked = false;
        for (int r : ring) {
          const int h = holder[static_cast<std::size_t>(r)];
          if (h >= 0 && todo[static_cast<std::size_t>(h)].degree() > 1) {
            blocked = true;
            break;
          }
          evicted += h >= 0 ? 1 : 0;
          shared += mine[static_cast<std::size_t>(r)];
        }
        if (blocked) continue;
        const std::tuple<int, int, double, int> key{evicted, it->first, start(ring), -shared};
        if (best == nullptr || key < best_key) best = &ring, best_key = key;
      }
      if (best != nullptr && std::get<0>(best_key) == 0) break;  // a wider ring cannot beat it
    }
    return best;
  }
  void take(std::size_t i, const std::vector<int>& ring, std::vector<char>& placed) {
    for (int r : ring) {
      if (const int h = holder[static_cast<std::size_t>(r)]; h >= 0) placed[static_cast<std::size_t>(h)] = 0;
      holder[static_cast<std::size_t>(r)] = static_cast<int>(i);
    }
    placed[i] = 1;
  }
};

}  // namespace

Plan RingSet::project(Plan plan, const Batch& batch, const Cluster& cluster, const CostModel& cost) const {
  if (empty() || inside(plan)) return plan;
  const int widest = by_size_.rbegin()->first;
  const std::vector<GroupStats> single = single_stats(batch, cost);
  std::vector<double> free(static_cast<std::size_t>(cluster.num_ranks), 0.0);
  auto run = [&](const Group& g) {
    double s = 0.0;
    for (int r : g.ranks) s = std::max(s, free[static_cast<std::size_t>(r)]);
    const double t = cost.group_time(g, single, cluster);
    for (int r : g.ranks) free[static_cast<std::size_t>(r)] = s + t;
  };
  std::vector<std::vector<Group>> out;
  for (auto& slot : plan.microbatches) {
    std::vector<Group> todo = std::move(slot);
    while (!todo.empty()) {
      SlotProjection sp{by_size_, free, std::vector<int>(free.size(), -1), todo};
      std::vector<char> placed(todo.size(), 0);
      std::vector<std::size_t> moved;
      for (std::size_t i = 0; i < todo.size(); ++i) {  // groups on a ring of the set (or one rank) stay
        const std::vector<int>* ring = todo[i].degree() == 1 ? &todo[i].ranks : find(todo[i].ranks);
        const bool free_now = ring != nullptr && std::all_of(ring->begin(), ring->end(), [&](int r) {
                                return sp.holder[static_cast<std::size_t>(r)] < 0;
                              });
        if (!free_now) {
          moved.push_back(i);
          continue;
        }
        todo[i].ranks = *ring;
        sp.take(i, todo[i].ranks, placed);
      }
      std::stable_sort(moved.begin(), moved.end(),
                       [&](std::size_t x, std::size_t y) { return todo[x].degree() > todo[y].degree(); });
      for (std::size_t i : moved) {
        if (todo[i].degree() > widest)
          invalid("ring_set: a group needs ", todo[i].degree(), " ranks but the widest ring of the set has ", widest,
                  "; add a ring of at least that size (e.g. the whole pool)");
        if (todo[i].degree() == 1) continue;  // (only a spilled single: it waits for the next slot)
        if (const std::vector<int>* ring = sp.choose(todo[i])) {
          todo[i].ranks = *ring;
          sp.take(i, todo[i].ranks, placed);
        }
      }
      std::vector<Group> here, spill;
      for (std::size_t i = 0; i < todo.size(); ++i) (placed[i] ? here : spill).push_back(std::move(todo[i]));
      for (const Group& g : here) run(g);
      out.push_back(std::move(here));
      todo = std::move(spill);
    }
  }
  plan.microbatches = std::move(out);
  return plan;
}

RingPicker::RingPicker(const RingSet& set, int num_ranks, int ranks_per_node)
    : on_node_(static_cast<std::size_t>((num_ranks + ranks_per_node - 1) / ranks_per_node)),
      seen_(static_cast<std::size_t>(num_ranks), 0.0),
      rpn_(ranks_per_node) {
  for (const auto& [d, rings] : set.by_size_) {
    auto& entries = rings_[d];
    auto& order = order_[d];
    for (const auto& ring : rings) {
      Entry e{ring, 0.0};
      std::sort(e.ranks.begin(), e.ranks.end());
      const std::size_t i = entries.size();
      int last = -1;
      for (int r : e.ranks)
        if (r / rpn_ != last) last = r / rpn_, on_node_[static_cast<std::size_t>(last)].push_back({d, i});
      entries.push_back(std::move(e));
      order.insert({0.0, i});
    }
  }
}

std::vector<int> RingPicker::pick(int d) const {
  const auto it = order_.find(d);
  if (it == order_.end() || it->second.empty()) return {};
  const auto& [start, i] = *it->second.begin();
  if (!std::isfinite(start)) return {};  // (as RingSet::pick)
  return rings_.at(d)[i].ranks;
}

void RingPicker::update(int node, const std::vector<double>& free) {
  // Free times only grow in dynacp's builds: a ring's start is then the larger of its start and the node's new
  // times on it (O(ranks on the node) per ring); a time that fell recomputes the ring over all its ranks.
  const int lo = node * rpn_, hi = std::min(lo + rpn_, static_cast<int>(seen_.size()));
  bool fell = false;
  for (int r = lo; r < hi; ++r) fell = fell || free[static_cast<std::size_t>(r)] < seen_[static_cast<std::size_t>(r)];
  for (int r = lo; r < hi; ++r) seen_[static_cast<std::size_t>(r)] = free[static_cast<std::size_t>(r)];
  for (const auto& [d, i] : on_node_[static_cast<std::size_t>(node)]) {
    Entry& e = rings_[d][i];
    double t = e.start;
    if (fell) {
      t = -std::numeric_limits<double>::infinity();
      for (int r : e.ranks) t = std::max(t, free[static_cast<std::size_t>(r)]);
    } else {  // the ring's ranks on this node (ranks ascending)
      for (auto it = std::lower_bound(e.ranks.begin(), e.ranks.end(), lo); it != e.ranks.end() && *it < hi; ++it)
        t = std::max(t, free[static_cast<std::size_t>(*it)]);
    }
    if (t == e.start) continue;
    auto& order = order_[d];
    order.erase({e.start, i});
    e.start = t;
    order.insert({t, i});
  }
}

}  // namespace dynacp::solve
