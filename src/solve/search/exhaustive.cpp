#include "dynacp/solve/search/exhaustive.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Placed {
  unsigned seqs = 0, ranks = 0;
  double t = 0.0, start = 0.0;  // start: on the group timeline (pp = 1)
};

class Search {
 public:
  Search(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options,
         const ExhaustiveLimits& limits)
      : batch_(batch),
        cluster_(cluster),
        cost_(cost),
        options_(options),
        limits_(limits),
        P_(cluster.num_ranks),
        n_(static_cast<int>(batch.size())),
        pp_(std::max(options.pp, 1)) {
    tabulate();
    load_.assign(static_cast<std::size_t>(P_), 0.0);
    count_.assign(static_cast<std::size_t>(P_), 0);
    history_.assign(static_cast<std::size_t>(P_), 0u);
    result_.time = limits.upper;
  }

  ExhaustiveResult run() {
    dfs((1u << n_) - 1u);
    return std::move(result_);
  }

 private:
  // Group times for every sequence subset and rank count (one node or across), +inf where the rows do not fit;
  // each sequence's best time alone; the node mask of every node.
  void tabulate() {
    const std::int64_t cap = cost_.token_capacity(cluster_);
    const std::size_t subsets = std::size_t{1} << n_;
    time_.assign(subsets * static_cast<std::size_t>(P_ + 1) * 2, kInf);
    work_.assign(subsets, 0.0);
    for (std::size_t s = 1; s < subsets; ++s) {
      std::vector<std::int64_t> ids;
      GroupStats st;
      for (int i = 0; i < n_; ++i)
        if (s >> i & 1) {
          ids.push_back(i);
          st.add(batch_.lengths[static_cast<std::size_t>(i)], cost_.eta(batch_.mask(static_cast<std::size_t>(i))));
          work_[s] += cost_.work(batch_.lengths[static_cast<std::size_t>(i)], batch_.mask(static_cast<std::size_t>(i)));
        }
      for (int d = 1; d <= P_; ++d) {
        if (group_rows(batch_, cluster_, ids, d) > cap) continue;
        for (int cross = 0; cross < 2; ++cross)
          time_[index(s, d, cross != 0)] = cost_.time(st, d, cross != 0, cluster_);
      }
    }
    single_.assign(static_cast<std::size_t>(n_), kInf);
    for (int i = 0; i < n_; ++i)
      for (int d = 1; d <= P_; ++d)
        for (int cross = 0; cross < 2; ++cross)
          single_[static_cast<std::size_t>(i)] =
              std::min(single_[static_cast<std::size_t>(i)], time_[index(1u << i, d, cross != 0)]);
    const int rpn = cluster_.ranks_per_node;
    for (int k = 0; k < cluster_.num_nodes(); ++k) node_mask_.push_back(((1u << rpn) - 1u) << (k * rpn));
  }

  std::size_t index(unsigned seqs, int d, bool cross) const {
    return (static_cast<std::size_t>(seqs) * static_cast<std::size_t>(P_ + 1) + static_cast<std::size_t>(d)) * 2 +
           (cross ? 1 : 0);
  }

  // Ranks j and k (same node) are interchangeable now: for pp = 1 when they are free at the same time (the timeline
  // from here on depends on nothing else), for pp > 1 when they ran the same groups (the same lists so far).
  bool interchangeable(int j, int k) const {
    if (pp_ <= 1) return load_[static_cast<std::size_t>(j)] == load_[static_cast<std::size_t>(k)];
    return history_[static_cast<std::size_t>(j)] == history_[static_cast<std::size_t>(k)];
  }

  // Whether rank set r is the canonical representative of its class under the symmetries of the current state: in
  // a node, of interchangeable ranks it takes the lowest; the wholly unused nodes it touches come first in index
  // order, taking nonincreasing counts.
  bool canonical(unsigned r) const {
    const int rpn = cluster_.ranks_per_node;
    int last_fresh_count = -1;
    bool gap = false;  // a wholly unused node was skipped
    for (std::size_t v = 0; v < node_mask_.size(); ++v) {
      const unsigned node = node_mask_[v];
      for (int k = static_cast<int>(v) * rpn; k < static_cast<int>(v + 1) * rpn; ++k) {
        if (!(r >> k & 1)) continue;
        for (int j = static_cast<int>(v) * rpn; j < k; ++j)
          if (!(r >> j & 1) && interchangeable(j, k)) return false;
      }
      if ((node & used_) == 0) {  // a wholly unused node
        const unsigned take = r & node;
        if (take == 0) {
          gap = true;
          continue;
        }
        if (gap) return false;
        const int c = std::popcount(take);
        if (last_fresh_count >= 0 && c > last_fresh_count) return false;
        last_fresh_count = c;
      }
    }
    return true;
  }

  // No completion of the current order, with the sequences `left` still to place, beats this. pp = 1: the groups
  // still to come start no earlier than the last one S (the order is by start time), so their work fits in
  // [max(free_r, S), end] on each rank r. pp > 1: a rank's list of m microbatches, S seconds in all, ends no
  // earlier than G(S - m c) (one_f_one_b_work_floor: more microbatches add at least c each).
  double bound_after(unsigned left) const {
    double top = max_t_, sum = 0.0;
    double rest = 0.0, hardest = 0.0;
    for (int i = 0; i < n_; ++i)
      if (left >> i & 1) rest += work_[1u << i], hardest = std::max(hardest, single_[static_cast<std::size_t>(i)]);
    if (pp_ > 1) {
      const double c = cost_.group_overhead;
      for (std::size_t k = 0; k < load_.size(); ++k) {
        sum += load_[k];
        if (count_[k] > 0) top = std::max(top, one_f_one_b_work_floor(std::max(0.0, load_[k] - count_[k] * c), c, pp_));
      }
      return std::max({top, hardest, (sum + rest) / (static_cast<double>(P_) * pp_)});
    }
    const double from = order_.back().start;
    for (double x : load_) top = std::max(top, x), sum += std::max(x, from);
    return std::max({top, from + hardest, (sum + rest) / P_});
  }

  // Whether a group (first sequence `first`, ranks r, starting at `start` for pp = 1) may follow the current order.
  // pp = 1: every schedule can be listed by (start, first sequence), so only that order is kept. pp > 1: a group on
  // ranks disjoint from the previous one's commutes with it, so only the lower first sequence goes first.
  bool in_order(int first, unsigned r, double start) const {
    if (order_.empty()) return true;
    const Placed& prev = order_.back();
    const int prev_first = std::countr_zero(prev.seqs);
    if (pp_ <= 1) return start > prev.start || (start == prev.start && first > prev_first);
    return (prev.ranks & r) != 0 || first > prev_first;
  }

  double start_on(unsigned r) const {
    double start = 0.0;
    for (int k = 0; k < P_; ++k)
      if (r >> k & 1) start = std::max(start, load_[static_cast<std::size_t>(k)]);
    return start;
  }

  void dfs(unsigned left) {
    if (left == 0) return leaf();
    for (unsigned s = left; s != 0 && !stopped_; s = (s - 1) & left) {
      const int first = std::countr_zero(s);
      for (unsigned r = 1; r < (1u << P_) && !stopped_; ++r) {
        const int d = std::popcount(r);
        bool cross = true;
        for (unsigned node : node_mask_) cross = cross && (r & ~node) != 0;
        const double t = time_[index(s, d, cross)];
        if (t == kInf || !in_order(first, r, pp_ <= 1 ? start_on(r) : 0.0) || !canonical(r)) continue;
        if (result_.groups_tried >= limits_.max_groups) {
          stopped_ = true, result_.complete = false;
          return;
        }
        push(s, r, t);
        if (bound_after(left & ~s) < result_.time) dfs(left & ~s);
        pop();
      }
    }
  }

  void push(unsigned s, unsigned r, double t) {
    saved_.push_back({load_, used_, max_t_});
    const double start = start_on(r);
    for (int k = 0; k < P_; ++k)
      if (r >> k & 1) {
        const auto i = static_cast<std::size_t>(k);
        load_[i] = pp_ > 1 ? load_[i] + t : start + t;
        ++count_[i];
        history_[i] |= 1u << order_.size();
      }
    used_ |= r, max_t_ = std::max(max_t_, t);
    order_.push_back({s, r, t, start});
    ++result_.groups_tried;
  }

  void pop() {
    const Placed g = order_.back();
    order_.pop_back();
    for (int k = 0; k < P_; ++k)
      if (g.ranks >> k & 1)
        --count_[static_cast<std::size_t>(k)], history_[static_cast<std::size_t>(k)] &= ~(1u << order_.size());
    load_ = std::move(saved_.back().load), used_ = saved_.back().used, max_t_ = saved_.back().max_t;
    saved_.pop_back();
  }

  bool counts_ok() const {
    for (int c : count_) {
      if (options_.count_policy == CountPolicy::Equal && c != count_.front()) return false;
      if (options_.vpp > 1 && c % pp_ != 0) return false;
    }
    return true;
  }

  // The slowest rank's own 1F1B list without ring synchronisation (one_f_one_b_makespan): the simulator, where
  // groups also wait for their partners, is never faster.
  double pipelines_floor() const {
    double out = 0.0;
    std::vector<double> times;
    for (int k = 0; k < P_; ++k) {
      times.clear();
      for (const Placed& g : order_)
        if (g.ranks >> k & 1) times.push_back(g.t);
      if (!times.empty()) out = std::max(out, one_f_one_b_makespan(times, pp_));
    }
    return out;
  }

  // The plan of the current order, laid out as early as each rank allows.
  Plan to_plan() const {
    Plan p;
    p.strategy = "exhaustive";
    p.num_ranks = P_;
    std::vector<int> last(static_cast<std::size_t>(P_), -1);
    for (const Placed& g : order_) {
      Group grp;
      for (int k = 0; k < P_; ++k)
        if (g.ranks >> k & 1) grp.ranks.push_back(k);
      for (int i = 0; i < n_; ++i)
        if (g.seqs >> i & 1) grp.sequences.push_back(i);
      int slot = 0;
      for (int k : grp.ranks) slot = std::max(slot, last[static_cast<std::size_t>(k)] + 1);
      for (int k : grp.ranks) last[static_cast<std::size_t>(k)] = slot;
      if (p.microbatches.size() <= static_cast<std::size_t>(slot))
        p.microbatches.resize(static_cast<std::size_t>(slot) + 1);
      p.microbatches[static_cast<std::size_t>(slot)].push_back(std::move(grp));
    }
    return p;
  }

  void leaf() {
    if (!counts_ok()) return;
    if (++result_.leaves > limits_.max_leaves) {
      stopped_ = true, result_.complete = false;
      return;
    }
    if (pp_ <= 1) {  // the timeline is exact: score only what improves on it
      double m = 0.0;
      for (double x : load_) m = std::max(m, x);
      if (m >= result_.time) return;
    } else if (pipelines_floor() >= result_.time) {
      return;  // no rank's own 1F1B list (without waiting for its ring partners) finishes in time
    }
    Plan p = to_plan();
    const double t = score(p, batch_, cluster_, cost_, options_);
    if (t < result_.time) result_.time = t, result_.best = std::move(p);
  }

  struct Saved {
    std::vector<double> load;
    unsigned used;
    double max_t;
  };

  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  const PlanOptions& options_;
  ExhaustiveLimits limits_;
  int P_, n_, pp_;
  std::vector<double> time_, work_, single_;
  std::vector<unsigned> node_mask_;
  std::vector<double> load_;  // pp = 1: each rank's finish time; pp > 1: its summed group times
  std::vector<int> count_;
  std::vector<unsigned> history_;  // per rank: bit g set when it runs the g-th group of the order
  std::vector<Placed> order_;
  std::vector<Saved> saved_;
  unsigned used_ = 0;
  double max_t_ = 0.0;
  bool stopped_ = false;
  ExhaustiveResult result_;
};

}  // namespace

ExhaustiveResult exhaustive_optimum(const Batch& batch, const Cluster& cluster, const CostModel& cost,
                                    const PlanOptions& options, const ExhaustiveLimits& limits) {
  if (cluster.num_ranks > 16 || batch.size() > 16 || batch.size() == 0)
    invalid("exhaustive_optimum: tiny instances only (1-16 sequences, at most 16 ranks), got ", batch.size(),
            " sequences on ", cluster.num_ranks, " ranks");
  return Search(batch, cluster, cost, options, limits).run();
}

}  // namespace dynacp::solve
