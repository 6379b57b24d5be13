// DP balancing: hand-checked cases, exact solver vs brute force, heuristics vs exact on tiny instances,
// partition properties, the 64 x 8 equal-count acceptance, and correctness at 32,768 -> 512.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/balance.hpp"

using namespace dynacp;
using namespace dynacp::solve;

namespace {

constexpr BalanceMethod kAll[] = {BalanceMethod::KarmarkarKarp, BalanceMethod::Greedy, BalanceMethod::Best};

/// Checks the output contract; returns "" when it holds.
std::string contract_violation(std::span<const double> w, int k, bool equal, const Parts& parts) {
  const std::size_t n = w.size();
  if (parts.size() != static_cast<std::size_t>(k)) return "wrong number of parts";
  std::vector<int> seen(n, 0);
  for (const auto& p : parts) {
    if (!std::is_sorted(p.begin(), p.end())) return "part not sorted";
    for (auto i : p) {
      if (i < 0 || static_cast<std::size_t>(i) >= n) return "index out of range";
      if (seen[static_cast<std::size_t>(i)]++) return "index repeated";
    }
  }
  if (std::count(seen.begin(), seen.end(), 1) != static_cast<std::ptrdiff_t>(n)) return "index missing";
  for (std::size_t j = 1; j < parts.size(); ++j) {
    const auto &a = parts[j - 1], &b = parts[j];
    if (a.empty() && !b.empty()) return "empty part before a non-empty one";
    if (!a.empty() && !b.empty() && a.front() >= b.front()) return "parts not ordered by smallest index";
  }
  if (equal) {
    const std::size_t q = n / static_cast<std::size_t>(k), r = n % static_cast<std::size_t>(k);
    std::size_t big = 0;
    for (const auto& p : parts) {
      if (p.size() != q && p.size() != q + 1) return "equal-count part has a wrong size";
      big += p.size() == q + 1;
    }
    if (big != r) return "wrong number of larger parts";
  }
  return "";
}

/// Optimal max part sum by enumerating all k^n assignments (respecting counts in equal mode).
double brute_force(const std::vector<double>& w, int k, bool equal) {
  const std::size_t n = w.size();
  const auto K = static_cast<std::size_t>(k);
  std::vector<std::size_t> a(n, 0);
  double best = std::numeric_limits<double>::infinity();
  for (;;) {
    std::vector<double> s(K, 0);
    std::vector<std::size_t> c(K, 0);
    for (std::size_t i = 0; i < n; ++i) s[a[i]] += w[i], ++c[a[i]];
    bool ok = true;
    if (equal) {
      const std::size_t q = n / K;
      for (auto x : c) ok = ok && (x == q || x == q + 1);
    }
    if (ok) best = std::min(best, *std::max_element(s.begin(), s.end()));
    std::size_t i = 0;
    while (i < n && ++a[i] == K) a[i++] = 0;
    if (i == n) break;
  }
  return best;
}

/// Token counts: round(lognormal(log median, sigma)), clipped to [64, 32768] when `clip` (the anchor's setup).
std::vector<double> lognormal(std::size_t n, double median, double sigma, std::uint64_t seed, bool clip = false) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(std::log(median), sigma);
  std::vector<double> w(n);
  for (auto& x : w) {
    x = std::round(d(rng));
    if (clip) x = std::clamp(x, 64.0, 32768.0);
  }
  return w;
}

double mean_load(std::span<const double> w, int k) { return std::accumulate(w.begin(), w.end(), 0.0) / k; }

}  // namespace

TEST(Balance, HandCheckedFreeCounts) {
  // The classic LDM counterexample: KK and LPT give 7/5, the optimum is 6/6.
  const std::vector<double> w{3, 3, 2, 2, 2};
  EXPECT_EQ(karmarkar_karp(w, 2, false), (Parts{{0, 2}, {1, 3, 4}}));
  EXPECT_EQ(greedy_lpt(w, 2, false), (Parts{{0, 2, 4}, {1, 3}}));
  EXPECT_EQ(exact_partition(w, 2, false), (Parts{{0, 1}, {2, 3, 4}}));
  EXPECT_EQ(balance(w, 2), (Parts{{0, 1}, {2, 3, 4}}));  // the swap 3 <-> 2 reaches the optimum
  EXPECT_DOUBLE_EQ(balance_lower_bound(w, 2, false), 6.0);
  // One dominant item: alone in its part.
  const std::vector<double> dom{1, 100, 2, 3};
  for (auto m : kAll) EXPECT_EQ(balance(dom, 2, false, m), (Parts{{0, 2, 3}, {1}})) << to_string(m);
}

TEST(Balance, HandCheckedEqualCounts) {
  const std::vector<double> w{1, 2, 3, 4, 5, 6};
  // BLDM: blocks (1,2) (3,4) (5,6); (6,5)+(3,4) -> (9,9); + (2,1) -> 11/10. LPT-capped gives the same parts.
  EXPECT_EQ(karmarkar_karp(w, 2, true), (Parts{{0, 3, 4}, {1, 2, 5}}));
  EXPECT_EQ(greedy_lpt(w, 2, true), (Parts{{0, 3, 4}, {1, 2, 5}}));
  EXPECT_DOUBLE_EQ(max_part_sum(w, exact_partition(w, 2, true)), 11.0);  // 21 is odd
  // Heavy item plus equal counts: 10 must take two other items, so the best is 10+1+2 = 13 vs 3+4+5.
  const std::vector<double> h{10, 1, 2, 3, 4, 5};
  EXPECT_EQ(exact_partition(h, 2, true), (Parts{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_EQ(balance(h, 2, true), (Parts{{0, 1, 2}, {3, 4, 5}}));
  EXPECT_DOUBLE_EQ(balance_lower_bound(h, 2, true), 13.0);
  // k does not divide n: sizes 3, 2, 2 (never drops an item).
  const std::vector<double> u{5, 5, 5, 5, 5, 5, 5};
  for (auto m : kAll) {
    const auto p = balance(u, 3, true, m);
    EXPECT_EQ(contract_violation(u, 3, true, p), "") << to_string(m);
    EXPECT_DOUBLE_EQ(max_part_sum(u, p), 15.0) << to_string(m);
  }
}

TEST(Balance, EdgeCases) {
  const std::vector<double> one{7};
  for (auto m : {BalanceMethod::KarmarkarKarp, BalanceMethod::Greedy, BalanceMethod::Exact, BalanceMethod::Best}) {
    EXPECT_EQ(balance(one, 1, false, m), (Parts{{0}}));
    EXPECT_EQ(balance(one, 3, false, m), (Parts{{0}, {}, {}})) << to_string(m);  // free counts: empty parts last
    EXPECT_EQ(balance(one, 1, true, m), (Parts{{0}}));
  }
  const std::vector<double> zeros(10, 0.0);
  for (auto m : kAll) {
    for (bool eq : {false, true}) {
      const auto p = balance(zeros, 4, eq, m);
      EXPECT_EQ(contract_violation(zeros, 4, eq, p), "") << to_string(m);
    }
  }
  // k = 1 and k = n.
  const std::vector<double> w{4, 1, 3};
  for (auto m : kAll) {
    EXPECT_EQ(balance(w, 1, false, m), (Parts{{0, 1, 2}}));
    EXPECT_EQ(balance(w, 3, true, m), (Parts{{0}, {1}, {2}}));
    EXPECT_EQ(balance(w, 3, false, m), (Parts{{0}, {1}, {2}}));
  }
}

TEST(Balance, Errors) {
  const std::vector<double> w{1, 2, 3};
  EXPECT_THROW(balance(w, 0), InvalidArgument);
  EXPECT_THROW(balance(std::vector<double>{}, 2), InvalidArgument);
  EXPECT_THROW(balance(std::vector<double>{1, -1}, 2), InvalidArgument);
  EXPECT_THROW(balance(std::vector<double>{1, std::nan("")}, 2), InvalidArgument);
  EXPECT_THROW(balance(std::vector<double>{1, std::numeric_limits<double>::infinity()}, 2), InvalidArgument);
  EXPECT_THROW(balance(w, 4, true), InvalidArgument);  // equal counts would leave a part empty
  EXPECT_THROW(balance(std::vector<double>(17, 1.0), 2, false, BalanceMethod::Exact), InvalidArgument);
  EXPECT_THROW(parse_balance_method("ldm"), InvalidArgument);
  try {
    balance(std::vector<double>{1, 2, -3}, 2);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weights[2]"), std::string::npos) << e.what();
  }
  for (auto name : {"kk", "greedy", "exact", "best"}) EXPECT_EQ(to_string(parse_balance_method(name)), name);
}

TEST(Balance, ExactMatchesBruteForce) {
  std::mt19937_64 rng(7);
  for (int t = 0; t < 300; ++t) {
    const std::size_t n = 1 + rng() % 8;
    const int k = 1 + static_cast<int>(rng() % 4);
    const bool eq = (t % 2) == 1 && n >= static_cast<std::size_t>(k);
    std::vector<double> w(n);
    for (auto& x : w) x = static_cast<double>(rng() % 30);
    const auto p = exact_partition(w, k, eq);
    ASSERT_EQ(contract_violation(w, k, eq, p), "");
    ASSERT_DOUBLE_EQ(max_part_sum(w, p), brute_force(w, k, eq)) << "t=" << t;
  }
}

TEST(Balance, HeuristicsAgainstExactOnTinyInstances) {
  // >= 500 instances per mode; integer weights so sums are exact.
  std::mt19937_64 rng(2024);
  for (bool eq : {false, true}) {
    int instances = 0, best_opt = 0, kk_opt = 0, greedy_opt = 0;
    double worst_best = 1, worst_kk = 1, worst_greedy = 1;
    for (int t = 0; t < 800; ++t) {
      const std::size_t n = 2 + rng() % 11;  // 2..12
      const int k = 2 + static_cast<int>(rng() % std::min<std::size_t>(5, n - 1));
      std::vector<double> w(n);
      const bool heavy = t % 3 == 0;
      std::lognormal_distribution<double> ln(std::log(100.0), 1.0);
      for (auto& x : w) x = heavy ? std::round(ln(rng)) : static_cast<double>(1 + rng() % 50);
      const double opt = max_part_sum(w, exact_partition(w, k, eq));
      const double kk = max_part_sum(w, karmarkar_karp(w, k, eq));
      const double gr = max_part_sum(w, greedy_lpt(w, k, eq));
      const auto pb = balance(w, k, eq);
      ASSERT_EQ(contract_violation(w, k, eq, pb), "");
      const double be = max_part_sum(w, pb);
      ASSERT_GE(kk, opt);
      ASSERT_GE(gr, opt);
      ASSERT_GE(be, opt);
      ASSERT_LE(be, gr) << "best worse than greedy, t=" << t;
      ASSERT_LE(be, kk) << "best worse than kk, t=" << t;
      ASSERT_GE(opt, balance_lower_bound(w, k, eq) - 1e-9);
      if (!eq) ASSERT_LE(gr, (4.0 / 3.0 - 1.0 / (3.0 * k)) * opt + 1e-9);  // Graham's LPT bound
      ++instances;
      best_opt += be == opt;
      kk_opt += kk == opt;
      greedy_opt += gr == opt;
      if (opt > 0) {
        worst_best = std::max(worst_best, be / opt);
        worst_kk = std::max(worst_kk, kk / opt);
        worst_greedy = std::max(worst_greedy, gr / opt);
      }
    }
    std::printf("[tiny %s] %d instances: optimal kk %d greedy %d best %d; worst ratio kk %.4f greedy %.4f best %.4f\n",
                eq ? "equal" : "free", instances, kk_opt, greedy_opt, best_opt, worst_kk, worst_greedy, worst_best);
    EXPECT_GE(best_opt, instances * 8 / 10);  // "best" is optimal on most tiny instances (measured: see docs)
    EXPECT_LE(worst_best, 1.25);              // documented empirical bound on this corpus
  }
}

TEST(Balance, PropertiesOnRandomInstances) {
  std::mt19937_64 rng(11);
  for (int t = 0; t < 60; ++t) {
    const std::size_t n = 1 + rng() % 1500;
    const int k = 1 + static_cast<int>(rng() % 70);
    std::vector<double> w = lognormal(n, 2048, 1.0, rng());
    if (t % 5 == 0)
      for (auto& x : w) x = std::floor(x / 512);  // many ties and zeros
    for (bool eq : {false, true}) {
      if (eq && n < static_cast<std::size_t>(k)) continue;
      for (auto m : kAll) {
        const auto p = balance(w, k, eq, m);
        ASSERT_EQ(contract_violation(w, k, eq, p), "") << to_string(m) << " n=" << n << " k=" << k;
        ASSERT_EQ(balance(w, k, eq, m), p) << "not deterministic";
        ASSERT_GE(max_part_sum(w, p), balance_lower_bound(w, k, eq) * (1 - 1e-12));
      }
      ASSERT_LE(max_part_sum(w, balance(w, k, eq)), max_part_sum(w, greedy_lpt(w, k, eq)));
      ASSERT_LE(max_part_sum(w, balance(w, k, eq)), max_part_sum(w, karmarkar_karp(w, k, eq)));
    }
  }
}

TEST(Balance, ImproveBySwapsKeepsSizesAndNeverWorsens) {
  std::mt19937_64 rng(5);
  const auto w = lognormal(200, 2048, 1.0, 3);
  Parts parts(8);
  for (std::size_t i = 0; i < w.size(); ++i) parts[i % 8].push_back(static_cast<std::int64_t>(i));
  const double before = max_part_sum(w, parts);
  Parts eq = parts;
  improve_by_swaps(w, eq, true, 1000);
  for (const auto& p : eq) EXPECT_EQ(p.size(), 25u);
  EXPECT_LT(max_part_sum(w, eq), before);
  Parts bad{{0, 1}, {1}};
  EXPECT_THROW(improve_by_swaps(w, bad, true, 10), InvalidArgument);
}

TEST(Balance, EqualCount64x8AcceptanceOver50Seeds) {
  // 64 parts x 8 items, lognormal(log 2048, 1), clipped to [64, 32768] (the anchor's setup) and unclipped:
  // "best" is never worse than the count-capped greedy on any seed.
  for (bool clip : {true, false}) {
    double s_kk = 0, s_gr = 0, s_be = 0, s_lb = 0, w_kk = 0, w_gr = 0, w_be = 0;
    int best_better = 0;
    const int seeds = 60;
    for (int seed = 0; seed < seeds; ++seed) {
      const auto w = lognormal(512, 2048, 1.0, 1000 + static_cast<std::uint64_t>(seed), clip);
      const double mean = mean_load(w, 64);
      const double kk = max_part_sum(w, karmarkar_karp(w, 64, true)) / mean;
      const double gr = max_part_sum(w, greedy_lpt(w, 64, true)) / mean;
      const auto pb = balance(w, 64, true);
      ASSERT_EQ(contract_violation(w, 64, true, pb), "");
      const double be = max_part_sum(w, pb) / mean;
      const double lb = balance_lower_bound(w, 64, true) / mean;
      ASSERT_LE(be, gr) << "seed " << seed;
      ASSERT_GE(be, lb * (1 - 1e-12));
      best_better += be < gr;
      s_kk += kk, s_gr += gr, s_be += be, s_lb += lb;
      w_kk = std::max(w_kk, kk), w_gr = std::max(w_gr, gr), w_be = std::max(w_be, be);
    }
    std::printf(
        "[64x8 equal, %s, %d seeds] mean max/mean: kk %.4f greedy %.4f best %.4f LB %.4f; worst kk %.4f "
        "greedy %.4f best %.4f; best < greedy on %d seeds\n",
        clip ? "clipped" : "unclipped", seeds, s_kk / seeds, s_gr / seeds, s_be / seeds, s_lb / seeds, w_kk, w_gr, w_be,
        best_better);
    EXPECT_GT(s_kk, s_gr);  // the known BLDM weakness with few items per part
  }
}

TEST(Balance, FreeCount32768Into512IsCorrectAndBalanced) {
  const auto w = lognormal(32768, 2048, 1.0, 42);
  const double mean = mean_load(w, 512);
  const auto kk = karmarkar_karp(w, 512, false);
  ASSERT_EQ(contract_violation(w, 512, false, kk), "");
  EXPECT_LT(max_part_sum(w, kk) / mean, 1.001);
  const auto eq = karmarkar_karp(w, 512, true);
  ASSERT_EQ(contract_violation(w, 512, true, eq), "");
  // Ties everywhere: all-equal weights spread perfectly (64 items per part).
  const std::vector<double> flat(32768, 3.0);
  const auto f = karmarkar_karp(flat, 512, false);
  for (const auto& p : f) ASSERT_EQ(p.size(), 64u);
  // Not divisible: 32767 items, equal counts -> 511 parts of 64 and one of 63.
  const std::vector<double> w2(w.begin(), w.end() - 1);
  ASSERT_EQ(contract_violation(w2, 512, true, karmarkar_karp(w2, 512, true)), "");
  ASSERT_EQ(contract_violation(w2, 512, true, balance(w2, 512, true)), "");
}
