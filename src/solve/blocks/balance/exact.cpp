// Exact branch and bound for tiny instances (BalanceMethod::Exact), to measure the heuristics' gaps.
#include <algorithm>

#include "dynacp/model/error.hpp"
#include "kernels.hpp"

namespace dynacp::solve {
namespace balancing {
namespace {

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
}  // namespace balancing

Parts exact_partition(std::span<const double> weights, int k, bool equal_count) {
  balancing::validate(weights, k, equal_count);
  if (weights.size() > kExactMaxItems)
    invalid("balance: method 'exact' supports at most ", kExactMaxItems, " weights, got ", weights.size());
  if (k == 1) return balancing::trivial_one_part(weights.size());
  return balancing::ExactSolver(weights, k, equal_count).solve();
}

}  // namespace dynacp::solve
