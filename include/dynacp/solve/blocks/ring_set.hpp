// A bounded set of CP rings (PlanOptions::ring_set): the process groups a runtime creates once at start-up
// (TransformerEngine needs one per ring). dynacp's builders pick their rings from it (RingSet::pick, allowed degrees)
// and score every candidate after RingSet::project, so its search chooses among plans that use only these rings;
// the other strategies get the projection after their solve (the fallback; api/planner.cpp). docs/strategies.md
// ("Ring sets") describes both.
#pragma once
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "dynacp/model/plan.hpp"

namespace dynacp::solve {

class RingSet {
 public:
  /// No constraint: every ring is allowed.
  RingSet() = default;
  /// `rings`: pool ranks in ring order, each of 2..P distinct ranks in [0, P), no ring twice (as a set of ranks).
  /// Single ranks are always allowed. Throws InvalidArgument naming the first bad ring.
  RingSet(const std::vector<std::vector<int>>& rings, int num_ranks);

  bool empty() const { return by_size_.empty(); }
  /// Rings in the set.
  std::size_t count() const { return members_.size(); }
  /// The rings of the set that tile the pool like a buddy allocator: 2^k consecutive ranks from a multiple of 2^k
  /// (rings of these never straddle each other). dynacp also searches on them alone (driver.cpp).
  RingSet power_of_two_tilings() const;
  /// Degree d has a ring in the set (d = 1 always; every d when the set is empty).
  bool allowed(int d) const { return empty() || d == 1 || by_size_.count(d) > 0; }
  /// The allowed degrees >= 2, ascending.
  std::vector<int> sizes() const;
  /// Per degree d of the set (ascending), the first ranks r of its rings on the consecutive ranks r..r+d-1 (in any
  /// ring order), ascending: where a builder may lay a ring of d consecutive ranks (shelves).
  std::map<int, std::vector<int>> consecutive_starts() const;
  /// The set's ring with the ranks of `ranks` (any order), or nullptr; a single rank is its own ring.
  const std::vector<int>* find(const std::vector<int>& ranks) const;
  /// The ring of size d whose latest-free rank (largest `free`) frees first; ties: the earlier ring of the set.
  /// Ranks ascending. Empty when the set has no ring of size d.
  std::vector<int> pick(int d, const std::vector<double>& free) const;
  /// `plan` with every group on a ring of the set: groups already on one keep it; the others, largest first, take
  /// the free ring of the slot (of their degree, else the next allowed one: more ranks hold fewer rows each) that
  /// starts earliest on the group timeline, most shared ranks first among ties; a group with no free ring in its slot
  /// opens a slot right after it. Sequences never move, so every group still fits. Identity on a plan already inside
  /// the set. Throws InvalidArgument when a group needs more ranks than the set's widest ring.
  Plan project(Plan plan, const Batch& batch, const Cluster& cluster, const CostModel& cost) const;
  /// True when every multi-rank group of `plan` is a ring of the set, in the set's ring order.
  bool inside(const Plan& plan) const;

 private:
  friend class RingPicker;
  std::map<int, std::vector<std::vector<int>>> by_size_;  // ring order, set order
  std::map<std::vector<int>, std::vector<int>> members_;  // ranks ascending -> the ring in ring order
  int num_ranks_ = 0;
};

/// RingSet::pick with an index: per degree the rings ordered by (latest free time of their ranks, set order),
/// refreshed for the rings on a node when the caller reports that node's free times changed (update). The same picks
/// as RingSet::pick in O(log rings) where the scan costs O(pool); dynacp's rank picker uses it (builder.cpp).
class RingPicker {
 public:
  /// Every rank starts free at 0.
  RingPicker(const RingSet& set, int num_ranks, int ranks_per_node);
  /// = RingSet::pick(d, free) for the free times reported so far.
  std::vector<int> pick(int d) const;
  /// The free times of `node`'s ranks changed (any others unchanged since the last update).
  void update(int node, const std::vector<double>& free);

 private:
  struct Entry {
    std::vector<int> ranks;  // ascending
    double start = 0.0;
  };
  std::map<int, std::vector<Entry>> rings_;                        // by degree, set order
  std::map<int, std::set<std::pair<double, std::size_t>>> order_;  // by degree: (start, index)
  std::vector<std::vector<std::pair<int, std::size_t>>> on_node_;  // node -> (degree, index) of its rings
  std::vector<double> seen_;                                       // per rank: the free time last reported
  int rpn_;
};

}  // namespace dynacp::solve
