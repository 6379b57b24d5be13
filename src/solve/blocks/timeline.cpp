#include "dynacp/solve/blocks/timeline.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {

TimelineBuilder::TimelineBuilder(const Batch& batch, const Cluster& cluster, const CostModel& cost)
    : batch_(batch), cluster_(cluster), cost_(cost), free_(static_cast<std::size_t>(cluster.num_ranks), 0.0) {}

double TimelineBuilder::time_of(const std::vector<int>& ranks, const GroupStats& stats) const {
  return cost_.time(stats, static_cast<int>(ranks.size()), cluster_.crosses_nodes(ranks), cluster_);
}

double TimelineBuilder::add(std::vector<int> ranks, std::vector<std::int64_t> ids) {
  const GroupStats st = group_stats(batch_, cost_, ids);
  double start = 0.0;
  for (int r : ranks) start = std::max(start, free_[static_cast<std::size_t>(r)]);
  const double end = start + time_of(ranks, st);
  for (int r : ranks) free_[static_cast<std::size_t>(r)] = end;
  std::sort(ids.begin(), ids.end());
  groups_.push_back({std::move(ranks), std::move(ids)});
  return end;
}

double TimelineBuilder::makespan() const { return *std::max_element(free_.begin(), free_.end()); }

Plan TimelineBuilder::to_plan() const { return lay_out_groups(groups_); }

Plan lay_out_groups(std::vector<Group> groups) {
  Plan plan;
  int ranks = 0;
  for (const auto& g : groups)
    for (int r : g.ranks) ranks = std::max(ranks, r + 1);
  std::vector<int> next(static_cast<std::size_t>(ranks), 0);
  for (auto& g : groups) {
    int slot = 0;
    for (int r : g.ranks) slot = std::max(slot, next[static_cast<std::size_t>(r)]);
    for (int r : g.ranks) next[static_cast<std::size_t>(r)] = slot + 1;
    if (plan.microbatches.size() <= static_cast<std::size_t>(slot))
      plan.microbatches.resize(static_cast<std::size_t>(slot) + 1);
    plan.microbatches[static_cast<std::size_t>(slot)].push_back(std::move(g));
  }
  return plan;
}

double score(const Plan& plan, const Batch& batch, const Cluster& cluster, const CostModel& cost,
             const PlanOptions& options) {
  return options.score ? options.score(plan) : evaluate(plan, batch, cluster, cost).step_time;
}

std::optional<Plan> best_of(std::vector<Plan> candidates, const Batch& batch, const Cluster& cluster,
                            const CostModel& cost, const PlanOptions& options) {
  std::size_t best = candidates.size();
  double best_t = std::numeric_limits<double>::infinity();
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (const double t = score(candidates[i], batch, cluster, cost, options); t < best_t) best = i, best_t = t;
  if (best == candidates.size()) return std::nullopt;
  return std::move(candidates[best]);
}

namespace {
// A plan's groups, slot by slot: its global order.
std::vector<Group> flatten(const Plan& plan) {
  std::vector<Group> groups;
  for (const auto& slot : plan.microbatches) groups.insert(groups.end(), slot.begin(), slot.end());
  return groups;
}

// A global order of groups laid out again as early as each rank allows: a group's slot is one past its ranks' last.
std::vector<std::vector<Group>> lay_out(const std::vector<Group>& groups, const std::vector<std::size_t>& order) {
  std::vector<Group> in_order;
  in_order.reserve(order.size());
  for (std::size_t i : order) in_order.push_back(groups[i]);
  return lay_out_groups(std::move(in_order)).microbatches;
}

// Each group's time on its ranks.
std::vector<double> group_times(const std::vector<Group>& groups, const Batch& batch, const Cluster& cluster,
                                const CostModel& cost) {
  std::vector<double> time(groups.size());
  for (std::size_t i = 0; i < groups.size(); ++i) time[i] = cost.group_time(groups[i], batch, cluster);
  return time;
}
// How many moves a polish scores at once: the solve's threads.
std::size_t polish_width(const PlanOptions& options) { return static_cast<std::size_t>(options.thread_count()); }

// The first improving move of a sequence, with the moves scored `width` at a time on `parallel`: eval(i) scores move
// i against the current state without changing it (-1: no move after all, not counted; 0: counted, no better; 1:
// counted, better). The moves are then read in order as a loop scoring one at a time would: each counted one spends
// one of `budget`, and the first better one is returned (npos when none, or the budget ran out first). Moves scored
// past it are wasted, at most width - 1 per call.
template <class Eval>
std::size_t first_improvement(std::size_t n, std::size_t width, const ParallelFor& parallel, int& spent, int budget,
                              Eval&& eval) {
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::vector<int> res;
  for (std::size_t lo = 0; lo < n && spent < budget; lo += width) {
    const std::size_t m = std::min(width, n - lo);
    res.assign(m, -1);
    auto one = [&](std::size_t j) { res[j] = eval(lo + j); };
    if (m > 1)
      run_tasks(parallel, m, one);
    else
      one(0);
    for (std::size_t j = 0; j < m; ++j) {
      if (spent >= budget) return npos;
      if (res[j] < 0) continue;
      ++spent;
      if (res[j] > 0) return lo + j;
    }
  }
  return npos;
}

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
}  // namespace

Plan reorder_rings(Plan plan, double t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                   const PlanOptions& options, const ParallelFor& parallel) {
  const std::vector<Group> groups = flatten(plan);
  const std::vector<double> time = group_times(groups, batch, cluster, cost);
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  auto layout = [&](const std::vector<std::size_t>& order) { return lay_out(groups, order); };
  auto rank_lists = [&](const std::vector<std::size_t>& order) {  // each rank's groups, in one pass
    std::vector<std::vector<std::size_t>> out(P);
    for (std::size_t i : order)
      for (int r : groups[i].ranks) out[static_cast<std::size_t>(r)].push_back(i);
    return out;
  };
  std::vector<double> x;  // list_time's buffers
  OneFOneBScratch scratch;
  auto list_time = [&](const std::vector<std::size_t>& list) {
    x.clear();
    for (std::size_t i : list) x.push_back(time[i]);
    return one_f_one_b_makespan(x, options.pp, cost.backward_ratio, scratch);
  };
  std::vector<std::size_t> order(groups.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  constexpr int kBudget = 64;
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  const std::size_t width = parallel ? polish_width(options) : 1;
  int spent = 0;
  bool moved_any = false;
  // A move: group g right before group h (h == npos: right after group `last`).
  struct Move {
    std::size_t g, h, last;
  };
  // Tries the moves in order (scored `width` at a time) and keeps the first that lowers t.
  auto first_better = [&](const std::vector<Move>& moves) {
    std::vector<std::pair<double, std::vector<std::size_t>>> trials(moves.size());
    const std::size_t hit = first_improvement(moves.size(), width, parallel, spent, kBudget, [&](std::size_t i) {
      const auto [g, h, last] = moves[i];
      std::vector<std::size_t> next = order;
      next.erase(std::find(next.begin(), next.end(), g));
      next.insert(h != npos ? std::find(next.begin(), next.end(), h) : std::find(next.begin(), next.end(), last) + 1,
                  g);
      Plan trial;
      trial.strategy = plan.strategy, trial.num_ranks = plan.num_ranks, trial.microbatches = layout(next);
      trials[i] = {score(trial, batch, cluster, cost, options), std::move(next)};
      return trials[i].first < t - 1e-12 ? 1 : 0;
    });
    if (hit == npos) return false;
    t = trials[hit].first, order = std::move(trials[hit].second), moved_any = true;
    return true;
  };
  for (bool better = true; better && spent < kBudget;) {
    const auto lists = rank_lists(order);
    std::size_t crit = 0;
    double worst = -1.0;
    for (std::size_t r = 0; r < P; ++r)
      if (const double m = list_time(lists[r]); m > worst) worst = m, crit = r;
    const std::vector<std::size_t>& list = lists[crit];
    // the critical rank's rings, where the move shortens its list
    std::vector<Move> moves;
    for (std::size_t a = 0; a < list.size(); ++a) {
      if (groups[list[a]].degree() < 2) continue;
      for (std::size_t b = 0; b <= list.size(); ++b) {
        if (b == a || b == a + 1) continue;  // before itself or its successor: no move
        std::vector<std::size_t> moved = list;
        moved.erase(moved.begin() + static_cast<std::ptrdiff_t>(a));
        moved.insert(moved.begin() + static_cast<std::ptrdiff_t>(b > a ? b - 1 : b), list[a]);
        if (list_time(moved) < worst - 1e-12) moves.push_back({list[a], b < list.size() ? list[b] : npos, list.back()});
      }
    }
    if ((better = first_better(moves))) continue;
    // else the rings that share ranks with its rings (what they wait for), past the rings on their own ranks
    std::vector<char> seen(groups.size(), 0);  // crit's own groups, then the rings already taken
    for (std::size_t i : list) seen[i] = 1;
    std::vector<std::size_t> near;
    for (std::size_t i : list)
      if (groups[i].degree() >= 2)
        for (int r : groups[i].ranks)
          for (std::size_t j : lists[static_cast<std::size_t>(r)])
            if (groups[j].degree() >= 2 && !seen[j]) seen[j] = 1, near.push_back(j);
    std::sort(near.begin(), near.end());
    std::stable_sort(near.begin(), near.end(), [&](std::size_t x, std::size_t y) { return time[x] > time[y]; });
    moves.clear();
    for (std::size_t g : near) {
      std::vector<char> on(P, 0);  // g's ranks
      for (int r : groups[g].ranks) on[static_cast<std::size_t>(r)] = 1;
      std::vector<std::size_t> rings;  // the rings on g's ranks, in order
      for (std::size_t i : order)
        if (i != g && groups[i].degree() >= 2 &&
            std::any_of(groups[i].ranks.begin(), groups[i].ranks.end(),
                        [&](int r) { return on[static_cast<std::size_t>(r)] != 0; }))
          rings.push_back(i);
      if (rings.empty()) continue;
      const auto pos_g = std::find(order.begin(), order.end(), g) - order.begin();
      for (std::size_t b = 0; b <= rings.size(); ++b) {
        // skip the position that leaves g where it is among these rings
        const auto before = [&](std::size_t k) {
          return std::find(order.begin(), order.end(), rings[k]) - order.begin() < pos_g;
        };
        if ((b < rings.size() && !before(b) && (b == 0 || before(b - 1))) || (b == rings.size() && before(b - 1)))
          continue;
        moves.push_back({g, b < rings.size() ? rings[b] : npos, rings.back()});
      }
    }
    better = first_better(moves);
  }
  if (moved_any) plan.microbatches = layout(order);
  return plan;
}

Plan reorder_classes(Plan plan, double* t, const Batch& batch, const Cluster& cluster, const CostModel& cost,
                     const PlanOptions& options, const ParallelFor& parallel) {
  const std::vector<Group> groups = flatten(plan);
  const auto P = static_cast<std::size_t>(cluster.num_ranks);
  const std::vector<double> time = group_times(groups, batch, cluster, cost);
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
  // classes: (length, the rings of degree >= 3 by place) -> ranks, in rank order
  std::map<std::vector<std::ptrdiff_t>, std::vector<std::size_t>> by_key;
  for (std::size_t r = 0; r < P; ++r) {
    std::vector<std::ptrdiff_t> key{static_cast<std::ptrdiff_t>(lists[r].size())};
    for (std::size_t i : lists[r]) key.push_back(groups[i].degree() >= 3 ? static_cast<std::ptrdiff_t>(i) : -1);
    by_key[key].push_back(r);
  }
  struct Class {
    std::vector<std::size_t> ranks;
    double worst = 0.0;
  };
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
  // one global order from per-rank lists: a group goes once it heads the lists of all its ranks (none on a cycle)
  auto merge = [&](const std::vector<std::vector<std::size_t>>& ls) {
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
  };
  auto layout = [&](const std::vector<std::size_t>& order) { return lay_out(groups, order); };
  constexpr int kBudget = 96;  // scorings
  // Per class: candidate permutations, fastest first (the class's slowest list time; the first is the identity).
  std::vector<std::vector<std::size_t>> class_ranks;
  for (const Class& c : classes) class_ranks.push_back(c.ranks);
  const auto cands = all_class_candidates(class_ranks, lists, time, options.pp, cost.backward_ratio, parallel);
  // Scores the plan with each class at its candidate choice[ci] into `out` (-1 when the new lists cannot be merged
  // into one order, else 1 when it lowers *t); first every class at its best at once (rings shared across classes
  // then move together), then one class at a time through its candidates, the moves scored `width` at a time.
  struct Trial {  // a scored choice and its plan's slots
    double s = 0.0;
    std::vector<std::size_t> choice;
    std::vector<std::vector<Group>> microbatches;
  };
  std::vector<std::size_t> pick(classes.size(), 0);
  auto eval = [&](const std::vector<std::size_t>& choice, Trial& out) {
    auto next = lists;
    for (std::size_t ci = 0; ci < classes.size(); ++ci)
      for (std::size_t r : classes[ci].ranks) {
        std::vector<std::size_t> moved;
        for (std::size_t k : cands[ci][choice[ci]]) moved.push_back(lists[r][k]);
        next[r] = std::move(moved);
      }
    const std::vector<std::size_t> order = merge(next);
    if (order.empty()) return -1;
    Plan trial;
    trial.strategy = plan.strategy, trial.num_ranks = plan.num_ranks, trial.microbatches = layout(order);
    out.s = score(trial, batch, cluster, cost, options), out.choice = choice;
    out.microbatches = std::move(trial.microbatches);
    return out.s < *t - 1e-12 ? 1 : 0;
  };
  auto keep = [&](Trial& x) { *t = x.s, pick = std::move(x.choice), plan.microbatches = std::move(x.microbatches); };
  const std::size_t width = parallel ? polish_width(options) : 1;
  constexpr std::size_t npos = static_cast<std::size_t>(-1);
  int spent = 0;
  {
    std::vector<std::size_t> all(classes.size(), 0);
    for (std::size_t ci = 0; ci < classes.size(); ++ci) all[ci] = cands[ci].size() > 1 ? 1 : 0;
    Trial x;
    if (all != pick && first_improvement(1, 1, {}, spent, kBudget, [&](std::size_t) { return eval(all, x); }) == 0)
      keep(x);
  }
  for (bool better = true; better && spent < kBudget;) {
    better = false;
    std::size_t from_ci = 0, from_k = 0;  // where the pass goes on after a kept move
    for (;;) {
      std::vector<std::pair<std::size_t, std::size_t>> rest;  // the pass's moves left, under the current pick
      for (std::size_t ci = from_ci; ci < classes.size(); ++ci)
        for (std::size_t k = ci == from_ci ? from_k : 0; k < cands[ci].size(); ++k)
          if (k != pick[ci]) rest.push_back({ci, k});
      std::vector<Trial> trials(rest.size());
      const std::size_t hit = first_improvement(rest.size(), width, parallel, spent, kBudget, [&](std::size_t i) {
        std::vector<std::size_t> choice = pick;
        choice[rest[i].first] = rest[i].second;
        return eval(choice, trials[i]);
      });
      if (hit == npos) break;
      keep(trials[hit]), better = true, from_ci = rest[hit].first, from_k = rest[hit].second + 1;
    }
  }
  return plan;
}

}  // namespace dynacp::solve
