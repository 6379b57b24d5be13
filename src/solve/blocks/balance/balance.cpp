// DP balancing: the input check and canonical form, count-capped LPT, the swap/move local search and
// BalanceMethod::Best (the better of KK and greedy, each improved), and the public entry points. See docs/balancing.md.
#include "dynacp/solve/blocks/balance.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>

#include "dynacp/model/error.hpp"
#include "kernels.hpp"

namespace dynacp::solve {
namespace balancing {

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

void canonicalize(Parts& parts) {
  for (auto& p : parts) std::sort(p.begin(), p.end());
  std::stable_sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) {
    if (a.empty() || b.empty()) return !a.empty() && b.empty();
    return a.front() < b.front();
  });
}

std::vector<Index> order_desc(std::span<const double> w) {
  std::vector<std::pair<double, Index>> keyed(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) keyed[i] = {w[i], static_cast<Index>(i)};
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<Index> order(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) order[i] = keyed[i].second;
  return order;
}

Parts trivial_one_part(std::size_t n) {
  Parts parts(1);
  parts[0].resize(n);
  std::iota(parts[0].begin(), parts[0].end(), std::int64_t{0});
  return parts;
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

namespace {

/// Part sums sorted descending: the comparison key of candidate solutions (lexicographically smaller is better).
std::vector<double> score(std::span<const double> w, const Parts& parts) {
  auto s = part_sums(w, parts);
  std::sort(s.begin(), s.end(), std::greater<>());
  return s;
}

}  // namespace

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

}  // namespace balancing

using balancing::best_impl;
using balancing::greedy_impl;
using balancing::improve_impl;
using balancing::kk_impl;
using balancing::trivial_one_part;
using balancing::validate;

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
