#include "dynacp/api/planner.hpp"

#include <algorithm>
#include <chrono>
#include <limits>

#include "dynacp/model/error.hpp"
#include "dynacp/model/log.hpp"
#include "dynacp/sim/pipeline.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/blocks/ring_set.hpp"
#include "dynacp/solve/bounds/lower_bound.hpp"

namespace dynacp {

double lower_bound(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  return solve::lower_bound(batch, cluster, cost, options.pp, options.vpp, options.tight_bound);
}

namespace {

/// The simulator's input for a pipelined plan: every group a microbatch of its ranks, its time split by the cost
/// model's backward_ratio over pp x vpp stage-chunks.
sim::PipelineProblem pipeline_problem(const Plan& plan, const Batch& batch, const Cluster& cluster,
                                      const CostModel& cost, const PlanOptions& options) {
  sim::PipelineProblem prob;
  prob.num_ranks = cluster.num_ranks;
  prob.pp = options.pp;
  prob.vpp = options.vpp;
  prob.rank_microbatches.resize(static_cast<std::size_t>(cluster.num_ranks));
  const double chunks = static_cast<double>(options.pp) * options.vpp;
  const StaticShapes& shapes = options.static_shapes;
  const bool padded = !shapes.token_buckets.empty();
  const std::vector<GroupStats> single = padded ? single_stats(batch, cost) : std::vector<GroupStats>{};
  for (const auto& slot : plan.microbatches)
    for (const auto& g : slot) {
      const double t = padded ? shapes.group_time(cost, g, single, batch, cluster) : cost.group_time(g, batch, cluster);
      std::int64_t tokens = 0;
      for (auto id : g.sequences) tokens += batch.lengths[static_cast<std::size_t>(id)];
      if (padded) {  // the padding rows are activations too
        const std::int64_t rows = group_rows(batch, cluster, g.sequences, g.degree());
        tokens = shapes.priced(GroupStats{tokens}, rows, g.degree()).tokens;
      }
      const int id = static_cast<int>(prob.group_ranks.size());
      prob.group_ranks.push_back(g.ranks);
      prob.group_forward.push_back(cost.forward_time(t, chunks));
      prob.group_backward.push_back(cost.backward_time(t, chunks));
      prob.group_memory.push_back(cost.mem_per_token * static_cast<double>((tokens + g.degree() - 1) / g.degree()) /
                                  chunks);
      for (int r : g.ranks) prob.rank_microbatches[static_cast<std::size_t>(r)].push_back(id);
    }
  return prob;
}

/// T of a placed group under the options' static shapes (their padding priced; the plain group time when off).
double shaped_time(const Group& g, const Batch& batch, std::span<const GroupStats> single, const Cluster& cluster,
                   const CostModel& cost, const PlanOptions& options) {
  if (options.static_shapes.token_buckets.empty()) return cost.group_time(g, single, cluster);
  return options.static_shapes.group_time(cost, g, single, batch, cluster);
}

/// The simulator's flat input for a pipelined plan (what pipeline_problem builds, without memory and per-group
/// allocations): group times from `single` (single_stats of the batch), split by backward_ratio over pp x vpp
/// stage-chunks.
sim::FlatProblem flat_problem(const Plan& plan, const Batch& batch, std::span<const GroupStats> single,
                              const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  sim::FlatProblem prob;
  prob.num_ranks = cluster.num_ranks, prob.pp = options.pp, prob.vpp = options.vpp;
  prob.rank_off.assign(static_cast<std::size_t>(cluster.num_ranks) + 1, 0);
  const double chunks = static_cast<double>(options.pp) * options.vpp;
  for (const auto& slot : plan.microbatches)
    for (const auto& g : slot) {
      const double t = shaped_time(g, batch, single, cluster, cost, options);
      prob.group_size.push_back(static_cast<std::int32_t>(g.ranks.size()));
      prob.group_forward.push_back(cost.forward_time(t, chunks));
      prob.group_backward.push_back(cost.backward_time(t, chunks));
      for (int r : g.ranks) ++prob.rank_off[static_cast<std::size_t>(r) + 1];
    }
  for (std::size_t r = 0; r < static_cast<std::size_t>(cluster.num_ranks); ++r)
    prob.rank_off[r + 1] += prob.rank_off[r];
  prob.rank_groups.resize(static_cast<std::size_t>(prob.rank_off.back()));
  std::vector<std::int32_t> at(prob.rank_off.begin(), prob.rank_off.end() - 1);
  std::int32_t id = 0;
  for (const auto& slot : plan.microbatches)
    for (const auto& g : slot) {
      for (int r : g.ranks) prob.rank_groups[static_cast<std::size_t>(at[static_cast<std::size_t>(r)]++)] = id;
      ++id;
    }
  return prob;
}

/// The step time alone (what candidate scoring needs): the group timeline for pp = 1, the simulator's longest path
/// (sim::step_time on flat arrays) for pp > 1. `single`: single_stats of the batch.
double step_time(const Plan& plan, const Batch& batch, std::span<const GroupStats> single, const Cluster& cluster,
                 const CostModel& cost, const PlanOptions& options) {
  if (options.pp > 1) {
    return sim::step_time(flat_problem(plan, batch, single, cluster, cost, options));
  }
  return solve::group_timeline(
      plan, cluster.num_ranks, [&](const Group& g) { return shaped_time(g, batch, single, cluster, cost, options); },
      [](const Group&, double) {});
}

/// predict() with the pipelined lower bound already computed (`lb` < 0: compute it).
Predicted predict_with(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                       const PlanOptions& options, double lb) {
  Predicted p = options.static_shapes.token_buckets.empty()  // its lower bound is the pp = 1 one
                    ? solve::evaluate(plan, batch, cluster, cost)
                    : solve::evaluate(plan, batch, cluster, cost, options.static_shapes);
  if (options.pp <= 1) return p;
  p.lower_bound = lb >= 0 ? lb : lower_bound(batch, cluster, cost, options);
  const sim::PipelineResult res = sim::simulate(pipeline_problem(plan, batch, cluster, cost, options));
  p.step_time = res.step_time;
  p.bubble_fraction = res.bubble_fraction;
  for (std::size_t r = 0; r < p.per_rank_time.size(); ++r) p.per_rank_time[r] = res.busy[r] / options.pp;
  return p;
}

/// Warns about sequences whose length is at least 90 % of what the whole pool holds: one such sequence occupies
/// (nearly) every rank, so the plan is close to infeasible and usually a wrong budget or a wrong lengths file.
void warn_near_capacity(const Batch& batch, std::int64_t cap, int ranks) {
  if (!core_log().should_log(spdlog::level::warn)) return;
  const std::int64_t pool = cap * ranks;
  std::size_t count = 0, first = 0;
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (10 * batch.lengths[i] >= 9 * pool && count++ == 0) first = i;
  if (count > 0)
    core_log().warn(
        "{} sequence(s) hold at least 90% of the pool's capacity of {} tokens ({} ranks x {} tokens per rank), "
        "e.g. sequence {} with {} tokens; check the token budget and the lengths",
        count, pool, ranks, cap, first, batch.lengths[first]);
}

/// Static shapes (CUDA-graph mode): validates them against the inputs and the strategy (only dynacp plans under
/// them; the others raise, naming the fallback) and checks that a plan can exist.
void check_shapes(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options,
                  const std::string& strategy) {
  const StaticShapes& shapes = options.static_shapes;
  shapes.validate(cluster, cost);
  if (strategy != "dynacp") invalid("strategy ", strategy, " cannot plan under static_shapes; use strategy 'dynacp'");
  for (std::size_t i = 0; i < options.ring_set.size(); ++i)
    if (!shapes.allows_degree(static_cast<int>(options.ring_set[i].size())))
      invalid("ring_set[", i, "] has ", options.ring_set[i].size(), " ranks, not one of StaticShapes.cp_sizes; every ",
              "ring of the set must have an allowed CP size");
  shapes.check_feasible(batch, cluster, cost);
}

/// The cluster a strategy plans on under static shapes: the largest bucket is the token capacity.
Cluster shaped_cluster(Cluster cluster, const StaticShapes& shapes) {
  if (!shapes.token_buckets.empty()) cluster.tokens_per_rank = shapes.token_buckets.back();
  return cluster;
}

/// The options a strategy plans with under static shapes: without a ring set, the node-aligned buddy tilings of
/// every allowed CP size > 1 (rings of d consecutive ranks from multiples of d) restrict the degrees.
PlanOptions shaped_options(PlanOptions opts, const Cluster& cluster) {
  const auto& sizes = opts.static_shapes.cp_sizes;
  if (!opts.ring_set.empty() || sizes.empty()) return opts;
  for (int d : sizes)
    if (d > 1)
      for (int start = 0; start + d <= cluster.num_ranks; start += d) {
        std::vector<int> ring(static_cast<std::size_t>(d));
        for (int i = 0; i < d; ++i) ring[static_cast<std::size_t>(i)] = start + i;
        opts.ring_set.push_back(std::move(ring));
      }
  return opts;
}

/// Solve statistics of one plan at DEBUG.
void log_solve(const Plan& p, const Batch& batch, const PlanOptions& options) {
  if (!core_log().should_log(spdlog::level::debug)) return;
  std::size_t groups = 0;
  for (const auto& slot : p.microbatches) groups += slot.size();
  core_log().debug(
      "plan: strategy={} sequences={} tokens={} pp={} vpp={} slots={} groups={} solve_ms={:.3f} "
      "step_time_s={:.6g} lower_bound_s={:.6g} bubble_fraction={:.4f}",
      p.strategy, batch.size(), batch.total_tokens(), options.pp, options.vpp, p.microbatches.size(), groups,
      p.solve_ms, p.predicted.step_time, p.predicted.lower_bound, p.predicted.bubble_fraction);
}

}  // namespace

Predicted predict(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options) {
  // The pricing reads lengths and rank times by index: names outside the batch or the pool are input errors here,
  // not reads out of bounds (the capacity is not checked: any plan may be priced).
  const auto n = static_cast<std::int64_t>(batch.size());
  for (std::size_t m = 0; m < plan.microbatches.size(); ++m)
    for (std::size_t gi = 0; gi < plan.microbatches[m].size(); ++gi) {
      const Group& g = plan.microbatches[m][gi];
      for (auto id : g.sequences)
        if (id < 0 || id >= n)
          invalid("predict: microbatch ", m, " group ", gi, " names sequence ", id, " but the batch has ", n);
      for (int r : g.ranks)
        if (r < 0 || r >= cluster.num_ranks)
          invalid("predict: microbatch ", m, " group ", gi, " names rank ", r, " outside the pool of ",
                  cluster.num_ranks);
    }
  return predict_with(plan, batch, cluster, cost, options, -1.0);
}

Plan plan(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  batch.validate();
  cluster.validate();
  cost.validate();
  options.validate();
  const auto& strategy = solve::find_strategy(options.strategy);
  const std::int64_t cap = cost.token_capacity(cluster);
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (cost.min_degree(batch.lengths[i], cluster) > cluster.num_ranks) {
      const std::int64_t k = cluster.seq_pad_multiple;
      invalid("sequence ", i, " has ", batch.lengths[i], " tokens but the whole pool of ", cluster.num_ranks,
              " ranks holds at most ", cap / k * k * cluster.num_ranks, " tokens of one sequence (", cap,
              " rows per rank; a sequence is padded to a multiple of ", k, " x ", cluster.num_ranks, " rows)");
    }
  warn_near_capacity(batch, cap, cluster.num_ranks);

  const bool shaped = options.static_shapes.enabled();
  if (shaped) check_shapes(batch, cluster, cost, options, strategy.name);
  const solve::RingSet rings(options.ring_set, cluster.num_ranks);                       // validated before the solve
  const double lb = options.pp > 1 ? lower_bound(batch, cluster, cost, options) : -1.0;  // once, not per candidate
  const std::vector<GroupStats> single = single_stats(batch, cost);
  PlanOptions opts = options;
  opts.score = [&](const Plan& p) {
    if (options.vpp > 1)  // interleaving runs whole microbatch groups of pp: other counts are not a candidate
      for (int c : p.microbatch_counts(cluster.num_ranks))
        if (c % options.pp != 0) return std::numeric_limits<double>::infinity();
    try {
      if (shaped) {  // a candidate outside the declared shapes is no candidate
        try {
          options.static_shapes.check_plan(p, batch, cluster);
        } catch (const InvalidArgument&) {
          return std::numeric_limits<double>::infinity();
        }
      }
      return step_time(p, batch, single, cluster, cost, options);
    } catch (const Error&) {  // e.g. a pipelined plan whose shared groups would deadlock under 1F1B
      return std::numeric_limits<double>::infinity();
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  Plan out =
      shaped ? strategy.fn(batch, shaped_cluster(cluster, options.static_shapes), cost, shaped_options(opts, cluster))
             : strategy.fn(batch, cluster, cost, opts);
  // dynacp plans inside the ring set; the other strategies' plans are projected onto it here (the fallback).
  out = rings.project(std::move(out), batch, cluster, cost);
  out.solve_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  out.strategy = strategy.name;
  out.num_ranks = cluster.num_ranks;
  out.version = Plan::kVersion;
  try {
    out.validate(batch, cluster, cost);
    if (shaped) options.static_shapes.check_plan(out, batch, cluster);
  } catch (const InvalidArgument& e) {
    throw Error(std::string("strategy '") + strategy.name + "' produced an invalid plan (a bug): " + e.what());
  }
  out.predicted = predict_with(out, batch, cluster, cost, options, lb);
  log_solve(out, batch, options);
  return out;
}

}  // namespace dynacp
