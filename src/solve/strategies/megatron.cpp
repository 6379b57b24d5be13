// `megatron`: our re-implementation of Megatron-Core's packing-aware dynamic-CP scheduler
// (`next_hdp_group_packing_aware`, PR #5154), from its description in docs/strategies.md:
//   - CP degrees are powers of two, cp_min(s) = 2^ceil(log2(s / capacity)) (the full pool when P is not a power
//     of two and nothing smaller fits);
//   - one call builds one microbatch spanning all P ranks out of aligned contiguous groups;
//   - the tallest remaining sequence opens the first group; every other sequence is tried once, over
//     cp in {cp_min, 2 cp_min, ...}: "add" to an existing group of that size with token room, or "new" group;
//     options are scored by the projected global max of sum s^2/cp per rank and must stay under
//     1.05 * tall * capacity; ties favour smaller cp and "add"; sequences with no option wait for the next call;
//   - empty ranks are filled by doubling the smallest group; when that cannot fill the pool (P not a power of
//     two), the microbatch falls back to one group of all P ranks;
//   - every rank runs every microbatch (equal counts);
//   - with vpp > 1 the count is brought to a multiple of pp (Megatron's microbatch group size per virtual stage) as
//     its `align_sample_id_groups` does: microbatches from the last one backwards are split at the group boundary
//     nearest the middle of the pool, and each half fills the pool again by doubling its leftmost smallest group.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/packing.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp::solve {
namespace {

struct MGroup {
  int size;
  std::vector<std::int64_t> ids;
  std::int64_t tokens = 0;  // total tokens
  std::int64_t rows = 0;    // padded rows per rank at `size` (Cluster::padded_rows); stale after a doubling
  double sq = 0.0;          // sum s^2
  double cost() const { return sq / size; }
};

int pow2_at_least(std::int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Doubles the first of the smallest groups until the groups cover all P ranks: Megatron's fill of empty ranks, and
// after a split its fill-by-expanding-CP (there the groups are in layout order, so the first of the smallest is the
// leftmost). False when a doubling would overrun the pool (P not a power of two).
bool fill_by_doubling(std::vector<MGroup>& groups, int P) {
  int used = 0;
  for (const auto& g : groups) used += g.size;
  while (used < P) {
    if (groups.empty()) return false;
    std::size_t small = 0;
    for (std::size_t gi = 1; gi < groups.size(); ++gi)
      if (groups[gi].size < groups[small].size) small = gi;
    if (used + groups[small].size > P) return false;
    used += groups[small].size;
    groups[small].size *= 2;
  }
  return true;
}

// One microbatch from groups in layout order: contiguous ranks from rank 0, sequence ids sorted, empty groups left
// out (their ranks stay unused).
std::vector<Group> lay_out(std::vector<MGroup> groups) {
  std::vector<Group> slot;
  int first = 0;
  for (auto& g : groups) {
    Group out;
    for (int r = 0; r < g.size; ++r) out.ranks.push_back(first + r);
    first += g.size;
    out.sequences = std::move(g.ids);
    std::sort(out.sequences.begin(), out.sequences.end());
    if (!out.sequences.empty()) slot.push_back(std::move(out));
  }
  return slot;
}

// Split one microbatch into two that each cover the pool: the groups left of the first boundary at or past P / 2,
// and the rest. Empty when it has one group or a half cannot refill the pool.
std::vector<std::vector<Group>> split_microbatch(const std::vector<Group>& slot, int P) {
  if (slot.size() < 2) return {};
  std::vector<MGroup> left, right;
  int covered = 0;
  for (const auto& g : slot) {
    (covered < P / 2 ? left : right).push_back({static_cast<int>(g.ranks.size()), g.sequences, 0, 0, 0.0});
    covered += static_cast<int>(g.ranks.size());
  }
  if (right.empty() || !fill_by_doubling(left, P) || !fill_by_doubling(right, P)) return {};
  return {lay_out(std::move(right)), lay_out(std::move(left))};
}

// One option for a sequence in the microbatch being filled: add it to a group (kind 0), open a new group (1), or
// none (-1).
struct Option {
  int kind = -1;
  std::size_t group = 0;
  int cp = 0;
  double score = 0.0;
};

// The groups of one microbatch while it fills (Megatron-Core's per-call state): the option a sequence would take and
// its placement.
struct MicrobatchFill {
  /// `tall` and `shortest`: the longest and shortest remaining sequence (tokens).
  MicrobatchFill(const Cluster& cluster, const CostModel& cost, std::int64_t tall, std::int64_t shortest)
      : cluster_(cluster),
        cost_(cost),
        P_(cluster.num_ranks),
        cap_(cost.token_capacity(cluster)),
        shortest_(shortest),
        cost_cap_(static_cast<double>(tall) * static_cast<double>(cap_) * 1.05),
        by_size_(static_cast<std::size_t>(P_) + 1) {}

  std::int64_t rows(std::int64_t s, int cp) const { return cluster_.padded_rows(s, cp); }
  int cp_min(std::int64_t s) const {
    const int c = pow2_at_least(cost_.min_degree(s, cluster_));
    return c <= P_ ? c : P_;
  }

  /// The best option for a sequence of `s` tokens (the microbatch's first, `first`, takes its minimum degree even
  /// over the cost cap): options are scored by the projected global max of sum s^2 / cp and must stay under 1.05 x
  /// tall x capacity; ties favour smaller cp and "add".
  Option option(std::int64_t s, bool first) const {
    const double s2 = static_cast<double>(s) * static_cast<double>(s);
    Option best;
    for (int cp = cp_min(s); cp <= P_; cp = (cp == P_ ? P_ + 1 : std::min(cp * 2, P_))) {
      if (!first) {
        // the score grows with the group's sum s^2, so the first group with token room is the best "add"
        for (const auto& [sq, gi] : by_size_[static_cast<std::size_t>(cp)]) {
          const MGroup& g = groups[gi];
          if (g.rows + rows(s, cp) > cap_) continue;
          const double score = std::max(global_max_, (g.sq + s2) / cp);
          if (score <= cost_cap_ && (best.kind < 0 || score < best.score)) best = {0, gi, cp, score};
          break;
        }
      }
      if (used_ + cp <= P_ && rows(s, cp) <= cap_) {
        const double score = std::max(global_max_, s2 / cp);
        if ((score <= cost_cap_ || first) && (best.kind < 0 || score < best.score)) best = {1, 0, cp, score};
      }
      if (first && best.kind >= 0) break;  // the tallest takes its minimum degree
      if (cp == P_) break;
    }
    return best;
  }

  /// Places sequence `id` of `s` tokens as `opt` says (opt.kind >= 0).
  void apply(const Option& opt, std::int64_t id, std::int64_t s) {
    std::size_t gi = opt.group;
    auto& set = by_size_[static_cast<std::size_t>(opt.cp)];
    if (opt.kind == 0) {
      set.erase({groups[gi].sq, gi});
    } else {
      groups.push_back({opt.cp, {}, 0, 0, 0.0});
      used_ += opt.cp;
      gi = groups.size() - 1;
    }
    MGroup& g = groups[gi];
    g.ids.push_back(id);
    g.tokens += s;
    g.rows += rows(s, g.size);
    g.sq += static_cast<double>(s) * static_cast<double>(s);
    global_max_ = std::max(global_max_, g.cost());
    // a group that cannot take even the shortest remaining sequence leaves the "add" candidates
    if (cap_ - g.rows >= rows(shortest_, g.size)) set.insert({g.sq, gi});
  }

  std::vector<MGroup> groups;

 private:
  const Cluster& cluster_;
  const CostModel& cost_;
  int P_;
  std::int64_t cap_, shortest_;
  double cost_cap_;
  int used_ = 0;
  double global_max_ = 0.0;
  // groups of each CP size, by their sum s^2 (the least loaded first; ties by creation order)
  std::vector<std::set<std::pair<double, std::size_t>>> by_size_;
};

using Waiting = std::pair<std::int64_t, std::int64_t>;  // (length, id)

// The sequences waiting for a microbatch, tallest first (a stable sort by length: ties in id order, or in the order
// they came back after a fallback): a sorted array whose entries are taken in place, with links to the next and the
// previous waiting entry (path halving). A microbatch then costs what it places and searches, not a pass over (and a
// copy of) everything still waiting.
class WaitingList {
 public:
  explicit WaitingList(std::vector<Waiting> items) { reset(std::move(items)); }
  bool empty() const { return count_ == 0; }
  std::size_t size() const { return items_.size(); }  // entries, taken ones included
  std::int64_t length(std::size_t i) const { return items_[i].first; }
  std::int64_t id(std::size_t i) const { return items_[i].second; }
  /// The first waiting entry at or after `i` (size() when none).
  std::size_t next(std::size_t i) {
    while (next_[i] != i) next_[i] = next_[next_[i]], i = next_[i];
    return i;
  }
  std::size_t first() { return next(0); }
  /// The last waiting entry (call only when not empty).
  std::size_t last() {
    std::size_t i = items_.size();  // prev_ is shifted by one: prev_[i + 1] is entry i, prev_[0] none
    while (prev_[i] != i) prev_[i] = prev_[prev_[i]], i = prev_[i];
    return i - 1;
  }
  void take(std::size_t i) { next_[i] = i + 1, prev_[i + 1] = i, --count_; }
  /// Appends `back` after what still waits and sorts again.
  void requeue(const std::vector<Waiting>& back) {
    std::vector<Waiting> items;
    for (std::size_t i = first(); i < size(); i = next(i + 1)) items.push_back(items_[i]);
    items.insert(items.end(), back.begin(), back.end());
    reset(std::move(items));
  }

 private:
  void reset(std::vector<Waiting> items) {
    std::stable_sort(items.begin(), items.end(), [](const Waiting& a, const Waiting& b) { return a.first > b.first; });
    items_ = std::move(items);
    count_ = items_.size();
    next_.resize(items_.size() + 1), prev_.resize(items_.size() + 1);
    std::iota(next_.begin(), next_.end(), std::size_t{0});
    std::iota(prev_.begin(), prev_.end(), std::size_t{0});
  }
  std::vector<Waiting> items_;
  std::vector<std::size_t> next_, prev_;
  std::size_t count_ = 0;
};

}  // namespace

Plan megatron(const Batch& batch, const Cluster& cluster, const CostModel& cost, const PlanOptions& options) {
  const int P = cluster.num_ranks;
  const std::int64_t cap = cost.token_capacity(cluster);
  auto len = [&](std::int64_t id) { return batch.lengths[static_cast<std::size_t>(id)]; };
  std::vector<Waiting> all_ids;
  all_ids.reserve(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) all_ids.push_back({batch.lengths[i], static_cast<std::int64_t>(i)});
  WaitingList waiting(std::move(all_ids));
  Plan plan;
  while (!waiting.empty()) {
    MicrobatchFill fill(cluster, cost, waiting.length(waiting.first()), waiting.length(waiting.last()));
    // Every waiting sequence is tried once, tallest first. Whether one has an option is monotone in its length (a
    // shorter one fits wherever a taller one does: fewer padded rows, a smaller s^2, more CP sizes), and the state
    // changes only when one is placed, so after a sequence without an option a binary search finds the next one with
    // an option, and the ones between wait for the next call untouched: the same microbatch in O(placed log n)
    // steps instead of one per waiting sequence. (The search runs over every entry of the sorted list, placed ones
    // included: their lengths keep the order, and the first waiting entry from its answer on is the one sought.)
    bool first = true;
    for (std::size_t k = waiting.first(); k < waiting.size(); k = waiting.next(k + 1), first = false) {
      if (const Option opt = fill.option(waiting.length(k), first); opt.kind >= 0) {
        fill.apply(opt, waiting.id(k), waiting.length(k));
        waiting.take(k);
        continue;
      }
      std::size_t lo = k + 1, hi = waiting.size();
      while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (fill.option(waiting.length(mid), false).kind >= 0)
          hi = mid;
        else
          lo = mid + 1;
      }
      k = lo - 1;
    }
    std::vector<MGroup> groups = std::move(fill.groups);
    auto add_to = [&](MGroup& g, std::int64_t id) {
      g.ids.push_back(id);
      g.tokens += len(id);
      g.rows += cluster.padded_rows(len(id), g.size);
      g.sq += static_cast<double>(len(id)) * static_cast<double>(len(id));
    };
    // Fill empty ranks by doubling the smallest group (first of that size).
    if (!fill_by_doubling(groups, P)) {
      // Fallback: one group of all P ranks holding what fits at CP = P; the rest waits (after what waited, then the
      // list is sorted again).
      std::vector<std::int64_t> all;
      for (const auto& g : groups) all.insert(all.end(), g.ids.begin(), g.ids.end());
      all = longest_first(batch, all);
      groups.assign(1, MGroup{P, {}, 0, 0, 0.0});
      std::vector<Waiting> back;
      for (auto id : all) {
        if (groups[0].rows + cluster.padded_rows(len(id), P) <= cap)
          add_to(groups[0], id);
        else
          back.push_back({len(id), id});
      }
      waiting.requeue(back);
    }
    if (groups.empty() || std::all_of(groups.begin(), groups.end(), [](const MGroup& g) { return g.ids.empty(); }))
      throw Error("megatron: no sequence could be placed in a microbatch (capacity too small for the pool)");
    // Aligned contiguous layout: largest groups first.
    std::stable_sort(groups.begin(), groups.end(), [](const MGroup& a, const MGroup& b) { return a.size > b.size; });
    plan.microbatches.push_back(lay_out(std::move(groups)));
  }
  if (options.vpp > 1 && options.pp > 1) {
    // Interleaved 1F1B runs microbatches in groups of pp per virtual stage: split microbatches, from the last one
    // backwards and each at most once, until the count is a multiple of pp. The right half takes the split one's
    // place and the left half goes to the end.
    const auto n = static_cast<std::ptrdiff_t>(plan.microbatches.size());
    std::ptrdiff_t missing = (options.pp - n % options.pp) % options.pp;
    for (std::ptrdiff_t i = n - 1; missing > 0 && i >= 0; --i) {
      auto halves = split_microbatch(plan.microbatches[static_cast<std::size_t>(i)], P);
      if (halves.empty()) continue;
      plan.microbatches[static_cast<std::size_t>(i)] = std::move(halves[0]);
      plan.microbatches.push_back(std::move(halves[1]));
      --missing;
    }
    if (missing > 0)
      throw Error(detail::cat("megatron: cannot make its ", n, " microbatch(es) a multiple of pp = ", options.pp,
                              " under vpp = ", options.vpp, ": ", missing,
                              " more are needed and no microbatch left to split has two groups (Megatron-Core's "
                              "alignment asserts here too); use vpp = 1 or a larger global batch"));
  }
  return plan;
}

}  // namespace dynacp::solve
