// Karmarkar-Karp / largest differencing (free counts) and its balanced variant BLDM (equal counts) on flat arrays.
// See docs/balancing.md.
#include <algorithm>
#include <cstddef>
#include <queue>

#include "kernels.hpp"

namespace dynacp::solve::balancing {
namespace {

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

}  // namespace

Parts kk_impl(std::span<const double> w, int k, bool equal_count) {
  if (k == 1) return trivial_one_part(w.size());
  KarmarkarKarpEngine engine(w, k);
  return equal_count ? engine.run_equal() : engine.run_free();
}

}  // namespace dynacp::solve::balancing
