// Rank-class order polish of pipelined plans (search/reorder.hpp): one permutation of list places per class of alike
// ranks, the classes' candidates merged back into one global order and scored.
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/search/reorder.hpp"
#include "reorder_common.hpp"

namespace dynacp::solve {
namespace {

using reorder::npos;

// The candidate permutations of one rank class's lists (all `ranks` run lists of one length), fastest first by the
// class's slowest list time, the identity first: every permutation up to 7 microbatches, else a move search from the
// identity; the best few below the identity are kept. list_time(list, perm) is a list's 1F1B time in perm's order.
template <class ListTime>
std::vector<std::vector<std::size_t>> class_candidates(const std::vector<std::size_t>& ranks,
                                                       const std::vector<std::vector<std::size_t>>& lists,
                                                       const std::vector<double>& time, ListTime& list_time) {
  constexpr int kMoves = 200;       // list-time evaluations per class beyond full enumeration
  constexpr std::size_t kKeep = 6;  // candidate permutations per class (by its slowest list), identity aside
  std::vector<std::vector<std::size_t>> out;
  std::vector<std::size_t> reps;  // the class's distinct lists by time: equal ones need one evaluation
  {
    std::map<std::vector<double>, std::size_t> seen;
    for (std::size_t r : ranks) {
      std::vector<double> key;
      for (std::size_t i : lists[r]) key.push_back(time[i]);
      if (seen.emplace(key, r).second) reps.push_back(r);
    }
  }
  const std::size_t n = lists[ranks[0]].size();
  std::vector<std::size_t> perm(n);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  out.push_back(perm);
  if (n < 2) return out;
  // the class's slowest list under q; stops once it reaches `cutoff` (the caller then drops q)
  auto worst = [&](const std::vector<std::size_t>& q, double cutoff) {
    double w = 0.0;
    for (std::size_t k = 0; k < reps.size() && w < cutoff; ++k) w = std::max(w, list_time(lists[reps[k]], q));
    return w;
  };
  const double start = worst(perm, std::numeric_limits<double>::infinity());
  std::vector<std::pair<double, std::vector<std::size_t>>> kept;   // the best kKeep below start, by (time, perm)
  auto offer = [&](double w, const std::vector<std::size_t>& q) {  // after the equal ones: a stable order
    if (w >= start - 1e-12 || (kept.size() == kKeep && w >= kept.back().first)) return;
    const auto at = std::upper_bound(kept.begin(), kept.end(), w, [](double v, const auto& e) { return v < e.first; });
    kept.insert(at, {w, q});
    if (kept.size() > kKeep) kept.pop_back();
  };
  auto bar = [&] { return kept.size() == kKeep ? std::min(kept.back().first, start - 1e-12) : start - 1e-12; };
  if (n <= 7) {
    while (std::next_permutation(perm.begin(), perm.end())) offer(worst(perm, bar()), perm);
  } else {
    std::vector<std::size_t> base = perm;
    double best = start;
    int spent = 0;
    for (bool better = true; better && spent < kMoves;) {
      better = false;
      for (std::size_t a = 0; a < n && !better && spent < kMoves; ++a)
        for (std::size_t b = 0; b < n && !better && spent < kMoves; ++b) {
          if (a == b) continue;
          std::vector<std::size_t> trial = base;
          const std::size_t x = trial[a];
          trial.erase(trial.begin() + static_cast<std::ptrdiff_t>(a));
          trial.insert(trial.begin() + static_cast<std::ptrdiff_t>(b), x);
          ++spent;
          if (const double w = worst(trial, best - 1e-12); w < best - 1e-12)
            best = w, base = std::move(trial), better = true;
        }
    }
    offer(best, base);
  }
  for (auto& [w, q] : kept) out.push_back(std::move(q));
  return out;
}
// Every class's candidate permutations (class_candidates), each class with its own list_time buffers, the classes
// with the longest lists (the most permutations) first on `parallel` (serially without one).
std::vector<std::vector<std::vector<std::size_t>>> all_class_candidates(
    const std::vector<std::vector<std::size_t>>& class_ranks, const std::vector<std::vector<std::size_t>>& lists,
    const std::vector<double>& time, int pp, double backward_ratio, const ParallelFor& parallel) {
  std::vector<std::vector<std::vector<std::size_t>>> cands(class_ranks.size());
  std::vector<std::size_t> longest_first(class_ranks.size());
  std::iota(longest_first.begin(), longest_first.end(), std::size_t{0});
  std::stable_sort(longest_first.begin(), longest_first.end(), [&](std::size_t a, std::size_t b) {
    return lists[class_ranks[a][0]].size() > lists[class_ranks[b][0]].size();
  });
  auto find = [&](std::size_t k) {
    const std::size_t ci = longest_first[k];
    std::vector<double> xs;
    OneFOneBScratch own;
    auto own_time = [&](const std::vector<std::size_t>& list, const std::vector<std::size_t>& perm) {
      xs.clear();
      for (std::size_t j : perm) xs.push_back(time[list[j]]);
      return one_f_one_b_makespan(xs, pp, backward_ratio, own);
    };
    cands[ci] = class_candidates(class_ranks[ci], lists, time, own_time);
  };
  run_tasks(parallel, class_ranks.size(), find);
  return cands;
}

struct Class {
  std::vector<std::size_t> ranks;
  double worst = 0.0;
};

// The classes: ranks whose lists have one length and the same rings of degree >= 3 at the same places, each in rank
// order, slowest list first (stable). list_time(list, perm) is a list's 1F1B time in perm's order.
template <class ListTime>
std::vector<Class> rank_classes(const std::vector<Group>& groups, const std::vector<std::vector<std::size_t>>& lists,
                                ListTime& list_time) {
  std::map<std::vector<std::ptrdiff_t>, std::vector<std::size_t>> by_key;  // (length, rings by place) -> ranks
  for (std::size_t r = 0; r < lists.size(); ++r) {
    std::vector<std::ptrdiff_t> key{static_cast<std::ptrdiff_t>(lists[r].size())};
    for (std::size_t i : lists[r]) key.push_back(groups[i].degree() >= 3 ? static_cast<std::ptrdiff_t>(i) : -1);
    by_key[key].push_back(r);
  }
  std::vector<Class> classes;
  std::vector<std::size_t> identity;
  for (auto& [key, ranks] : by_key) {
    identity.resize(lists[ranks[0]].size());
    std::iota(identity.begin(), identity.end(), std::size_t{0});
    double worst = 0.0;
    for (std::size_t r : ranks) worst = std::max(worst, list_time(lists[r], identity));
    classes.push_back({ranks, worst});
  }
  std::stable_sort(classes.begin(), classes.end(), [](const Class& a, const Class& b) { return a.worst > b.worst; });
  return classes;
}

// One global order from per-rank lists: a group goes once it heads the lists of all its ranks (none on a cycle).
// Empty when the lists order two shared groups both ways.
std::vector<std::size_t> merge_lists(const std::vector<Group>& groups,
                                     const std::vector<std::vector<std::size_t>>& ls) {
  const std::size_t P = ls.size();
  std::vector<std::size_t> at(P, 0), order;
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < P; ++r)
      while (at[r] < ls[r].size()) {
        const std::size_t g = ls[r][at[r]];
        bool heads = true;
        for (int q : groups[g].ranks) {
          const auto Q = static_cast<std::size_t>(q);
          heads = heads && at[Q] < ls[Q].size() && ls[Q][at[Q]] == g;
        }
        if (!heads) break;
        for (int q : groups[g].ranks) ++at[static_cast<std::size_t>(q)];
        order.push_back(g), progress = true;
      }
  }
  if (order.size() != groups.size()) order.clear();
  return order;
}

// The scored search over the classes' candidates (cands[ci][k]: class ci's k-th permutation, the identity first):
// first every class at its best at once (rings shared across classes then move together), then one class at a time
// through its candidates, the moves scored `width` at a time, within kBudget scorings.
class ClassChoice {
 public:
  ClassChoice(Plan& plan, double* t, const std::vector<Group>& groups,
              const std::vector<std::vector<std::size_t>>& lists, const std::vector<Class>& classes,
              const std::vector<std::vector<std::vector<std::size_t>>>& cands, const Batch& batch,
              const Cluster& cluster, const CostModel& cost, const PlanOptions& options, const ParallelFor& parallel)
      : plan_(plan),
        t_(t),
        groups_(groups),
        lists_(lists),
        classes_(classes),
        cands_(cands),
        batch_(batch),
        cluster_(cluster),
        cost_(cost),
        options_(options),
        parallel_(parallel),
        width_(parallel ? reorder::polish_width(options) : 1),
        pick_(classes.size(), 0) {}

  void run() {
    {
      std::vector<std::size_t> all(classes_.size(), 0);
      for (std::size_t ci = 0; ci < classes_.size(); ++ci) all[ci] = cands_[ci].size() > 1 ? 1 : 0;
      Trial x;
      if (all != pick_ &&
          reorder::first_improvement(1, 1, {}, spent_, kBudget, [&](std::size_t) { return eval(all, x); }) == 0)
        keep(x);
    }
    for (bool better = true; better && spent_ < kBudget;) {
      better = false;
      std::size_t from_ci = 0, from_k = 0;  // where the pass goes on after a kept move
      for (;;) {
        std::vector<std::pair<std::size_t, std::size_t>> rest;  // the pass's moves left, under the current pick
        for (std::size_t ci = from_ci; ci < classes_.size(); ++ci)
          for (std::size_t k = ci == from_ci ? from_k : 0; k < cands_[ci].size(); ++k)
            if (k != pick_[ci]) rest.push_back({ci, k});
        std::vector<Trial> trials(rest.size());
        const std::size_t hit =
            reorder::first_improvement(rest.size(), width_, parallel_, spent_, kBudget, [&](std::size_t i) {
              std::vector<std::size_t> choice = pick_;
              choice[rest[i].first] = rest[i].second;
              return eval(choice, trials[i]);
            });
        if (hit == npos) break;
        keep(trials[hit]), better = true, from_ci = rest[hit].first, from_k = rest[hit].second + 1;
      }
    }
  }

 private:
  static constexpr int kBudget = 96;  // scorings
  struct Trial {                      // a scored choice and its plan's slots
    double s = 0.0;
    std::vector<std::size_t> choice;
    std::vector<std::vector<Group>> microbatches;
  };

  // Scores the plan with each class at its candidate choice[ci] into `out` (-1 when the new lists cannot be merged
  // into one order, else 1 when it lowers *t).
  int eval(const std::vector<std::size_t>& choice, Trial& out) const {
    auto next = lists_;
    for (std::size_t ci = 0; ci < classes_.size(); ++ci)
      for (std::size_t r : classes_[ci].ranks) {
        std::vector<std::size_t> moved;
        for (std::size_t k : cands_[ci][choice[ci]]) moved.push_back(lists_[r][k]);
        next[r] = std::move(moved);
      }
    const std::vector<std::size_t> order = merge_lists(groups_, next);
    if (order.empty()) return -1;
    Plan trial;
    trial.strategy = plan_.strategy, trial.num_ranks = plan_.num_ranks,
    trial.microbatches = reorder::lay_out(groups_, order);
    out.s = score(trial, batch_, cluster_, cost_, options_), out.choice = choice;
    out.microbatches = std::move(trial.microbatches);
    return out.s < *t_ - 1e-12 ? 1 : 0;
  }
  void keep(Trial& x) { *t_ = x.s, pick_ = std::move(x.choice), plan_.microbatches = std::move(x.microbatches); }

  Plan& plan_;
  double* t_;
  const std::vector<Group>& groups_;
  const std::vector<std::vector<std::size_t>>& lists_;
  const std::vector<Class>& classes_;
  const std::vector<std::vector<std::vector<std::size_t>>>& cands_;
  const Batch& batch_;
  const Cluster& cluster_;
  const CostModel& cost_;
  const PlanOptions& options_;
  const ParallelFor& parallel_;
  const std::size_t width_;
  std::vector<std::size_t> pick_;
  int spent_ = 0;
};

}  // namespace

Plan reorder_classes(Plan plan, double* t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                     const PlanOptions& options, const ParallelFor& parallel) {
  const std::vector<Group> groups = reorder::flatten(plan);
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  const std::vector<double> time = reorder::group_times(groups, batch, cluster, cost);
  std::vector<std::vector<std::size_t>> lists(P);
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (int r : groups[i].ranks) lists[static_cast<std::size_t>(r)].push_back(i);
  std::vector<double> x;  // list_time's buffers
  OneFOneBScratch scratch;
  auto list_time = [&](const std::vector<std::size_t>& list, const std::vector<std::size_t>& perm) {
    x.clear();
    for (std::size_t k : perm) x.push_back(time[list[k]]);
    return one_f_one_b_makespan(x, options.pp, cost.backward_ratio, scratch);
  };
  const std::vector<Class> classes = rank_classes(groups, lists, list_time);
  // Per class: candidate permutations, fastest first (the class's slowest list time; the first is the identity).
  std::vector<std::vector<std::size_t>> class_ranks;
  for (const Class& c : classes) class_ranks.push_back(c.ranks);
  const auto cands = all_class_candidates(class_ranks, lists, time, options.pp, cost.backward_ratio, parallel);
  ClassChoice(plan, t, groups, lists, classes, cands, batch, cluster, cost, options, parallel).run();
  return plan;
}

}  // namespace dynacp::solve
