// DP balancing: split n non-negative weights into k parts minimising the heaviest part.
//
// Kernels (see docs/balancing.md for algorithms, tie-breaking, complexity and measured numbers):
//   - Karmarkar-Karp / largest differencing (free counts) and its balanced variant BLDM (equal counts), on flat
//     arrays: O(n log n + n log k) typical time, O(n + k) memory (32,768 items into 512 parts in a few ms).
//   - Longest-processing-time greedy, count-capped in equal-count mode.
//   - Exact branch and bound for tiny instances (n <= kExactMaxItems), to measure gaps.
//   - Best: KK and greedy, each improved by pairwise swaps (and single-item moves in free-count mode), keep the
//     better. Never worse than the greedy or KK on any instance. This is the default.
//
// Output contract (all methods): exactly k parts; every index 0..n-1 in exactly one part; indices ascending
// inside a part; parts ordered by their smallest index, empty parts (free counts with n < k only) last. In
// equal-count mode part sizes are floor(n/k) or ceil(n/k) (exactly n mod k parts get the larger size).
// Deterministic: the same weights and arguments always give the same parts, on every platform.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dynacp::solve {

enum class BalanceMethod {
  KarmarkarKarp,  ///< "kk": LDM (free counts) or BLDM (equal counts), nothing else.
  Greedy,         ///< "greedy": LPT, count-capped in equal-count mode.
  Exact,          ///< "exact": optimal max part sum; n <= kExactMaxItems.
  Best,           ///< "best": max(KK, greedy) then pairwise swaps / moves; the default.
};

using Parts = std::vector<std::vector<std::int64_t>>;

/// Largest instance `BalanceMethod::Exact` accepts (its worst case is exponential; intended for n <= 12).
inline constexpr std::size_t kExactMaxItems = 16;

/// "kk", "greedy", "exact", "best". Throws InvalidArgument naming the accepted names otherwise.
BalanceMethod parse_balance_method(std::string_view name);
std::string_view to_string(BalanceMethod method);

/// Splits `weights` into `k` parts. Throws InvalidArgument for k < 1, empty weights, negative / NaN / infinite
/// weights, equal_count with fewer than k items (some part would be empty), and Exact with n > kExactMaxItems.
Parts balance(std::span<const double> weights, int k, bool equal_count = false,
              BalanceMethod method = BalanceMethod::Best);

/// Individual kernels (same validation and output contract as balance()).
Parts karmarkar_karp(std::span<const double> weights, int k, bool equal_count);
Parts greedy_lpt(std::span<const double> weights, int k, bool equal_count);
Parts exact_partition(std::span<const double> weights, int k, bool equal_count);

/// Local search in place: repeatedly take the heaviest part (lowest position on ties) and apply the best swap
/// (equal counts) or swap-or-move (free counts) with the lightest part that has a strictly improving one, until
/// none exists or `max_moves` moves were made. Part sizes are preserved by swaps. Returns the number of moves.
/// `parts` must be a valid partition of 0..n-1 into any number of parts; the output is re-canonicalised.
std::size_t improve_by_swaps(std::span<const double> weights, Parts& parts, bool equal_count, std::size_t max_moves);

/// Sum of weights per part, each summed in ascending index order.
std::vector<double> part_sums(std::span<const double> weights, const Parts& parts);

/// Largest part sum (0 for no parts).
double max_part_sum(std::span<const double> weights, const Parts& parts);

/// A lower bound on the optimal max part sum: max(total/k, largest item, w(k) + w(k+1) when n > k, where w(i)
/// is the i-th largest); in equal-count mode also largest + the floor(n/k) - 1 smallest other items.
double balance_lower_bound(std::span<const double> weights, int k, bool equal_count);

}  // namespace dynacp::solve
