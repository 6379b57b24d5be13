// Internal to the DP balancing kernels (blocks/balance.hpp): the shared input check and canonical form, and each
// kernel without validation (karmarkar_karp.cpp, exact.cpp, balance.cpp).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/solve/blocks/balance.hpp"

namespace dynacp::solve::balancing {

using Index = std::int32_t;

/// Throws InvalidArgument for k < 1, empty weights, too many, negative / NaN / infinite weights, and equal_count with
/// fewer than k items.
void validate(std::span<const double> w, int k, bool equal_count);
/// Sorts indices inside parts, orders parts by smallest index, empty parts last.
void canonicalize(Parts& parts);
/// Indices sorted by weight descending, ties by index ascending.
std::vector<Index> order_desc(std::span<const double> w);
/// Every index in one part.
Parts trivial_one_part(std::size_t n);

/// The kernels on validated input: Karmarkar-Karp (karmarkar_karp.cpp), LPT, the swap/move local search and Best
/// (balance.cpp).
Parts kk_impl(std::span<const double> w, int k, bool equal_count);
Parts greedy_impl(std::span<const double> w, int k, bool equal_count);
std::size_t improve_impl(std::span<const double> w, Parts& parts, bool equal_count, std::size_t max_moves);
Parts best_impl(std::span<const double> w, int k, bool equal_count);

}  // namespace dynacp::solve::balancing
