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

namespace dynacp::solve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::size_t kTargets = 2;  // the fastest units a move may go to
constexpr std::size_t kMoves = 4;    // the sequences of the slowest unit a move may take

struct Unit {
  int start = 0, width = 1;
};

struct Packed {
  double makespan = kInf;
  std::vector<std::vector<std::int64_t>> bins;  // each microbatch's sequences, run order, none empty (Units::groups
                                                // splits them into rings)
};

GroupStats stats_of(const Batch& batch, const CostModel& cost, std::size_t i) {
  const std::int64_t id = static_cast<std::int64_t>(i);
  return group_stats(batch, cost, std::span(&id, 1));
}

// A block of `width` ranks may lie inside one node or span whole nodes.
bool block_size_ok(int width, int rpn) { return width <= rpn ? rpn % width == 0 : width % rpn == 0; }

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

// One unit's sequences (heaviest first) into m microbatches: each, in turn, into the microbatch with the most time
// left against profile_j S / m (S: the unit's per-rank time at m microbatches) among those with token room.
Packed Units::pack(const std::vector<std::int64_t>& ids, int width, int m) {
  const double c = cost_.group_overhead;
  const std::int64_t cap = cost_.token_capacity(cluster_);
  const auto& t1 = alone(width);
  double S = m * c;
  for (std::int64_t id : ids) S += t1[static_cast<std::size_t>(id)] - c;
  const std::vector<double> profile = one_f_one_b_profile(m, pp_);
  const auto M = static_cast<std::size_t>(m);
  std::vector<GroupStats> stats(M);
  std::vector<std::int64_t> used(M, 0);  // padded rows per rank
  std::vector<double> time(M, 0.0);
  std::vector<std::vector<std::int64_t>> bins(M);
  // Adding a sequence of s tokens raises a group's time by at least its linear work linear_coef s / width (every
  // other term only grows, and the overlap hides at most the added attention), so a microbatch's time left after it
  // is at most its slack (room - time) less that. The microbatches are tried in order of slack, largest first, and
  // the scan stops once even the next slack (with a margin far above rounding) cannot beat the best so far: the same
  // choice (the most time left, ties to the lowest index) for far fewer pricings.
  std::vector<double> room(M), slack(M);
  for (std::size_t j = 0; j < M; ++j) room[j] = slack[j] = profile[j] * S / m;
  const double margin = 1e-9 * (*std::max_element(room.begin(), room.end()) + 1.0);
  std::vector<std::size_t> order(M);  // by slack, largest first (ties: lower index first)
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return slack[x] > slack[y]; });
  for (std::int64_t id : ids) {
    const auto i = static_cast<std::size_t>(id);
    const std::int64_t need = rows(i, width);
    const double rise = cost_.linear_coef * static_cast<double>(batch_.lengths[i]) / width;
    std::size_t best = M, at = M;
    double best_left = 0.0, best_time = 0.0;
    for (std::size_t k = 0; k < M; ++k) {
      const std::size_t j = order[k];
      if (best < M) {
        const double bound = slack[j] - rise;
        if (bound + 1e-9 * std::abs(bound) + margin <= best_left) break;
      }
      if (used[j] + need > cap) continue;
      GroupStats g = stats[j];
      g.merge(one_[i]);
      const double t = this->time(g, width);
      const double left = room[j] - t;
      if (best == M || left > best_left || (left == best_left && j < best))
        best = j, at = k, best_left = left, best_time = t;
    }
    if (best == M) return {};
    stats[best].merge(one_[i]);
    used[best] += need;
    time[best] = best_time;
    bins[best].push_back(id);
    slack[best] = room[best] - best_time;
    auto before = [&](std::size_t x, std::size_t y) { return slack[x] > slack[y] || (slack[x] == slack[y] && x < y); };
    for (; at + 1 < M && before(order[at + 1], best); ++at) order[at] = order[at + 1];  // back to its place
    for (; at > 0 && before(best, order[at - 1]); --at) order[at] = order[at - 1];
    order[at] = best;
  }
  Packed out;
  std::vector<double> times;
  for (std::size_t j = 0; j < M; ++j)
    if (!bins[j].empty()) {
      times.push_back(split(bins[j], 0, 0, width, nullptr));
      out.bins.push_back(std::move(bins[j]));
    }
  if (static_cast<int>(times.size()) % step_ != 0) return {};  // an emptied microbatch breaks the multiple
  out.makespan = one_f_one_b_makespan(times, pp_, cost_.backward_ratio, scratch_);
  return out;
}

Plan Units::run(const std::vector<Unit>& units, std::vector<std::vector<std::int64_t>> ids) {
  Plan plan;
  plan.strategy = "dynacp";
  plan.num_ranks = cluster_.num_ranks;
  const std::size_t U = units.size();
  auto best_m = [](const std::vector<Packed>& row) {  // 0 when no m fits
    int m = 0;
    double best = kInf;
    for (std::size_t k = 0; k < row.size(); ++k)
      if (row[k].makespan < best) best = row[k].makespan, m = static_cast<int>(k) + 1;
    return m;
  };
  std::vector<std::vector<Packed>> packs(U);
  for (std::size_t u = 0; u < U; ++u) {
    sort_heaviest_first(ids[u], units[u].width);
    packs[u] = pack_all(ids[u], units[u].width, 1, m_max_);
  }
  std::vector<int> chosen(U, 0);  // the count each unit runs (0: no sequences)
  if (equal_) {
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
    if (common == 0) return plan;
    std::fill(chosen.begin(), chosen.end(), common);
  } else {
    for (std::size_t u = 0; u < U; ++u) {
      chosen[u] = best_m(packs[u]);
      if (!ids[u].empty() && chosen[u] == 0) return plan;  // no m fits the unit's tokens
    }
    // Balance: move one sequence from the slowest unit to one of the kTargets fastest that has the memory for it, the
    // move that lowers the slower of the two most (each re-packed for m within 1 of its count), while one helps, at
    // most U times.
    auto span_of = [&](std::size_t u) {
      return chosen[u] ? packs[u][static_cast<std::size_t>(chosen[u] - 1)].makespan : 0.0;
    };
    for (std::size_t round = 0; round < U; ++round) {
      std::vector<std::size_t> by_span(U);
      std::iota(by_span.begin(), by_span.end(), 0);
      std::stable_sort(by_span.begin(), by_span.end(),
                       [&](std::size_t x, std::size_t y) { return span_of(x) < span_of(y); });
      const std::size_t hi = by_span.back();
      double best = span_of(hi);
      std::size_t pick = ids[hi].size(), to = hi;
      std::vector<Packed> best_hi, best_lo;
      std::map<std::size_t, std::vector<Packed>> without;  // the slowest unit re-packed without its k-th sequence
      for (std::size_t r = 0; r < std::min<std::size_t>(kTargets, U - 1); ++r) {
        const std::size_t lo = by_span[r];
        const auto& t_lo = alone(units[lo].width);
        // the kMoves sequences whose per-rank work is nearest half the gap's worth (makespan ~ 1.2 work / pp)
        const auto& t_hi = alone(units[hi].width);
        const double half = (span_of(hi) - span_of(lo)) * pp_ / 2.4;
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
          if ((ids[hi].size() > 1 && ma == 0) || !(t_hi < best - 1e-12)) continue;
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
          if (t < best - 1e-12) best = t, pick = k, to = lo, best_hi = ra, best_lo = std::move(rb);
        }
      }
      if (pick == ids[hi].size()) break;
      const std::size_t lo = to;
      const std::int64_t s = ids[hi][pick];
      ids[hi].erase(ids[hi].begin() + static_cast<std::ptrdiff_t>(pick));
      ids[lo].push_back(s);
      sort_heaviest_first(ids[lo], units[lo].width);
      packs[hi] = std::move(best_hi), packs[lo] = std::move(best_lo);
      chosen[hi] = best_m(packs[hi]), chosen[lo] = best_m(packs[lo]);
    }
  }
  for (std::size_t u = 0; u < U; ++u) {
    if (chosen[u] == 0) continue;
    auto mbs = groups(packs[u][static_cast<std::size_t>(chosen[u] - 1)], units[u].width);
    if (plan.microbatches.size() < mbs.size()) plan.microbatches.resize(mbs.size());
    for (std::size_t j = 0; j < mbs.size(); ++j)
      for (Group& g : mbs[j]) {
        for (int& r : g.ranks) r += units[u].start;
        plan.microbatches[j].push_back(std::move(g));
      }
  }
  return plan;
}

double Units::split(std::vector<std::int64_t>& ids, std::size_t depth, int start, int width, std::vector<Group>* out) {
  if (width % 2 == 0 && ids.size() >= 2) {
    const int half = width / 2;
    const std::int64_t cap = cost_.token_capacity(cluster_);
    sort_heaviest_first(ids, half);
    auto& part = parts_.at(depth);
    part[0].clear(), part[1].clear();
    GroupStats g[2];
    std::int64_t used[2] = {0, 0};  // padded rows per rank of each half
    double t[2] = {0.0, 0.0};
    bool ok = true;
    for (std::int64_t id : ids) {
      const auto i = static_cast<std::size_t>(id);
      double after[2];
      for (int k = 0; k < 2; ++k) {
        GroupStats h = g[k];
        h.merge(one_[i]);
        after[k] = used[k] + rows(i, half) <= cap ? time(h, half) : kInf;
      }
      const int k = after[1] < after[0] ? 1 : 0;
      if (after[k] == kInf) ok = false;
      g[k].merge(one_[i]), t[k] = after[k], part[k].push_back(id);
      used[k] += rows(i, half);
    }
    if (ok && !part[1].empty() && std::max(t[0], t[1]) < time(sum_stats(one_, ids), width) - 1e-12) {
      const double a = split(part[0], depth + 1, start, half, out);
      return std::max(a, split(part[1], depth + 1, start + half, half, out));
    }
  }
  std::sort(ids.begin(), ids.end());
  const double t = time(sum_stats(one_, ids), width);
  if (out) {
    std::vector<int> ranks(static_cast<std::size_t>(width));
    std::iota(ranks.begin(), ranks.end(), start);
    out->push_back({std::move(ranks), ids});
  }
  return t;
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
  // Giants: the `giants` sequences slowest at their best degree, each on a block of its own at the end of the pool
  // (the multiple of width whose time is closest to the best split of the work left on the other ranks); each must
  // take target / 2 at least.
  std::vector<Unit> units;
  std::vector<std::vector<std::int64_t>> ids;
  std::vector<char> giant(n, 0);
  int end = P;
  if (giants > 0) {
    std::vector<std::pair<double, std::size_t>> best(n);
    for (std::size_t i = 0; i < n; ++i) {
      const GroupStats g = stats_of(batch, cost, i);
      best[i] = {cost.time(g, cost.best_degree(g, cost.min_degree(batch.lengths[i], cluster), cluster), cluster), i};
    }
    std::stable_sort(best.begin(), best.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    const int k_max = std::min<int>(giants, static_cast<int>(n));
    for (int k = 0; k < k_max; ++k)
      if (best[static_cast<std::size_t>(k)].first < 0.5 * target) return none;  // not a giant
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
      if (sizes[static_cast<std::size_t>(k)].empty()) return none;
      used += sizes[static_cast<std::size_t>(k)].front();
    }
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
    if (P - used < width) return none;
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
    // widest blocks at the very end
    std::vector<int> order(static_cast<std::size_t>(k_max));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return sizes[static_cast<std::size_t>(x)][at[static_cast<std::size_t>(x)]] >
             sizes[static_cast<std::size_t>(y)][at[static_cast<std::size_t>(y)]];
    });
    for (int k : order) {
      const int d = sizes[static_cast<std::size_t>(k)][at[static_cast<std::size_t>(k)]];
      end -= d;
      if (!b.aligned(end, d)) return none;
      units.push_back({end, d});
      ids.push_back({static_cast<std::int64_t>(best[static_cast<std::size_t>(k)].second)});
    }
  }
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
