// Internal to the `dynacp` strategy: the per-sequence facts, the rank picker and the Builder that turns a target
// (tau for pp = 1, a microbatch target mu for pp > 1) into a plan. The candidate families (families.cpp) call it;
// the driver (driver.cpp) scores, pools and polishes what they build. See docs/strategies.md.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"
#include "dynacp/solve/blocks/ring_set.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies/dynacp/tuning.hpp"

namespace dynacp::solve::dyn {

struct Seq {
  std::int64_t id;
  std::int64_t len;
  double eta;
  double work;  // eta*a*s^2 + b*s
  int dmin;
  std::int64_t rows1 = 0;  // padded rows when it runs alone on one rank (Cluster::padded_rows(len, 1))
  double t1 = 0.0;         // T(s, 1)
  // T(s, d) on the pieces [lo[0], rpn] (ring inside a node) and [lo[1], P] (across nodes): arg[k] is the
  // minimiser of piece k (CostModel::piece_minima; 0 when the piece is empty).
  int lo[2] = {0, 0}, arg[2] = {0, 0};
};

struct Bin {                      // one group of short sequences on one rank
  std::vector<std::size_t> seqs;  // indices into the Seq array
  std::int64_t rows = 0;          // padded rows on its rank: the sum of its sequences' rows1
  double work = 0.0;
};

struct Ring {
  std::size_t seq;
  int d;        // the degree that reaches the target (or the fastest)
  double t;     // T(s, d)
  int at = -1;  // first of its d consecutive ranks when fixed (shelves), else -1: the picker chooses
};

/// Finds the d ranks that free up earliest, inside one node when d fits a node (else a window of whole nodes).
/// Pools of more than kScanNodes nodes keep, for each k, a set of (k-th smallest free time of a node, node):
/// O(rpn log nodes) per update; smaller ones scan the nodes (O(nodes) per pick, faster there). Same picks.
/// With a ring set (PlanOptions::ring_set) a degree of the set takes the set's ring that frees first instead.
class NodePicker {
 public:
  NodePicker(int P, int rpn, const RingSet* rings = nullptr);
  std::vector<int> pick(int d, const std::vector<double>& free) const;
  void update(int node, const std::vector<double>& free);

 private:
  static constexpr int kScanNodes = 32;  // a speed crossover, not a tuning knob: picks do not depend on it
  int earliest(int d) const;             // the node whose d-th earliest free rank frees first (ties: lower id)
  int rpn_, nodes_;
  std::optional<RingPicker> rings_;  // empty: any ranks
  std::vector<std::vector<std::pair<double, int>>> sorted_;
  std::vector<std::set<std::pair<double, int>>> kth_;
};

/// The order a rank runs its own microbatches in (Pipe::order).
enum class OwnOrder {
  HeaviestFirst,  ///< heaviest first
  Pyramid,        ///< lightest first and last, heaviest in the middle
  RiseThenFall,   ///< the best split's shape (rise_then_fall); rounds of rings permuted alike
};

/// How pipelined() sizes rings that cannot reach the microbatch target mu.
struct TargetRule {
  enum Kind { Relative, Seconds } kind = Relative;
  double value = 1.0;  ///< Relative: within value x the ring's fastest time; Seconds: within value seconds
  bool operator==(const TargetRule&) const = default;
};

/// How many microbatches pipelined() brings each rank to.
struct CountRule {
  enum Kind { Free, Exactly, NearestMultiple } kind = Free;
  int n = 0;  ///< Exactly: the count; NearestMultiple: each rank to its nearest multiple of n (at least n)
};

/// Lead microbatches before a rank's first ring.
struct LeadRule {
  enum Kind { None, Fraction, Profile } kind = None;
  int count = 0;       ///< lead microbatches
  double value = 0.0;  ///< Fraction: their total share of the ring's time; Profile: the rising ratio
};

/// How pipelined() builds one plan.
struct Pipe {
  TargetRule target;  ///< degree rule for rings that cannot reach mu
  double mu = 0.0;    ///< microbatch target, seconds
  CountRule count;
  OwnOrder order = OwnOrder::HeaviestFirst;
  LeadRule lead;
  bool align = false;                        ///< rings onto the ranks with the fewest rings first
  bool isolate = false;                      ///< the slowest rings keep their ranks from other rings
  bool tile = false;                         ///< wide rings on a power-of-two number of whole nodes
  const std::vector<Ring>* fixed = nullptr;  ///< rings placed first, in this order, at their `at` (shelves)
};

/// rise_then_fall: indices of `w` in the shape of the best split of a pipeline's work into microbatches (the linear
/// program of tools/gen_pipeline_bound.py): the q = min(pp - 1, n / 4) lightest first in rising order, then the rest
/// falling.
std::vector<std::size_t> rise_then_fall(const std::vector<double>& w, int pp);
/// The order of a rank's own microbatches given their work; ties keep index order (reversed for heaviest first).
std::vector<std::size_t> own_order(const std::vector<double>& w, OwnOrder order, int pp);

class Builder {
 public:
  /// `rings`: the allowed rings (PlanOptions::ring_set), null for none; it must outlive the builder.
  /// `shapes`: static shapes whose bucket padding T(s, d) includes (StaticShapes::priced), null for none.
  Builder(const Batch& b, const Cluster& c, const CostModel& m, const DynacpTuning& tuning,
          const RingSet* rings = nullptr, const StaticShapes* shapes = nullptr);

  const Batch& batch() const { return batch_; }
  const Cluster& cluster() const { return cluster_; }
  const CostModel& cost() const { return cost_; }
  const DynacpTuning& tuning() const { return tuning_; }
  /// The allowed rings, or null (no constraint).
  const RingSet* rings() const { return rings_; }
  /// Whether degree d may be used (always true without a ring set).
  bool degree_allowed(int d) const { return rings_ == nullptr || rings_->allowed(d); }

  double time1(const Seq& s, int d) const;
  /// Smallest degree with T(s, d) <= tau (binary search on the decreasing part of each piece), else the best; with a
  /// ring set, the smallest allowed such degree, else the fastest allowed one.
  int degree_for(const Seq& s, double tau) const;
  /// The sequence with the most work (ties: the lowest id).
  const Seq& hardest() const { return seqs_[order_.front()]; }
  /// Largest single-rank time among sequences that fit one rank, and the time of the hardest ring sequence.
  double upper_tau() const;
  double total_work() const;
  bool has_wide_rings() const;
  double largest_work() const;
  /// What a flat build for tau depends on: the ring sequences and their degrees.
  std::vector<std::pair<std::size_t, int>> signature(double tau) const;

  // ---- pp = 1 (flat.cpp) ----
  /// Builds the plan for target tau; returns its makespan and, if `out` is given, the plan. ring_order: 0 largest
  /// area first, 1 longest first, 2 widest first. `forced`: the rings and their places (shelves()).
  double build(double tau, int local_search_rounds, Plan* out, int ring_order = 0,
               const std::vector<Ring>* forced = nullptr) const;
  /// Rings for shelf packing of the wide rings at tau (empty when they do not crowd the pool).
  std::vector<Ring> shelves(double tau) const;

  // ---- pp > 1: slotted plans (slotted.cpp) ----
  /// A pipelined plan of m exclusive slots; `edge` is the share of the first and last slot.
  Plan slotted(int m, double edge) const;

  // ---- pp > 1: per-rank microbatch lists (pipelined.cpp) ----
  /// The ring sequences of pipelined(target, mu) with their degrees (the rest go to `shorts`).
  std::vector<Ring> pipelined_rings(const TargetRule& target, double mu, std::vector<std::size_t>& shorts,
                                    bool tile = false) const;
  /// The rings (sequence, degree) pipelined() builds for this rule: all that a build's target changes.
  std::vector<std::pair<std::size_t, int>> ring_set(const TargetRule& target, double mu, bool tile) const;
  Plan pipelined(const Pipe& spec, int pp) const;
  /// Shelf layouts of the giants for pipelined plans (pipelined_shelves.cpp). `parallel` (optional) searches the
  /// full shelves and each column width on several threads; the layouts do not depend on it.
  std::vector<std::vector<Ring>> pipelined_shelves(int pp, std::size_t keep, std::size_t drop = 0,
                                                   const ParallelFor& parallel = {}) const;

 private:
  friend struct PipelinedBuild;
  friend struct FlatBuild;
  friend struct SetShelf;
  friend struct ShelfSearch;
  void classify(const std::vector<std::size_t>& ids, double tau, int ring_order, std::vector<std::size_t>& shorts,
                std::vector<Ring>& rings) const;
  std::vector<std::size_t> build_slot(const std::vector<std::size_t>& subset, double tau, TimelineBuilder& tl) const;
  std::pair<Bin, Bin> halve(const Bin& all) const;
  void equalize_counts(std::vector<std::vector<Bin>>& bins, const std::vector<int>& rings_on,
                       const CountRule& rule) const;
  double finish(double base, const std::vector<Bin>& rb) const;
  bool improve(const std::vector<double>& base, std::vector<std::vector<Bin>>& bins, std::vector<double>& fin) const;
  void move_item(Bin& from, std::size_t k, Bin& to) const;
  void add_to(Bin& b, std::size_t i) const;
  std::vector<std::int64_t> ids_of(const Bin& b) const;

  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  const DynacpTuning& tuning_;
  const RingSet* rings_;
  const StaticShapes* shapes_;                              // null, or shapes with token buckets
  std::vector<int> allowed_sizes_;                          // under a ring set: 1 and its sizes, ascending
  int allowed_degree_for(const Seq& s, double tau) const;   // degree_for under a ring set
  int first_within(const Seq& s, int k, double tau) const;  // smallest d of piece k with T(s, d) <= tau
  std::int64_t cap_ = 0;
  std::vector<Seq> seqs_;
  std::vector<std::size_t> order_;  // by work, heaviest first (ties: lower index)
  std::vector<double> ring_t1_;     // per sequence: t1, or infinity when dmin > 1 (it rings at every tau): signature()
  /// Loops over many sequences in order_'s order read seqs_ at random: they prefetch this many ahead.
  static constexpr std::size_t kAhead = 16;
};

}  // namespace dynacp::solve::dyn
