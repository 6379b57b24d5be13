#include "dynacp/solve/blocks/degrees.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check(const DegreeProblem& p) {
  if (p.ranks <= 0) invalid("degree allocation needs ranks >= 1, got ", p.ranks);
  long long need = 0;
  for (std::size_t i = 0; i < p.min_degree.size(); ++i) {
    if (p.min_degree[i] < 1) invalid("group ", i, " has min degree ", p.min_degree[i], "; it must be >= 1");
    need += p.min_degree[i];
  }
  if (need > p.ranks)
    invalid("the groups need at least ", need, " ranks together but the pool has ", p.ranks,
            "; split the batch into more microbatches");
}

// Extra ranks worth considering for group i: up to its cap, at most the slack.
int useful(const DegreeProblem& p, std::size_t i, int slack) {
  if (p.max_degree.empty()) return slack;
  return std::clamp(p.max_degree[i] - p.min_degree[i], 0, slack);
}

// prefix-min table: best[i][k] = min_{d_min <= d <= d_min + k} T_i(d), k in [0, useful extra ranks]
std::vector<std::vector<double>> prefix_min(const DegreeProblem& p, int slack) {
  std::vector<std::vector<double>> best(p.min_degree.size());
  for (std::size_t i = 0; i < best.size(); ++i) {
    auto& row = best[i];
    row.resize(static_cast<std::size_t>(useful(p, i, slack)) + 1);
    double m = kInf;
    for (std::size_t k = 0; k < row.size(); ++k)
      row[k] = m = std::min(m, p.time(i, p.min_degree[i] + static_cast<int>(k)));
  }
  return best;
}

// Canonical degrees for threshold t: the smallest d per group with prefix-min <= t.
DegreeResult degrees_at(const DegreeProblem& p, const std::vector<std::vector<double>>& best, double t) {
  DegreeResult r;
  r.degrees.resize(best.size());
  for (std::size_t i = 0; i < best.size(); ++i) {
    const auto& row = best[i];
    // row is non-increasing: first index with row[k] <= t
    const auto it = std::partition_point(row.begin(), row.end(), [t](double v) { return v > t; });
    const int k = static_cast<int>(it - row.begin());
    r.degrees[i] = p.min_degree[i] + k;
    r.makespan = std::max(
        r.makespan, row[static_cast<std::size_t>(std::min<std::size_t>(static_cast<std::size_t>(k), row.size() - 1))]);
  }
  return r;
}

int slack_of(const DegreeProblem& p) { return p.ranks - std::accumulate(p.min_degree.begin(), p.min_degree.end(), 0); }

}  // namespace

DegreeResult allocate_degrees_dp(const DegreeProblem& p) {
  check(p);
  const std::size_t K = p.min_degree.size();
  if (K == 0) return {};
  const int slack = slack_of(p);
  // Index ranks as extra ranks beyond the minimum: DP[i][e] = best makespan of groups < i using e extra ranks.
  std::vector<double> prev(static_cast<std::size_t>(slack) + 1, 0.0), cur(prev.size());
  for (std::size_t i = 0; i < K; ++i) {
    std::vector<double> t(static_cast<std::size_t>(slack) + 1);
    const int cap = useful(p, i, slack);  // degrees past the cap are never faster: leave them out
    for (int k = 0; k <= slack; ++k) t[static_cast<std::size_t>(k)] = k <= cap ? p.time(i, p.min_degree[i] + k) : kInf;
    for (int e = 0; e <= slack; ++e) {
      double v = kInf;
      for (int k = 0; k <= e; ++k)
        v = std::min(v, std::max(prev[static_cast<std::size_t>(e - k)], t[static_cast<std::size_t>(k)]));
      cur[static_cast<std::size_t>(e)] = v;
    }
    std::swap(prev, cur);
  }
  const double opt = *std::min_element(prev.begin(), prev.end());
  DegreeResult r = degrees_at(p, prefix_min(p, slack), opt);
  r.makespan = opt;
  return r;
}

DegreeResult allocate_degrees_threshold(const DegreeProblem& p) {
  check(p);
  if (p.min_degree.empty()) return {};
  const int slack = slack_of(p);
  const auto best = prefix_min(p, slack);
  std::vector<double> cand;
  for (const auto& row : best) cand.insert(cand.end(), row.begin(), row.end());
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  auto feasible = [&](double t) {
    long long extra = 0;
    for (const auto& row : best) {
      const auto it = std::partition_point(row.begin(), row.end(), [t](double v) { return v > t; });
      if (it == row.end()) return false;
      extra += it - row.begin();
      if (extra > slack) return false;
    }
    return true;
  };
  // Smallest feasible candidate (the largest candidate is always feasible: every group at its best degree... only
  // if the extras fit; the search below handles that because all-min-degree is feasible at its own makespan).
  const auto it = std::partition_point(cand.begin(), cand.end(), [&](double t) { return !feasible(t); });
  if (it == cand.end()) throw Error("degree allocation found no feasible makespan (non-finite times?)");
  return degrees_at(p, best, *it);
}

DegreeResult allocate_degrees(const DegreeProblem& p) {
  const double slack = p.ranks - std::accumulate(p.min_degree.begin(), p.min_degree.end(), 0.0);
  const double dp_work = static_cast<double>(p.min_degree.size()) * (slack + 1) * (slack + 2) / 2;
  return dp_work <= 2.0e5 ? allocate_degrees_dp(p) : allocate_degrees_threshold(p);
}

}  // namespace dynacp::solve
