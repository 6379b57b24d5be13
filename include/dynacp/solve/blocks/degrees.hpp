// CP-degree allocation: give each group i a degree d_i >= d_min_i with sum d_i <= P, minimising max_i T_i(d_i).
#pragma once
#include <functional>
#include <vector>

namespace dynacp::solve {

struct DegreeProblem {
  int ranks = 0;                                 ///< P
  std::vector<int> min_degree;                   ///< d_min per group
  std::function<double(std::size_t, int)> time;  ///< T(group, d), any function of d
  /// Optional per-group cap: degrees above it are never faster (e.g. past the minimum of T). Empty = no cap.
  /// Keeps the tables at O(sum of useful degrees) instead of O(K * P) on large pools.
  std::vector<int> max_degree;
};

struct DegreeResult {
  std::vector<int> degrees;  ///< per group; canonical: the smallest degrees that reach the optimum
  double makespan = 0.0;     ///< max_i T_i(d_i), the optimum
};

/// FCP's 2D dynamic program: DP[i][j] = min over d of max(DP[i-1][j-d], T_i(d)). O(K * P^2).
DegreeResult allocate_degrees_dp(const DegreeProblem& p);

/// The same optimum by a search over candidate makespans: for a threshold t each group takes the smallest d
/// with T_i(d) <= t; t is feasible iff those degrees sum to <= P. O(K * P + K log P log(K P)).
DegreeResult allocate_degrees_threshold(const DegreeProblem& p);

/// Exact allocation: the DP on small problems, the threshold search on large ones (same optimum and degrees).
DegreeResult allocate_degrees(const DegreeProblem& p);

}  // namespace dynacp::solve
