// DP balancing kernels: Karmarkar-Karp (LDM / BLDM) on flat arrays, count-capped LPT, exact branch and bound,
// and the swap/move local search behind BalanceMethod::Best. See docs/balancing.md.
#include "dynacp/solve/blocks/balance.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <queue>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {
namespace {

using Index = std::int32_t;

void validate(std::span<const double> w, int k, bool equal_count) {
  if (k < 1) invalid("balance: k must be >= 1, got ", k);
  if (w.empty()) invalid("balance: weights must not be empty");
  if (w.size() > static_cast<std::size_t>(std::numeric_limits<Index>::max() / 2))
    invalid("balance: weights has ", w.size(), " items, more than supported");
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (std::isnan(w[i])) invalid("balance: weights[", i, "] is NaN");
    if (!std::isfinite(w[i])) invalid("balance: weights[", i, "] is infinite");
    if (w[i] < 0) invalid("balance: weights[", i, "] is negative (", w[i], "); weights must be >= 0");
  }
  if (equal_count && w.size() < static_cast<std::size_t>(k))
    invalid("balance: equal_count needs at least k items so that no part is empty, got ", w.size(),
            " weights for k = ", k);
}

/// Sorts indices inside parts, orders parts by smallest index, empty parts last.
void canonicalize(Parts& parts) {
  for (auto& p : parts) std::sort(p.begin(), p.end());
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) {
    if (a.empty() || b.empty()) return !a.empty() && b.empty();
    return a.front() < b.front();
  });
}

/// Indices sorted by weight descending, ties by index ascending.
std::vector<Index> order_desc(std::span<const double> w) {
  std::vector<std::pair<double, Index>> keyed(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) keyed[i] = {w[i], static_cast<Index>(i)};
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<Index> order(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) order[i] = keyed[i].second;
  return order;
}

// ---------------------------------------------------------------------------------------------------------------
// Karmarkar-Karp on flat arrays.
//
// A partial solution is k "sets", each {sum, head, tail} of a singly linked list of items threaded through the
// shared `next_` array, stored contiguously in a pool slot as a binary min-heap in the "lighter" order, with the
// heaviest sum kept in `top_[slot]`. Merging A (popped first) with B pairs A's i-th heaviest set with B's i-th
// lightest (both sorted, O(k log k)), concatenating item lists in O(1).
//
// Free counts: a singleton solution (w, 0, ..., 0) is never materialised. Singletons are consumed from the
// weight-descending order; only merged solutions live in the pool/heap. A merged solution that still has an
// empty set has spread = its heaviest set >= every remaining singleton, and a singleton loses ties against a
// merged solution, so a new solution is created from two singletons only when no such solution exists: at most
// one live solution has an empty set and every other one holds >= k items. Live slots <= n/k + 2, so memory is
// O(n + k) sums. Merging a singleton into a solution adds it to the lightest set (the heap root) and sifts it
// down: O(log k).
//
// Equal counts (BLDM): pad to a multiple of k with zero-weight dummies, cut the ascending order into blocks of
// k (dummies first, so all in block 0, one per set) and merge blocks; dummies are dropped from the output.
// ---------------------------------------------------------------------------------------------------------------

struct KKSet {
  double sum;
  Index head;  // -1: empty
  Index tail;
};

/// Heaviest first; at equal sums non-empty before empty, then by head item index. A strict total order up to
/// empty sets, which are interchangeable.
struct Heavier {
  bool operator()(const KKSet& a, const KKSet& b) const {
    if (a.sum != b.sum) return a.sum > b.sum;
    if ((a.head < 0) != (b.head < 0)) return a.head >= 0;
    return a.head < b.head;
  }
};
struct Lighter {
  bool operator()(const KKSet& a, const KKSet& b) const { return Heavier{}(b, a); }
};
constexpr Heavier heavier{};
constexpr Lighter lighter{};

/// Restores the min-heap (by `lighter`) below position i.
void sift_down(KKSet* h, std::size_t k, std::size_t i) {
  const KKSet x = h[i];
  for (;;) {
    std::size_t c = 2 * i + 1;
    if (c >= k) break;
    if (c + 1 < k && lighter(h[c + 1], h[c])) ++c;
    if (!lighter(h[c], x)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
}

struct HeapKey {
  double spread;
  double top;
  std::int64_t id;  // creation order
  Index slot;
};

/// Priority: larger spread, then larger heaviest set, then older.
struct HeapLess {
  bool operator()(const HeapKey& a, const HeapKey& b) const {
    if (a.spread != b.spread) return a.spread < b.spread;
    if (a.top != b.top) return a.top < b.top;
    return a.id > b.id;
  }
};

class KarmarkarKarpEngine {
 public:
  KarmarkarKarpEngine(std::span<const double> w, int k) : w_(w), k_(static_cast<std::size_t>(k)) {}

  Parts run_free() {
    const std::size_t n = w_.size();
    next_.assign(n, -1);
    singles_ = order_desc(w_);
    std::size_t solutions = n;
    while (solutions > 1) {
      const Item a = pop();
      const Item b = pop();
      if (a.single && b.single) {
        // Ascending order is a valid min-heap: empties, then b, then a (w[a] >= w[b]; ties: a has the smaller
        // index, so it is the heavier).
        const Index s = alloc();
        KKSet* sets = slot(s);
        for (std::size_t i = 0; i + 2 < k_; ++i) sets[i] = {0.0, -1, -1};
        sets[k_ - 2] = {w_[b.id], b.id, b.id};
        sets[k_ - 1] = {w_[a.id], a.id, a.id};
        top_[static_cast<std::size_t>(s)] = w_[a.id];
        sorted_[static_cast<std::size_t>(s)] = 1;
        push(s);
      } else if (a.single || b.single) {
        const Index s = a.single ? b.id : a.id;
        absorb(s, a.single ? a.id : b.id);
        push(s);
      } else {
        merge(a.id, b.id);
        push(a.id);
      }
      --solutions;
    }
    if (heap_.empty()) {  // n == 1
      Parts parts(k_);
      parts[0].push_back(singles_[0]);
      return parts;
    }
    return collect(heap_.top().slot, n);
  }

  Parts run_equal() {
    const std::size_t n = w_.size();
    const std::size_t blocks = (n + k_ - 1) / k_;
    const std::size_t padded = blocks * k_;
    next_.assign(padded, -1);
    // Ascending: dummies (ids n..padded-1) first, then real items by (weight, index).
    std::vector<Index> asc = order_desc(w_);
    std::reverse(asc.begin(), asc.end());
    // Reversing breaks the index tie order; restore ascending index within equal weights.
    for (std::size_t i = 0; i < asc.size();) {
      std::size_t j = i;
      while (j < asc.size() && w_[asc[j]] == w_[asc[i]]) ++j;
      std::reverse(asc.begin() + static_cast<std::ptrdiff_t>(i), asc.begin() + static_cast<std::ptrdiff_t>(j));
      i = j;
    }
    std::vector<Index> seq;
    seq.reserve(padded);
    for (std::size_t d = n; d < padded; ++d) seq.push_back(static_cast<Index>(d));
    seq.insert(seq.end(), asc.begin(), asc.end());
    auto weight = [&](Index i) { return static_cast<std::size_t>(i) < n ? w_[i] : 0.0; };
    for (std::size_t b = 0; b < blocks; ++b) {
      const Index s = alloc();
      KKSet* sets = slot(s);
      for (std::size_t i = 0; i < k_; ++i) {
        const Index item = seq[b * k_ + i];
        sets[i] = {weight(item), item, item};
      }
      std::sort(sets, sets + k_, lighter);
      top_[static_cast<std::size_t>(s)] = sets[k_ - 1].sum;
      sorted_[static_cast<std::size_t>(s)] = 1;
      push(s);
    }
    while (heap_.size() > 1) {
      const Index a = heap_.top().slot;
      heap_.pop();
      const Index b = heap_.top().slot;
      heap_.pop();
      merge(a, b);
      push(a);
    }
    return collect(heap_.top().slot, n);
  }

 private:
  struct Item {
    bool single;
    Index id;  // item index for a singleton, slot otherwise
  };

  KKSet* slot(Index s) { return pool_.data() + static_cast<std::size_t>(s) * k_; }

  Index alloc() {
    if (!free_.empty()) {
      const Index s = free_.back();
      free_.pop_back();
      return s;
    }
    const auto s = static_cast<Index>(top_.size());
    pool_.resize(pool_.size() + k_);
    top_.push_back(0.0);
    sorted_.push_back(0);
    return s;
  }

  void push(Index s) {
    const double top = top_[static_cast<std::size_t>(s)];
    heap_.push({top - slot(s)[0].sum, top, next_id_++, s});
  }

  /// Free counts: the next solution by (spread desc); a merged solution wins a tie against a singleton.
  Item pop() {
    const bool have_single = next_single_ < singles_.size();
    if (!heap_.empty() && (!have_single || heap_.top().spread >= w_[singles_[next_single_]])) {
      const Index s = heap_.top().slot;
      heap_.pop();
      return {false, s};
    }
    return {true, singles_[next_single_++]};
  }

  static void append(KKSet& dst, const KKSet& src, std::vector<Index>& next) {
    dst.sum += src.sum;
    if (src.head < 0) return;
    if (dst.head < 0) {
      dst.head = src.head;
    } else {
      next[static_cast<std::size_t>(dst.tail)] = src.head;
    }
    dst.tail = src.tail;
  }

  /// Adds singleton `item` to the lightest set of slot `s` (the heap root) and restores the heap.
  void absorb(Index s, Index item) {
    KKSet* sets = slot(s);
    append(sets[0], KKSet{w_[item], item, item}, next_);
    double& top = top_[static_cast<std::size_t>(s)];
    top = std::max(top, sets[0].sum);
    sift_down(sets, k_, 0);
    sorted_[static_cast<std::size_t>(s)] = 0;
  }

  /// Merges slot b into slot a (a popped first) and frees b. The result is left as a min-heap (O(k) build);
  /// only the inputs are sorted, and a slot still sorted from its creation skips its sort.
  void merge(Index a, Index b) {
    KKSet* sa = slot(a);
    KKSet* sb = slot(b);
    if (sorted_[static_cast<std::size_t>(a)]) {
      std::reverse(sa, sa + k_);  // A heaviest first
    } else {
      std::sort(sa, sa + k_, heavier);
    }
    if (!sorted_[static_cast<std::size_t>(b)]) std::sort(sb, sb + k_, lighter);  // B lightest first
    double top = 0;
    for (std::size_t i = 0; i < k_; ++i) {
      append(sa[i], sb[i], next_);
      top = std::max(top, sa[i].sum);
    }
    for (std::size_t i = k_ / 2; i-- > 0;) sift_down(sa, k_, i);
    top_[static_cast<std::size_t>(a)] = top;
    sorted_[static_cast<std::size_t>(a)] = 0;
    free_.push_back(b);
  }

  Parts collect(Index s, std::size_t n) {
    Parts parts(k_);
    const KKSet* sets = slot(s);
    for (std::size_t i = 0; i < k_; ++i)
      for (Index it = sets[i].head; it >= 0; it = next_[static_cast<std::size_t>(it)])
        if (static_cast<std::size_t>(it) < n) parts[i].push_back(it);
    canonicalize(parts);
    return parts;
  }

  std::span<const double> w_;
  std::size_t k_;
  std::vector<KKSet> pool_;
  std::vector<double> top_;
  std::vector<char> sorted_;  // slot holds its sets sorted ascending (not just heap-ordered)
  std::vector<Index> free_;
  std::vector<Index> next_;
  std::vector<Index> singles_;
  std::size_t next_single_ = 0;
  std::priority_queue<HeapKey, std::vector<HeapKey>, HeapLess> heap_;
  std::int64_t next_id_ = 0;
};

Parts trivial_one_part(std::size_t n) {
  Parts parts(1);
  parts[0].resize(n);
  std::iota(parts[0].begin(), parts[0].end(), std::int64_t{0});
  return parts;
}

Parts kk_impl(std::span<const double> w, int k, bool equal_count) {
  if (k == 1) return trivial_one_part(w.size());
  KarmarkarKarpEngine engine(w, k);
  return equal_count ? engine.run_equal() : engine.run_free();
}

// ---------------------------------------------------------------------------------------------------------------
// LPT greedy: items by weight descending (ties by index) into the lightest part (ties: lowest part id) that still
// has count room. Equal counts: q = floor(n/k), r = n mod k; a part may take a (q+1)-th item only while fewer than
// r parts have q+1 items, so the final sizes are exactly r x (q+1) and (k - r) x q.
// ---------------------------------------------------------------------------------------------------------------

Parts greedy_impl(std::span<const double> w, int k, bool equal_count) {
  const std::size_t n = w.size();
  const auto K = static_cast<std::size_t>(k);
  const std::size_t q = n / K;
  const std::size_t r = n % K;
  std::size_t big = 0;
  std::vector<std::size_t> count(K, 0);
  Parts parts(K);
  using Entry = std::pair<double, std::size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;  // lightest, then lowest id
  for (std::size_t p = 0; p < K; ++p) heap.push({0.0, p});
  for (const Index item : order_desc(w)) {
    for (;;) {
      const auto [sum, p] = heap.top();
      heap.pop();
      const std::size_t cap = !equal_count ? n : (big < r ? q + 1 : q);
      if (count[p] >= cap) continue;  // full for good: the cap never grows again
      parts[p].push_back(item);
      if (equal_count && ++count[p] == q + 1) ++big;
      heap.push({sum + w[item], p});
      break;
    }
  }
  canonicalize(parts);
  return parts;
}

// ---------------------------------------------------------------------------------------------------------------
// Local search (BalanceMethod::Best).
// ---------------------------------------------------------------------------------------------------------------

std::size_t improve_impl(std::span<const double> w, Parts& parts, bool equal_count, std::size_t max_moves) {
  const std::size_t k = parts.size();
  if (k < 2) return 0;
  std::vector<double> sums = part_sums(w, parts);
  std::vector<std::size_t> order(k);
  std::vector<std::int64_t> sorted_p;
  std::size_t moves = 0;
  auto by_weight = [&](std::int64_t a, std::int64_t b) { return w[a] != w[b] ? w[a] < w[b] : a < b; };
  while (moves < max_moves) {
    const std::size_t h = static_cast<std::size_t>(std::max_element(sums.begin(), sums.end()) - sums.begin());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return sums[a] < sums[b]; });
    bool moved = false;
    for (const std::size_t p : order) {
      if (p == h) continue;
      const double sh = sums[h], sp = sums[p];
      if (!(sp < sh)) break;
      const double gap = sh - sp;
      // Transfer d from h to p; new pair max = max(sh - d, sp + d) < sh iff 0 < d < gap. Best: d nearest gap/2.
      double best = sh;
      std::ptrdiff_t best_a = -1, best_b = -1;  // positions in parts[h] / sorted_p (-1: move only)
      auto consider = [&](double d, std::ptrdiff_t ia, std::ptrdiff_t ib) {
        if (!(d > 0 && d < gap)) return;
        const double m = std::max(sh - d, sp + d);
        if (m < best) {
          best = m;
          best_a = ia;
          best_b = ib;
        }
      };
      sorted_p = parts[p];
      std::sort(sorted_p.begin(), sorted_p.end(), by_weight);
      const auto& ph = parts[h];
      for (std::size_t ia = 0; ia < ph.size(); ++ia) {
        const double a = w[ph[ia]];
        if (!equal_count) consider(a, static_cast<std::ptrdiff_t>(ia), -1);
        // Swap with b: d = a - b, want b near a - gap/2.
        const double target = a - gap / 2;
        auto it = std::partition_point(sorted_p.begin(), sorted_p.end(), [&](std::int64_t x) { return w[x] < target; });
        const auto pos = it - sorted_p.begin();
        for (std::ptrdiff_t ib = pos - 1; ib <= pos; ++ib)
          if (ib >= 0 && ib < static_cast<std::ptrdiff_t>(sorted_p.size()))
            consider(a - w[sorted_p[static_cast<std::size_t>(ib)]], static_cast<std::ptrdiff_t>(ia), ib);
      }
      if (best_a < 0) continue;
      auto& hp = parts[h];
      const std::int64_t ia_item = hp[static_cast<std::size_t>(best_a)];
      hp.erase(hp.begin() + best_a);
      parts[p].push_back(ia_item);
      if (best_b >= 0) {
        const std::int64_t ib_item = sorted_p[static_cast<std::size_t>(best_b)];
        auto& pp = parts[p];
        pp.erase(std::find(pp.begin(), pp.end(), ib_item));
        hp.push_back(ib_item);
      }
      // Recompute the two sums exactly rather than incrementally (no drift).
      double s1 = 0, s2 = 0;
      for (auto i : hp) s1 += w[i];
      for (auto i : parts[p]) s2 += w[i];
      sums[h] = s1;
      sums[p] = s2;
      moved = true;
      break;
    }
    if (!moved) break;
    ++moves;
  }
  canonicalize(parts);
  return moves;
}

/// Part sums sorted descending: the comparison key of candidate solutions (lexicographically smaller is better).
std::vector<double> score(std::span<const double> w, const Parts& parts) {
  auto s = part_sums(w, parts);
  std::sort(s.begin(), s.end(), std::greater<>());
  return s;
}

Parts best_impl(std::span<const double> w, int k, bool equal_count) {
  std::vector<Parts> cand;
  cand.push_back(greedy_impl(w, k, equal_count));
  cand.push_back(kk_impl(w, k, equal_count));
  const std::size_t max_moves = 4 * w.size() + 64;
  for (std::size_t i = 0; i < 2; ++i) {
    Parts improved = cand[i];
    improve_impl(w, improved, equal_count, max_moves);
    cand.push_back(std::move(improved));
  }
  // Candidate order breaks exact ties: improved greedy, improved KK, greedy, KK.
  const std::size_t pref[] = {2, 3, 0, 1};
  std::size_t best = pref[0];
  auto best_score = score(w, cand[best]);
  for (std::size_t j = 1; j < 4; ++j) {
    auto s = score(w, cand[pref[j]]);
    if (s < best_score) {
      best_score = std::move(s);
      best = pref[j];
    }
  }
  return std::move(cand[best]);
}

// ---------------------------------------------------------------------------------------------------------------
// Exact branch and bound on the max part sum. Items in weight-descending order; a part is tried only if the new
// max stays strictly below the incumbent (initially the Best heuristic); parts with identical (sum, count) are
// interchangeable, so only the first is tried. Stops early when the incumbent meets the lower bound.
// ---------------------------------------------------------------------------------------------------------------

class ExactSolver {
 public:
  ExactSolver(std::span<const double> w, int k, bool equal_count)
      : w_(w), k_(static_cast<std::size_t>(k)), equal_(equal_count), order_(order_desc(w)) {
    const std::size_t n = w.size();
    q_ = n / k_;
    r_ = n % k_;
    sums_.assign(k_, 0.0);
    counts_.assign(k_, 0);
    assign_.assign(n, 0);
    lb_ = balance_lower_bound(w, k, equal_count);
  }

  Parts solve() {
    Parts inc = best_impl(w_, static_cast<int>(k_), equal_);
    best_ = max_part_sum(w_, inc);
    best_assign_.assign(w_.size(), 0);
    for (std::size_t p = 0; p < inc.size(); ++p)
      for (auto i : inc[p]) best_assign_[static_cast<std::size_t>(i)] = p;
    if (best_ > lb_) rec(0, 0.0);
    Parts parts(k_);
    for (std::size_t i = 0; i < w_.size(); ++i) parts[best_assign_[i]].push_back(static_cast<std::int64_t>(i));
    canonicalize(parts);
    return parts;
  }

 private:
  void rec(std::size_t pos, double cur_max) {
    if (pos == order_.size()) {
      // Re-sum in index order so the value matches max_part_sum() exactly.
      std::vector<double> s(k_, 0.0);
      for (std::size_t i = 0; i < w_.size(); ++i) s[assign_[i]] += w_[i];
      const double m = *std::max_element(s.begin(), s.end());
      if (m < best_) {
        best_ = m;
        best_assign_ = assign_;
      }
      return;
    }
    const auto item = static_cast<std::size_t>(order_[pos]);
    const double x = w_[item];
    const std::size_t cap = !equal_ ? order_.size() : (big_ < r_ ? q_ + 1 : q_);
    for (std::size_t p = 0; p < k_; ++p) {
      if (best_ <= lb_) return;
      if (counts_[p] >= cap) continue;
      const double nm = std::max(cur_max, sums_[p] + x);
      if (!(nm < best_)) continue;
      bool dup = false;
      for (std::size_t o = 0; o < p && !dup; ++o) dup = sums_[o] == sums_[p] && counts_[o] == counts_[p];
      if (dup) continue;
      sums_[p] += x;
      const bool to_big = equal_ && ++counts_[p] == q_ + 1;
      if (!equal_) ++counts_[p];
      if (to_big) ++big_;
      assign_[item] = p;
      rec(pos + 1, nm);
      if (to_big) --big_;
      --counts_[p];
      sums_[p] -= x;
    }
  }

  std::span<const double> w_;
  std::size_t k_;
  bool equal_;
  std::vector<Index> order_;
  std::size_t q_ = 0, r_ = 0, big_ = 0;
  std::vector<double> sums_;
  std::vector<std::size_t> counts_;
  std::vector<std::size_t> assign_, best_assign_;
  double lb_ = 0, best_ = 0;
};

}  // namespace

BalanceMethod parse_balance_method(std::string_view name) {
  if (name == "kk") return BalanceMethod::KarmarkarKarp;
  if (name == "greedy") return BalanceMethod::Greedy;
  if (name == "exact") return BalanceMethod::Exact;
  if (name == "best") return BalanceMethod::Best;
  invalid("balance: method must be one of 'kk', 'greedy', 'exact', 'best', got '", name, "'");
}

std::string_view to_string(BalanceMethod method) {
  switch (method) {
    case BalanceMethod::KarmarkarKarp:
      return "kk";
    case BalanceMethod::Greedy:
      return "greedy";
    case BalanceMethod::Exact:
      return "exact";
    case BalanceMethod::Best:
      return "best";
  }
  return "?";
}

Parts karmarkar_karp(std::span<const double> weights, int k, bool equal_count) {
  validate(weights, k, equal_count);
  return kk_impl(weights, k, equal_count);
}

Parts greedy_lpt(std::span<const double> weights, int k, bool equal_count) {
  validate(weights, k, equal_count);
  return greedy_impl(weights, k, equal_count);
}

Parts exact_partition(std::span<const double> weights, int k, bool equal_count) {
  validate(weights, k, equal_count);
  if (weights.size() > kExactMaxItems)
    invalid("balance: method 'exact' supports at most ", kExactMaxItems, " weights, got ", weights.size());
  if (k == 1) return trivial_one_part(weights.size());
  return ExactSolver(weights, k, equal_count).solve();
}

Parts balance(std::span<const double> weights, int k, bool equal_count, BalanceMethod method) {
  switch (method) {
    case BalanceMethod::KarmarkarKarp:
      return karmarkar_karp(weights, k, equal_count);
    case BalanceMethod::Greedy:
      return greedy_lpt(weights, k, equal_count);
    case BalanceMethod::Exact:
      return exact_partition(weights, k, equal_count);
    case BalanceMethod::Best:
      validate(weights, k, equal_count);
      if (k == 1) return trivial_one_part(weights.size());
      return best_impl(weights, k, equal_count);
  }
  invalid("balance: unknown method");
}

std::size_t improve_by_swaps(std::span<const double> weights, Parts& parts, bool equal_count, std::size_t max_moves) {
  const std::size_t n = weights.size();
  std::vector<char> seen(n, 0);
  std::size_t total = 0;
  for (const auto& p : parts)
    for (auto i : p) {
      if (i < 0 || static_cast<std::size_t>(i) >= n) invalid("improve_by_swaps: index ", i, " is out of range");
      if (seen[static_cast<std::size_t>(i)]++) invalid("improve_by_swaps: index ", i, " appears twice");
      ++total;
    }
  if (total != n) invalid("improve_by_swaps: parts cover ", total, " of ", n, " indices");
  return improve_impl(weights, parts, equal_count, max_moves);
}

std::vector<double> part_sums(std::span<const double> weights, const Parts& parts) {
  std::vector<double> s;
  s.reserve(parts.size());
  for (const auto& p : parts) {
    std::vector<std::int64_t> idx(p);
    std::sort(idx.begin(), idx.end());
    double t = 0;
    for (auto i : idx) t += weights[static_cast<std::size_t>(i)];
    s.push_back(t);
  }
  return s;
}

double max_part_sum(std::span<const double> weights, const Parts& parts) {
  double m = 0;
  for (double s : part_sums(weights, parts)) m = std::max(m, s);
  return m;
}

double balance_lower_bound(std::span<const double> weights, int k, bool equal_count) {
  validate(weights, k, equal_count);
  const std::size_t n = weights.size();
  const auto K = static_cast<std::size_t>(k);
  std::vector<double> d(weights.begin(), weights.end());
  std::sort(d.begin(), d.end(), std::greater<>());
  double total = 0;
  for (double x : weights) total += x;
  double lb = std::max(total / k, d[0]);
  if (n > K) lb = std::max(lb, d[K - 1] + d[K]);
  if (equal_count) {
    // The part holding the largest item has at least q = floor(n/k) items.
    const std::size_t q = n / K;
    double s = d[0];
    for (std::size_t j = 0; j + 1 < q; ++j) s += d[n - 1 - j];
    lb = std::max(lb, s);
  }
  return lb;
}

}  // namespace dynacp::solve
