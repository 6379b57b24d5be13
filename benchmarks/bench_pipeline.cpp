// Pipeline simulator throughput: P ranks x pp stages x m microbatches, CP groups of 1-8 consecutive ranks per
// microbatch slot (wave plans, so orders are consistent).
//   build/.../benchmarks/bench_pipeline --benchmark_filter=Pipeline
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>

#include "dynacp/sim/pipeline.hpp"

using namespace dynacp::sim;

namespace {

PipelineProblem wave_problem(int P, int pp, int vpp, int m, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> t(0.0, 0.8);
  PipelineProblem p;
  p.num_ranks = P;
  p.pp = pp;
  p.vpp = vpp;
  p.rank_microbatches.assign(P, {});
  for (int j = 0; j < m; ++j)
    for (int r = 0; r < P;) {
      const int size = std::min<int>(P - r, 1 << static_cast<int>(rng() % 4));
      std::vector<int> ranks;
      for (int i = 0; i < size; ++i) {
        ranks.push_back(r + i);
        p.rank_microbatches[r + i].push_back(static_cast<int>(p.group_ranks.size()));
      }
      p.group_ranks.push_back(std::move(ranks));
      const double T = t(rng) * 1e-2 / (pp * vpp);
      p.group_forward.push_back(T / 3);
      p.group_backward.push_back(2 * T / 3);
      p.group_memory.push_back(T * 1e11);
      r += size;
    }
  p.grad_sync = 1e-2;
  return p;
}

void BM_Pipeline(benchmark::State& state) {
  const auto p = wave_problem(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
                              static_cast<int>(state.range(2)), static_cast<int>(state.range(3)), 1);
  for (auto _ : state) benchmark::DoNotOptimize(simulate(p).step_time);
  const double ops = static_cast<double>(state.range(0)) * state.range(1) * state.range(2) * state.range(3) * 2;
  state.counters["rank_ops"] = ops;
  state.counters["rank_ops/s"] = benchmark::Counter(ops, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_Pipeline)
    ->ArgNames({"P", "pp", "vpp", "m"})
    ->Args({64, 4, 1, 16})
    ->Args({1024, 8, 1, 32})
    ->Args({1024, 8, 2, 32})
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
