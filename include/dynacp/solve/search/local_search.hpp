// Local search over plans: the last stage of dynacp. Small edits of a plan (a sequence to another group, two
// sequences swapped, a ring grown, shrunk or shifted to other ranks, two groups merged, one split, a group moved in
// the run order), each priced by score() (timeline.hpp, the evaluator dynacp ranks its candidates with), kept when
// they lower it. See docs/strategies.md.
#pragma once
#include <chrono>
#include <cstdint>

#include "dynacp/model/plan.hpp"

namespace dynacp {
struct PlanOptions;
}

namespace dynacp::solve {

/// Every tuning constant of local_search, with its default.
struct LocalSearchTuning {
  /// Most score() calls in one search (each prices a whole plan: the group timeline for pp = 1, the pipeline
  /// simulator for pp > 1).
  int max_evaluations = 3000;
  /// Most plan-size units in one search: each score() call spends the plan's groups + ranks + sequences, so larger
  /// plans (where each call costs more) afford fewer calls; tiny plans stop at max_evaluations.
  std::int64_t max_work = 40'000;
  /// The search runs only on batches of at most this many sequences on at most max_ranks ranks (others come back
  /// unchanged): every move re-prices the whole plan, which at 64 ranks and 512 sequences costs about a millisecond
  /// under pp = 4 (measured: a budget of a few hundred calls tripled dynacp's solve time there).
  int max_sequences = 24;
  int max_ranks = 16;
  /// A move is kept only when it lowers the score by more than this fraction of it.
  double min_gain = 1e-9;
  /// The hottest ranks whose groups the moves start from in each round (ranks by finish time for pp = 1, by summed
  /// group time for pp > 1; ties: the lower rank). A round that finds nothing on them tries every group.
  int hot_ranks = 2;
  /// Split moves try every two-way split of a group's sequences up to this many sequences; a larger group splits
  /// off one sequence at a time.
  int split_all_up_to = 6;
  /// Kicks once the climb stalls: the k-th move of a round (k = 0 .. kicks - 1, hot ranks' groups first) is taken
  /// even when it costs, the climb runs again, and the result is kept only when it beats the best plan so far.
  int kicks = 256;
  /// Before the search (on every batch, whatever its size): rebalance_solos (rebalance.hpp), the one-rank groups'
  /// sequences repacked onto the ranks where they finish earliest, kept when that lowers the score.
  bool rebalance_solos = true;
};

/// Improves `start` (first with rebalance_solos when tuning.rebalance_solos, on any batch; then the climb below, on
/// batches within max_sequences and max_ranks) (a valid plan of `batch` meeting options.count_policy) by
/// first-improvement hill climbing and returns it; returns `start` unchanged (same slots) when no move lowers score().
/// Every plan it returns is valid (Plan::validate: each sequence once, every group's padded rows within the token
/// capacity, a rank at most once per slot) and meets the count policy (equal counts under CountPolicy::Equal, multiples
/// of pp under vpp > 1). A plan is a global order of groups laid out as early as each rank allows, so every rank keeps
/// one list and shared groups keep one order (no deadlock). Deterministic: moves are tried in a fixed order (groups and
/// ranks by index, ties by index) and the search stops at tuning's budgets; `deadline` (default: none) also stops it,
/// at the price of results that depend on the machine's speed.
Plan local_search(Plan start, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options, const LocalSearchTuning& tuning = {},
                  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());

}  // namespace dynacp::solve
