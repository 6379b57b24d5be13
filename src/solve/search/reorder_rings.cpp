// Ring order polish of pipelined plans (search/reorder.hpp): rings of the slowest rank moved in the global group order.
#include <algorithm>
#include <numeric>
#include <string>

#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/search/reorder.hpp"
#include "reorder_common.hpp"

namespace dynacp::solve {
namespace {

using reorder::npos;

// A move: group g right before group h (h == npos: right after group `last`).
struct Move {
  std::size_t g, h, last;
};

// One polish: the plan's groups in a global order that moves change, scored first improvement within kBudget.
class RingPolish {
 public:
  RingPolish(const Plan& plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
             const PlanOptions& options, const ParallelFor& parallel)
      : strategy_(plan.strategy),
        num_ranks_(plan.num_ranks),
        batch_(batch),
        cluster_(cluster),
        cost_(cost),
        options_(options),
        parallel_(parallel),
        groups_(reorder::flatten(plan)),
        time_(reorder::group_times(groups_, batch, cluster, cost)),
        P_(static_cast<std::size_t>(cluster.num_ranks)),
        width_(parallel ? reorder::polish_width(options) : 1),
        t_(t),
        order_(groups_.size()) {
    std::iota(order_.begin(), order_.end(), std::size_t{0});
  }

  // The moved order laid out anew, or `plan` unchanged when no move lowered the score.
  Plan run(Plan plan) {
    for (bool better = true; better && spent_ < kBudget;) {
      const auto lists = rank_lists();
      std::size_t crit = 0;
      double worst = -1.0;
      for (std::size_t r = 0; r < P_; ++r)
        if (const double m = list_time(lists[r]); m > worst) worst = m, crit = r;
      if ((better = first_better(critical_moves(lists[crit], worst)))) continue;
      better = first_better(neighbour_moves(lists, lists[crit]));
    }
    if (moved_any_) plan.microbatches = reorder::lay_out(groups_, order_);
    return plan;
  }

 private:
  static constexpr int kBudget = 64;

  // Each rank's groups in the current order, in one pass.
  std::vector<std::vector<std::size_t>> rank_lists() const {
    std::vector<std::vector<std::size_t>> out(P_);
    for (std::size_t i : order_)
      for (int r : groups_[i].ranks) out[static_cast<std::size_t>(r)].push_back(i);
    return out;
  }
  // A rank list's 1F1B time.
  double list_time(const std::vector<std::size_t>& list) {
    x_.clear();
    for (std::size_t i : list) x_.push_back(time_[i]);
    return one_f_one_b_makespan(x_, options_.pp, cost_.backward_ratio, scratch_);
  }

  // Tries the moves in order (scored `width` at a time) and keeps the first that lowers t.
  bool first_better(const std::vector<Move>& moves) {
    std::vector<std::pair<double, std::vector<std::size_t>>> trials(moves.size());
    const std::size_t hit =
        reorder::first_improvement(moves.size(), width_, parallel_, spent_, kBudget, [&](std::size_t i) {
          const auto [g, h, last] = moves[i];
          std::vector<std::size_t> next = order_;
          next.erase(std::find(next.begin(), next.end(), g));
          next.insert(
              h != npos ? std::find(next.begin(), next.end(), h) : std::find(next.begin(), next.end(), last) + 1, g);
          Plan trial;
          trial.strategy = strategy_, trial.num_ranks = num_ranks_;
          trial.microbatches = reorder::lay_out(groups_, next);
          trials[i] = {score(trial, batch_, cluster_, cost_, options_), std::move(next)};
          return trials[i].first < t_ - 1e-12 ? 1 : 0;
        });
    if (hit == npos) return false;
    t_ = trials[hit].first, order_ = std::move(trials[hit].second), moved_any_ = true;
    return true;
  }

  // The critical rank's rings (list: its groups, worst: its list time) before another of its groups or after its
  // last, where the move shortens its list.
  std::vector<Move> critical_moves(const std::vector<std::size_t>& list, double worst) {
    std::vector<Move> moves;
    for (std::size_t a = 0; a < list.size(); ++a) {
      if (groups_[list[a]].degree() < 2) continue;
      for (std::size_t b = 0; b <= list.size(); ++b) {
        if (b == a || b == a + 1) continue;  // before itself or its successor: no move
        std::vector<std::size_t> moved = list;
        moved.erase(moved.begin() + static_cast<std::ptrdiff_t>(a));
        moved.insert(moved.begin() + static_cast<std::ptrdiff_t>(b > a ? b - 1 : b), list[a]);
        if (list_time(moved) < worst - 1e-12) moves.push_back({list[a], b < list.size() ? list[b] : npos, list.back()});
      }
    }
    return moves;
  }

  // The rings that share ranks with the critical rank's rings (what they wait for), slowest first, each before
  // another ring on its ranks or after their last (not where it already is among them).
  std::vector<Move> neighbour_moves(const std::vector<std::vector<std::size_t>>& lists,
                                    const std::vector<std::size_t>& list) const {
    std::vector<char> seen(groups_.size(), 0);  // crit's own groups, then the rings already taken
    for (std::size_t i : list) seen[i] = 1;
    std::vector<std::size_t> near;
    for (std::size_t i : list)
      if (groups_[i].degree() >= 2)
        for (int r : groups_[i].ranks)
          for (std::size_t j : lists[static_cast<std::size_t>(r)])
            if (groups_[j].degree() >= 2 && !seen[j]) seen[j] = 1, near.push_back(j);
    std::sort(near.begin(), near.end());
    std::stable_sort(near.begin(), near.end(), [&](std::size_t x, std::size_t y) { return time_[x] > time_[y]; });
    std::vector<Move> moves;
    for (std::size_t g : near) {
      std::vector<char> on(P_, 0);  // g's ranks
      for (int r : groups_[g].ranks) on[static_cast<std::size_t>(r)] = 1;
      std::vector<std::size_t> rings;  // the rings on g's ranks, in order
      for (std::size_t i : order_)
        if (i != g && groups_[i].degree() >= 2 &&
            std::any_of(groups_[i].ranks.begin(), groups_[i].ranks.end(),
                        [&](int r) { return on[static_cast<std::size_t>(r)] != 0; }))
          rings.push_back(i);
      if (rings.empty()) continue;
      const auto pos_g = std::find(order_.begin(), order_.end(), g) - order_.begin();
      for (std::size_t b = 0; b <= rings.size(); ++b) {
        // skip the position that leaves g where it is among these rings
        const auto before = [&](std::size_t k) {
          return std::find(order_.begin(), order_.end(), rings[k]) - order_.begin() < pos_g;
        };
        if ((b < rings.size() && !before(b) && (b == 0 || before(b - 1))) || (b == rings.size() && before(b - 1)))
          continue;
        moves.push_back({g, b < rings.size() ? rings[b] : npos, rings.back()});
      }
    }
    return moves;
  }

  const std::string strategy_;  // the plan's, for the trial plans
  const int num_ranks_;
  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  const PlanOptions& options_;
  const ParallelFor& parallel_;
  const std::vector<Group> groups_;
  const std::vector<double> time_;
  const std::size_t P_, width_;
  double t_;
  std::vector<std::size_t> order_;
  int spent_ = 0;
  bool moved_any_ = false;
  std::vector<double> x_;  // list_time's buffers
  OneFOneBScratch scratch_;
};

}  // namespace

Plan reorder_rings(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options, const ParallelFor& parallel) {
  RingPolish polish(plan, t, batch, cluster, cost, options, parallel);
  return polish.run(std::move(plan));
}

}  // namespace dynacp::solve
