// The `dynacp` strategy's driver: one search context, the candidate families of the registry in order (each
// generating, scoring and pooling its plans), the slot-order polish of every family's pool, and the final choice;
// on pipelines the winner gets the class and ring order polish. The plan records which family produced it.
// docs/strategies.md ("dynacp: the portfolio") describes every family; DynacpTuning holds every constant.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/model/log.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/blocks/shapes.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/bounds/lower_bound.hpp"
#include "dynacp/solve/search/local_search.hpp"
#include "dynacp/solve/search/reorder.hpp"
#include "search.hpp"

namespace dynacp {
namespace solve {
namespace dyn {

Runner::Runner(int threads, std::function<void()> check, double time_limit_s)
    : threads_(std::max(1, threads)), check_(std::move(check)), has_deadline_(time_limit_s > 0) {
  if (has_deadline_)
    deadline_ = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(time_limit_s));
}

bool Runner::expired() const { return has_deadline_ && std::chrono::steady_clock::now() >= deadline_; }

struct Runner::Batch {
  std::size_t n;
  const std::function<void(std::size_t)>& f;
  bool timed;  // stop starting tasks past the deadline
  std::vector<std::exception_ptr> errors;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false}, skipped{false};
};

Runner::~Runner() {
  {
    const std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
}

void Runner::work(Batch& b, bool caller) {
  for (;;) {
    if (b.stop.load()) return;
    if (caller) check();  // may throw (an interrupt): for_each's catch stops the others
    if (b.timed && expired()) {
      b.skipped = true;
      return;
    }
    const std::size_t i = b.next.fetch_add(1);
    if (i >= b.n) return;
    try {
      b.f(i);
    } catch (...) {
      b.errors[i] = std::current_exception();
      b.stop = true;
    }
  }
}

void Runner::serve() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return closing_ || generation_ != seen; });
    if (closing_) return;
    seen = generation_;
    if (!batch_) continue;  // that batch already ended
    Batch& b = *batch_;
    ++busy_;
    lock.unlock();
    work(b, false);
    lock.lock();
    if (--busy_ == 0) idle_.notify_all();
  }
}

void Runner::for_each(std::size_t n, const std::function<void(std::size_t)>& f) {
  if (n == 0) return;
  Batch b{n, f, true, std::vector<std::exception_ptr>(n)};
  run_batch(b);
}

void Runner::for_each_to_end(std::size_t n, const std::function<void(std::size_t)>& f) {
  if (n == 0) return;
  Batch b{n, f, false, std::vector<std::exception_ptr>(n)};
  run_batch(b);
}

void Runner::run_batch(Batch& b) {
  const bool helped = threads_ > 1 && b.n > 1;
  if (helped) {
    {
      const std::lock_guard lock(mutex_);
      if (pool_.empty())
        for (int k = 1; k < threads_; ++k) pool_.emplace_back([this] { serve(); });
      batch_ = &b;
      ++generation_;
    }
    wake_.notify_all();
  }
  std::exception_ptr interrupt;
  try {
    work(b, true);
  } catch (...) {
    interrupt = std::current_exception();
    b.stop = true;
  }
  if (helped) {  // no helper joins from now on; wait for the ones inside
    std::unique_lock lock(mutex_);
    batch_ = nullptr;
    idle_.wait(lock, [&] { return busy_ == 0; });
  }
  if (interrupt) std::rethrow_exception(interrupt);
  for (const auto& e : b.errors)
    if (e) std::rethrow_exception(e);
  if (b.skipped) cut_short_ = true;
}

std::vector<TargetRule> SearchContext::targets_at(double scale) const {
  std::vector<TargetRule> t;
  for (double f : tune.ring_targets)
    t.push_back({TargetRule::Relative, f}), t.push_back({TargetRule::Seconds, f * scale});
  return t;
}

double SearchContext::mu_at(double scale, int k) const {
  return scale * std::pow(tune.mu_floor, static_cast<double>(k) / (tune.mu_grid - 1));
}

void SearchContext::keep(Plan p, double t, std::size_t family) {
  if (!std::isfinite(t) || !counts_ok(p, cluster.num_ranks, options)) return;
  auto& pool = pools[family];
  const auto room = static_cast<std::size_t>(families()[family].places);
  if (room == 0 || (pool.size() == room && t >= pool.back().first)) return;
  auto at = std::upper_bound(pool.begin(), pool.end(), t,
                             [](double x, const std::pair<double, Plan>& e) { return x < e.first; });
  pool.insert(at, {t, std::move(p)});
  if (pool.size() > room) pool.pop_back();
}

// One job's results in keep order: under fixed counts first the builds brought to the median's and the largest
// count (and, interleaving with variable counts, each rank to its own nearest multiple of pp), then the plan itself.
struct JobResult {
  std::vector<std::tuple<Plan, double, std::size_t>> kept;
  double t = std::numeric_limits<double>::infinity();
  bool ran = false;
};

std::vector<CountRule> SearchContext::count_rules(const Plan& p) const {
  std::vector<CountRule> rules;
  if (options.vpp > 1 && options.count_policy == CountPolicy::Variable)
    rules.push_back({CountRule::NearestMultiple, options.pp});
  const int step = options.vpp > 1 ? options.pp : 1;
  std::vector<int> n = p.microbatch_counts(cluster.num_ranks);
  std::sort(n.begin(), n.end());
  const int median = (n[n.size() / 2] + step - 1) / step * step, most = (n.back() + step - 1) / step * step;
  rules.push_back({CountRule::Exactly, median});
  if (most != median) rules.push_back({CountRule::Exactly, most});
  return rules;
}

std::vector<std::vector<std::pair<std::size_t, int>>> SearchContext::ring_sets(const std::vector<RingQuery>& queries) {
  std::vector<std::vector<std::pair<std::size_t, int>>> out(queries.size());
  run.for_each_to_end(queries.size(),  // every set, past the time limit too: the walks compare all of them
                      [&](std::size_t i) { out[i] = b.ring_set(queries[i].target, queries[i].mu, queries[i].tile); });
  return out;
}

void SearchContext::run_jobs(const std::vector<Job>& jobs) {
  builds += jobs.size();
  std::vector<JobResult> res(jobs.size());
  const std::size_t interleaved = family_index("interleaved");
  run.for_each(jobs.size(), [&](std::size_t j) {
    const Job& job = jobs[j];
    JobResult& r = res[j];
    Plan p = b.pipelined(job.spec, options.pp);
    if (fixed_counts)
      for (const CountRule& rule : count_rules(p)) {
        Pipe counted = job.spec;
        counted.count = rule;
        Plan q = b.pipelined(counted, options.pp);
        if (counts_ok(q, cluster.num_ranks, options)) {
          const double tq = score(q, batch, cluster, cost, options);
          r.kept.emplace_back(std::move(q), tq, rule.kind == CountRule::NearestMultiple ? interleaved : job.family);
        }
      }
    r.t = score(p, batch, cluster, cost, options);
    r.kept.emplace_back(std::move(p), r.t, job.family);
    r.ran = true;
  });
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (!res[j].ran) continue;
    for (auto& [p, t, f] : res[j].kept) keep(std::move(p), t, f);
    if (jobs[j].trial) trials.push_back({res[j].t, jobs[j].spec});
    if (jobs[j].extra_trial) extra_trials.push_back({res[j].t, jobs[j].spec.mu});
  }
}

const std::vector<std::vector<Ring>>& SearchContext::layouts(std::size_t drop) {
  auto it = shelf_layouts.find(drop);
  if (it == shelf_layouts.end())
    it = shelf_layouts
             .emplace(drop, b.pipelined_shelves(options.pp, static_cast<std::size_t>(tune.shelf_layouts), drop,
                                                [this](std::size_t n, const std::function<void(std::size_t)>& f) {
                                                  run.for_each(n, f);
                                                }))
             .first;
  return it->second;
}

namespace {

// The pipelined bound's terms and the grids read from them. The mu grid is scaled by the bound without its
// critical-sequence and shared terms, which say little about microbatch sizes; with vpp > 1 a second walk is scaled
// by the plain 1F1B terms. Extra targets and breakpoints only when the whole bound exceeds the microbatch scale.
void prepare_pipelined(SearchContext& c) {
  const PlanOptions& o = c.options;
  c.bt = pipelined_bound_terms(c.batch, c.cluster, c.cost, o.pp, o.vpp, /*with_cover=*/false);
  c.lb_pp = std::max({c.bt.single, c.bt.wide, c.bt.average, 1e-12});
  if (o.vpp > 1) {
    const auto b1 = pipelined_bound_terms(c.batch, c.cluster, c.cost, o.pp, 1, /*with_cover=*/false);
    c.lb_alt = std::max({b1.single, b1.wide, b1.average, 1e-12});
  }
  c.fixed_counts = o.count_policy == CountPolicy::Equal || o.vpp > 1;
  if (const double lb_full = std::max(c.bt.critical, c.bt.shared); lb_full > c.tune.extra_threshold * c.lb_pp) {
    for (double f : c.tune.extra_targets) c.extra_targets.push_back(f * lb_full);
    const Seq& hard = c.b.hardest();
    for (int d = hard.dmin; d <= c.cluster.num_ranks; ++d)
      if (const double t = c.b.time1(hard, d); t >= c.tune.break_low * lb_full && t <= c.tune.break_high * lb_full)
        c.breaks.push_back(t);
    if (c.tune.break_points > 0 && c.breaks.size() > static_cast<std::size_t>(c.tune.break_points)) {
      std::vector<std::size_t> by(c.breaks.size());  // nearest the whole bound first, then back in degree order
      std::iota(by.begin(), by.end(), std::size_t{0});
      std::stable_sort(by.begin(), by.end(), [&](std::size_t x, std::size_t y) {
        return std::abs(c.breaks[x] - lb_full) < std::abs(c.breaks[y] - lb_full);
      });
      by.resize(static_cast<std::size_t>(c.tune.break_points));
      std::sort(by.begin(), by.end());
      std::vector<double> kept;
      for (std::size_t i : by) kept.push_back(c.breaks[i]);
      c.breaks = std::move(kept);
    }
  }
}

// Every family's candidates in registry order, the pooled ones after the slot-order polish (run in parallel).
std::vector<Candidate> gather(SearchContext& c) {
  const auto& all = families();
  std::vector<std::tuple<std::size_t, double, Plan*>> polish;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& pool : c.pools)
    if (!pool.empty()) best = std::min(best, pool.front().first);
  for (std::size_t f = 0; f < all.size(); ++f)
    for (auto& [t, p] : c.pools[f])
      if (t <= c.tune.polish_within * best) polish.emplace_back(f, t, &p);
  if (c.tune.polish_plans > 0 && polish.size() > static_cast<std::size_t>(c.tune.polish_plans)) {
    std::vector<std::size_t> by(polish.size());
    std::iota(by.begin(), by.end(), std::size_t{0});
    std::stable_sort(by.begin(), by.end(),
                     [&](std::size_t x, std::size_t y) { return std::get<1>(polish[x]) < std::get<1>(polish[y]); });
    by.resize(static_cast<std::size_t>(c.tune.polish_plans));
    std::sort(by.begin(), by.end());  // back to registry order
    std::vector<std::tuple<std::size_t, double, Plan*>> kept;
    for (std::size_t i : by) kept.push_back(polish[i]);
    polish = std::move(kept);
  }
  std::vector<Plan> polished(polish.size());
  std::vector<std::size_t> longest_first(polish.size());  // the plans with the most slots (the longest polish) first
  std::iota(longest_first.begin(), longest_first.end(), std::size_t{0});
  std::stable_sort(longest_first.begin(), longest_first.end(), [&](std::size_t x, std::size_t y) {
    return std::get<2>(polish[x])->microbatches.size() > std::get<2>(polish[y])->microbatches.size();
  });
  c.run.for_each(polish.size(), [&](std::size_t k) {
    const std::size_t i = longest_first[k];
    auto& [f, t, p] = polish[i];
    polished[i] = reorder_slots(std::move(*p), t, c.batch, c.cluster, c.cost, c.options, c.tune.reorder_budget);
  });
  std::vector<Candidate> out;
  std::size_t k = 0;
  for (std::size_t f = 0; f < all.size(); ++f) {
    for (auto& d : c.direct)
      if (d.family == f) out.push_back(std::move(d));
    for (; k < polish.size() && std::get<0>(polish[k]) == f; ++k)
      if (!polished[k].microbatches.empty()) out.push_back({std::move(polished[k]), f});
  }
  return out;
}

}  // namespace
}  // namespace dyn

std::vector<std::string> dynacp_families() {
  std::vector<std::string> out;
  for (const auto& f : dyn::families()) out.emplace_back(f.name);
  return out;
}

namespace dyn {
namespace {
// A candidate as the solve would return it: on the ring set (RingSet::project) and within the static shapes'
// sequence cap (split_sequences).
Plan shaped(Plan p, const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options,
            const RingSet& rings) {
  return split_sequences(rings.project(std::move(p), batch, cluster, cost), batch, cluster, options.static_shapes);
}

// The scorer the search uses: options.score (or the group timeline) memoised by the plan's assignment. Builds often
// repeat a plan (about a fifth of the pipelined builds on bench.py's batches) and scoring - the simulator - is much
// of the search's cost. The key is Plan::fingerprint, two independent 64-bit hashes of the assignment (a false match
// would need both to collide); scores are pure functions of the plan, so the outcome does not depend
// on which thread scored a plan first.
// With a ring set every plan is scored as projected onto it (RingSet::project), the plan the solve would return.
std::function<double(const Plan&)> memoised_score(const Batch& batch, const Cluster& cluster, const CostModel& cost,
                                                  const PlanOptions& options, const RingSet& rings) {
  struct Memo {
    std::mutex mutex;
    std::map<std::pair<std::uint64_t, std::uint64_t>, double> seen;
  };
  auto memo = std::make_shared<Memo>();
  return [memo, &batch, &cluster, &cost, &rings, options](const Plan& p) {
    const auto key = p.fingerprint();
    {
      const std::lock_guard lock(memo->mutex);
      if (auto it = memo->seen.find(key); it != memo->seen.end()) return it->second;
    }
    const double t = rings.empty() && options.static_shapes.max_sequences <= 0
                         ? score(p, batch, cluster, cost, options)
                         : score(shaped(p, batch, cluster, cost, options, rings), batch, cluster, cost, options);
    const std::lock_guard lock(memo->mutex);
    memo->seen.emplace(key, t);
    return t;
  };
}
}  // namespace
}  // namespace dyn

namespace dyn {
namespace {
// Every family's candidates for one builder (its ring set), the pooled ones after the slot-order polish.
std::vector<Candidate> search(const Builder& b, const PlanOptions& options, Runner& run) {
  const DynacpTuning& tune = options.tuning;
  const Batch& batch = b.batch();
  const Cluster& cluster = b.cluster();
  const CostModel& cost = b.cost();
  SearchContext c(b, options, run);
  c.lo = std::max(lower_bound(batch, cluster, cost), 1e-12);
  c.hi = std::max(b.upper_tau(), c.lo);
  c.pools.resize(families().size());
  if (options.pp > 1) prepare_pipelined(c);
  for (const auto& f : families()) {
    if (std::find(tune.skip_families.begin(), tune.skip_families.end(), f.name) != tune.skip_families.end()) continue;
    if (!c.direct.empty() && run.expired()) break;  // the time limit: keep what was found
    if (!f.applies(c)) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t cpu0 = std::clock();
    const std::size_t builds0 = c.builds;
    f.generate(c);
    if (core_log().should_log(spdlog::level::debug))
      core_log().debug("dynacp family {}: {} list builds, {:.3f} ms wall, {:.3f} ms process CPU", f.name,
                       c.builds - builds0,
                       std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                       1e3 * static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC);
    run.check();
  }
  return gather(c);
}
}  // namespace
}  // namespace dyn

Plan dynacp(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& caller_options) {
  using namespace dyn;
  PlanOptions options = caller_options;
  const RingSet rings(options.ring_set, cluster.num_ranks);
  options.score = memoised_score(batch, cluster, cost, caller_options, rings);
  const DynacpTuning& tune = options.tuning;
  tune.validate();
  const Builder b(batch, cluster, cost, tune, &rings);
  const int threads = options.thread_count();
  Runner run(threads, options.check_interrupt, options.time_limit_s);
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&t0](const char* what) {
    if (!core_log().should_log(spdlog::level::debug)) return;
    const auto now = std::chrono::steady_clock::now();
    core_log().debug("dynacp {}: {:.3f} ms", what, std::chrono::duration<double, std::milli>(now - t0).count());
    t0 = now;
  };
  std::vector<Candidate> candidates = search(b, options, run);
  // A ring set with more than the power-of-two tilings: its other degrees can fragment the pool (a 24-rank ring
  // at offset 24 blocks two 32-rank halves), so the search also runs on the tilings alone and the better plan wins.
  if (const RingSet tiled = rings.power_of_two_tilings(); !tiled.empty() && tiled.count() < rings.count()) {
    const Builder b2(batch, cluster, cost, tune, &tiled);
    for (auto& x : search(b2, options, run)) candidates.push_back(std::move(x));
  }
  lap("slot-order polish of the pools");
  if (options.pp > 1)
    std::erase_if(candidates, [&](const Candidate& x) { return !counts_ok(x.plan, cluster.num_ranks, options); });
  // The fastest candidate (ties: the earliest) that the simulator accepts.
  std::vector<double> scores(candidates.size(), std::numeric_limits<double>::infinity());
  run.for_each_to_end(candidates.size(),  // every candidate is scored, even past the time limit
                      [&](std::size_t i) { scores[i] = score(candidates[i].plan, batch, cluster, cost, options); });
  lap("final scoring");
  std::size_t best = candidates.size();
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (scores[i] < (best == candidates.size() ? std::numeric_limits<double>::infinity() : scores[best])) best = i;
  const bool partial = run.cut_short() || (options.time_limit_s > 0 && run.expired());
  if (best < candidates.size()) {
    Plan out = shaped(std::move(candidates[best].plan), batch, cluster, cost, options, rings);  // (as scored)
    if (options.pp > 1) {
      double t = scores[best];
      const ParallelFor parallel = [&run](std::size_t n, const std::function<void(std::size_t)>& f) {
        run.for_each_to_end(n, f);
      };
      out = reorder_classes(std::move(out), &t, batch, cluster, cost, options, parallel);
      out = reorder_rings(std::move(out), t, batch, cluster, cost, options, parallel);
      lap("class and ring order polish of the winner");
    }
    out = local_search(std::move(out), batch, cluster, cost, options, tune.local_search, run.deadline());
    out = shaped(std::move(out), batch, cluster, cost, options, rings);  // (its moves are scored so)
    lap("local search");
    out.family = families()[candidates[best].family].name;
    out.partial = partial;
    return out;
  }
  if (options.static_shapes.enabled())
    invalid("dynacp: no candidate plan meets ", options.static_shapes.describe(), " (", batch.size(), " sequences, ",
            batch.total_tokens(), " tokens on ", cluster.num_ranks,
            " ranks); allow more microbatch slots, sequences per group or a larger bucket");
  if (options.pp <= 1) throw Error("dynacp: no candidate plan could be scored (a bug)");
  if (Plan p = pool_slots(batch, cluster, cost, options.vpp > 1 ? options.pp : 1); !p.microbatches.empty()) {
    p.family = "pool-slots";
    p.partial = partial;
    return p;
  }
  invalid("dynacp: no plan meets the count policy (", batch.size(), " sequences on ", cluster.num_ranks,
          " ranks, pp = ", options.pp, ", vpp = ", options.vpp,
          "): interleaving needs every rank's microbatch count divisible by pp and equal counts one count for all; "
          "whole-pool slots need at least pp sequences under vpp > 1, and their tokens must fit");
}

}  // namespace solve
}  // namespace dynacp
