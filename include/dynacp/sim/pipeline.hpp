// Pipeline simulator: 1F1B and interleaved 1F1B per pipeline, CP groups synchronised across pipelines, final
// gradient synchronisation. See docs/simulator.md for the model, the op orders and the closed-form validation.
#pragma once
#include <cstdint>
#include <vector>

namespace dynacp::sim {

/// Pipeline schedule. A problem runs Interleaved exactly when vpp > 1 (see schedule_of).
enum class Schedule { OneFOneB, Interleaved };  // Interleaved requires vpp > 1

/// One step of P pipelines of `pp` stages each. Rank r of the DP x CP pool is pipeline r; its stage k is a GPU,
/// and stage k of all pipelines forms the DP x CP pool at that stage. Every microbatch is a CP group: group g runs
/// on the ranks `group_ranks[g]` together (at each stage, chunk and direction it starts when all its ranks are
/// ready). Point-to-point transfers between stages take zero time.
struct PipelineProblem {
  int num_ranks = 0;                                // P pipelines
  int pp = 1;                                       // stages
  int vpp = 1;                                      // virtual chunks per stage (interleaved 1F1B when > 1)
  std::vector<std::vector<int>> rank_microbatches;  // per rank: group ids in run order
  std::vector<std::vector<int>> group_ranks;        // per group: ranks (each rank lists this group once)
  std::vector<double> group_forward;                // per group: forward time of ONE stage-chunk
  std::vector<double> group_backward;               // per group: backward time of one stage-chunk
  std::vector<double> group_memory;                 // per group: activation bytes per stage-chunk, fwd..bwd
                                                    // (empty = all zero)
  double grad_sync = 0.0;                           // seconds of the final gradient all-reduce
};

/// Simulation result. Times are seconds from the step start.
struct PipelineResult {
  /// Max over ranks and stages of the last op's end, plus grad_sync.
  double step_time = 0.0;
  /// Wall-time bubble: 1 - sum(busy) / (T * P * pp), where T = step_time - grad_sync (the compute makespan).
  /// Uniform 1F1B gives (p - 1) / (m + p - 1); see docs/simulator.md for the Megatron-paper ratio (p - 1) / m.
  double bubble_fraction = 0.0;
  /// Per rank: busy seconds SUMMED over its pp stages (each op counts its full duration on every rank of its group).
  std::vector<double> busy;
  /// Per rank: pp * T - busy (idle seconds summed over its stages within the compute makespan T).
  std::vector<double> idle;
  /// Per rank: max over its stages of the in-flight activation bytes (sum of group_memory of the stage-chunks
  /// whose forward ran and whose backward has not yet ended).
  std::vector<double> peak_memory;
  struct Op {
    int rank, stage, chunk, group;
    bool backward;
    double start, end;
  };
  /// Timeline (only when keep_timeline): per rank, per stage, in that rank-stage's op order.
  std::vector<Op> ops;
};

/// The schedule a problem runs: Interleaved when vpp > 1, else OneFOneB.
inline Schedule schedule_of(const PipelineProblem& p) { return p.vpp > 1 ? Schedule::Interleaved : Schedule::OneFOneB; }

/// A step in flat arrays, for searches that score many candidate plans: rank r runs the groups
/// rank_groups[rank_off[r] .. rank_off[r + 1]) in that order; group g spans group_size[g] ranks (each listing it once)
/// and takes group_forward[g] / group_backward[g] per stage-chunk. No memory, no gradient sync.
struct FlatProblem {
  int num_ranks = 0;
  int pp = 1;
  int vpp = 1;
  std::vector<std::int32_t> rank_off;     // num_ranks + 1 offsets into rank_groups
  std::vector<std::int32_t> rank_groups;  // per rank, its group ids in run order
  std::vector<std::int32_t> group_size;   // per group: how many ranks list it
  std::vector<double> group_forward;      // per group: forward time of one stage-chunk
  std::vector<double> group_backward;     // per group: backward time of one stage-chunk
};

/// The flat form of a problem (its rank lists concatenated, each group's rank count); no validation.
FlatProblem flatten(const PipelineProblem& p);

/// simulate(p).step_time for a flat problem (the same op orders and longest path, without the per-rank statistics or
/// per-group allocations). Throws InvalidArgument for inconsistent arrays (a group listed by more or fewer ranks than
/// its size, unknown ids, bad times, a count not a multiple of pp under vpp > 1) and Error on a dependency cycle.
double step_time(const FlatProblem& p);

/// Simulates one step in O(total ops) time and memory. Throws InvalidArgument for bad inputs (inconsistent
/// group/rank lists, unknown group ids, negative or non-finite times, vpp > 1 with a rank whose microbatch count is
/// not a multiple of pp) and Error when ranks order shared groups inconsistently (a dependency cycle; the message
/// names the ranks and groups on the cycle).
PipelineResult simulate(const PipelineProblem& p, bool keep_timeline = false);

}  // namespace dynacp::sim
