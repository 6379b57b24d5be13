// The candidate families of the `dynacp` strategy and their registry (docs/strategies.md, "dynacp: the portfolio").
// Each family generates candidate plans from the shared context; pooled families (places > 0) keep their best few
// for the slot-order polish, the others hand their plans straight to the final choice. Families run in registry
// order, so a family may read what earlier ones recorded (the plain trials, the extra-target trials, the best tau).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies/dynacp/units.hpp"
#include "search.hpp"

namespace dynacp::solve::dyn {
namespace {

using RingSet = std::vector<std::pair<std::size_t, int>>;

bool always(const SearchContext&) { return true; }
bool pipelined(const SearchContext& c) { return c.options.pp > 1; }
bool interleaved(const SearchContext& c) { return c.options.pp > 1 && c.lb_alt > 0; }
bool shelved(const SearchContext& c) { return c.options.pp > 1 && c.options.vpp <= 1 && !c.trials.empty(); }
// A ring across nodes can be the faster one only when the inter-node link beats the intra-node one in bandwidth or
// latency; relabelling needs several nodes of several ranks.
bool crossing_helps(const SearchContext& c) {
  const Cluster& k = c.cluster;
  return k.ranks_per_node > 1 && k.num_nodes() > 1 &&
         (k.inter_node_bandwidth > k.intra_node_bandwidth || k.inter_node_latency < k.intra_node_latency);
}

// ---- pp = 1 families (they run at every pp: their plans are candidates for pipelines too) ----

// The tau scan: a geometric grid of makespan targets between the lower bound and the slowest single-rank sequence,
// refined around the best; each distinct ring set is built once per ring order (in parallel), the best built again
// with the per-rank search.
void tau_scan(SearchContext& c) {
  const DynacpTuning& tn = c.tune;
  const int orders = c.b.has_wide_rings() && c.cluster.num_nodes() <= tn.wide_nodes ? tn.ring_orders : 1;
  double best_t = -1;
  c.best_tau = c.lo;
  std::set<RingSet> seen;
  // A build depends on tau only through which sequences become rings and their degrees: skip repeats.
  auto attempt = [&](const std::vector<double>& taus) {
    std::vector<std::pair<double, int>> todo;
    for (double tau : taus)
      if (seen.insert(c.b.signature(tau)).second)
        for (int order = 0; order < orders; ++order) todo.push_back({tau, order});
    std::vector<double> t(todo.size(), -1.0);
    c.run.for_each(todo.size(), [&](std::size_t i) { t[i] = c.b.build(todo[i].first, 0, nullptr, todo[i].second); });
    for (std::size_t i = 0; i < todo.size(); ++i)
      if (t[i] >= 0 && (best_t < 0 || t[i] < best_t))
        best_t = t[i], c.best_tau = todo[i].first, c.best_order = todo[i].second;
  };
  std::vector<double> taus;
  for (int k = 0; k <= tn.tau_grid; ++k)
    taus.push_back(c.lo * std::pow(c.hi / c.lo, static_cast<double>(k) / tn.tau_grid));
  attempt(taus);
  // refine between the neighbours of the best point so far (it moves as the refinement finds better ones)
  const double step = std::pow(c.hi / c.lo, 1.0 / tn.tau_grid);
  for (int k = 1; k <= tn.tau_refine_steps; ++k) {
    const double f = std::pow(step, k / static_cast<double>(tn.tau_refine_division));
    attempt({c.best_tau * f});
    attempt({c.best_tau / f});
  }
  Plan p;
  c.b.build(c.best_tau, tn.flat_local_search_rounds, &p, c.best_order);
  c.direct.push_back({std::move(p), family_index("tau-scan")});
}

// Shelf packing of the wide rings (side by side, degrees by area) at the best tau.
void flat_shelves(SearchContext& c) {
  const auto forced = c.b.shelves(c.best_tau);
  if (forced.empty()) return;
  Plan p;
  c.b.build(c.best_tau, c.tune.flat_local_search_rounds, &p, 0, &forced);
  c.direct.push_back({std::move(p), family_index("flat-shelves")});
}

// ---- pp > 1 ----

// Exclusive slots for m around the knee of the per-microbatch budget curve (multiples of pp, at least as many as
// memory needs), each with equal and with light edge slots.
void slotted(SearchContext& c) {
  const int pp = c.options.pp;
  const double need = static_cast<double>(c.batch.total_tokens()) /
                      (static_cast<double>(c.cost.token_capacity(c.cluster)) * c.cluster.num_ranks);
  const int m_min = std::max(1, static_cast<int>(std::ceil(need)));
  const int knee =
      knee_microbatches(c.b.total_work(), c.b.largest_work(), c.cluster.num_ranks, pp, c.tune.knee_max_multiple);
  const int floor_m = (m_min + pp - 1) / pp * pp;
  std::vector<std::pair<int, double>> todo;
  std::vector<int> grid;
  for (int m : {knee - pp, knee, knee + pp}) {
    m = std::max({m, pp, floor_m});
    if (std::find(grid.begin(), grid.end(), m) == grid.end()) grid.push_back(m);
  }
  for (int m : grid)
    for (double edge : c.tune.slot_edges) todo.push_back({m, edge});
  std::vector<Plan> out(todo.size());
  c.run.for_each(todo.size(), [&](std::size_t i) { out[i] = c.b.slotted(todo[i].first, todo[i].second); });
  for (auto& p : out)
    if (!p.microbatches.empty()) c.direct.push_back({std::move(p), family_index("slotted")});
}

// The mu grid at `scale` over the degree rules `targets` (untiled or tiled), each distinct ring set once per mu,
// A plain spec: the degree rule, mu and the two placement switches (everything else at its default).
Pipe spec_of(const TargetRule& target, double mu, bool align, bool tile = false) {
  Pipe p;
  p.target = target, p.mu = mu, p.align = align, p.tile = tile;
  return p;
}

// rings placed by estimate and with ranks of fewer rings first (align). `seed`: rules whose ring sets count as seen.
void walk(SearchContext& c, const std::vector<double>& mus, const std::vector<TargetRule>& seed,
          const std::vector<TargetRule>& targets, std::vector<bool> tiles, std::size_t family, bool trial,
          bool extra_trial) {
  std::vector<SearchContext::RingQuery> queries;  // every ring set the walk compares, in the loops' order
  for (double mu : mus)
    for (bool tile : tiles) {
      for (const auto& t : seed) queries.push_back({t, mu, tile});
      for (const auto& target : targets) queries.push_back({target, mu, tile});
    }
  const auto sets = c.ring_sets(queries);
  std::size_t q = 0;
  std::vector<Job> jobs;
  for (double mu : mus) {
    for (bool tile : tiles) {
      std::set<RingSet> seen;
      for (std::size_t k = 0; k < seed.size(); ++k) seen.insert(sets[q++]);
      for (const auto& target : targets) {
        if (!seen.insert(sets[q++]).second) continue;
        for (bool align : {false, true})
          jobs.push_back({spec_of(target, mu, align, tile), family, trial, extra_trial && !tile});
      }
    }
  }
  c.run_jobs(jobs);
}

// The mu grid at `scale`.
std::vector<double> grid(const SearchContext& c, double scale) {
  std::vector<double> mus;
  for (int k = 0; k < c.tune.mu_grid; ++k) mus.push_back(c.mu_at(scale, k));
  return mus;
}

// Where the plain walk's winners cluster: the grid mus of its best `walk_mus` builds (all of the grid when 0), in
// grid order.
std::vector<double> best_mus(const SearchContext& c) {
  std::vector<double> all = grid(c, c.lb_pp);
  if (c.tune.walk_mus <= 0 || c.trials.empty()) return all;
  std::vector<std::pair<double, std::size_t>> by;  // (best score at the grid point, index)
  for (std::size_t k = 0; k < all.size(); ++k) {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& t : c.trials)
      if (t.spec.mu == all[k]) best = std::min(best, t.score);
    by.push_back({best, k});
  }
  std::stable_sort(by.begin(), by.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::size_t> keep;
  for (std::size_t i = 0; i < by.size() && static_cast<int>(i) < c.tune.walk_mus; ++i) keep.push_back(by[i].second);
  std::sort(keep.begin(), keep.end());
  std::vector<double> out;
  for (std::size_t k : keep) out.push_back(all[k]);
  return out;
}

std::vector<TargetRule> extra_rules(const SearchContext& c) {
  std::vector<TargetRule> out;
  for (double f : c.extra_targets) out.push_back({TargetRule::Seconds, f});
  return out;
}

// Plain per-rank lists: the mu grid, mu refined around the best, then lead and order variants of the best few.
void plain(SearchContext& c) {
  const std::size_t me = family_index("plain");
  const auto rules = c.targets_at(c.lb_pp);
  const auto coarse = c.cluster.num_ranks < c.tune.coarse_min_ranks
                          ? std::size_t{0}
                          : std::min(rules.size(), static_cast<std::size_t>(c.tune.coarse_rules));
  if (coarse == 0 || coarse == rules.size()) {
    walk(c, grid(c, c.lb_pp), {}, rules, {false}, me, true, false);
  } else {  // coarse to fine: the first rules over the whole grid, the others at the best grid points only
    const std::vector<TargetRule> first(rules.begin(), rules.begin() + static_cast<std::ptrdiff_t>(coarse));
    const std::vector<TargetRule> rest(rules.begin() + static_cast<std::ptrdiff_t>(coarse), rules.end());
    walk(c, grid(c, c.lb_pp), {}, first, {false}, me, true, false);
    walk(c, best_mus(c), first, rest, {false}, me, true, false);
  }
  if (c.trials.empty()) return;
  const auto best = *std::min_element(c.trials.begin(), c.trials.end(),
                                      [](const auto& x, const auto& y) { return x.score < y.score; });
  const double step = std::pow(c.tune.mu_floor, 1.0 / (c.tune.mu_grid - 1));
  std::vector<Job> jobs;
  for (double f : c.tune.mu_refine) {
    Pipe spec = best.spec;
    spec.mu *= std::pow(step, f);
    jobs.push_back({spec, me, true});
  }
  c.run_jobs(jobs);
  std::stable_sort(c.trials.begin(), c.trials.end(), [](const auto& x, const auto& y) { return x.score < y.score; });
  jobs.clear();
  for (std::size_t i = 0; i < std::min<std::size_t>(c.trials.size(), c.tune.variant_trials); ++i) {
    for (OwnOrder order : {OwnOrder::HeaviestFirst, OwnOrder::Pyramid})
      for (int lead : c.tune.lead_counts)
        for (double frac : c.tune.lead_fractions) {
          Pipe spec = c.trials[i].spec;
          spec.order = order, spec.lead = {LeadRule::Fraction, lead, frac};
          jobs.push_back({spec, me});
        }
    Pipe spec = c.trials[i].spec;
    spec.order = OwnOrder::RiseThenFall, spec.lead = {};
    jobs.push_back({spec, me});
  }
  c.run_jobs(jobs);
}

// Profile leads on the best plain builds: pp - 1 microbatches rising towards the first ring.
void profile_lead(SearchContext& c) {
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < std::min<std::size_t>(c.trials.size(), c.tune.variant_trials); ++i)
    for (OwnOrder order : {OwnOrder::HeaviestFirst, OwnOrder::Pyramid})
      for (double ratio : c.tune.profile_ratios) {
        Pipe spec = c.trials[i].spec;
        spec.order = order, spec.lead = {LeadRule::Profile, c.options.pp - 1, ratio};
        jobs.push_back({spec, family_index("profile-lead")});
      }
  c.run_jobs(jobs);
}

// The best plain builds with their slowest rings kept apart from other rings.
void isolated(SearchContext& c) {
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < std::min<std::size_t>(c.trials.size(), c.tune.variant_trials); ++i) {
    Pipe spec = c.trials[i].spec;
    spec.isolate = true;
    jobs.push_back({spec, family_index("isolated")});
  }
  c.run_jobs(jobs);
}

// Extra targets near the whole bound, whose critical and shared terms say how far the hardest rings must widen.
void extra_target(SearchContext& c) {
  walk(c, best_mus(c), c.targets_at(c.lb_pp), extra_rules(c), {false}, family_index("extra-target"), false, true);
}

// Wide rings on a power-of-two number of whole nodes, so they stack without gaps.
void tiled(SearchContext& c) {
  auto targets = c.targets_at(c.lb_pp);
  for (const auto& t : extra_rules(c)) targets.push_back(t);
  walk(c, best_mus(c), {}, targets, {true}, family_index("tiled"), false, false);
}

// vpp > 1: the grid walked again, scaled by the plain 1F1B terms (the interleaved bound lacks the best-split term,
// so its grid leans towards microbatches too small for their overhead). Counted builds that bring each rank to its
// own nearest multiple of pp join this family too.
void interleaved_walk(SearchContext& c) {
  const std::size_t me = family_index("interleaved");
  auto targets = c.targets_at(c.lb_alt);
  const std::size_t plain_n = targets.size();
  for (const auto& t : extra_rules(c)) targets.push_back(t);
  std::vector<SearchContext::RingQuery> queries;  // every ring set compared below, in the loops' order
  for (int k = 0; k < c.tune.mu_grid; ++k)
    for (const auto& target : targets)
      for (bool tile : {false, true}) queries.push_back({target, c.mu_at(c.lb_alt, k), tile});
  const auto sets = c.ring_sets(queries);
  std::size_t q = 0;
  std::vector<Job> jobs;
  for (int k = 0; k < c.tune.mu_grid; ++k) {
    const double mu = c.mu_at(c.lb_alt, k);
    std::set<RingSet> seen[2];
    for (std::size_t i = 0; i < targets.size(); ++i)
      for (bool tile : {false, true}) {
        if (!seen[tile ? 1 : 0].insert(sets[q++]).second) continue;
        for (bool align : {false, true})
          jobs.push_back({spec_of(targets[i], mu, align, tile), me, false, i >= plain_n && !tile});
      }
  }
  c.run_jobs(jobs);
}

// The times of the hardest sequence's degrees near the whole bound: each is the step at which that ring may narrow
// by one rank; tried at the mu of the best two extra-target builds.
void breakpoint(SearchContext& c) {
  std::stable_sort(c.extra_trials.begin(), c.extra_trials.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<double> mus;
  for (const auto& [t, mu] : c.extra_trials)
    if (static_cast<int>(mus.size()) < c.tune.break_mus && std::find(mus.begin(), mus.end(), mu) == mus.end())
      mus.push_back(mu);
  std::vector<SearchContext::RingQuery> queries;  // every ring set compared below, in the loops' order
  for (double mu : mus)
    for (double target : c.breaks) queries.push_back({{TargetRule::Seconds, target}, mu, false});
  const auto sets = c.ring_sets(queries);
  std::size_t q = 0;
  std::vector<Job> jobs;
  for (double mu : mus) {
    std::set<RingSet> seen;
    for (double target : c.breaks) {
      const TargetRule rule{TargetRule::Seconds, target};
      if (!seen.insert(sets[q++]).second) continue;
      for (bool align : {false, true}) jobs.push_back({spec_of(rule, mu, align), family_index("breakpoint")});
    }
  }
  c.run_jobs(jobs);
}

// Shelves (pipelined_shelves): giants side by side in shelves that every rank runs in turn, the other sequences
// packed as in the best plain build (its target, its mu scaled), with the rank's own microbatches heaviest first or
// in pyramid order, or a profile lead (`leads` false); or one lead microbatch of a fraction of the first shelf's time
// (`leads` true). `drop` > 0: layouts of all giants but the `drop` smallest.
void shelves(SearchContext& c, std::size_t drop, bool leads, const char* name) {
  const Pipe base = c.trials.front().spec;
  std::vector<Job> jobs;
  for (const auto& rings : c.layouts(drop))
    for (double f : c.tune.shelf_mu_factors) {
      Pipe spec = spec_of(base.target, base.mu * f, false);
      spec.fixed = &rings;
      if (leads) {
        for (double frac : c.tune.shelf_lead_fractions) {
          Pipe s = spec;
          s.lead = {LeadRule::Fraction, 1, frac};
          jobs.push_back({s, family_index(name)});
        }
        continue;
      }
      Pipe pyramid = spec, profile = spec;
      pyramid.order = OwnOrder::Pyramid;
      profile.lead = {LeadRule::Profile, c.options.pp - 1, c.tune.shelf_profile_ratio};
      for (const Pipe& s : {spec, pyramid, profile}) jobs.push_back({s, family_index(name)});
    }
  c.run_jobs(jobs);
}
bool has_drop(const SearchContext& c, std::size_t k) { return k < c.tune.shelf_drops.size() && shelved(c); }
void shelf_plain(SearchContext& c) {
  if (has_drop(c, 0)) shelves(c, static_cast<std::size_t>(c.tune.shelf_drops[0]), false, "shelves");
}
void shelf_leads(SearchContext& c) {
  if (has_drop(c, 0)) shelves(c, static_cast<std::size_t>(c.tune.shelf_drops[0]), true, "shelf-leads");
}
void shelf_drops(SearchContext& c) {
  if (has_drop(c, 1)) shelves(c, static_cast<std::size_t>(c.tune.shelf_drops[1]), false, "shelf-drops");
}

// Units: rings of one width per node-aligned unit, microbatches packed towards the best split (units.hpp); giants
// on blocks of their own only under plain 1F1B (a lone giant's count of 1 cannot interleave).
void units(SearchContext& c) {
  const double full = std::max({c.lb_pp, c.bt.critical, c.bt.shared});
  std::vector<std::pair<int, int>> todo;
  for (int w = 1; w <= c.cluster.ranks_per_node; ++w)
    for (int giants = 0; giants <= (c.options.vpp > 1 ? 0 : c.tune.unit_giants); ++giants) todo.push_back({w, giants});
  std::vector<Plan> out(todo.size());
  c.run.for_each(todo.size(), [&](std::size_t k) {
    const std::size_t i = todo.size() - 1 - k;  // the widest units (the longest builds) start first
    out[i] = profile_units(c.batch, c.cluster, c.cost, todo[i].first, c.options.pp,
                           c.options.count_policy == CountPolicy::Equal, todo[i].second, full, c.options.vpp);
  });
  for (auto& p : out)
    if (!p.microbatches.empty()) c.direct.push_back({std::move(p), family_index("units")});
}

// The other strategies' plans, so dynacp is never worse than any of them.
void anchors(SearchContext& c) {
  std::vector<const StrategyInfo*> others;
  for (const auto& s : strategies())
    if (std::string(s.name) != "dynacp") others.push_back(&s);
  std::vector<std::optional<Plan>> out(others.size());
  std::vector<std::exception_ptr> errors(others.size());
  c.run.for_each(others.size(), [&](std::size_t i) {
    try {
      out[i] = others[i]->fn(c.batch, c.cluster, c.cost, c.options);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  });
  for (std::size_t i = 0; i < others.size(); ++i) {
    if (errors[i]) try {
        std::rethrow_exception(errors[i]);
      } catch (const InvalidArgument&) {
        throw;                  // bad input still raises
      } catch (const Error&) {  // an anchor that cannot plan this batch (megatron, when its microbatches cannot be
        continue;               // split to a multiple of pp under vpp > 1)
      }
    if (out[i]) c.direct.push_back({std::move(*out[i]), family_index("anchors")});
  }
}

// Cross-node rings: the whole search again on a pool of one rank per node (every ring of two or more ranks priced
// on the inter-node link), its plans relabelled so that logical rank i runs on physical rank
// (i mod nodes) x ranks_per_node + i / nodes: consecutive logical ranks sit on different nodes, so each ring crosses
// nodes as it was priced. The inner search scores its candidates relabelled, on the real pool (a ring that still
// lands in one node is priced as such).
Plan relabel_across_nodes(Plan p, const Cluster& cluster) {
  const int nodes = cluster.num_nodes(), rpn = cluster.ranks_per_node;
  for (auto& slot : p.microbatches)
    for (Group& g : slot) {
      for (int& r : g.ranks) r = (r % nodes) * rpn + r / nodes;
      std::sort(g.ranks.begin(), g.ranks.end());
    }
  return p;
}

void cross_node(SearchContext& c) {
  const auto left = c.run.deadline() - std::chrono::steady_clock::now();
  if (c.run.deadline() != std::chrono::steady_clock::time_point::max() && left <= left.zero()) return;
  PlanOptions o = c.options;
  if (o.time_limit_s > 0) o.time_limit_s = std::chrono::duration<double>(left).count();
  o.score = [&c](const Plan& p) {
    return score(relabel_across_nodes(p, c.cluster), c.batch, c.cluster, c.cost, c.options);
  };
  Cluster flat = c.cluster;
  flat.ranks_per_node = 1;
  c.direct.push_back({relabel_across_nodes(dynacp(c.batch, flat, c.cost, o), c.cluster), family_index("cross-node")});
}

}  // namespace

const std::vector<CandidateFamily>& families() {
  static const std::vector<CandidateFamily> registry = {
      {"tau-scan", "pp = 1 builds over a grid of makespan targets, rings then per-rank packing and search", 0, &always,
       &tau_scan},
      {"flat-shelves", "wide rings side by side in shelves (degrees by area) at the best tau", 0, &always,
       &flat_shelves},
      {"slotted", "exclusive slots around the knee of the microbatch budget curve", 0, &pipelined, &slotted},
      {"plain", "per-rank microbatch lists over the mu grid, refined, with lead and order variants", 3, &pipelined,
       &plain},
      {"profile-lead", "the best plain lists with pp - 1 lead microbatches rising towards the first ring", 2,
       &pipelined, &profile_lead},
      {"isolated", "the best plain lists with the slowest rings on ranks of their own", 1, &pipelined, &isolated},
      {"extra-target", "rings sized by fractions of the whole pipelined bound", 1, &pipelined, &extra_target},
      {"tiled", "rings wider than a node on a power-of-two number of whole nodes", 1, &pipelined, &tiled},
      {"interleaved", "vpp > 1: the mu grid scaled by the plain 1F1B bound; per-rank multiples of pp", 2, &interleaved,
       &interleaved_walk},
      {"breakpoint", "the hardest ring at each degree whose time lies near the whole bound", 1, &pipelined,
       &breakpoint},
      {"shelves", "giants in shelves every rank runs in turn, the rest as in the best plain list", 4, &shelved,
       &shelf_plain},
      {"shelf-leads", "shelf layouts with one lead microbatch before the first shelf", 2, &shelved, &shelf_leads},
      {"shelf-drops", "shelf layouts of all giants but the smallest, which the ring picker places", 4, &shelved,
       &shelf_drops},
      {"units", "rings of one width per node-aligned unit, packed towards the best split", 0, &pipelined, &units},
      {"anchors", "the other strategies' plans (packing, fcp, megatron, bytescale)", 0, &always, &anchors},
      {"cross-node", "the whole search on one rank per node, relabelled so rings cross nodes (faster inter-node link)",
       0, &crossing_helps, &cross_node},
  };
  return registry;
}

std::size_t family_index(const std::string& name) {
  const auto& all = families();
  for (std::size_t i = 0; i < all.size(); ++i)
    if (name == all[i].name) return i;
  std::string known;
  for (const auto& f : all) known += (known.empty() ? "" : ", ") + std::string(f.name);
  invalid("unknown dynacp family '", name, "'; known families: ", known);
}

}  // namespace dynacp::solve::dyn
