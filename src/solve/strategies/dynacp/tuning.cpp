// DynacpTuning::validate: every field's bounds, named in the error (include/dynacp/solve/strategies/dynacp/tuning.hpp).
#include "dynacp/solve/strategies/dynacp/tuning.hpp"

#include <cmath>

#include "dynacp/model/error.hpp"
#include "search.hpp"

namespace dynacp {

void DynacpTuning::validate() const {
  auto at_least = [](const char* field, long long v, long long lo) {
    if (v < lo) invalid("DynacpTuning.", field, " is ", v, "; it must be >= ", lo);
  };
  auto positive = [](const char* field, double v) {
    if (!std::isfinite(v) || v <= 0) invalid("DynacpTuning.", field, " is ", v, "; it must be finite and > 0");
  };
  auto list = [&](const char* field, const std::vector<double>& v) {
    if (v.empty()) invalid("DynacpTuning.", field, " is empty; give at least one value");
    for (double x : v) positive(field, x);
  };
  at_least("tau_grid", tau_grid, 1), at_least("tau_refine_steps", tau_refine_steps, 0);
  at_least("tau_refine_division", tau_refine_division, 1);
  at_least("flat_local_search_rounds", flat_local_search_rounds, 0), at_least("ring_orders", ring_orders, 1);
  at_least("wide_nodes", wide_nodes, 0), at_least("neighbour_degrees", neighbour_degrees, 0);
  at_least("gap_tries", gap_tries, 0), at_least("search_receivers", search_receivers, 1);
  at_least("search_items", search_items, 0), at_least("knee_max_multiple", knee_max_multiple, 1);
  at_least("slot_tau_grid", slot_tau_grid, 1), at_least("mu_grid", mu_grid, 2), at_least("break_mus", break_mus, 0);
  at_least("walk_mus", walk_mus, 0), at_least("break_points", break_points, 0);
  at_least("coarse_rules", coarse_rules, 0), at_least("coarse_min_ranks", coarse_min_ranks, 0);
  at_least("variant_trials", variant_trials, 0), at_least("shelf_giants", shelf_giants, 0);
  at_least("shelf_orders", shelf_orders, 0), at_least("shelf_layouts", shelf_layouts, 0);
  at_least("shelf_stride_ranks", shelf_stride_ranks, 1), at_least("unit_giants", unit_giants, 0);
  at_least("reorder_budget", reorder_budget, 0), at_least("polish_plans", polish_plans, 0);
  if (ring_orders > 3) invalid("DynacpTuning.ring_orders is ", ring_orders, "; there are 3 ring orders");
  positive("shelf_saturation", shelf_saturation), positive("mu_floor", mu_floor);
  positive("extra_threshold", extra_threshold), positive("break_low", break_low), positive("break_high", break_high);
  positive("isolate", isolate), positive("shelf_profile_ratio", shelf_profile_ratio);
  if (!(polish_within >= 1)) invalid("DynacpTuning.polish_within is ", polish_within, "; it must be >= 1");
  list("slot_edges", slot_edges), list("ring_targets", ring_targets), list("extra_targets", extra_targets);
  list("lead_fractions", lead_fractions), list("profile_ratios", profile_ratios);
  list("shelf_mu_factors", shelf_mu_factors), list("shelf_lead_fractions", shelf_lead_fractions);
  for (double f : mu_refine)
    if (!std::isfinite(f)) invalid("DynacpTuning.mu_refine holds ", f, "; values must be finite");
  for (int n : lead_counts) at_least("lead_counts", n, 1);
  for (int n : shelf_drops) at_least("shelf_drops", n, 0);
  for (const auto& name : skip_families) solve::dyn::family_index(name);  // throws naming the known families
  const auto& ls = local_search;
  at_least("local_search.max_evaluations", ls.max_evaluations, 0), at_least("local_search.max_work", ls.max_work, 0);
  at_least("local_search.max_sequences", ls.max_sequences, 0), at_least("local_search.max_ranks", ls.max_ranks, 0);
  at_least("local_search.hot_ranks", ls.hot_ranks, 1), at_least("local_search.split_all_up_to", ls.split_all_up_to, 1);
  at_least("local_search.kicks", ls.kicks, 0);
  if (!(ls.min_gain >= 0) || !std::isfinite(ls.min_gain))
    invalid("DynacpTuning.local_search.min_gain is ", ls.min_gain, "; it must be finite and >= 0");
}

}  // namespace dynacp
