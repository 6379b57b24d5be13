// Internal to the `dynacp` strategy: the shared search context, the candidate-family interface and its registry,
// and the small thread pool the driver runs candidate builds on. See docs/strategies.md ("dynacp: the portfolio").
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "builder.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/bounds/lower_bound.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve::dyn {

/// Runs independent tasks on a few threads; results are stored by index, so the outcome does not depend on the
/// thread count. The calling thread takes part and alone runs the interrupt check (PlanOptions::check_interrupt,
/// which may throw) between its tasks; past the deadline no new task starts (Runner::expired). The helper threads
/// start with the first for_each of two or more tasks and wait between calls (starting a thread costs about as much
/// as a list build); the destructor stops them.
class Runner {
 public:
  Runner(int threads, std::function<void()> check, double time_limit_s);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  /// Calls f(i) for every i in [0, n) unless the deadline passes first (callers keep each task's result in its own
  /// slot and skip the ones that did not run); returns once no thread runs f any more.
  void for_each(std::size_t n, const std::function<void(std::size_t)>& f);
  /// Calls f(i) for every i in [0, n), past the deadline too (the final scoring and polish of the winner, which must
  /// see every candidate); the interrupt check still runs between the caller's tasks.
  void for_each_to_end(std::size_t n, const std::function<void(std::size_t)>& f);
  bool expired() const;
  /// The time limit's instant (time_point::max() when there is none).
  std::chrono::steady_clock::time_point deadline() const {
    return has_deadline_ ? deadline_ : std::chrono::steady_clock::time_point::max();
  }
  /// True once any for_each skipped a task because the deadline had passed.
  bool cut_short() const { return cut_short_; }
  void check() const {
    if (check_) check_();
  }

 private:
  struct Batch;                      // one for_each's tasks and outcome
  void run_batch(Batch& b);          // for_each and for_each_to_end: b's tasks on the caller and the helpers
  void work(Batch& b, bool caller);  // runs b's tasks until none is left (or stop, or b's deadline)
  void serve();                      // a helper thread: joins each new batch until the destructor
  int threads_;
  std::function<void()> check_;
  bool has_deadline_;
  std::chrono::steady_clock::time_point deadline_;
  bool cut_short_ = false;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  Batch* batch_ = nullptr;  // the running for_each's batch (helpers may join it), else null
  std::uint64_t generation_ = 0;
  int busy_ = 0;  // helpers inside the current batch
  bool closing_ = false;
  std::vector<std::jthread> pool_;  // last: destroyed (joined) first
};

/// One scored candidate kept for the final choice.
struct Candidate {
  Plan plan;
  std::size_t family;  ///< index into families()
};

/// A pipelined build to run: its spec, the family whose pool gets it, and which records it feeds.
struct Job {
  Pipe spec;
  std::size_t family;
  bool trial = false;        ///< a plain build (heaviest first, no lead): later families vary the best of these
  bool extra_trial = false;  ///< an untiled extra-target build: breakpoints are tried at the mu of the best
};

/// What the families share: the builder, the bound's terms and grids, the records earlier families leave for later
/// ones (the plain trials, the extra-target trials, the best tau), the per-family pools and the direct candidates.
struct SearchContext {
  SearchContext(const Builder& builder, const PlanOptions& o, Runner& runner)
      : b(builder),
        batch(builder.batch()),
        cluster(builder.cluster()),
        cost(builder.cost()),
        options(o),
        tune(builder.tuning()),
        run(runner) {}
  const Builder& b;
  const Batch& batch;
  const Cluster& cluster;
  const CostModel& cost;
  const PlanOptions& options;
  const DynacpTuning& tune;
  Runner& run;
  // pp = 1 (and every pp): the tau scan's result
  double lo = 0.0, hi = 0.0, best_tau = 0.0;
  int best_order = 0;
  // pp > 1
  PipelinedBoundTerms bt;
  double lb_pp = 0.0, lb_alt = 0.0;
  bool fixed_counts = false;
  std::vector<double> extra_targets, breaks;
  struct Trial {
    double score;
    Pipe spec;
  };
  std::vector<Trial> trials;                            ///< sorted by score once the plain family is done
  std::vector<std::pair<double, double>> extra_trials;  ///< (score, mu) of untiled extra-target builds
  std::map<std::size_t, std::vector<std::vector<Ring>>> shelf_layouts;  ///< by `drop`
  std::vector<std::vector<std::pair<double, Plan>>> pools;              ///< by family: (score, plan), best first
  std::vector<Candidate> direct;                                        ///< plans that skip the pools
  std::size_t builds = 0;  ///< pipelined builds run so far (the DEBUG log reports them per family)

  /// The microbatch targets' degree rules at `scale`: f x a ring's fastest time, and f x scale seconds.
  std::vector<TargetRule> targets_at(double scale) const;
  /// mu of grid point k at `scale`.
  double mu_at(double scale, int k) const;
  /// The count rules a build is also brought to under fixed counts (equal counts, or vpp > 1): each rank to its own
  /// nearest multiple of pp (interleaving with variable counts), then the median's and the largest count, rounded up
  /// to the step (pp under vpp > 1), the smaller first.
  std::vector<CountRule> count_rules(const Plan& p) const;
  /// The ring sets (Builder::ring_set) of (rule, mu, tile) queries, computed in parallel, in query order.
  struct RingQuery {
    TargetRule target;
    double mu;
    bool tile;
  };
  std::vector<std::vector<std::pair<std::size_t, int>>> ring_sets(const std::vector<RingQuery>& queries);
  /// Builds and scores the jobs (in parallel), then pools the results in job order.
  void run_jobs(const std::vector<Job>& jobs);
  /// Keeps a scored plan in its family's pool (bounded by the family's places; ties keep the earlier).
  void keep(Plan p, double t, std::size_t family);
  const std::vector<std::vector<Ring>>& layouts(std::size_t drop);
};

/// A family of candidate plans: a name, when it applies, how it generates candidates from the shared context, and
/// its polish budget (`places`: how many of its best plans get the slot-order polish; 0 = its plans go straight to
/// the final choice).
struct CandidateFamily {
  const char* name;
  const char* summary;
  int places;
  bool (*applies)(const SearchContext&);
  void (*generate)(SearchContext&);
};

/// The registry, in the order the driver runs the families and lists their candidates.
const std::vector<CandidateFamily>& families();
std::size_t family_index(const std::string& name);

/// True when every rank's microbatch count meets the count policy (equal counts; multiples of pp under vpp > 1).
bool counts_ok(const Plan& plan, int P, const PlanOptions& o);
/// Slot order polish for pipelined plans (polish.cpp).
Plan reorder_slots(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options, int budget);
/// The fallback when no candidate meets the count policy: whole-pool slots (polish.cpp).
Plan pool_slots(const Batch& batch, const Cluster& cluster, const CostModel& cost, int multiple);

}  // namespace dynacp::solve::dyn
