// Internal to the order polishes (reorder_rings.cpp, reorder_classes.cpp): a plan as a global order of groups, and
// the first-improvement loop that scores moves several at a time.
#pragma once
#include <algorithm>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve::reorder {

inline constexpr std::size_t npos = static_cast<std::size_t>(-1);

// A plan's groups, slot by slot: its global order.
inline std::vector<Group> flatten(const Plan& plan) {
  std::vector<Group> groups;
  for (const auto& slot : plan.microbatches) groups.insert(groups.end(), slot.begin(), slot.end());
  return groups;
}

// A global order of groups laid out again as early as each rank allows: a group's slot is one past its ranks' last.
inline std::vector<std::vector<Group>> lay_out(const std::vector<Group>& groups,
                                               const std::vector<std::size_t>& order) {
  std::vector<Group> in_order;
  in_order.reserve(order.size());
  for (std::size_t i : order) in_order.push_back(groups[i]);
  return lay_out_groups(std::move(in_order)).microbatches;
}

// Each group's time on its ranks.
inline std::vector<double> group_times(const std::vector<Group>& groups, const Batch& batch, const Cluster& cluster,
                                       const CostModel& cost) {
  std::vector<double> time(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) time[i] = cost.group_time(groups[i], batch, cluster);
  return time;
}
// How many moves a polish scores at once: the solve's threads.
inline std::size_t polish_width(const PlanOptions& options) { return static_cast<std::size_t>(options.thread_count()); }

// The first improving move of a sequence, with the moves scored `width` at a time on `parallel`: eval(i) scores move
// i against the current state without changing it (-1: no move after all, not counted; 0: counted, no better; 1:
// counted, better). The moves are then read in order as a loop scoring one at a time would: each counted one spends
// one of `budget`, and the first better one is returned (npos when none, or the budget ran out first). Moves scored
// past it are wasted, at most width - 1 per call.
template <class Eval>
std::size_t first_improvement(std::size_t n, std::size_t width, const ParallelFor& parallel, int& spent, int budget,
                              Eval&& eval) {
  std::vector<int> res;
  for (std::size_t lo = 0; lo < n && spent < budget; lo += width) {
    const std::size_t m = std::min(width, n - lo);
    res.assign(m, -1);
    auto one = [&](std::size_t j) { res[j] = eval(lo + j); };
    if (m > 1)
      run_tasks(parallel, m, one);
    else
      one(0);
    for (std::size_t j = 0; j < m; ++j) {
      if (spent >= budget) return npos;
      if (res[j] < 0) continue;
      ++spent;
      if (res[j] > 0) return lo + j;
    }
  }
  return npos;
}

}  // namespace dynacp::solve::reorder
