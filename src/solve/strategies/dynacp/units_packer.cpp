// The units family's packing (units_packer.hpp): a unit's sequences into m microbatches by the 1F1B profile, and a
// microbatch split into rings on the halves of its unit where that is faster.
#include "units_packer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace dynacp::solve::dyn {

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

}  // namespace dynacp::solve::dyn
