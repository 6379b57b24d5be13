// Internal to the units family (include/dynacp/solve/strategies/dynacp/units.hpp): the unit build shared by
// profile_units - packing a unit's sequences into m microbatches and splitting microbatches into rings
// (units_packer.cpp), choosing counts and balancing sequences between units (units.cpp).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"

namespace dynacp::solve::dyn {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr std::size_t kTargets = 2;  // the fastest units a move may go to
inline constexpr std::size_t kMoves = 4;    // the sequences of the slowest unit a move may take

struct Unit {
  int start = 0, width = 1;
};

struct Packed {
  double makespan = kInf;
  std::vector<std::vector<std::int64_t>> bins;  // each microbatch's sequences, run order, none empty (Units::groups
                                                // splits them into rings)
};

inline GroupStats stats_of(const Batch& batch, const CostModel& cost, std::size_t i) {
  const std::int64_t id = static_cast<std::int64_t>(i);
  return group_stats(batch, cost, std::span(&id, 1));
}

// A block of `width` ranks may lie inside one node or span whole nodes.
inline bool block_size_ok(int width, int rpn) { return width <= rpn ? rpn % width == 0 : width % rpn == 0; }

// Everything a unit build shares: the batch, the model, and each sequence's time alone at each width (lazily).
class Units {
 public:
  Units(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, bool equal_counts, int step)
      : batch_(batch),
        cluster_(cluster),
        cost_(cost),
        pp_(pp),
        equal_(equal_counts),
        step_(step),
        m_max_(std::min(32, 8 * pp) / step * step),
        one_(single_stats(batch, cost)),
        parts_(64) {}

  /// A unit of `width` ranks from `start` is usable when it stays inside one node or spans whole nodes.
  bool aligned(int start, int width) const {
    const int rpn = cluster_.ranks_per_node;
    return width <= rpn ? start / rpn == (start + width - 1) / rpn : start % rpn == 0 && width % rpn == 0;
  }
  /// Padded rows per rank of sequence i on a ring of `width` ranks.
  std::int64_t rows(std::size_t i, int width) const { return cluster_.padded_rows(batch_.lengths[i], width); }
  bool fits(std::size_t i, int width) const { return rows(i, width) <= cost_.token_capacity(cluster_); }
  double time(const GroupStats& g, int width) const {
    return cost_.time(g, width, width > cluster_.ranks_per_node, cluster_);
  }
  /// T({s_i}, width), cached per width.
  const std::vector<double>& alone(int width) {
    auto& t = alone_[width];
    if (t.empty())
      for (std::size_t i = 0; i < batch_.size(); ++i) t.push_back(time(stats_of(batch_, cost_, i), width));
    return t;
  }

  /// Packs each unit's sequences, picks counts, balances (variable counts) and emits the plan; empty when some unit
  /// cannot hold its sequences or (equal counts) no count suits every unit.
  Plan run(const std::vector<Unit>& units, std::vector<std::vector<std::int64_t>> ids);

 private:
  // The units' sequences, packings per count and chosen counts while run() balances them (variable counts).
  struct Balance {
    const std::vector<Unit>& units;
    std::vector<std::vector<std::int64_t>> ids;
    std::vector<std::vector<Packed>> packs;
    std::vector<int> chosen;  // the count each unit runs (0: no sequences)
    double span_of(std::size_t u) const {
      return chosen[u] ? packs[u][static_cast<std::size_t>(chosen[u] - 1)].makespan : 0.0;
    }
  };
  // The best balancing move found so far: the slower unit's time after it, which sequence of the slowest unit
  // (its size: none), to which unit, and both units' packings.
  struct Move {
    double best;
    std::size_t pick, to;
    std::vector<Packed> hi, lo;
  };
  /// The count (0 when no m fits) with the least makespan in one unit's packings.
  static int best_m(const std::vector<Packed>& row);
  /// Equal counts: the multiple of step_ with the least slowest unit (0 when none suits every unit).
  int common_count(const std::vector<std::vector<Packed>>& packs) const;
  /// Moves of the kMoves sequences of unit hi nearest half the gap's worth to unit lo; keeps the best below move.best.
  void try_moves(const Balance& state, std::size_t hi, std::size_t lo,
                 std::map<std::size_t, std::vector<Packed>>& without, Move& move);
  /// One balancing round: the best move from the slowest unit to one of the kTargets fastest; false when none helps.
  bool move_one(Balance& state);

  Packed pack(const std::vector<std::int64_t>& ids, int width, int m);
  std::vector<Packed> pack_all(const std::vector<std::int64_t>& ids, int width, int lo, int hi) {
    std::vector<Packed> row(static_cast<std::size_t>(m_max_));
    for (int m = std::max(lo, 1); m <= std::min({hi, m_max_, static_cast<int>(ids.size())}); ++m)
      if (m % step_ == 0) row[static_cast<std::size_t>(m - 1)] = pack(ids, width, m);
    return row;
  }
  void sort_heaviest_first(std::vector<std::int64_t>& ids, int width) {
    const auto& t = alone(width);
    std::sort(ids.begin(), ids.end(), [&](std::int64_t x, std::int64_t y) {  // a total order: ids are distinct
      const double tx = t[static_cast<std::size_t>(x)], ty = t[static_cast<std::size_t>(y)];
      return tx > ty || (tx == ty && x < y);
    });
  }

  /// A microbatch of a unit, split into two rings on the halves of its ranks (recursively) while that makes it
  /// faster: its sequences, heaviest first, each to the half it slows least. Returns the slowest ring's time and,
  /// when `out` is given, adds the rings to it. Reorders `ids`; `depth` picks the scratch for the halves.
  double split(std::vector<std::int64_t>& ids, std::size_t depth, int start, int width, std::vector<Group>* out);
  /// A packing's microbatches as rings (ranks counted from the unit's first): the chosen count's only.
  std::vector<std::vector<Group>> groups(Packed& p, int width) {
    std::vector<std::vector<Group>> mbs(p.bins.size());
    for (std::size_t j = 0; j < p.bins.size(); ++j) split(p.bins[j], 0, 0, width, &mbs[j]);
    return mbs;
  }

  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  int pp_;
  bool equal_;
  int step_;  // counts are multiples of it (pp under interleaving)
  int m_max_;
  std::map<int, std::vector<double>> alone_;
  std::vector<GroupStats> one_;                                  // each sequence's stats alone
  std::vector<std::array<std::vector<std::int64_t>, 2>> parts_;  // split's halves, by depth (a unit is < 2^64 ranks)
  OneFOneBScratch scratch_;
};

}  // namespace dynacp::solve::dyn
