// Plan evaluation without pipelines: per-rank timelines where a group starts when all its ranks are free.
#pragma once
#include <algorithm>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"

namespace dynacp::solve {

/// The pp = 1 group timeline, the one place its rule is written: groups run in plan order, each starting once all of
/// its ranks are free and holding them for time_of(g) seconds; visit(g, t) sees every group with its time. Returns
/// the step time, when the last of `num_ranks` ranks is free (0 with no ranks).
template <class TimeOf, class Visit>
double group_timeline(const Plan& plan, int num_ranks, TimeOf&& time_of, Visit&& visit) {
  std::vector<double> free(static_cast<std::size_t>(num_ranks), 0.0);
  for (const auto& slot : plan.microbatches)
    for (const Group& g : slot) {
      double start = 0.0;
      for (int r : g.ranks) start = std::max(start, free[static_cast<std::size_t>(r)]);
      const double t = time_of(g);
      for (int r : g.ranks) free[static_cast<std::size_t>(r)] = start + t;
      visit(g, t);
    }
  double last = 0.0;
  for (double f : free) last = std::max(last, f);
  return last;
}

/// Predicted step time, busy time per rank, peak tokens per rank and bubble fraction of `plan`; the lower bound
/// is filled from lower_bound() (bounds/lower_bound.hpp).
Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost);
/// The same with every group priced under `shapes` (StaticShapes::priced) and padding_fraction filled.
Predicted evaluate(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const StaticShapes& shapes);

}  // namespace dynacp::solve
