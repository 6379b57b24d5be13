// DP balancing benchmarks (dynacp/solve/blocks/balance.hpp).
//   build/.../benchmarks/bench_balance --benchmark_min_time=0.2
// Weights: token counts, round(lognormal(log 2048, sigma 1)) clipped to [64, 32768] (the setup of
// ../shared/reference/dp_balancing_anchors.md §3). Counters: max_over_mean = heaviest part / mean part, and
// lb_over_mean = balance_lower_bound / mean (both on the benchmarked instance).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "dynacp/solve/blocks/balance.hpp"

using namespace dynacp::solve;

namespace {

std::vector<double> lognormal(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(std::log(2048.0), 1.0);
  std::vector<double> w(n);
  for (auto& x : w) x = std::clamp(std::round(d(rng)), 64.0, 32768.0);
  return w;
}

void run(benchmark::State& state, BalanceMethod method, bool equal_count) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const int k = static_cast<int>(state.range(1));
  const auto w = lognormal(n, 42);
  Parts parts;
  for (auto _ : state) {
    parts = balance(w, k, equal_count, method);
    benchmark::DoNotOptimize(parts.data());
  }
  const double mean = std::accumulate(w.begin(), w.end(), 0.0) / k;
  state.counters["max_over_mean"] = max_part_sum(w, parts) / mean;
  state.counters["lb_over_mean"] = balance_lower_bound(w, k, equal_count) / mean;
}

void BM_KKFree(benchmark::State& s) { run(s, BalanceMethod::KarmarkarKarp, false); }
void BM_KKEqual(benchmark::State& s) { run(s, BalanceMethod::KarmarkarKarp, true); }
void BM_GreedyFree(benchmark::State& s) { run(s, BalanceMethod::Greedy, false); }
void BM_GreedyEqual(benchmark::State& s) { run(s, BalanceMethod::Greedy, true); }
void BM_BestFree(benchmark::State& s) { run(s, BalanceMethod::Best, false); }
void BM_BestEqual(benchmark::State& s) { run(s, BalanceMethod::Best, true); }

void sizes(benchmark::internal::Benchmark* b) {
  b->Args({512, 64})->Args({4096, 64})->Args({32768, 64})->Args({32768, 512})->Unit(benchmark::kMillisecond);
}

}  // namespace

// The acceptance case: free counts, 32,768 items into 512 parts (Python KK: 44 s, 2.7 GB).
BENCHMARK(BM_KKFree)->Apply(sizes);
BENCHMARK(BM_GreedyFree)->Apply(sizes);
BENCHMARK(BM_BestFree)->Apply(sizes);
// Equal counts; 512 x 64 is the 64 parts x 8 items acceptance shape.
BENCHMARK(BM_KKEqual)->Apply(sizes);
BENCHMARK(BM_GreedyEqual)->Apply(sizes);
BENCHMARK(BM_BestEqual)->Apply(sizes);

BENCHMARK_MAIN();
