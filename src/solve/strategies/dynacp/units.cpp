// The units family of dynacp's pipelined plans (include/dynacp/solve/strategies/dynacp/units.hpp): each unit's count,
// the balancing moves between units, the giants' blocks, and profile_units itself. The packing is units_packer.cpp.
#include "dynacp/solve/strategies/dynacp/units.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <vector>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/balance.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "units_packer.hpp"

namespace dynacp::solve {
namespace dyn {

int Units::best_m(const std::vector<Packed>& row) {
  int m = 0;
  double best = kInf;
  for (std::size_t k = 0; k < row.size(); ++k)
    if (row[k].makespan < best) best = row[k].makespan, m = static_cast<int>(k) + 1;
  return m;
}

int Units::common_count(const std::vector<std::vector<Packed>>& packs) const {
  double best = kInf;
  int common = 0;
  for (int m = step_; m <= m_max_; m += step_) {
    double worst = 0.0;
    for (const auto& row : packs) {
      const Packed& p = row[static_cast<std::size_t>(m - 1)];
      worst = std::max(worst, static_cast<int>(p.bins.size()) == m ? p.makespan : kInf);
    }
    if (worst < best) best = worst, common = m;
  }
  return common;
}

void Units::try_moves(const Balance& state, std::size_t hi, std::size_t lo,
                      std::map<std::size_t, std::vector<Packed>>& without, Move& move) {
  const auto& ids = state.ids;
  const auto& units = state.units;
  const auto& chosen = state.chosen;
  const auto& t_lo = alone(units[lo].width);
  // the kMoves sequences whose per-rank work is nearest half the gap's worth (makespan ~ 1.2 work / pp)
  const auto& t_hi = alone(units[hi].width);
  const double half = (state.span_of(hi) - state.span_of(lo)) * pp_ / 2.4;
  std::vector<std::size_t> tries(ids[hi].size());
  std::iota(tries.begin(), tries.end(), 0);
  auto off = [&](std::size_t k) {
    return std::abs(t_hi[static_cast<std::size_t>(ids[hi][k])] - cost_.group_overhead - half);
  };
  std::stable_sort(tries.begin(), tries.end(), [&](std::size_t x, std::size_t y) { return off(x) < off(y); });
  if (tries.size() > kMoves) tries.resize(kMoves);
  for (std::size_t k : tries) {
    const std::int64_t s = ids[hi][k];
    if (!fits(static_cast<std::size_t>(s), units[lo].width)) continue;
    auto found = without.find(k);
    if (found == without.end()) {
      std::vector<std::int64_t> a = ids[hi];
      a.erase(a.begin() + static_cast<std::ptrdiff_t>(k));
      found = without.emplace(k, pack_all(a, units[hi].width, chosen[hi] - step_, chosen[hi] + step_)).first;
    }
    const std::vector<Packed>& ra = found->second;
    const int ma = best_m(ra);
    const double t_hi = ma ? ra[static_cast<std::size_t>(ma - 1)].makespan : 0.0;
    // the move is kept only when both units end below `best`: no need to pack the receiver otherwise
    if ((ids[hi].size() > 1 && ma == 0) || !(t_hi < move.best - 1e-12)) continue;
    std::vector<std::int64_t> b = ids[lo];
    auto at = std::find_if(b.begin(), b.end(), [&](std::int64_t y) {
      const double ts = t_lo[static_cast<std::size_t>(s)], ty = t_lo[static_cast<std::size_t>(y)];
      return ts > ty || (ts == ty && s < y);
    });
    b.insert(at, s);
    auto rb = pack_all(b, units[lo].width, chosen[lo] - step_, chosen[lo] + step_);
    const int mb = best_m(rb);
    if (mb == 0) continue;
    const double t = std::max(t_hi, rb[static_cast<std::size_t>(mb - 1)].makespan);
    if (t < move.best - 1e-12) move.best = t, move.pick = k, move.to = lo, move.hi = ra, move.lo = std::move(rb);
  }
}

bool Units::move_one(Balance& state) {
  const std::size_t U = state.units.size();
  auto& ids = state.ids;
  std::vector<std::size_t> by_span(U);
  std::iota(by_span.begin(), by_span.end(), 0);
  std::stable_sort(by_span.begin(), by_span.end(),
                   [&](std::size_t x, std::size_t y) { return state.span_of(x) < state.span_of(y); });
  const std::size_t hi = by_span.back();
  Move move{state.span_of(hi), ids[hi].size(), hi, {}, {}};
  std::map<std::size_t, std::vector<Packed>> without;  // the slowest unit re-packed without its k-th sequence
  for (std::size_t r = 0; r < std::min<std::size_t>(kTargets, U - 1); ++r)
    try_moves(state, hi, by_span[r], without, move);
  if (move.pick == ids[hi].size()) return false;
  const std::size_t lo = move.to;
  const std::int64_t s = ids[hi][move.pick];
  ids[hi].erase(ids[hi].begin() + static_cast<std::ptrdiff_t>(move.pick));
  ids[lo].push_back(s);
  sort_heaviest_first(ids[lo], state.units[lo].width);
  state.packs[hi] = std::move(move.hi), state.packs[lo] = std::move(move.lo);
  state.chosen[hi] = best_m(state.packs[hi]), state.chosen[lo] = best_m(state.packs[lo]);
  return true;
}

Plan Units::run(const std::vector<Unit>& units, std::vector<std::vector<std::int64_t>> ids) {
  Plan plan;
  plan.strategy = "dynacp";
  plan.num_ranks = cluster_.num_ranks;
  const std::size_t U = units.size();
  Balance state{units, std::move(ids), std::vector<std::vector<Packed>>(U), std::vector<int>(U, 0)};
  for (std::size_t u = 0; u < U; ++u) {
    sort_heaviest_first(state.ids[u], units[u].width);
    state.packs[u] = pack_all(state.ids[u], units[u].width, 1, m_max_);
  }
  if (equal_) {
    const int common = common_count(state.packs);
    if (common == 0) return plan;
    std::fill(state.chosen.begin(), state.chosen.end(), common);
  } else {
    for (std::size_t u = 0; u < U; ++u) {
      state.chosen[u] = best_m(state.packs[u]);
      if (!state.ids[u].empty() && state.chosen[u] == 0) return plan;  // no m fits the unit's tokens
    }
    // Balance: move one sequence from the slowest unit to one of the kTargets fastest that has the memory for it, the
    // move that lowers the slower of the two most (each re-packed for m within 1 of its count), while one helps, at
    // most U times.
    for (std::size_t round = 0; round < U && move_one(state); ++round) {
    }
  }
  for (std::size_t u = 0; u < U; ++u) {
    if (state.chosen[u] == 0) continue;
    auto mbs = groups(state.packs[u][static_cast<std::size_t>(state.chosen[u] - 1)], units[u].width);
    if (plan.microbatches.size() < mbs.size()) plan.microbatches.resize(mbs.size());
    for (std::size_t j = 0; j < mbs.size(); ++j)
      for (Group& g : mbs[j]) {
        for (int& r : g.ranks) r += units[u].start;
        plan.microbatches[j].push_back(std::move(g));
      }
  }
  return plan;
}

}  // namespace dyn

namespace {

using dyn::block_size_ok;
using dyn::kInf;
using dyn::stats_of;
using dyn::Unit;
using dyn::Units;

// The giants' blocks by water-filling (sizes[k]: giant k's usable block sizes, at[k]: the one it takes, used: their
// ranks in all): the slowest giant takes its next larger size that is faster, while that lowers max(slowest giant,
// min_m h(m, pp) (W + m c) / pp) with W the units' per-rank work on the ranks left.
void grow_giant_blocks(Units& b, const CostModel& cost, int width, int pp, int P, double rest_work,
                       const std::vector<GroupStats>& g, const std::vector<std::vector<int>>& sizes,
                       std::vector<std::size_t>& at, int& used) {
  const int k_max = static_cast<int>(sizes.size());
  auto time_of = [&](int k) {
    const auto K = static_cast<std::size_t>(k);
    return b.time(g[K], sizes[K][at[K]]);
  };
  auto units_floor = [&](int ranks) {
    return ranks < width ? kInf : one_f_one_b_work_floor(rest_work / ranks, cost.group_overhead, pp);
  };
  auto score = [&] {
    double s = units_floor(P - used);
    for (int k = 0; k < k_max; ++k) s = std::max(s, time_of(k));
    return s;
  };
  for (;;) {
    int slow = 0;
    for (int k = 1; k < k_max; ++k)
      if (time_of(k) > time_of(slow)) slow = k;
    const auto S = static_cast<std::size_t>(slow);
    const std::size_t was = at[S];
    const double now = score(), t_was = time_of(slow);
    std::size_t next = was + 1;
    while (next < sizes[S].size() && b.time(g[S], sizes[S][next]) >= t_was) ++next;
    if (next >= sizes[S].size()) break;
    const int grow = sizes[S][next] - sizes[S][was];
    at[S] = next, used += grow;
    if (P - used < width || score() >= now) {
      at[S] = was, used -= grow;
      break;
    }
  }
}

// Giants: the `giants` sequences slowest at their best degree, each on a block of its own at the end of the pool (the
// multiple of width whose time is closest to the best split of the work left on the other ranks); each must take
// target / 2 at least. Appends their units and ids, marks them in `giant` and lowers `end` to the first giant's
// block; false when the family does not apply.
bool place_giants(Units& b, const Batch& batch, const Cluster& cluster, const CostModel& cost, int width, int pp,
                  int giants, double target, std::vector<Unit>& units, std::vector<std::vector<std::int64_t>>& ids,
                  std::vector<char>& giant, int& end) {
  const int P = cluster.num_ranks, rpn = cluster.ranks_per_node;
  const std::size_t n = batch.size();
  std::vector<std::pair<double, std::size_t>> best(n);
  for (std::size_t i = 0; i < n; ++i) {
    const GroupStats g = stats_of(batch, cost, i);
    best[i] = {cost.time(g, cost.best_degree(g, cost.min_degree(batch.lengths[i], cluster), cluster), cluster), i};
  }
  std::stable_sort(best.begin(), best.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  const int k_max = std::min<int>(giants, static_cast<int>(n));
  for (int k = 0; k < k_max; ++k)
    if (best[static_cast<std::size_t>(k)].first < 0.5 * target) return false;  // not a giant
  for (int k = 0; k < k_max; ++k) giant[best[static_cast<std::size_t>(k)].second] = 1;
  const auto& t = b.alone(width);
  double rest_work = 0.0;  // the units' total rank-time
  for (std::size_t i = 0; i < n; ++i) rest_work += giant[i] ? 0.0 : (t[i] - cost.group_overhead) * width;
  // Block sizes: water-filling from each giant's least size. The slowest giant takes its next larger size that
  // is faster, while that lowers max(slowest giant, min_m h(m, pp) (W + m c) / pp) with W the units' per-rank work.
  std::vector<std::vector<int>> sizes(static_cast<std::size_t>(k_max));
  std::vector<std::size_t> at(static_cast<std::size_t>(k_max), 0);
  std::vector<GroupStats> g(static_cast<std::size_t>(k_max));
  int used = 0;
  for (int k = 0; k < k_max; ++k) {
    const std::size_t i = best[static_cast<std::size_t>(k)].second;
    g[static_cast<std::size_t>(k)] = stats_of(batch, cost, i);
    for (int e = width; e <= P; e += width)
      if (b.fits(i, e) && block_size_ok(e, rpn)) sizes[static_cast<std::size_t>(k)].push_back(e);
    if (sizes[static_cast<std::size_t>(k)].empty()) return false;
    used += sizes[static_cast<std::size_t>(k)].front();
  }
  if (P - used < width) return false;
  grow_giant_blocks(b, cost, width, pp, P, rest_work, g, sizes, at, used);
  // widest blocks at the very end
  std::vector<int> order(static_cast<std::size_t>(k_max));
  std::iota(order.begin(), order.end(), 0);
  auto size_of = [&](int k) { return sizes[static_cast<std::size_t>(k)][at[static_cast<std::size_t>(k)]]; };
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return size_of(x) > size_of(y); });
  for (int k : order) {
    const int d = size_of(k);
    end -= d;
    if (!b.aligned(end, d)) return false;
    units.push_back({end, d});
    ids.push_back({static_cast<std::int64_t>(best[static_cast<std::size_t>(k)].second)});
  }
  return true;
}

}  // namespace

Plan profile_units(const Batch& batch, const Cluster& cluster, const CostModel& cost, int width, int pp,
                   bool equal_counts, int giants, double target, int vpp) {
  if (width < 1 || pp < 1 || vpp < 1 || giants < 0)
    invalid("profile_units: width, pp and vpp must be >= 1 and giants >= 0, got ", width, ", ", pp, ", ", vpp, " and ",
            giants);
  const int P = cluster.num_ranks, rpn = cluster.ranks_per_node;
  Plan none;
  none.strategy = "dynacp";
  none.num_ranks = P;
  if (!block_size_ok(width, rpn) || (width > rpn && P % width != 0)) return none;
  Units b(batch, cluster, cost, pp, equal_counts, vpp > 1 ? pp : 1);
  const std::size_t n = batch.size();
  std::vector<Unit> units;
  std::vector<std::vector<std::int64_t>> ids;
  std::vector<char> giant(n, 0);
  int end = P;
  if (giants > 0 && !place_giants(b, batch, cluster, cost, width, pp, giants, target, units, ids, giant, end))
    return none;
  std::vector<std::int64_t> rest;
  std::vector<double> weight;
  const auto& t = b.alone(width);
  for (std::size_t i = 0; i < n; ++i) {
    if (giant[i]) continue;
    if (!b.fits(i, width)) return none;
    rest.push_back(static_cast<std::int64_t>(i));
    weight.push_back((t[i] - cost.group_overhead) * width);
  }
  const int count = end / width;
  Parts parts = rest.empty() ? Parts(static_cast<std::size_t>(count)) : balance(weight, count);
  for (int u = 0; u < count; ++u) {
    units.push_back({u * width, width});
    ids.emplace_back();
    for (std::int64_t k : parts[static_cast<std::size_t>(u)]) ids.back().push_back(rest[static_cast<std::size_t>(k)]);
  }
  Plan plan = b.run(units, std::move(ids));
  for (auto& slot : plan.microbatches)  // groups in rank order
    std::stable_sort(slot.begin(), slot.end(), [](const Group& x, const Group& y) { return x.ranks < y.ranks; });
  return plan;
}

}  // namespace dynacp::solve
