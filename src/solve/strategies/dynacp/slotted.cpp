// pp > 1 slotted plans: m exclusive slots (every rank runs one microbatch per slot). Sequences, longest work first,
// fill the slots against workload quotas (eqs. 1-3; with `edge` < 1 the first and last slot get a smaller share),
// alternating the blog's two objectives: workload-first (the slot with the least work, when it has token room) and,
// when memory binds, memory-first (the slot under quota with the most token room). Each slot then scans a few
// targets tau and keeps its fastest layout; what does not fit moves on.
#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <set>

#include "builder.hpp"
#include "dynacp/model/error.hpp"

namespace dynacp::solve::dyn {

// One exclusive slot: each rank runs at most one group. Ring sequences take the degree that reaches tau, shorts go
// longest-work first to the least-loaded rank with token room, and a rank left empty takes half of the heaviest
// multi-sequence group (so counts stay equal where the data allows). Appends the groups to `tl` and returns the
// sequences that did not fit (they move to a later slot).
std::vector<std::size_t> Builder::build_slot(const std::vector<std::size_t>& subset, double tau,
                                             TimelineBuilder& tl) const {
  const int P = cluster_.num_ranks, rpn = cluster_.ranks_per_node;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> busy(static_cast<std::size_t>(P), 0.0);  // kInf = taken by a ring
  std::vector<std::size_t> spill, shorts;
  std::vector<Ring> rings;
  classify(subset, tau, 0, shorts, rings);
  NodePicker picker(P, rpn, rings_);
  int left = P;
  std::vector<std::pair<std::vector<int>, std::vector<std::int64_t>>> groups;
  for (const auto& ring : rings) {
    if (ring.d > left) {
      spill.push_back(ring.seq);
      continue;
    }
    auto ranks = picker.pick(ring.d, busy);
    for (int r : ranks) busy[static_cast<std::size_t>(r)] = kInf;
    for (int node = ranks.front() / rpn; node <= ranks.back() / rpn; ++node) picker.update(node, busy);
    left -= ring.d;
    groups.push_back({std::move(ranks), {seqs_[ring.seq].id}});
  }
  std::vector<Bin> bins(static_cast<std::size_t>(P));
  using Item = std::pair<double, int>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  for (int r = 0; r < P; ++r)
    if (busy[static_cast<std::size_t>(r)] < kInf) heap.push({0.0, r});
  std::vector<Item> popped;
  for (std::size_t i : shorts) {
    const Seq& q = seqs_[i];
    int r = -1;
    while (!heap.empty()) {
      const Item it = heap.top();
      heap.pop();
      if (bins[static_cast<std::size_t>(it.second)].rows + q.rows1 <= cap_) {
        r = it.second;
        break;
      }
      popped.push_back(it);
    }
    for (const auto& it : popped) heap.push(it);
    popped.clear();
    if (r < 0) {
      spill.push_back(i);
      continue;
    }
    auto& b = bins[static_cast<std::size_t>(r)];
    add_to(b, i);
    heap.push({b.work, r});
  }
  // empty ranks take half of the heaviest group that has two or more sequences (ties: the lowest rank)
  std::set<std::pair<double, int>> heavy;  // (-work, rank) of the groups with two or more sequences
  auto enter = [&](int r) {
    if (bins[static_cast<std::size_t>(r)].seqs.size() >= 2) heavy.insert({-bins[static_cast<std::size_t>(r)].work, r});
  };
  for (int r = 0; r < P; ++r) enter(r);
  for (int e = 0; e < P && !heavy.empty(); ++e) {
    if (busy[static_cast<std::size_t>(e)] == kInf || !bins[static_cast<std::size_t>(e)].seqs.empty()) continue;
    const int h = heavy.begin()->second;
    heavy.erase(heavy.begin());
    auto [a, b] = halve(bins[static_cast<std::size_t>(h)]);
    bins[static_cast<std::size_t>(h)] = std::move(a);
    bins[static_cast<std::size_t>(e)] = std::move(b);
    enter(h), enter(e);
  }
  for (auto& g : groups) tl.add(std::move(g.first), std::move(g.second));
  for (int r = 0; r < P; ++r)
    if (!bins[static_cast<std::size_t>(r)].seqs.empty()) tl.add({r}, ids_of(bins[static_cast<std::size_t>(r)]));
  return spill;
}

Plan Builder::slotted(int m, double edge) const {
  const int P = cluster_.num_ranks;
  const double slot_cap = static_cast<double>(cap_) * P;
  // Slot weights: the first and last microbatch get `edge` (a light first forward and last backward shorten
  // the pipeline fill and drain), the others 1; the quotas split the total work in proportion.
  std::vector<double> weight(static_cast<std::size_t>(m), 1.0);
  if (m > 2) weight.front() = weight.back() = edge;
  double wsum = 0;
  for (double w : weight) wsum += w;
  std::vector<double> quota;
  for (double w : weight) quota.push_back(total_work() * w / wsum);
  std::vector<std::vector<std::size_t>> slots(static_cast<std::size_t>(m));
  std::vector<double> work(static_cast<std::size_t>(m), 0.0), tokens(static_cast<std::size_t>(m), 0.0);
  for (std::size_t i : order_) {
    const double len = static_cast<double>(seqs_[i].rows1);
    std::size_t best = 0;  // workload-first: the slot furthest below its quota
    for (std::size_t k = 1; k < slots.size(); ++k)
      if (work[k] / weight[k] < work[best] / weight[best]) best = k;
    if (tokens[best] + len > slot_cap) {  // memory binds: the slot under quota with the most token room
      bool found = false;
      for (std::size_t k = 0; k < slots.size(); ++k)
        if (tokens[k] + len <= slot_cap && work[k] < quota[k] && (!found || tokens[k] < tokens[best]))
          best = k, found = true;
      for (std::size_t k = 0; !found && k < slots.size(); ++k)
        if (tokens[k] + len <= slot_cap) best = k, found = true;
    }
    slots[best].push_back(i), work[best] += seqs_[i].work, tokens[best] += len;
  }
  TimelineBuilder tl(batch_, cluster_, cost_);
  std::vector<std::size_t> carry;
  for (std::size_t k = 0; k < slots.size() || !carry.empty(); ++k) {
    std::vector<std::size_t> subset = carry;
    if (k < slots.size()) subset.insert(subset.end(), slots[k].begin(), slots[k].end());
    std::stable_sort(subset.begin(), subset.end(), [&](std::size_t x, std::size_t y) {
      return seqs_[x].work != seqs_[y].work ? seqs_[x].work > seqs_[y].work : x < y;
    });
    double w = 0, top = 0;
    for (std::size_t i : subset) w += seqs_[i].work, top = std::max(top, time1(seqs_[i], seqs_[i].dmin));
    const double lo = std::max(w / P, 1e-12);
    double best_tau = lo, best_t = -1;
    for (int g = 0; g <= tuning_.slot_tau_grid; ++g) {
      const double tau = lo * std::pow(std::max(top / lo, 1.0), static_cast<double>(g) / tuning_.slot_tau_grid);
      TimelineBuilder trial(batch_, cluster_, cost_);
      const auto sp = build_slot(subset, tau, trial);
      const double t = trial.makespan() * (1.0 + static_cast<double>(sp.size()));  // spills are costly
      if (best_t < 0 || t < best_t) best_t = t, best_tau = tau;
    }
    carry = build_slot(subset, best_tau, tl);
    if (k > 4 * slots.size() + 8) throw Error("dynacp: slot construction did not converge (a bug)");
  }
  return tl.to_plan();
}

}  // namespace dynacp::solve::dyn
