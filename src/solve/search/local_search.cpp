#include "dynacp/solve/search/local_search.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/search/rebalance.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

namespace {

using Groups = std::vector<Group>;  // a plan as one global order of its groups

class Climber {
 public:
  Climber(const Plan& start, const Batch& batch, const Cluster& cluster, const CostModel& cost,
          const PlanOptions& options, const LocalSearchTuning& tuning, std::chrono::steady_clock::time_point deadline)
      : start_(start),
        batch_(batch),
        cluster_(cluster),
        cost_(cost),
        options_(options),
        tuning_(tuning),
        deadline_(deadline),
        P_(cluster.num_ranks),
        cap_(cost.token_capacity(cluster)) {
    for (const auto& slot : start.microbatches) groups_.insert(groups_.end(), slot.begin(), slot.end());
    best_ = score(start, batch, cluster, cost, options);
  }

  // Rounds of first-improvement moves until one finds nothing or a budget runs out, then kicks: the k-th move of a
  // round (k = 0, 1, ...) taken whatever it costs, and the climb again from there; kept when the climb ends below
  // the best plan so far (k starts again at 0), else undone. Whether any move was kept.
  bool run() {
    if (!std::isfinite(best_) || groups_.empty()) return false;
    const double start = best_;
    climb();
    Groups best = groups_;
    double best_t = best_;
    for (int k = 0; k < tuning_.kicks && !out_of_budget(); ++k) {
      kick_ = k, seen_ = 0;
      const bool kicked = round();
      kick_ = -1;
      if (!kicked && seen_ <= k) break;  // a round has fewer than k + 1 moves
      if (!kicked) continue;             // the k-th move gives a plan the evaluator rejects
      climb();
      if (best_ < best_t * (1 - tuning_.min_gain)) {
        best = groups_, best_t = best_, k = -1;
      } else {
        groups_ = best, best_ = best_t;
      }
    }
    groups_ = std::move(best), best_ = best_t;
    return best_ < start;
  }

  void climb() {
    while (!out_of_budget() && round()) {
    }
  }

  Plan plan() const { return to_plan(groups_); }

 private:
  bool out_of_budget() const {
    if (evaluations_ >= tuning_.max_evaluations || work_ >= tuning_.max_work) return true;
    return deadline_ != std::chrono::steady_clock::time_point::max() && std::chrono::steady_clock::now() >= deadline_;
  }

  double group_time(const Group& g) const { return cost_.group_time(g, batch_, cluster_); }

  // Per rank: its finish time on the group timeline (pp = 1) or its summed group time (pp > 1).
  std::vector<double> heat(std::size_t skip = SIZE_MAX) const {
    std::vector<double> h(static_cast<std::size_t>(P_), 0.0);
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (i == skip) continue;
      const Group& g = groups_[i];
      const double t = group_time(g);
      double start = 0.0;
      if (options_.pp <= 1)
        for (int r : g.ranks) start = std::max(start, h[static_cast<std::size_t>(r)]);
      for (int r : g.ranks)
        h[static_cast<std::size_t>(r)] = options_.pp <= 1 ? start + t : h[static_cast<std::size_t>(r)] + t;
    }
    return h;
  }

  bool fits(const Group& g) const {
    return !g.sequences.empty() && !g.ranks.empty() && group_rows(batch_, cluster_, g.sequences, g.degree()) <= cap_;
  }

  bool counts_ok(const Groups& gs) const {
    if (options_.count_policy != CountPolicy::Equal && options_.vpp <= 1) return true;
    std::vector<int> n(static_cast<std::size_t>(P_), 0);
    for (const Group& g : gs)
      for (int r : g.ranks) ++n[static_cast<std::size_t>(r)];
    for (int c : n) {
      if (options_.count_policy == CountPolicy::Equal && c != n.front()) return false;
      if (options_.vpp > 1 && c % options_.pp != 0) return false;
    }
    return true;
  }

  // The global order laid out as early as each rank allows: a group's slot is one past its ranks' last.
  Plan to_plan(const Groups& gs) const {
    Plan p;
    p.version = start_.version, p.strategy = start_.strategy, p.num_ranks = start_.num_ranks;
    std::vector<int> last(static_cast<std::size_t>(P_), -1);
    for (const Group& g : gs) {
      int k = 0;
      for (int r : g.ranks) k = std::max(k, last[static_cast<std::size_t>(r)] + 1);
      for (int r : g.ranks) last[static_cast<std::size_t>(r)] = k;
      if (p.microbatches.size() <= static_cast<std::size_t>(k)) p.microbatches.resize(static_cast<std::size_t>(k) + 1);
      p.microbatches[static_cast<std::size_t>(k)].push_back(g);
    }
    return p;
  }

  // Prices `next` (changed groups already checked with fits) and keeps it when it is better; false when it is not
  // or a budget ran out (then `stop_` ends the round).
  bool attempt(Groups next) {
    if (out_of_budget()) {
      stop_ = true;
      return false;
    }
    if (!counts_ok(next)) return false;
    if (kick_ >= 0 && seen_++ != kick_) return false;  // a kick takes only the kick_-th move
    ++evaluations_;
    work_ += static_cast<std::int64_t>(next.size()) + P_ + static_cast<std::int64_t>(batch_.size());
    const double t = score(to_plan(next), batch_, cluster_, cost_, options_);
    if (kick_ >= 0 ? !std::isfinite(t) : !(t < best_ * (1 - tuning_.min_gain))) return false;
    best_ = t, groups_ = std::move(next);
    return true;
  }

  // One round: the moves of the hot ranks' groups, then (when those find nothing) of every other group.
  bool round() {
    stop_ = false;
    const std::vector<double> h = heat();
    std::vector<int> by_heat(static_cast<std::size_t>(P_));
    std::iota(by_heat.begin(), by_heat.end(), 0);
    std::stable_sort(by_heat.begin(), by_heat.end(),
                     [&](int x, int y) { return h[static_cast<std::size_t>(x)] > h[static_cast<std::size_t>(y)]; });
    cool_.resize(static_cast<std::size_t>(P_));  // coolest first; ties: the lower rank
    std::iota(cool_.begin(), cool_.end(), 0);
    std::stable_sort(cool_.begin(), cool_.end(),
                     [&](int x, int y) { return h[static_cast<std::size_t>(x)] < h[static_cast<std::size_t>(y)]; });
    std::vector<char> hot(static_cast<std::size_t>(P_), 0);
    for (int k = 0; k < std::min(tuning_.hot_ranks, P_); ++k)
      hot[static_cast<std::size_t>(by_heat[static_cast<std::size_t>(k)])] = 1;
    std::vector<std::size_t> first, later;
    for (std::size_t a = 0; a < groups_.size(); ++a) {
      const bool on_hot = std::any_of(groups_[a].ranks.begin(), groups_[a].ranks.end(),
                                      [&](int r) { return hot[static_cast<std::size_t>(r)] != 0; });
      (on_hot ? first : later).push_back(a);
    }
    for (std::size_t a : first) {
      if (moves_of(a)) return true;
      if (stop_) return false;
    }
    if (relabel_moves()) return true;
    for (std::size_t a : later) {
      if (moves_of(a)) return true;
      if (stop_) return false;
    }
    return false;
  }

  // The whole plan with its ranks renamed by `to` (a permutation): every group keeps its sequences and partners,
  // only which rings cross nodes changes.
  bool relabel(const std::vector<int>& to) {
    Groups next = groups_;
    for (Group& g : next) {
      for (int& r : g.ranks) r = to[static_cast<std::size_t>(r)];
      std::sort(g.ranks.begin(), g.ranks.end());
    }
    return attempt(std::move(next));
  }

  // Whole-order moves: the run order reversed, and rotated (its first k groups moved to the end, k = 1 .. G - 1).
  bool order_block_moves() {
    if (groups_.size() < 2 || stop_) return false;
    if (attempt(Groups(groups_.rbegin(), groups_.rend()))) return true;
    for (std::size_t k = 1; k < groups_.size() && !stop_; ++k) {
      Groups next = groups_;
      std::rotate(next.begin(), next.begin() + static_cast<std::ptrdiff_t>(k), next.end());
      if (attempt(std::move(next))) return true;
    }
    return false;
  }

  // Rank renamings that move rings across or into nodes: the striped one (rank r of node k becomes rank k of node
  // r, so that consecutive ranks lie on different nodes), then two ranks of different nodes swapped.
  bool relabel_moves() {
    if (order_block_moves()) return true;
    const int rpn = cluster_.ranks_per_node, nodes = cluster_.num_nodes();
    if (nodes < 2 || stop_) return false;
    std::vector<int> to(static_cast<std::size_t>(P_));
    if (rpn > 1) {
      for (int r = 0; r < P_; ++r) to[static_cast<std::size_t>(r)] = (r % nodes) * rpn + r / nodes;
      if (relabel(to)) return true;
    }
    for (int x = 0; x < P_ && !stop_; ++x)
      for (int y = x + 1; y < P_ && !stop_; ++y) {
        if (cluster_.node_of(x) == cluster_.node_of(y)) continue;
        std::iota(to.begin(), to.end(), 0);
        std::swap(to[static_cast<std::size_t>(x)], to[static_cast<std::size_t>(y)]);
        if (relabel(to)) return true;
      }
    return false;
  }

  bool moves_of(std::size_t a) {
    return sequence_moves(a) || swap_moves(a) || ring_moves(a) || replace_moves(a) || merge_moves(a) ||
           split_moves(a) || order_moves(a);
  }

  // The d coolest ranks without group `skip` (ties: the lower rank, or with spread, the rank earlier in the striped
  // order that alternates nodes), ascending.
  std::vector<int> coolest(int d, std::size_t skip, bool spread) const {
    const std::vector<double> h = heat(skip);
    const int nodes = cluster_.num_nodes(), rpn = cluster_.ranks_per_node;
    auto stripe = [&](int r) { return spread ? (r % rpn) * nodes + r / rpn : r; };
    std::vector<int> ranks(static_cast<std::size_t>(P_));
    std::iota(ranks.begin(), ranks.end(), 0);
    std::stable_sort(ranks.begin(), ranks.end(), [&](int x, int y) {
      const double hx = h[static_cast<std::size_t>(x)], hy = h[static_cast<std::size_t>(y)];
      return hx != hy ? hx < hy : stripe(x) < stripe(y);
    });
    ranks.resize(static_cast<std::size_t>(d));
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }

  // Group a placed anew, last in the run order, on the d coolest ranks of the plan without it (packed or spread
  // over nodes), for every degree d; and each of its sequences (when it has several) taken out into a group of its
  // own placed so.
  bool replace_moves(std::size_t a) {
    auto place = [&](Groups next, std::size_t from, Group g) {
      const std::int64_t tokens = group_stats(batch_, cost_, g.sequences).tokens;
      for (int d = std::max(1, cost_.min_degree(tokens, cluster_)); d <= P_ && !stop_; ++d)
        for (bool spread : {false, true}) {
          if (spread && cluster_.num_nodes() < 2) continue;
          g.ranks = coolest(d, from, spread);
          if (!fits(g)) continue;
          Groups trial = next;
          trial.push_back(g);
          if (attempt(std::move(trial))) return true;
        }
      return false;
    };
    {
      Groups next = groups_;
      next.erase(next.begin() + static_cast<std::ptrdiff_t>(a));
      if (place(std::move(next), a, groups_[a])) return true;
    }
    if (groups_[a].sequences.size() < 2) return false;
    for (std::size_t i = 0; i < groups_[a].sequences.size() && !stop_; ++i) {
      Groups next = groups_;
      const std::int64_t s = next[a].sequences[i];
      next[a].sequences.erase(next[a].sequences.begin() + static_cast<std::ptrdiff_t>(i));
      if (!fits(next[a])) continue;
      if (place(std::move(next), SIZE_MAX, Group{{}, {s}})) return true;
    }
    return false;
  }

  // A sequence of group a to another group (a vanishes when it was its only sequence).
  bool sequence_moves(std::size_t a) {
    for (std::size_t i = 0; i < groups_[a].sequences.size(); ++i)
      for (std::size_t b = 0; b < groups_.size() && !stop_; ++b) {
        if (b == a) continue;
        Groups next = groups_;
        const std::int64_t s = next[a].sequences[i];
        next[a].sequences.erase(next[a].sequences.begin() + static_cast<std::ptrdiff_t>(i));
        next[b].sequences.push_back(s);
        if (!fits(next[b])) continue;
        if (next[a].sequences.empty()) next.erase(next.begin() + static_cast<std::ptrdiff_t>(a));
        if (attempt(std::move(next))) return true;
      }
    return false;
  }

  bool same_kind(std::int64_t x, std::int64_t y) const {
    const auto i = static_cast<std::size_t>(x), j = static_cast<std::size_t>(y);
    return batch_.lengths[i] == batch_.lengths[j] && batch_.mask(i) == batch_.mask(j);
  }

  // A sequence of group a swapped with one of another group.
  bool swap_moves(std::size_t a) {
    for (std::size_t i = 0; i < groups_[a].sequences.size(); ++i)
      for (std::size_t b = 0; b < groups_.size(); ++b) {
        if (b == a) continue;
        for (std::size_t j = 0; j < groups_[b].sequences.size() && !stop_; ++j) {
          if (same_kind(groups_[a].sequences[i], groups_[b].sequences[j])) continue;  // the same plan
          Groups next = groups_;
          std::swap(next[a].sequences[i], next[b].sequences[j]);
          if (fits(next[a]) && fits(next[b]) && attempt(std::move(next))) return true;
        }
      }
    return false;
  }

  // Ring a shrunk by one rank, grown by one of another ring's (which gives it up), or one rank shifted to another
  // (coolest first; across nodes too), or grown by one.
  bool ring_moves(std::size_t a) {
    const std::vector<int>& ranks = groups_[a].ranks;
    auto with = [&](std::vector<int> r) {
      Groups next = groups_;
      std::sort(r.begin(), r.end());
      next[a].ranks = std::move(r);
      return fits(next[a]) && attempt(std::move(next));
    };
    for (std::size_t i = 0; i < ranks.size() && ranks.size() > 1 && !stop_; ++i) {
      std::vector<int> r = ranks;
      r.erase(r.begin() + static_cast<std::ptrdiff_t>(i));
      if (with(std::move(r))) return true;
    }
    for (std::size_t b = 0; b < groups_.size(); ++b) {  // a rank handed over from another ring
      if (b == a || groups_[b].ranks.size() < 2) continue;
      for (std::size_t i = 0; i < groups_[b].ranks.size() && !stop_; ++i) {
        const int r = groups_[b].ranks[i];
        if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) continue;
        Groups next = groups_;
        next[b].ranks.erase(next[b].ranks.begin() + static_cast<std::ptrdiff_t>(i));
        next[a].ranks.push_back(r);
        std::sort(next[a].ranks.begin(), next[a].ranks.end());
        if (fits(next[a]) && fits(next[b]) && attempt(std::move(next))) return true;
      }
    }
    for (int target : cool_) {
      if (std::find(ranks.begin(), ranks.end(), target) != ranks.end()) continue;
      for (std::size_t i = 0; i < ranks.size() && !stop_; ++i) {
        std::vector<int> r = ranks;
        r[i] = target;
        if (with(std::move(r))) return true;
      }
      std::vector<int> r = ranks;
      r.push_back(target);
      if (stop_ || with(std::move(r))) return !stop_;
    }
    return false;
  }

  // Group a merged with another on the union of their ranks, on a's or on the other's, at the earlier place.
  bool merge_moves(std::size_t a) {
    for (std::size_t b = 0; b < groups_.size(); ++b) {
      if (b == a) continue;
      std::vector<std::int64_t> seqs = groups_[a].sequences;
      seqs.insert(seqs.end(), groups_[b].sequences.begin(), groups_[b].sequences.end());
      std::vector<int> both = groups_[a].ranks;
      both.insert(both.end(), groups_[b].ranks.begin(), groups_[b].ranks.end());
      std::sort(both.begin(), both.end());
      both.erase(std::unique(both.begin(), both.end()), both.end());
      for (const std::vector<int>* r : {&both, &groups_[a].ranks, &groups_[b].ranks}) {
        if (stop_) return false;
        Groups next = groups_;
        const std::size_t keep = std::min(a, b), drop = std::max(a, b);
        next[keep] = Group{*r, seqs};
        next.erase(next.begin() + static_cast<std::ptrdiff_t>(drop));
        if (fits(next[keep]) && attempt(std::move(next))) return true;
      }
    }
    return false;
  }

  // Group a's sequences split in two (every split up to split_all_up_to sequences, else one sequence off): one
  // part after the other on a's ranks, or side by side on a's ranks cut in two (in index order, or alternating
  // over nodes).
  bool split_moves(std::size_t a) {
    const Group g = groups_[a];
    const std::size_t k = g.sequences.size();
    if (k < 2) return false;
    // a's ranks in index order, and alternating over their nodes (so that both parts may cross nodes)
    std::vector<int> striped = g.ranks;
    const int rpn = cluster_.ranks_per_node, nodes = cluster_.num_nodes();
    std::stable_sort(striped.begin(), striped.end(),
                     [&](int x, int y) { return (x % rpn) * nodes + x / rpn < (y % rpn) * nodes + y / rpn; });
    const bool spread = striped != g.ranks;
    std::vector<std::uint64_t> parts;  // bit i: sequence i goes to the first part
    if (k <= static_cast<std::size_t>(tuning_.split_all_up_to))
      for (std::uint64_t m = 1; m + 1 < (std::uint64_t{1} << k); ++m) parts.push_back(m);
    else
      for (std::size_t i = 0; i < k; ++i) parts.push_back(std::uint64_t{1} << i);
    for (std::uint64_t m : parts) {
      Group x, y;
      for (std::size_t i = 0; i < k; ++i) (m >> i & 1 ? x : y).sequences.push_back(g.sequences[i]);
      auto place = [&](std::vector<int> rx, std::vector<int> ry) {
        Groups next = groups_;
        std::sort(rx.begin(), rx.end()), std::sort(ry.begin(), ry.end());
        x.ranks = std::move(rx), y.ranks = std::move(ry);
        if (!fits(x) || !fits(y)) return false;
        next[a] = x;
        next.insert(next.begin() + static_cast<std::ptrdiff_t>(a) + 1, y);
        return attempt(std::move(next));
      };
      if (place(g.ranks, g.ranks)) return true;
      for (const std::vector<int>* order : {&g.ranks, static_cast<const std::vector<int>*>(&striped)}) {
        if (order == &striped && !spread) continue;
        for (std::size_t cut = 1; cut < order->size() && !stop_; ++cut)
          if (place({order->begin(), order->begin() + static_cast<std::ptrdiff_t>(cut)},
                    {order->begin() + static_cast<std::ptrdiff_t>(cut), order->end()}))
            return true;
      }
      if (stop_) return false;
    }
    return false;
  }

  // Group a moved in the run order right before another group it shares a rank with, or right after one (other
  // places give the same per-rank lists as one of these).
  bool order_moves(std::size_t a) {
    auto shares = [&](std::size_t b) {
      for (int r : groups_[b].ranks)
        if (std::find(groups_[a].ranks.begin(), groups_[a].ranks.end(), r) != groups_[a].ranks.end()) return true;
      return false;
    };
    for (std::size_t b = 0; b <= groups_.size() && !stop_; ++b) {  // before b (b == size: after everything)
      const bool passes = b < a ? shares(b) : b > a + 1 && shares(b - 1);
      if (!passes) continue;
      Groups next = groups_;
      Group g = std::move(next[a]);
      next.erase(next.begin() + static_cast<std::ptrdiff_t>(a));
      next.insert(next.begin() + static_cast<std::ptrdiff_t>(b > a ? b - 1 : b), std::move(g));
      if (attempt(std::move(next))) return true;
    }
    return false;
  }

  const Plan& start_;
  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  const PlanOptions& options_;
  const LocalSearchTuning& tuning_;
  std::chrono::steady_clock::time_point deadline_;
  int P_;
  std::int64_t cap_;
  Groups groups_;
  std::vector<int> cool_;  // ranks, coolest first (this round)
  double best_ = 0.0;
  int evaluations_ = 0;
  std::int64_t work_ = 0;
  bool stop_ = false;
  int kick_ = -1, seen_ = 0;  // kick_ >= 0: attempt() takes the kick_-th move it sees (seen_ counts them)
};

}  // namespace

Plan local_search(Plan start, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                  const PlanOptions& options, const LocalSearchTuning& tuning,
                  std::chrono::steady_clock::time_point deadline) {
  if (tuning.rebalance_solos) start = rebalance_solos(std::move(start), batch, cluster, cost, options);
  if (static_cast<int>(batch.size()) > tuning.max_sequences || cluster.num_ranks > tuning.max_ranks) return start;
  Climber climber(start, batch, cluster, cost, options, tuning, deadline);
  if (!climber.run()) return start;
  Plan out = climber.plan();
  out.solve_ms = start.solve_ms;
  return out;
}

}  // namespace dynacp::solve
