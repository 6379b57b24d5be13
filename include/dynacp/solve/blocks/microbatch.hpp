// Pipeline-aware microbatching helpers after the Megatron Dynamic-CP blog (seed 002, eqs. 1-3 and figure 7).
#pragma once
#include <span>
#include <vector>

namespace dynacp::solve {

/// Per-microbatch workload quotas W_i for ranks running counts[i] microbatches of a pipeline with p stages and
/// v virtual stages, so that all ranks finish together: W_i (m_i v + p - 1) is the same for every rank (eq. 1-2)
/// and sum_i W_i m_i = total (eq. 3). Ranks with more microbatches get smaller ones. Throws on counts < 1.
std::vector<double> workload_quotas(double total, const std::vector<int>& counts, int pp, int vpp);

/// The knee of the per-microbatch budget over the grid m = pp, 2 pp, ..., kmax pp (figure 7): budget(m) is the
/// equal-count quota total / (ranks m), floored at the largest single item (a microbatch cannot be smaller).
/// Returns the first grid m whose next grid point lowers the budget by less than `flat` (relative), else the last.
int knee_microbatches(double total, double largest, int ranks, int pp, int kmax, double flat = 0.1);

/// A factor h(m, pp) such that m microbatches taking S seconds in all (any split) cannot finish faster than
/// h S / pp on one pipeline of pp stages under Megatron-Core's 1F1B schedule (t / (3 pp) forward and 2 t / (3 pp)
/// backward per stage, as the simulator splits them): the optimum of the linear program over all splits
/// (tools/gen_pipeline_bound.py), tabulated for pp <= 16, m <= 64 and rounded down, else 1 (every stage runs S / pp).
/// h(1, pp) = pp; for m >= 2 it lies below the equal-split value (m + pp - 1) / m, by up to ~8%, because a light
/// first microbatch, rising to the heaviest and then falling, beats equal ones. Throws on m < 1 or pp < 1.
double one_f_one_b_floor(int m, int pp);

/// G(W) = min over m of h(m, pp) (W + m c) / pp (h = one_f_one_b_floor, m <= 64; beyond the table the drain bound
/// (W + (64 + pp) c) / pp): no 1F1B pipeline running per-rank work W, at c per microbatch, in any split is faster.
/// Increasing in W.
double one_f_one_b_work_floor(double W, double c, int pp);

/// One optimal split behind one_f_one_b_floor: the sizes of m microbatches in run order, relative to their mean
/// (light ones rising over the first pp - 1, a plateau, then falling), from the same linear program
/// (tools/gen_pipeline_bound.py --profile; the optimum need not be unique, this is the solver's vertex). Tabulated
/// for 2 <= pp <= 16 and m <= 32; elsewhere, and for pp = 1, equal sizes. Throws on m < 1 or pp < 1.
std::vector<double> one_f_one_b_profile(int m, int pp);

/// Makespan of one pipeline of pp stages running microbatches of the given times (each over all stages, forward
/// and backward) in list order under Megatron-Core's 1F1B schedule, with the simulator's split: t / ((1 + r) pp)
/// forward and r t / ((1 + r) pp) backward per stage, r = backward_ratio (CostModel::backward_ratio; 2 gives t/(3 pp)
/// and 2t/(3 pp)). No CP-group synchronisation: exact for ranks that share no group with other pipelines. Throws on
/// pp < 1 or a negative or non-finite time.
double one_f_one_b_makespan(std::span<const double> times, int pp, double backward_ratio = 2.0);
/// Buffers one_f_one_b_makespan reuses across calls (per-stage op ends and clocks).
struct OneFOneBScratch {
  std::vector<double> fwd, bwd, clock;
  std::vector<int> done;
};
/// The same with a caller's buffers (no allocation once they have grown).
double one_f_one_b_makespan(std::span<const double> times, int pp, double backward_ratio, OneFOneBScratch& scratch);
/// one_f_one_b_chain_floor (below) with a caller's buffers (its per-stage ends in scratch.fwd and scratch.bwd).
double one_f_one_b_chain_floor(std::span<const double> times, int pp, double backward_ratio, OneFOneBScratch& scratch);

/// A floor on the makespan of any 1F1B pipeline of pp stages that runs microbatches of these times in this order,
/// whatever other microbatches it runs before, between or after them: the longest chain through their ops along
/// the orders every such schedule keeps (each stage runs forwards in microbatch order and backwards in microbatch
/// order, the last stage alternates F and B of consecutive microbatches, and a microbatch crosses the stages forward
/// and back). One microbatch gives its time t (its round trip); two, a then b, give
/// max(a + 2 b / (3 pp), a / (3 pp) + b, ((pp + 2) a + (2 pp + 1) b) / (3 pp)). Throws on pp < 1 or a negative or
/// non-finite time. backward_ratio as for one_f_one_b_makespan (the lower bound uses the default, 2).
double one_f_one_b_chain_floor(std::span<const double> times, int pp, double backward_ratio = 2.0);

/// The most other work a pipeline of pp stages can run within S beside "giant" microbatches of times t (in this run
/// order), by one_f_one_b_chain_floor: the other work goes anywhere around them, as microbatches of its own (x_0
/// before the first giant, x_i after giant i) or inside a giant's group, growing that giant's time (delta_i). Other
/// microbatches only add ops to the chain floor's longest path, and cutting a microbatch into smaller ones never
/// lengthens it, so the list's chain floor is at least that of the other work as a fluid: a stream crossing each
/// stage as a flow line (a stage's stream starts once the stream reaches it and the stage is free, and ends no
/// sooner than the stream before it ends). That floor is a maximum of path lengths affine in (x, delta), so the
/// room, max sum x + sum delta with the floor <= S, is found by cutting planes: every LP value on the way is an
/// upper bound, and the first LP point that meets S is the optimum. For one giant the floor is homogeneous (scaling
/// every time scales it): room(t, S) = S r(t / S) with r nonincreasing and concave, tabulated at kGrid + 1 points
/// (each solved on first use, so one object is not for concurrent use) and read as an upper bound: r(tau_i) for
/// tau >= tau_i, and the chords of the neighbouring intervals extended, where their points were solved to the
/// optimum. Never above 3 pp (S - chain_floor(t)), the first cut (each variable adds at least its forward share on
/// one stage to every path). Returns < 0 when the giants alone exceed S.
class ChainRoom {
 public:
  static constexpr int kMaxGiants = 8;
  static constexpr int kGrid = 256;
  /// Throws InvalidArgument on pp < 1.
  explicit ChainRoom(int pp);
  /// One giant of time t, from the table (an upper bound, within ~1e-3 S of the exact room).
  double operator()(double t, double S) const;
  /// Giants of times t in run order: the table for one, else exact(). Throws on more than kMaxGiants.
  double operator()(std::span<const double> t, double S) const;
  /// The room by cutting planes (the optimum, or an upper bound on it when 40 cuts do not reach it). Throws on an
  /// empty list, more than kMaxGiants, or a negative or non-finite time.
  double exact(std::span<const double> t, double S, bool* optimal = nullptr) const;

 private:
  double at(std::size_t i) const;
  int pp_;
  mutable std::vector<double> table_;
  mutable std::vector<char> optimal_;
};

}  // namespace dynacp::solve
