// The cover term of the pipelined lower bound: the hardest few sequences' rings, chained along the ranks they share.
#pragma once
#include <functional>
#include <vector>

#include "dynacp/model/cluster.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"

namespace dynacp::solve {

/// What the work beyond the cover sequences leaves room for at a step S: budget = P C(S) - W' (W' the other work,
/// C(S) the most per-rank work within S; -inf when not even an empty rank finishes), capacity = C(S), and
/// loss[u][d] = the least work capacity below C(S), in all, that a unit u (a mask of the cover sequences in one
/// group) takes from its ranks on any degree >= d that finishes within S (infinite when none does).
struct OtherWork {
  double budget = 0.0, capacity = 0.0;
  std::vector<std::vector<double>> loss;
};

/// Per unit u (a mask of the cover sequences in one group) and degree d = 0..P, whatever the step: time[u][d] = t, its
/// group's fastest time on exactly d ranks, hid[u][d] = E, the work its other co-members may hide, and load[u][d] =
/// t - c - E, the work its microbatch puts on each of its ranks (t and load infinite below its least degree).
struct GiantShares {
  std::vector<std::vector<double>> time, hid, load;
};

/// The cover term over the k (2..5) hardest sequences, by mask in `shares`, priced against `other` (docs/cost_model.md,
/// "cover"): the least step S, at least `from`, for which some set partition of them into units, some order of the
/// units and some share graph (which units meet on a rank) fit the pool - every path of the graph along the order
/// within S by the 1F1B chain floor, every set of units that share no rank within P ranks, and the other work within
/// the capacity their ranks leave (a linear program over the kinds of rank). Search budgets past which a step is
/// granted (a relaxation, still a bound) keep it under about a second at P = 64. k < 2 gives 0.
double cover_term(const Cluster& cluster, int pp, int k, const std::function<OtherWork(double)>& other, double from,
                  const ChainRoom& fluid_room, const GiantShares& shares);

}  // namespace dynacp::solve
