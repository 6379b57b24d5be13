// Solve-time benchmarks: each registered strategy on (GBS, P) grids of long-tailed batches.
//   build/.../benchmarks/bench_solve --benchmark_filter=fcp
// Lengths: lognormal (median 1K, sigma 1.3) with a Pareto tail above 8K, capped at 128K (a Wikipedia-like shape;
// the Python driver benchmarks/bench.py uses the embedded real distributions).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "dynacp/api/planner.hpp"

using namespace dynacp;

namespace {

Batch long_tailed(int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> body(std::log(1000.0), 1.3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Batch b;
  for (int i = 0; i < n; ++i) {
    double s = body(rng);
    if (s > 8192) s = 8192 * std::pow(1 - u(rng), -1 / 1.2);  // Pareto(alpha 1.2) tail
    b.lengths.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(s), 1, 131072));
  }
  return b;
}

void run(benchmark::State& state, const char* strategy) {
  const int gbs = static_cast<int>(state.range(0));
  const int P = static_cast<int>(state.range(1));
  Cluster cluster;
  cluster.num_ranks = P;
  cluster.ranks_per_node = 8;
  const CostModel cost;  // 16,384 tokens per rank with the default budget
  PlanOptions opt;
  opt.strategy = strategy;
  std::vector<Batch> batches;
  for (int k = 0; k < 16; ++k) batches.push_back(long_tailed(gbs, 1000 + static_cast<std::uint64_t>(k)));
  std::size_t k = 0;
  double gap = 0;
  for (auto _ : state) {
    const Plan p = plan(batches[k++ % batches.size()], cluster, cost, opt);
    gap += p.predicted.step_time / p.predicted.lower_bound - 1;
    benchmark::DoNotOptimize(p.microbatches.data());
  }
  state.counters["gap_to_lb"] = gap / static_cast<double>(state.iterations());
}

void grid(benchmark::internal::Benchmark* b) {
  for (int gbs : {128, 512, 2048})
    for (int P : {64, 256, 1024}) b->Args({gbs, P});
}

// pp = 1 scaling with the batch size (issue 26): one long-tailed batch of state.range(0) sequences on 1,024 ranks
// (8 per node), planned by `dynacp` (which runs every other strategy as a candidate too). items_per_second (sequences
// planned per second) should stay about flat from 100k to 1M sequences.
void scaling(benchmark::State& state) {
  const auto n = static_cast<int>(state.range(0));
  Cluster cluster;
  cluster.num_ranks = 1024;
  cluster.ranks_per_node = 8;
  const CostModel cost;
  PlanOptions opt;
  opt.strategy = "dynacp";
  const Batch batch = long_tailed(n, 2026);
  double gap = 0;
  for (auto _ : state) {
    const Plan p = plan(batch, cluster, cost, opt);
    gap += p.predicted.step_time / p.predicted.lower_bound - 1;
    benchmark::DoNotOptimize(p.microbatches.data());
  }
  state.counters["gap_to_lb"] = gap / static_cast<double>(state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(n) * static_cast<std::int64_t>(state.iterations()));
}

}  // namespace

BENCHMARK(scaling)->Arg(100000)->Arg(300000)->Arg(1000000)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK_CAPTURE(run, packing, "packing")->Apply(grid)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, fcp, "fcp")->Apply(grid)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, megatron, "megatron")->Apply(grid)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, bytescale, "bytescale")->Apply(grid)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(run, dynacp, "dynacp")->Apply(grid)->Unit(benchmark::kMillisecond);
// The large case of issue 3: 16,384 sequences on 12,288 ranks.
BENCHMARK_CAPTURE(run, dynacp_large, "dynacp")->Args({16384, 12288})->Unit(benchmark::kMillisecond)->Iterations(3);

BENCHMARK_MAIN();
