// Every tuning constant of the `dynacp` strategy in one documented struct (PlanOptions::tuning). The defaults are
// the values the benchmark tables in docs/benchmarks.md were measured with; Python exposes the struct as
// dynacp.DynacpTuning for experiments (benchmarks/families.py switches families off through `skip_families`).
#pragma once
#include <string>
#include <vector>

#include "dynacp/solve/search/local_search.hpp"

namespace dynacp {

struct DynacpTuning {
  // ---- pp = 1: the tau scan (docs/strategies.md, "dynacp") ----
  /// Geometric grid points of the makespan target tau between the lower bound and the slowest single sequence.
  int tau_grid = 8;
  /// Refinement around the best grid point: tau x step^(+-k / tau_refine_division) for k = 1..tau_refine_steps.
  int tau_refine_steps = 3;
  int tau_refine_division = 4;
  /// Rounds of the per-rank move/swap search after a build (each one improving move; stops early).
  int flat_local_search_rounds = 200;
  /// Ring placement orders tried when some ring spans more than a node: largest area, longest, widest.
  int ring_orders = 3;
  /// Pools of up to this many nodes get the full search for rings wider than a node (neighbour degrees, orders).
  int wide_nodes = 128;
  /// A ring also tries the degrees within this many of its target degree, keeping the one that finishes first.
  int neighbour_degrees = 2;
  /// Gaps (idle time before a ring) tried per short sequence, tightest first.
  int gap_tries = 8;
  /// The per-rank search: receivers tried (fastest first) and sequences examined per rank.
  int search_receivers = 8;
  int search_items = 48;
  /// Flat shelves: a wide ring takes one more rank while that costs at most this factor of its least rank-time.
  double shelf_saturation = 1.02;

  // ---- pp > 1: slotted plans ----
  /// Microbatch counts tried: the knee of the budget curve over m = pp..knee_max_multiple pp, and +-pp around it.
  int knee_max_multiple = 4;
  /// Share of the first and last slot (1 = equal quotas).
  std::vector<double> slot_edges = {1.0, 0.3};
  /// Targets tau tried per slot (geometric, between the slot's mean work and its slowest sequence).
  int slot_tau_grid = 6;

  // ---- pp > 1: per-rank microbatch lists (Builder::pipelined) ----
  /// Microbatch targets mu: mu_grid points from the bound's scale down to mu_floor x it (geometric).
  int mu_grid = 8;
  double mu_floor = 0.03;
  /// Degree rules for rings that cannot reach mu: within f x their fastest time, and within f x the bound's scale.
  std::vector<double> ring_targets = {1.0, 1.05, 1.12, 1.25};
  /// The extra-target and tiled walks run at the mus of the best `walk_mus` plain grid points only (0 = the whole
  /// grid): the winners cluster around the best plain mu.
  int walk_mus = 3;
  /// Coarse to fine: the plain walk tries only the first `coarse_rules` degree rules (ring_targets, each relative and
  /// in seconds, in that order) over the whole mu grid and the others at the best walk_mus points (0 = all rules
  /// everywhere). 2 (with walk_mus 3) cut the pp = 4 search by a fifth at +0.07 % mean step time on bench.py's
  /// batches (docs/benchmarks.md, issue 26).
  int coarse_rules = 2;
  /// ... on pools of at least this many ranks: smaller pools build fast and lose more (up to 7 % on small random
  /// instances), so they walk every rule.
  int coarse_min_ranks = 32;
  /// Extra targets, fractions of the whole bound, used when it exceeds the microbatch scale by extra_threshold.
  double extra_threshold = 1.02;
  std::vector<double> extra_targets = {0.95, 1.05, 1.2};
  /// Breakpoints: the hardest sequence's degree times within [low, high] x the whole bound, at the mu of the best
  /// `break_mus` extra-target builds.
  double break_low = 0.9;
  double break_high = 1.2;
  int break_mus = 2;
  /// At most this many breakpoints, those whose times lie nearest the whole bound (0 = all).
  int break_points = 0;
  /// mu refinement around the best plain build: mu x grid step^f.
  std::vector<double> mu_refine = {-2.0 / 3, -1.0 / 3, 1.0 / 3, 2.0 / 3};
  /// The best plain builds that get lead, order, profile and isolation variants.
  int variant_trials = 2;
  std::vector<int> lead_counts = {1, 2};
  std::vector<double> lead_fractions = {0.6};
  /// Profile leads: pp - 1 microbatches rising by these ratios towards the first ring.
  std::vector<double> profile_ratios = {0.5, 0.75};
  /// Rings within this factor of the slowest keep their ranks from other rings (isolated builds).
  double isolate = 0.75;
  /// Shelf layouts: the most giants, the most shelves whose every order is tried, layouts built, mu factors of the
  /// best plain build, single-lead fractions, the profile-lead ratio, and how many of the smallest giants to drop.
  int shelf_giants = 7;
  int shelf_orders = 5;
  int shelf_layouts = 8;
  std::vector<double> shelf_mu_factors = {0.5, 1.0, 2.0};
  std::vector<double> shelf_lead_fractions = {0.6, 0.3};
  double shelf_profile_ratio = 0.5;
  std::vector<int> shelf_drops = {0, 2};
  /// Degrees and column widths of shelf layouts step by num_ranks / shelf_stride_ranks (at least 1).
  int shelf_stride_ranks = 64;
  /// Units: the most giants on blocks of their own (plain 1F1B only). 3 gave no faster plan on bench.py's batches
  /// and cost about a tenth of the pp = 4 search (docs/benchmarks.md, issue 26).
  int unit_giants = 2;
  /// Slot-order polish: the most simulations per plan (48: bench.py's pp = 1 and pp = 4 plans keep their step times
  /// with 96; a few vpp = 2 and small pp > 1 plans lose up to 1.3 %), and which pooled plans get it: those within this
  /// factor of the best pooled plan's score (the others rarely overtake it).
  int reorder_budget = 48;
  double polish_within = 1.05;
  /// ... and at most this many of them, the best by score (ties: registry order); 0 = no cap.
  int polish_plans = 0;

  /// The last stage: local search from the chosen plan (include/dynacp/solve/search/local_search.hpp documents each
  /// field).
  solve::LocalSearchTuning local_search;

  /// Families (names from dynacp_families()) left out of the search, for experiments.
  std::vector<std::string> skip_families;

  /// Throws InvalidArgument naming the first bad field (a count below its minimum, an empty list, a negative factor,
  /// or an unknown family name).
  void validate() const;
};

}  // namespace dynacp
