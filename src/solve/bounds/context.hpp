// Internal to the lower bound: the terms' registry, what every term reads (BoundContext, built once per bound), the
// facts several terms share (HideCap, Giants) and the term functions themselves, each with its validity condition.
// The bound is the maximum of the terms in registry order (terms.cpp); docs/cost_model.md gives the proofs.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"

namespace dynacp::solve::bounds {

class BoundContext;

/// One term of the lower bound: its name and the function that prices it (0 where its condition does not hold).
struct BoundTerm {
  const char* name;
  double (*value)(const BoundContext&);
};

/// Every term in evaluation order: single, wide, average, critical, shared, cover (terms.cpp).
const std::vector<BoundTerm>& bound_terms();

// ---- the terms (each: no plan is faster under the cost model where its condition holds; 0 elsewhere) ----

/// "single" (bounds/terms.cpp), any pp, vpp and cost model: the best time of the hardest sequence alone, over every
/// degree from its least one (a full scan, in each degree's faster layout), tried for the longest sequence of each
/// mask kind (the time grows with the length for a given mask). A microbatch crosses every stage forward and back, so
/// pipelines do not shorten it.
double term_single(const BoundContext& ctx);

/// "wide" (bounds/terms.cpp), any pp, vpp and cost model: sequences needing more than half the pool can never run
/// side by side (in one group or several), and a group takes at least its compute time / d + c with d <= P: their
/// work / P + c, over pp with pipelines (the stages may overlap them). 0 when there is none.
double term_wide(const BoundContext& ctx);

/// "average" (bounds/terms.cpp), any pp, vpp and cost model: every rank in use pays a group overhead c, so the step
/// is at least sum work / P + c; with pipelines (sum work / P + c) / pp plus the fill and drain (pp - 1)(c + w_min /
/// P) / (pp vpp). Under 1F1B (BoundContext::one_f_one_b) also G(sum work / P), the best split of the mean work into
/// microbatches.
double term_average(const BoundContext& ctx);

/// "critical" (bounds/terms.cpp), BoundContext::one_f_one_b only: the hardest sequence's microbatch with the other
/// work its ranks must run beside it (the critical-sequence argument), for the longest sequence of each mask kind.
double term_critical(const BoundContext& ctx);

/// "shared" (bounds/shared.cpp), BoundContext::one_f_one_b only: the k hardest sequences either meet (two on one
/// rank or in one group) or run on pairwise disjoint rings that leave the other work room enough; the least step for
/// which one of the two can hold, maximised over k = 2..Giants::kGiants.
double term_shared(const BoundContext& ctx);
/// The shared term computed (one_f_one_b only); BoundContext::shared() keeps its value, which the cover term reads.
double shared_floor(const BoundContext& ctx);

/// "cover" (bounds/cover.cpp), BoundContext::one_f_one_b and with_cover only: the chains of the hardest five
/// sequences' rings (six when the sixth needs more than a node) along the ranks they share, priced against the other
/// work (cover_term, bounds/cover.hpp), searched from the shared term up. The slowest term; no strategy reads it.
double term_cover(const BoundContext& ctx);

// ---- what the terms share ----

/// The fastest time of group g on d ranks: a ring of d <= ranks_per_node may still span nodes, so the faster layout.
double fastest(const CostModel& cost, const Cluster& cluster, const GroupStats& g, int d);

/// Work grouped with a sequence s* (length L) in a ring of d ranks hides in that ring's exposed communication only
/// as far as it adds more attention than ring traffic: a member of length s adds a eta s^2 / d of attention and
/// (d - 1) s kv / (d bw) of communication per rank (bw: the hop bandwidth of a d-rank ring), so it hides at most
/// s / d (a eta s - (d - 1) kv / bw) - nothing in a wide inter-node ring unless it is very long. The members fit in
/// the ring's memory (sum s <= d cap - L), so the work hidden per rank is at most
/// (d cap - L) / d max(0, max_j a eta_j s_j - (d - 1) kv / bw), taking the layout (bandwidth) that hides the most.
/// eta_j s_j is the largest over the batch but for s* itself.
class HideCap {
 public:
  HideCap(const Batch& batch, const Cluster& cluster, const CostModel& cost);
  /// Per-rank work that other members of s*'s ring of d ranks can hide (s* = len with mask).
  double operator()(std::int64_t len, Mask mask, int d) const;
  /// The same when no other member has eta s above eta_s.
  double operator()(std::int64_t len, int d, double eta_s) const;

 private:
  const Cluster& cluster_;
  const CostModel& cost_;
  double cap_;
  double top_[2] = {0.0, 0.0};
};

/// The batch's sums that several terms read, in one pass in index order.
struct BatchTotals {
  double work = 0.0;                 ///< the summed work of every sequence
  double wide_work = 0.0;            ///< ... of the sequences that need more than half the pool
  double min_work = -1.0;            ///< the least work of a sequence (-1 for an empty batch)
  std::int64_t longest[2] = {0, 0};  ///< the longest sequence of each mask kind (0: none)
  BatchTotals(const Batch& batch, const Cluster& cluster, const CostModel& cost);
};

class Giants;

/// What every term reads: the instance, the batch's totals and the parts several terms share, each computed once
/// per bound (the giants and the shared term's value on first use: one context is not for concurrent use).
class BoundContext {
 public:
  BoundContext(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp, bool with_cover);
  ~BoundContext();
  BoundContext(const BoundContext&) = delete;
  BoundContext& operator=(const BoundContext&) = delete;

  const Batch& batch;
  const Cluster& cluster;
  const CostModel& cost;
  const int pp, vpp;
  const bool with_cover;
  const BatchTotals totals;
  /// The 1F1B terms (critical, shared, cover, and average's split floor) hold: pp > 1, vpp = 1, the 1 : 2 forward :
  /// backward split the tables of tools/gen_pipeline_bound.py assume (CostModel::backward_ratio 2; another ratio
  /// keeps only the split-free terms, still a bound), and a table that says more than the drain (h(2, pp) > 1).
  const bool one_f_one_b;

  /// sum work / P + c: the pp = 1 average term, which the pipelined terms build on.
  double plain_average() const;
  /// G(W) = min_m h(m, pp) (W + m c) / pp (one_f_one_b_work_floor): no 1F1B rank running work W finishes sooner.
  double G(double W) const;
  /// HideCap of the batch (one_f_one_b only).
  const HideCap& hide() const { return *hide_; }
  /// The hardest few sequences (shared and cover terms; one_f_one_b only).
  const Giants& giants() const;
  /// The shared term's value (one_f_one_b only): the cover term's search starts from it.
  double shared() const;

 private:
  std::optional<HideCap> hide_;
  mutable std::unique_ptr<Giants> giants_;
  mutable std::optional<double> shared_;
};

/// The k = min(kGiants, n) hardest sequences by work (ties: the lower index), what the shared and cover terms price
/// them with, and the per-rank capacity a step S leaves. `usable` is false (both terms 0) for k < 2 or when a giant
/// needs more than the pool (plan() rejects the batch).
class Giants {
 public:
  static constexpr std::size_t kGiants = 8;
  explicit Giants(const BoundContext& ctx);

  bool usable = false;
  std::size_t k = 0;
  std::vector<std::size_t> ids;           ///< batch indices, the first k the giants, hardest first
  std::vector<double> member;             ///< [m]: the largest eta s outside the first m giants
  std::vector<std::vector<double>> time;  ///< [i][d - dmin[i]]: giant i's fastest time on d ranks
  std::vector<int> dmin;                  ///< giant i's least degree
  std::vector<double> w;                  ///< giant i's work
  std::vector<double> best;               ///< giant i's fastest time on any degree
  std::vector<GroupStats> stats;          ///< giant i alone
  const ChainRoom fluid_room;             ///< the other work's room beside giants, by the chain floor
  double total_work;                      ///< max(0, average - c) P: the batch's work as the average term counts it

  /// C(S) rounded up: an upper bound on the work a rank may run within S (G(C) <= S); < 0 when not even G(0) fits.
  double capacity(double S) const;
  /// The work the co-members of a group of `tokens` and `work` in all, on d ranks (time t), may hide, with
  /// co-members outside the first m giants.
  double hidden_in(double work, std::int64_t tokens, int d, double t, std::size_t m) const;
  /// The most other work a rank of a microbatch of time t, whose co-members may hide E, may run within S, C = C(S):
  /// the critical-sequence argument; < 0 when the microbatch alone does not fit.
  double room_beside(double t, double E, double S, double C) const;
  /// ... of giant i on d ranks (time t), with co-members outside the first m giants.
  double room(std::size_t i, int d, double t, double S, double C, std::size_t m) const;

 private:
  const BoundContext& ctx_;
};

}  // namespace dynacp::solve::bounds
