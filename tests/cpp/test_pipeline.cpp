// Pipeline simulator: closed forms of 1F1B and interleaved 1F1B, CP synchronisation across pipelines, variable
// microbatch counts, activation memory, gradient synchronisation, cycle detection and input validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "clusters.hpp"
#include "dynacp/api/planner.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/sim/pipeline.hpp"
#include "dynacp/solve/blocks/microbatch.hpp"
#include "dynacp/solve/blocks/partitions.hpp"
#include "dynacp/solve/blocks/timeline.hpp"
#include "dynacp/solve/bounds/cover.hpp"
#include "dynacp/solve/search/small_lp.hpp"
#include "dynacp/solve/strategies/dynacp/units.hpp"

using namespace dynacp;
using namespace dynacp::sim;

namespace {

constexpr double kRel = 1e-9;

// The sequences rank r runs in a plan, sorted.
std::vector<std::int64_t> sequences_on(const Plan& p, int r) {
  std::vector<std::int64_t> out;
  for (const auto& slot : p.microbatches)
    for (const auto& g : slot)
      if (std::find(g.ranks.begin(), g.ranks.end(), r) != g.ranks.end())
        out.insert(out.end(), g.sequences.begin(), g.sequences.end());
  std::sort(out.begin(), out.end());
  return out;
}

void expect_rel(double got, double want, const std::string& what) {
  const double scale = std::max(std::abs(want), 1e-300);
  EXPECT_LE(std::abs(got - want) / scale, kRel) << what << ": got " << got << " want " << want;
}

/// m microbatch times u^power, u uniform in [0, 1): power > 1 mixes a few large microbatches with many small ones.
std::vector<double> random_times(std::mt19937_64& rng, int m, double power) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> t(static_cast<std::size_t>(m));
  for (auto& x : t) x = std::pow(u(rng), power);
  return t;
}

/// The simulated 1F1B makespan of one rank running microbatches of the given times (all stages, forward and
/// backward): t / (3 pp) forward and 2 t / (3 pp) backward on each stage, the split the planner uses.
double one_rank(const std::vector<double>& times, int pp) {
  PipelineProblem p;
  p.num_ranks = 1;
  p.pp = pp;
  p.vpp = 1;
  p.rank_microbatches.assign(1, {});
  for (std::size_t i = 0; i < times.size(); ++i) {
    p.rank_microbatches[0].push_back(static_cast<int>(i));
    p.group_ranks.push_back({0});
    p.group_forward.push_back(times[i] / (3.0 * pp));
    p.group_backward.push_back(2.0 * times[i] / (3.0 * pp));
    p.group_memory.push_back(0.0);
  }
  return simulate(p).step_time;
}

/// P independent pipelines (no CP sharing), m uniform microbatches each.
PipelineProblem uniform(int P, int pp, int vpp, int m, double f, double b, double mem = 0.0) {
  PipelineProblem p;
  p.num_ranks = P;
  p.pp = pp;
  p.vpp = vpp;
  p.rank_microbatches.resize(P);
  for (int r = 0; r < P; ++r)
    for (int i = 0; i < m; ++i) {
      p.rank_microbatches[r].push_back(static_cast<int>(p.group_ranks.size()));
      p.group_ranks.push_back({r});
      p.group_forward.push_back(f);
      p.group_backward.push_back(b);
      p.group_memory.push_back(mem);
    }
  return p;
}

/// P pipelines where microbatch i of every rank is ONE CP group spanning all P ranks.
PipelineProblem uniform_shared(int P, int pp, int vpp, int m, double f, double b) {
  PipelineProblem p;
  p.num_ranks = P;
  p.pp = pp;
  p.vpp = vpp;
  p.rank_microbatches.assign(P, {});
  for (int i = 0; i < m; ++i) {
    std::vector<int> ranks;
    for (int r = 0; r < P; ++r) {
      p.rank_microbatches[r].push_back(i);
      ranks.push_back(r);
    }
    p.group_ranks.push_back(ranks);
    p.group_forward.push_back(f);
    p.group_backward.push_back(b);
  }
  return p;
}

/// Independent check of a timeline: ops on a rank-stage never overlap, every op starts exactly at the max of its
/// predecessors' ends (order predecessor on every rank of its group, data predecessor), and joint ops of a group
/// start at the same time on all its ranks.
void check_timeline(const PipelineProblem& p, const PipelineResult& res) {
  using Key = std::tuple<int, int, int, int>;  // group, backward, chunk, stage
  std::map<Key, std::pair<double, double>> when;
  std::map<Key, double> ready;  // max end of order predecessors
  const PipelineResult::Op* prev = nullptr;
  for (const auto& op : res.ops) {
    const Key key{op.group, op.backward, op.chunk, op.stage};
    auto [it, fresh] = when.emplace(key, std::make_pair(op.start, op.end));
    if (!fresh) {
      EXPECT_DOUBLE_EQ(it->second.first, op.start) << "group " << op.group << " starts at different times";
    }
    EXPECT_NEAR(op.end - op.start, op.backward ? p.group_backward[op.group] : p.group_forward[op.group], 1e-12);
    double& rdy = ready.emplace(key, 0.0).first->second;
    if (prev && prev->rank == op.rank && prev->stage == op.stage) {
      EXPECT_GE(op.start, prev->end - 1e-12);
      rdy = std::max(rdy, prev->end);
    }
    prev = &op;
  }
  const int pp = p.pp, v = p.vpp;
  for (const auto& [key, se] : when) {
    auto [g, bwd, c, k] = key;
    double r = ready[key];
    Key dp{-1, 0, 0, 0};
    if (!bwd) {
      if (k > 0)
        dp = {g, 0, c, k - 1};
      else if (c > 0)
        dp = {g, 0, c - 1, pp - 1};
    } else {
      if (k < pp - 1)
        dp = {g, 1, c, k + 1};
      else if (c < v - 1)
        dp = {g, 1, c + 1, 0};
      else
        dp = {g, 0, v - 1, pp - 1};
    }
    if (std::get<0>(dp) >= 0) {
      ASSERT_TRUE(when.count(dp));
      EXPECT_GE(se.first, when[dp].second - 1e-12);
      r = std::max(r, when[dp].second);
    }
    EXPECT_NEAR(se.first, r, 1e-9) << "op of group " << g << " is not started as early as possible";
  }
}

}  // namespace

TEST(Pipeline, OneFOneBClosedForm) {
  const std::vector<std::pair<double, double>> fb = {{1.0, 2.0}, {0.37, 1.1}, {2.5, 2.5}, {1e-3, 7e-3}};
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 5, 8, 16, 33})
      for (auto [f, b] : fb)
        for (bool shared : {false, true}) {
          auto prob = shared ? uniform_shared(3, p, 1, m, f, b) : uniform(2, p, 1, m, f, b);
          auto res = simulate(prob, true);
          const std::string what = "p=" + std::to_string(p) + " m=" + std::to_string(m) + " f=" + std::to_string(f);
          expect_rel(res.step_time, (m + p - 1) * (f + b), what + " total");
          if (p > 1)
            expect_rel(res.bubble_fraction, double(p - 1) / (m + p - 1), what + " bubble");
          else
            EXPECT_NEAR(res.bubble_fraction, 0.0, 1e-12);
          for (std::size_t r = 0; r < res.busy.size(); ++r) {
            expect_rel(res.busy[r], p * m * (f + b), what + " busy");
            EXPECT_NEAR(res.idle[r], p * (p - 1) * (f + b), 1e-9 * p * (m + p) * (f + b)) << what;
          }
          check_timeline(prob, res);
        }
}

TEST(Pipeline, InterleavedClosedForm) {
  const std::vector<std::pair<double, double>> fb = {{1.0, 2.0}, {0.37, 1.1}, {2.5, 2.5}};
  for (int v : {2, 3})
    for (int p : {1, 2, 4, 8})
      for (int groups : {1, 2, 3, 5})
        for (auto [f, b] : fb)
          for (bool shared : {false, true}) {
            const int m = groups * p;
            auto prob = shared ? uniform_shared(2, p, v, m, f, b) : uniform(2, p, v, m, f, b);
            auto res = simulate(prob, true);
            const std::string what = "v=" + std::to_string(v) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                                     " f=" + std::to_string(f);
            expect_rel(res.step_time, (v * m + p - 1) * (f + b), what + " total");
            if (p > 1) expect_rel(res.bubble_fraction, double(p - 1) / (v * m + p - 1), what + " bubble");
            for (double busy : res.busy) expect_rel(busy, p * v * m * (f + b), what + " busy");
            check_timeline(prob, res);
          }
}

TEST(Pipeline, OneFOneBOpOrderMatchesMegatron) {
  // pp = 4, m = 6: stage k runs min(3 - k, 6) warm-up forwards, then 1F1B, then cool-down backwards.
  auto res = simulate(uniform(1, 4, 1, 6, 1.0, 2.0), true);
  std::map<int, std::string> order;
  for (const auto& op : res.ops) order[op.stage] += (op.backward ? "B" : "F") + std::to_string(op.group);
  EXPECT_EQ(order[0], "F0F1F2F3B0F4B1F5B2B3B4B5");
  EXPECT_EQ(order[1], "F0F1F2B0F3B1F4B2F5B3B4B5");
  EXPECT_EQ(order[3], "F0B0F1B1F2B2F3B3F4B4F5B5");
}

TEST(Pipeline, InterleavedOpOrderMatchesMegatron) {
  // pp = 2, vpp = 2, m = 4: virtual microbatch i -> chunk (i % 4) / 2, microbatch (i / 4) * 2 + i % 2.
  auto res = simulate(uniform(1, 2, 2, 4, 1.0, 1.0), true);
  std::map<int, std::string> order;
  for (const auto& op : res.ops)
    order[op.stage] += (op.backward ? "B" : "F") + std::to_string(op.group) + "." + std::to_string(op.chunk) + " ";
  // Stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards; stage 1: 2.
  EXPECT_EQ(order[0], "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  EXPECT_EQ(order[1], "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0 ");
}

TEST(Pipeline, CpGroupWaitsForSlowRankSingleStage) {
  // pp = 1. Rank 0 runs its own slow microbatch A then shared S; rank 1 a fast B then S. S waits for rank 0.
  PipelineProblem p;
  p.num_ranks = 2;
  p.rank_microbatches = {{0, 2}, {1, 2}};
  p.group_ranks = {{0}, {1}, {0, 1}};
  p.group_forward = {3, 1, 1};
  p.group_backward = {3, 1, 1};
  auto res = simulate(p, true);
  EXPECT_DOUBLE_EQ(res.step_time, 8.0);
  EXPECT_DOUBLE_EQ(res.busy[0], 8.0);
  EXPECT_DOUBLE_EQ(res.busy[1], 4.0);
  EXPECT_DOUBLE_EQ(res.idle[1], 4.0);
  EXPECT_DOUBLE_EQ(res.bubble_fraction, 0.25);
  for (const auto& op : res.ops)
    if (op.group == 2) EXPECT_DOUBLE_EQ(op.start, op.backward ? 7.0 : 6.0);
  check_timeline(p, res);
}

TEST(Pipeline, CpGroupWaitsForSlowRankTwoStages) {
  // pp = 2, hand-computed. Rank 0: [A (2,4), S (1,2)]; rank 1: [B (1,2), S]. Stage 0 order F F B B, stage 1 F B F B.
  //   stage 0: F_A [0,2] | F_B [0,1]; F_S needs both ranks: [2,3]; B_B [4,6]; B_A [8,12]; B_S [12,14]
  //   stage 1: F_A [2,4], B_A [4,8] | F_B [1,2], B_B [2,4]; F_S waits for rank 0: [8,9]; B_S [9,11]
  PipelineProblem p;
  p.num_ranks = 2;
  p.pp = 2;
  p.rank_microbatches = {{0, 2}, {1, 2}};
  p.group_ranks = {{0}, {1}, {0, 1}};
  p.group_forward = {2, 1, 1};
  p.group_backward = {4, 2, 2};
  auto res = simulate(p, true);
  EXPECT_DOUBLE_EQ(res.step_time, 14.0);
  EXPECT_DOUBLE_EQ(res.busy[0], 18.0);
  EXPECT_DOUBLE_EQ(res.busy[1], 12.0);
  EXPECT_DOUBLE_EQ(res.idle[1], 2 * 14.0 - 12.0);
  EXPECT_DOUBLE_EQ(res.bubble_fraction, 1.0 - 30.0 / 56.0);
  std::map<std::tuple<int, int, bool, int>, double> start;  // rank, stage, backward, group
  for (const auto& op : res.ops) start[{op.rank, op.stage, op.backward, op.group}] = op.start;
  EXPECT_DOUBLE_EQ((start[{0, 0, false, 2}]), 2.0);
  EXPECT_DOUBLE_EQ((start[{1, 0, false, 2}]), 2.0);
  EXPECT_DOUBLE_EQ((start[{1, 1, false, 2}]), 8.0);  // rank 1 stage 1 idles from 4 to 8
  EXPECT_DOUBLE_EQ((start[{1, 1, true, 2}]), 9.0);
  EXPECT_DOUBLE_EQ((start[{1, 0, true, 1}]), 4.0);
  EXPECT_DOUBLE_EQ((start[{0, 0, true, 0}]), 8.0);
  EXPECT_DOUBLE_EQ((start[{1, 0, true, 2}]), 12.0);
  check_timeline(p, res);
}

TEST(Pipeline, VariableMicrobatchCounts) {
  // ByteScale-style: rank 1 runs twice as many (cheaper) microbatches. Independent pipelines follow the closed form
  // each; the step is the slowest.
  PipelineProblem p = uniform(1, 4, 1, 4, 2.0, 4.0);
  p.num_ranks = 2;
  p.rank_microbatches.emplace_back();
  for (int i = 0; i < 8; ++i) {
    p.rank_microbatches[1].push_back(static_cast<int>(p.group_ranks.size()));
    p.group_ranks.push_back({1});
    p.group_forward.push_back(1.0);
    p.group_backward.push_back(2.0);
    p.group_memory.push_back(0.0);
  }
  auto res = simulate(p, true);
  expect_rel(res.step_time, std::max((4 + 3) * 6.0, (8 + 3) * 3.0), "variable step");
  expect_rel(res.busy[0], 4 * 4 * 6.0, "busy 0");
  expect_rel(res.busy[1], 4 * 8 * 3.0, "busy 1");
  expect_rel(res.idle[0], 4 * 42.0 - 96.0, "idle 0");
  expect_rel(res.bubble_fraction, 1.0 - 192.0 / (42.0 * 2 * 4), "bubble");
  check_timeline(p, res);

  // A rank with no microbatches is idle for the whole step; variable counts with vpp need multiples of pp.
  PipelineProblem q = uniform(1, 2, 2, 4, 1.0, 1.0);
  q.num_ranks = 2;
  q.rank_microbatches.emplace_back();
  auto rq = simulate(q);
  EXPECT_DOUBLE_EQ(rq.busy[1], 0.0);
  expect_rel(rq.idle[1], 2 * rq.step_time, "idle of an empty rank");
}

TEST(Pipeline, VariableCountsWithSharedGroup) {
  // pp = 2, rank 0 runs [S, a], rank 1 runs [S, b, c]; S is shared and comes first on both, so orders agree.
  PipelineProblem p;
  p.num_ranks = 2;
  p.pp = 2;
  p.rank_microbatches = {{0, 1}, {0, 2, 3}};
  p.group_ranks = {{0, 1}, {0}, {1}, {1}};
  p.group_forward = {1, 1, 1, 1};
  p.group_backward = {2, 2, 2, 2};
  auto res = simulate(p, true);
  // Rank 1 alone would be the 1F1B closed form with m = 3: (3 + 1) * 3 = 12; rank 0 alone (2 + 1) * 3 = 9.
  EXPECT_DOUBLE_EQ(res.step_time, 12.0);
  check_timeline(p, res);
}

TEST(Pipeline, PeakMemoryOneFOneB) {
  for (int pp : {1, 2, 4, 8})
    for (int m : {1, 3, 4, 9}) {
      const double mem = 1.5e9;
      auto prob = uniform(2, pp, 1, m, 1.0, 2.0, mem);
      auto res = simulate(prob, true);
      for (double peak : res.peak_memory) expect_rel(peak, std::min(m, pp) * mem, "rank peak");
      // Per stage from the timeline (bytes live from a forward's start to its backward's end): min(m, pp - k).
      for (int k = 0; k < pp; ++k) {
        std::vector<std::pair<double, double>> events;  // (time, +-1); frees sort before allocations at ties
        for (const auto& op : res.ops)
          if (op.rank == 0 && op.stage == k) events.emplace_back(op.backward ? op.end : op.start, op.backward ? -1 : 1);
        std::sort(events.begin(), events.end());
        double live = 0, peak = 0;
        for (auto [t, d] : events) peak = std::max(peak, live += d);
        EXPECT_EQ(peak, std::min(m, pp - k)) << "pp=" << pp << " m=" << m << " stage " << k;
      }
    }
  // Interleaved, uniform: stage 0 holds its warm-up forwards plus one: min(2(pp-1) + (v-1)pp + 1, v m) stage-chunks.
  for (int v : {2, 3}) {
    const int pp = 4, m = 8;
    auto res = simulate(uniform(1, pp, v, m, 1.0, 2.0, 1.0));
    EXPECT_DOUBLE_EQ(res.peak_memory[0], std::min(2 * (pp - 1) + (v - 1) * pp + 1, v * m));
  }
  // Non-uniform memory: the heavy microbatch counts only while in flight.
  PipelineProblem p = uniform(1, 2, 1, 3, 1.0, 1.0, 1.0);
  p.group_memory = {10.0, 1.0, 1.0};
  EXPECT_DOUBLE_EQ(simulate(p).peak_memory[0], 11.0);  // stage 0 holds {0, 1} after its warm-up
  p.group_memory = {};
  EXPECT_DOUBLE_EQ(simulate(p).peak_memory[0], 0.0);  // empty memory vector = zero bytes
}

// one_f_one_b_floor(m, pp) S / pp never exceeds the 1F1B makespan of m microbatches taking S in all, and is reached
// by the linear program's optimal split: pp = 2, m = 3, times 1/3, 1, 2/3 (S = 2) take 23/18 against 4/3 for three
// equal ones.
TEST(Pipeline, OneFOneBFloorIsALowerBoundAndTight) {
  for (int pp = 1; pp <= 8; ++pp) EXPECT_NEAR(solve::one_f_one_b_floor(1, pp), pp, 1e-5);
  const std::vector<double> best{1.0 / 3, 1.0, 2.0 / 3};
  EXPECT_NEAR(one_rank(best, 2), 23.0 / 18, 1e-12);
  EXPECT_LE(solve::one_f_one_b_floor(3, 2) * 2.0 / 2, 23.0 / 18);
  EXPECT_GE(solve::one_f_one_b_floor(3, 2) * 2.0 / 2, 23.0 / 18 - 1e-5);
  // below the equal split for m >= 2 (unequal splits are faster), and 1 beyond the table
  EXPECT_LT(solve::one_f_one_b_floor(8, 4), (8 + 3) / 8.0);
  EXPECT_DOUBLE_EQ(solve::one_f_one_b_floor(65, 4), 1.0);
  EXPECT_DOUBLE_EQ(solve::one_f_one_b_floor(3, 17), 1.0);
  EXPECT_THROW(solve::one_f_one_b_floor(0, 4), InvalidArgument);
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    const int pp = 2 + static_cast<int>(rng() % 7), m = 1 + static_cast<int>(rng() % 24);
    const std::vector<double> t = random_times(rng, m, trial % 2 ? 1.0 : 4.0);
    const double S = std::accumulate(t.begin(), t.end(), 0.0);
    EXPECT_GE(one_rank(t, pp), solve::one_f_one_b_floor(m, pp) * S / pp * (1 - 1e-12)) << "pp " << pp << " m " << m;
  }
}

// The chain behind the lower bound's critical-sequence term: on stage 0, the ops before F_j, microbatch j's round trip
// (t_j) and the ops after B_j; only the forwards of the next pp - 1 microbatches (1/3 of their time) and the
// backwards of the previous pp - 1 (2/3) may overlap it, so the makespan is >= t_j + (S - t_j) / (3 pp). A light
// microbatch first and the heavy one second reaches it: 12 + 1/12 for times 1 and 12 at pp = 4.
TEST(Pipeline, OneFOneBRoundTripChain) {
  EXPECT_NEAR(one_rank(std::vector<double>{1.0, 12.0}, 4), 12.0 + 1.0 / 12, 1e-12);
  EXPECT_NEAR(one_rank(std::vector<double>{12.0, 1.0}, 4), 12.0 + 2.0 / 12, 1e-12);
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 2000; ++trial) {
    const int pp = 2 + static_cast<int>(rng() % 7), m = 1 + static_cast<int>(rng() % 16);
    const std::vector<double> t = random_times(rng, m, 3.0);
    const double S = std::accumulate(t.begin(), t.end(), 0.0);
    const double got = one_rank(t, pp);
    for (double tj : t) EXPECT_GE(got, (tj + (S - tj) / (3.0 * pp)) * (1 - 1e-12)) << "pp " << pp << " m " << m;
  }
}

TEST(Pipeline, OneFOneBPairFloor) {
  // Any two microbatches of one pipeline, whatever else it runs, take at least the chain floor of their order, so
  // at least pair(a, b) = the smaller of the two orders' floors (docs/cost_model.md), which is above the order-free
  // max(a + b / (3 pp), ((pp + 2) a + (2 pp + 1) b) / (3 pp)) used before. Through the simulator, with triples too.
  auto chain = [](std::vector<double> x, int pp) { return solve::one_f_one_b_chain_floor(x, pp); };
  auto pair = [&](double a, double b, int pp) { return std::min(chain({a, b}, pp), chain({b, a}, pp)); };
  EXPECT_NEAR(one_rank(std::vector<double>{1.0, 1.0}, 4), pair(1.0, 1.0, 4), 1e-12);  // 1.25
  EXPECT_NEAR(pair(1.0, 1.0, 4), 1.25, 1e-12);
  EXPECT_NEAR(one_rank(std::vector<double>{1.0, 12.0}, 4), pair(12.0, 1.0, 4), 1e-12);  // light one first
  EXPECT_NEAR(pair(2.0, 1.4, 4), 2.2, 1e-12);  // the order-free value is 2 + 1.4 / 12
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int pp = 2 + static_cast<int>(rng() % 7), m = 2 + static_cast<int>(rng() % 15);
    const std::vector<double> t = random_times(rng, m, trial % 2 ? 1.0 : 4.0);
    const double got = one_rank(t, pp);
    for (int a = 0; a < m; ++a)
      for (int b = a + 1; b < m; ++b) {
        EXPECT_GE(got, chain({t[a], t[b]}, pp) * (1 - 1e-12)) << "pp " << pp << " m " << m;
        const int c = b + 1 + static_cast<int>(rng() % static_cast<unsigned>(m - b));
        if (c < m) EXPECT_GE(got, chain({t[a], t[b], t[c]}, pp) * (1 - 1e-12)) << "pp " << pp << " m " << m;
      }
  }
}

TEST(Pipeline, GradSyncIsAdded) {
  auto prob = uniform(2, 4, 1, 8, 1.0, 2.0);
  const double base = simulate(prob).step_time;
  prob.grad_sync = 0.75;
  auto res = simulate(prob);
  expect_rel(res.step_time, base + 0.75, "step with grad sync");
  expect_rel(res.step_time, (8 + 3) * 3.0 + 0.75, "closed form + grad sync");
  expect_rel(res.bubble_fraction, 3.0 / 11.0, "bubble excludes grad sync");
}

TEST(Pipeline, Deterministic) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  // Wave plan: slot j of every rank belongs to a group of consecutive ranks; shared groups keep the same slot on
  // all their ranks, so orders are consistent.
  const int P = 12, pp = 4, m = 8;
  PipelineProblem p;
  p.num_ranks = P;
  p.pp = pp;
  p.vpp = 2;
  p.rank_microbatches.assign(P, {});
  for (int j = 0; j < m; ++j)
    for (int r = 0; r < P;) {
      const int size = std::min<int>(P - r, 1 + static_cast<int>(rng() % 4));
      std::vector<int> ranks;
      for (int i = 0; i < size; ++i) {
        ranks.push_back(r + i);
        p.rank_microbatches[r + i].push_back(static_cast<int>(p.group_ranks.size()));
      }
      p.group_ranks.push_back(ranks);
      const double t = u(rng);
      p.group_forward.push_back(t);
      p.group_backward.push_back(2 * t);
      p.group_memory.push_back(u(rng));
      r += size;
    }
  auto a = simulate(p, true), b = simulate(p, true);
  EXPECT_EQ(a.step_time, b.step_time);
  EXPECT_EQ(a.busy, b.busy);
  EXPECT_EQ(a.peak_memory, b.peak_memory);
  ASSERT_EQ(a.ops.size(), b.ops.size());
  ASSERT_EQ(a.ops.size(), static_cast<std::size_t>(P) * pp * m * 2 * 2);
  for (std::size_t i = 0; i < a.ops.size(); ++i) EXPECT_EQ(a.ops[i].start, b.ops[i].start);
  check_timeline(p, a);
  // Every stage of a rank is busy at most the whole makespan.
  for (int r = 0; r < P; ++r) EXPECT_GE(a.step_time * pp + 1e-9, a.busy[r]);
}

TEST(Pipeline, CycleIsDetectedAndNamed) {
  // Ranks 0 and 1 share groups 0 and 1 but run them in opposite orders: a deadlock.
  PipelineProblem p;
  p.num_ranks = 3;
  p.rank_microbatches = {{0, 1}, {1, 0}, {2}};
  p.group_ranks = {{0, 1}, {0, 1}, {2}};
  p.group_forward = {1, 1, 1};
  p.group_backward = {2, 2, 2};
  for (int pp : {1, 2}) {
    p.pp = pp;
    try {
      simulate(p);
      FAIL() << "expected a cycle error";
    } catch (const InvalidArgument&) {
      FAIL() << "a cycle is an Error, not InvalidArgument";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ranks {0, 1}"), std::string::npos) << msg;
      EXPECT_NE(msg.find("groups {0, 1}"), std::string::npos) << msg;
    }
  }
  // Variable counts can deadlock even with the same relative order: rank 1 runs a private microbatch between the
  // shared ones, so at stage 0 it runs B(S0) before F(S1) while rank 0 runs F(S1) first.
  PipelineProblem q;
  q.num_ranks = 2;
  q.pp = 2;
  q.rank_microbatches = {{0, 1}, {0, 2, 1}};
  q.group_ranks = {{0, 1}, {0, 1}, {1}};
  q.group_forward = {1, 1, 1};
  q.group_backward = {1, 1, 1};
  EXPECT_THROW(simulate(q), Error);
}

TEST(Pipeline, BadInputs) {
  auto base = [] {
    PipelineProblem p;
    p.num_ranks = 2;
    p.pp = 2;
    p.rank_microbatches = {{0, 1}, {0, 2}};
    p.group_ranks = {{0, 1}, {0}, {1}};
    p.group_forward = {1, 1, 1};
    p.group_backward = {2, 2, 2};
    return p;
  };
  EXPECT_NO_THROW(simulate(base()));
  auto expect_invalid = [](const PipelineProblem& p, const std::string& needle) {
    try {
      simulate(p);
      ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    auto p = base();  // group 2 lists rank 0, which does not list it
    p.group_ranks[2] = {1, 0};
    expect_invalid(p, "group 2 lists rank 0 but rank 0 does not list group 2");
  }
  {
    auto p = base();  // rank 1 lists group 1, which does not list rank 1
    p.rank_microbatches[1] = {0, 2, 1};
    expect_invalid(p, "does not list rank 1");
  }
  {
    auto p = base();
    p.rank_microbatches[0] = {0, 7};
    expect_invalid(p, "unknown group id 7");
  }
  {
    auto p = base();
    p.rank_microbatches[0] = {0, -1};
    expect_invalid(p, "unknown group id -1");
  }
  {
    auto p = base();
    p.group_ranks[1] = {5};
    expect_invalid(p, "unknown rank 5");
  }
  {
    auto p = base();
    p.rank_microbatches[0] = {0, 1, 1};
    expect_invalid(p, "more than once");
  }
  {
    auto p = base();
    p.group_forward[1] = -0.5;
    expect_invalid(p, "group_forward[1]");
  }
  {
    auto p = base();
    p.group_backward[2] = std::numeric_limits<double>::quiet_NaN();
    expect_invalid(p, "group_backward[2]");
  }
  {
    auto p = base();
    p.group_memory = {1, -1, 1};
    expect_invalid(p, "group_memory[1]");
  }
  {
    auto p = base();
    p.grad_sync = -1;
    expect_invalid(p, "grad_sync");
  }
  {
    auto p = base();
    p.vpp = 2;  // every rank has 2 = pp microbatches: fine
    EXPECT_NO_THROW(simulate(p));
    p.pp = 4;  // 2 % 4 != 0
    expect_invalid(p, "multiple of pp");
  }
  {
    auto p = base();
    p.group_forward.pop_back();
    expect_invalid(p, "one entry per group");
  }
  {
    auto p = base();
    p.num_ranks = 3;
    expect_invalid(p, "num_ranks");
  }
  {
    auto p = base();
    p.pp = 0;
    expect_invalid(p, "pp must be >= 1");
  }
  {
    auto p = base();
    p.group_ranks.push_back({});
    p.group_forward.push_back(1);
    p.group_backward.push_back(1);
    expect_invalid(p, "group 3 has no ranks");
  }
}

namespace {
// A random problem of up to `max_ranks` ranks and `max_groups` groups (each on a random set of ranks, times in
// 1/97 and 1/89 steps, memory when `memory`), its rank lists shuffled (often a cycle) when `shuffle`.
PipelineProblem random_problem(std::mt19937_64& rng, int max_ranks, int max_groups, bool shuffle, bool memory) {
  PipelineProblem p;
  p.num_ranks = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_ranks));
  p.pp = 1 + static_cast<int>(rng() % 4);
  p.vpp = rng() % 3 == 0 ? 2 : 1;
  const int G = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_groups));
  p.rank_microbatches.assign(p.num_ranks, {});
  for (int g = 0; g < G; ++g) {
    std::vector<int> ranks;
    for (int r = 0; r < p.num_ranks; ++r)
      if (rng() % 3 == 0) ranks.push_back(r);
    if (ranks.empty()) ranks.push_back(static_cast<int>(rng() % p.num_ranks));
    for (int r : ranks) p.rank_microbatches[r].push_back(g);
    p.group_ranks.push_back(ranks);
    p.group_forward.push_back(0.1 + static_cast<double>(rng() % 1000) / 97.0);
    p.group_backward.push_back(static_cast<double>(rng() % 1000) / 89.0);
    if (memory) p.group_memory.push_back(static_cast<double>(rng() % 5));
  }
  if (shuffle)
    for (auto& mbs : p.rank_microbatches) std::shuffle(mbs.begin(), mbs.end(), rng);
  if (p.vpp > 1)
    for (const auto& mbs : p.rank_microbatches)
      if (mbs.size() % p.pp) p.vpp = 1;
  return p;
}
}  // namespace

TEST(Pipeline, RandomOrdersSimulateOrReportACycle) {
  std::mt19937_64 rng(11);
  int simulated = 0, cycles = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const PipelineProblem p = random_problem(rng, 5, 10, true, true);
    try {
      auto res = simulate(p, true);
      check_timeline(p, res);
      for (int r = 0; r < p.num_ranks; ++r)
        EXPECT_NEAR(res.busy[r] + res.idle[r], p.pp * (res.step_time - p.grad_sync), 1e-9 * (1 + res.step_time));
      ++simulated;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("dependency cycle"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("a bug"), std::string::npos) << msg;
      ++cycles;
    }
  }
  EXPECT_GT(simulated, 50);
  EXPECT_GT(cycles, 50);
}

// The flat step-time path (what dynacp's scorer runs) gives simulate()'s step time bit for bit on random problems,
// and reports the same cycles; bad flat arrays raise InvalidArgument naming the problem.
TEST(Pipeline, FlatStepTimeIsTheSimulators) {
  std::mt19937_64 rng(77);
  int same = 0, cycles = 0;
  for (int iter = 0; iter < 600; ++iter) {
    const PipelineProblem p = random_problem(rng, 6, 12, rng() % 2 == 1, false);
    double full = -1.0;
    try {
      full = simulate(p).step_time;
    } catch (const Error&) {
    }
    if (full < 0) {
      EXPECT_THROW(sim::step_time(sim::flatten(p)), Error) << "iteration " << iter;
      ++cycles;
    } else {
      EXPECT_EQ(sim::step_time(sim::flatten(p)), full) << "iteration " << iter;
      ++same;
    }
  }
  EXPECT_GT(same, 200);
  EXPECT_GT(cycles, 50);
}

TEST(Pipeline, FlatStepTimeRejectsInconsistentArrays) {
  const sim::FlatProblem good = sim::flatten(uniform_shared(3, 2, 1, 4, 1.0, 2.0));
  EXPECT_GT(sim::step_time(good), 0.0);
  auto expect_invalid = [](const sim::FlatProblem& f, const std::string& words) {
    try {
      sim::step_time(f);
      ADD_FAILURE() << "no error for: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  sim::FlatProblem f = good;
  f.group_size[0] += 1;
  expect_invalid(f, "is listed by");
  f = good;
  f.rank_groups[0] = 99;
  expect_invalid(f, "unknown group id 99");
  f = good;
  f.rank_off.pop_back();
  expect_invalid(f, "rank_off");
  f = good;
  f.group_forward[1] = -1.0;
  expect_invalid(f, "group 1 has forward -1");
  f = good;
  f.pp = 0;
  expect_invalid(f, "must be >= 1");
}

// The solver's own 1F1B makespan (one pipeline, no CP groups) is the simulator's, exactly; uniform microbatches give
// the closed form (m + pp - 1) t / pp.
TEST(Pipeline, OneFOneBMakespanIsTheSimulators) {
  EXPECT_DOUBLE_EQ(solve::one_f_one_b_makespan(std::vector<double>{}, 4), 0.0);
  EXPECT_NEAR(solve::one_f_one_b_makespan(std::vector<double>(8, 2.0), 4), (8 + 3) * 2.0 / 4, 1e-12);
  EXPECT_NEAR(solve::one_f_one_b_makespan(std::vector<double>{1.0, 12.0}, 4), 12.0 + 1.0 / 12, 1e-12);
  EXPECT_THROW(solve::one_f_one_b_makespan(std::vector<double>{1.0}, 0), InvalidArgument);
  EXPECT_THROW(solve::one_f_one_b_makespan(std::vector<double>{1.0, -1.0}, 2), InvalidArgument);
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 1000; ++trial) {
    const int pp = 1 + static_cast<int>(rng() % 8), m = 1 + static_cast<int>(rng() % 24);
    const std::vector<double> t = random_times(rng, m, trial % 2 ? 1.0 : 3.0);
    EXPECT_NEAR(solve::one_f_one_b_makespan(t, pp), one_rank(t, pp), 1e-12) << "pp " << pp << " m " << m;
  }
}

// The chain floor of microbatches in a given order holds for every list that runs them in that order, whatever
// else it runs around them: against the exact makespan of random lists and random order-keeping sublists. Hand
// values: one microbatch is its round trip, two are the three chains of the docs, equal ones the closed form.
TEST(Pipeline, OneFOneBChainFloorHoldsAroundAnyOtherWork) {
  const double n = 4;
  EXPECT_DOUBLE_EQ(solve::one_f_one_b_chain_floor(std::vector<double>{}, 4), 0.0);
  EXPECT_NEAR(solve::one_f_one_b_chain_floor(std::vector<double>{2.5}, 4), 2.5, 1e-12);
  for (auto [a, b] : {std::pair{2.0, 1.4}, std::pair{1.4, 2.0}, std::pair{1.0, 1.0}, std::pair{3.0, 0.1}}) {
    const double hand = std::max({a + 2 * b / (3 * n), a / (3 * n) + b, ((n + 2) * a + (2 * n + 1) * b) / (3 * n)});
    EXPECT_NEAR(solve::one_f_one_b_chain_floor(std::vector<double>{a, b}, 4), hand, 1e-12) << a << " " << b;
  }
  // 1.4 then 2.0 alone: 2.2 = its exact makespan, above the order-free pair bound 2 + 1.4 / 12 it replaces
  EXPECT_NEAR(solve::one_f_one_b_chain_floor(std::vector<double>{1.4, 2.0}, 4), 2.2, 1e-12);
  EXPECT_NEAR(solve::one_f_one_b_makespan(std::vector<double>{1.4, 2.0}, 4), 2.2, 1e-12);
  EXPECT_NEAR(solve::one_f_one_b_chain_floor(std::vector<double>(6, 1.5), 4), (6 + 3) * 1.5 / 4, 1e-12);
  EXPECT_THROW(solve::one_f_one_b_chain_floor(std::vector<double>{1.0}, 0), InvalidArgument);
  EXPECT_THROW(solve::one_f_one_b_chain_floor(std::vector<double>{1.0, NAN}, 2), InvalidArgument);
  std::mt19937_64 rng(33);
  int tight = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int pp = 1 + static_cast<int>(rng() % 8), m = 1 + static_cast<int>(rng() % 16);
    const std::vector<double> t = random_times(rng, m, trial % 2 ? 1.0 : 3.0);
    const double full = solve::one_f_one_b_makespan(t, pp);
    std::vector<double> sub;
    for (double x : t)
      if (rng() % 3 == 0) sub.push_back(x);
    const double floor = solve::one_f_one_b_chain_floor(sub, pp);
    EXPECT_LE(floor, full * (1 + 1e-12)) << "pp " << pp << " m " << m << " sub " << sub.size();
    EXPECT_LE(solve::one_f_one_b_chain_floor(t, pp), full * (1 + 1e-12)) << "pp " << pp << " m " << m;
    if (sub.size() == t.size() && floor > full * (1 - 1e-12)) ++tight;
  }
  EXPECT_GT(tight, 0);  // a kept-whole list often reaches it (a floor that never bites would say nothing)
}

// The small simplex: hand optima, unboundedness, bad input, and random two-variable programs against every vertex
// (intersections of two boundary lines, axes included) that is feasible.
TEST(Pipeline, SmallLpMatchesVertexEnumeration) {
  std::vector<double> x;
  // max x + y: x + 2 y <= 4, 3 x + y <= 6 -> (1.6, 1.2)
  EXPECT_NEAR(solve::small_lp_max({1, 2, 3, 1}, {4, 6}, {1, 1}, &x), 2.8, 1e-12);
  EXPECT_NEAR(x[0], 1.6, 1e-12);
  EXPECT_NEAR(x[1], 1.2, 1e-12);
  EXPECT_EQ(solve::small_lp_max({-1, 1}, {1}, {1, 0}), std::numeric_limits<double>::infinity());
  EXPECT_DOUBLE_EQ(solve::small_lp_max({1, 1}, {3}, {-1, -2}), 0.0);  // the origin is optimal
  EXPECT_THROW(solve::small_lp_max({1, 1}, {-1}, {1, 1}), InvalidArgument);
  EXPECT_THROW(solve::small_lp_max({1, 1, 1}, {1}, {1, 1}), InvalidArgument);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 2.0), pos(0.0, 3.0);
  for (int trial = 0; trial < 500; ++trial) {
    const int m = 1 + static_cast<int>(rng() % 5);
    std::vector<double> A, b, c{u(rng), u(rng)};
    for (int r = 0; r < m; ++r) A.push_back(u(rng)), A.push_back(u(rng)), b.push_back(pos(rng));
    // boundary lines a x = b, with the axes x = 0 and y = 0
    std::vector<std::array<double, 3>> lines{{1, 0, 0}, {0, 1, 0}};
    for (int r = 0; r < m; ++r) lines.push_back({A[2 * r], A[2 * r + 1], b[r]});
    auto feasible = [&](double px, double py) {
      if (px < -1e-9 || py < -1e-9) return false;
      for (int r = 0; r < m; ++r)
        if (A[2 * r] * px + A[2 * r + 1] * py > b[r] + 1e-9) return false;
      return true;
    };
    double best = -std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < lines.size(); ++i)
      for (std::size_t j = i + 1; j < lines.size(); ++j) {
        const auto& [a1, b1, c1] = lines[i];
        const auto& [a2, b2, c2] = lines[j];
        const double det = a1 * b2 - a2 * b1;
        if (std::abs(det) < 1e-9) continue;
        const double px = (c1 * b2 - c2 * b1) / det, py = (a1 * c2 - a2 * c1) / det;
        if (feasible(px, py)) best = std::max(best, c[0] * px + c[1] * py);
      }
    // unbounded when some feasible ray gains: test far points along the directions that stay feasible
    bool unbounded = false;
    for (int k = 0; k < 360 && !unbounded; ++k) {
      const double dx = std::cos(k * M_PI / 180), dy = std::sin(k * M_PI / 180);
      if (dx < 0 || dy < 0 || c[0] * dx + c[1] * dy <= 1e-6) continue;
      bool ray = true;
      for (int r = 0; r < m && ray; ++r) ray = A[2 * r] * dx + A[2 * r + 1] * dy <= 0;
      unbounded = ray;
    }
    const double got = solve::small_lp_max(A, b, c);
    if (unbounded)
      EXPECT_EQ(got, std::numeric_limits<double>::infinity()) << "trial " << trial;
    else if (std::isfinite(got))
      EXPECT_NEAR(got, best, 1e-7 * (1 + std::abs(best))) << "trial " << trial;
  }
}

// A degenerate LP from the cover term's rank check (longcontext batch 1, cut down to 29 rows that still show it):
// pivoting on entries down to 1e-12 left rounding that made the final point infeasible, so the solve proved
// nothing. Pivots are now at least 1e-9, and the value matches HiGHS (scipy 1.17, 1113.2591300919262).
TEST(Pipeline, SmallLpSettlesADegenerateCoverLp) {
  const std::vector<std::vector<std::pair<int, double>>> rows{{{9, 1}, {21, -1}},
                                                              {{9, 1}, {11, 1}, {21, -1}},
                                                              {{10, 1}, {11, 1}, {21, -1}},
                                                              {{10, 1}, {13, 1}, {21, -1}},
                                                              {{11, 1}, {13, 1}, {21, -1}},
                                                              {{12, 1}, {14, 1}, {21, -1}},
                                                              {{10, 1}, {12, 1}, {13, 1}, {21, -1}},
                                                              {{10, 1}, {12, 1}, {14, 1}, {21, -1}},
                                                              {{10, 1}, {16, 1}, {21, -1}},
                                                              {{11, 1}, {16, 1}, {21, -1}},
                                                              {{10, 1}, {11, 1}, {17, 1}, {21, -1}},
                                                              {{10, 1}, {12, 1}, {17, 1}, {21, -1}},
                                                              {{10, 1}, {11, 1}, {18, 1}, {21, -1}},
                                                              {{10, 1}, {12, 1}, {18, 1}, {21, -1}},
                                                              {{15, 1}, {19, 1}, {21, -1}},
                                                              {{15, 1}, {20, 1}, {21, -1}},
                                                              {{18, 1}, {20, 1}, {21, -1}},
                                                              {{0, 1}, {9, -44}},
                                                              {{0, 1}, {10, -46}},
                                                              {{1, 1}, {5, 42}, {11, -42}},
                                                              {{1, 1}, {6, 44}, {12, -44}},
                                                              {{2, 1}, {13, -36}},
                                                              {{2, 1}, {14, -37}},
                                                              {{3, 1}, {15, -26}},
                                                              {{3, 1}, {7, 27}, {16, -27}},
                                                              {{3, 1}, {8, 28}, {17, -28}},
                                                              {{3, 1}, {18, -29}},
                                                              {{4, 1}, {19, -18}},
                                                              {{4, 1}, {20, -20}}};
  const std::vector<double> b{8.5678118929464873,
                              13.618612370407501,
                              12.763482423602888,
                              10.687016177198416,
                              10.392604432850002,
                              9.9165106266240315,
                              17.647361436253671,
                              17.493615173853641,
                              10.654138230573539,
                              10.327283825936776,
                              17.799964137862926,
                              17.380789263877094,
                              17.61299725729657,
                              17.193822383310739,
                              18.135232149567674,
                              13.1215560198976,
                              12.517509174990913,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0,
                              0};
  std::vector<double> c(22, 0.0);
  std::fill(c.begin(), c.begin() + 5, 1.0);
  c[21] = -64.0;
  std::vector<double> A(rows.size() * c.size(), 0.0), x;
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (const auto& [j, v] : rows[r]) A[r * c.size() + static_cast<std::size_t>(j)] = v;
  EXPECT_NEAR(solve::small_lp_max(A, b, c, &x), 1113.2591300919262, 1e-7);
  for (std::size_t r = 0; r < rows.size(); ++r) {  // the point it returns is feasible
    double lhs = 0.0;
    for (const auto& [j, v] : rows[r]) lhs += v * x[static_cast<std::size_t>(j)];
    EXPECT_LE(lhs, b[r] + 1e-9) << r;
  }
}

// The room beside giants: hand values (pp = 1 runs everything in series, so room = S - sum t; no giant leaves pp S,
// the last stage's share of a fluid; a giant of time S leaves nothing), the table against the exact solve, and
// validity against discrete lists: random other microbatches around the giants (and growth of the giants), kept
// within S by one_f_one_b_chain_floor, never add up to more than the room.
TEST(Pipeline, ChainRoomBoundsTheOtherWorkAroundGiants) {
  EXPECT_NEAR(solve::ChainRoom(1)(0.3, 1.0), 0.7, 1e-9);
  EXPECT_NEAR(solve::ChainRoom(1).exact(std::vector<double>{0.2, 0.3}, 1.0), 0.5, 1e-9);
  for (int pp : {2, 4, 8}) {
    const solve::ChainRoom room(pp);
    EXPECT_NEAR(room(0.0, 1.0), pp * 1.0, 1e-9) << pp;
    EXPECT_NEAR(room(2.0, 2.0), 0.0, 1e-9) << pp;
    EXPECT_LT(room(2.1, 2.0), 0.0) << pp;
    EXPECT_LE(room(0.5, 1.0), 3.0 * pp * 0.5 + 1e-9) << pp;  // the first cut
    for (double tau = 0.0; tau <= 1.0; tau += 0.0371) {
      bool optimal = false;
      const double exact = room.exact(std::vector<double>{tau * 3.0}, 3.0, &optimal);
      EXPECT_TRUE(optimal) << pp << " " << tau;
      EXPECT_GE(room(tau * 3.0, 3.0), exact - 1e-9) << pp << " " << tau;        // the table is an upper bound
      EXPECT_LE(room(tau * 3.0, 3.0), exact + 1e-3 * 3.0) << pp << " " << tau;  // and a close one
    }
  }
  EXPECT_THROW(solve::ChainRoom(0), InvalidArgument);
  EXPECT_THROW(solve::ChainRoom(2).exact(std::vector<double>{}, 1.0), InvalidArgument);
  EXPECT_THROW(solve::ChainRoom(2).exact(std::vector<double>(9, 0.1), 1.0), InvalidArgument);
  std::vector<solve::ChainRoom> rooms;
  for (int pp = 0; pp < 8; ++pp) rooms.emplace_back(std::max(pp, 1));
  std::mt19937_64 rng(41);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int near = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int pp = 2 + static_cast<int>(rng() % 6), j = 1 + static_cast<int>(rng() % 3);
    std::vector<double> giants(static_cast<std::size_t>(j));
    for (double& g : giants) g = 0.2 + 2.0 * u(rng);
    const double S = solve::one_f_one_b_chain_floor(giants, pp) * (1.0 + 0.6 * u(rng));
    const double room = rooms[static_cast<std::size_t>(pp)](giants, S);
    // a random list: giants (some grown) in order, other microbatches in the gaps
    std::vector<double> list;
    double other = 0.0;
    const double scale = 0.05 + 0.6 * u(rng);
    for (int i = 0; i <= j; ++i) {
      for (int k = static_cast<int>(rng() % 4); k > 0; --k) list.push_back(scale * u(rng)), other += list.back();
      if (i < j) {
        const double grow = rng() % 3 == 0 ? scale * u(rng) : 0.0;
        list.push_back(giants[static_cast<std::size_t>(i)] + grow), other += grow;
      }
    }
    if (solve::one_f_one_b_chain_floor(list, pp) > S) continue;
    EXPECT_LE(other, room + 1e-9) << "trial " << trial << " pp " << pp;
    if (other > 0.5 * room) ++near;
  }
  EXPECT_GT(near, 20);  // lists come close to the room: a bound far above every list would say little
}

// The tabulated optimal split sums to m (3 decimals) and reaches h(m, pp) to within the rounding; its first
// microbatch is its lightest part of the rise. Outside the table: equal sizes.
TEST(Pipeline, OneFOneBProfileReachesTheFloor) {
  for (int pp = 2; pp <= 16; ++pp)
    for (int m = 1; m <= 32; ++m) {
      const std::vector<double> x = solve::one_f_one_b_profile(m, pp);
      ASSERT_EQ(x.size(), static_cast<std::size_t>(m));
      EXPECT_NEAR(std::accumulate(x.begin(), x.end(), 0.0), m, 2e-3 * m) << "pp " << pp << " m " << m;
      for (double v : x) EXPECT_GE(v, 0.0);
      const double h = solve::one_f_one_b_floor(m, pp), got = solve::one_f_one_b_makespan(x, pp) * pp / m;
      EXPECT_GE(got, h * (1 - 2e-3)) << "pp " << pp << " m " << m;
      EXPECT_LE(got, h * (1 + 2e-3)) << "pp " << pp << " m " << m;
      if (m > pp) EXPECT_LT(x.front(), 1.0) << "pp " << pp << " m " << m;
    }
  EXPECT_EQ(solve::one_f_one_b_profile(33, 4), std::vector<double>(33, 1.0));
  EXPECT_EQ(solve::one_f_one_b_profile(5, 1), std::vector<double>(5, 1.0));
  EXPECT_THROW(solve::one_f_one_b_profile(0, 4), InvalidArgument);
}

namespace {
using dynacp::testing::make_cluster;

/// Checks the unit structure of a profile_units plan with no giants: every group lies inside one block of `width`
/// ranks at a multiple of width, on an aligned piece of it (width / 2^k ranks), and every rank of a block takes part in
/// the same slots (so blocks share no group and each runs one list).
void expect_units(const Plan& p, int P, int width, const std::string& where) {
  std::vector<std::vector<int>> slots_of(static_cast<std::size_t>(P));
  for (std::size_t j = 0; j < p.microbatches.size(); ++j)
    for (const auto& g : p.microbatches[j]) {
      const int d = g.degree(), r0 = g.ranks.front();
      EXPECT_EQ(width % d, 0) << where;
      EXPECT_EQ((width / d) & (width / d - 1), 0) << where;  // a power-of-two piece
      EXPECT_EQ(r0 % d, 0) << where;
      EXPECT_EQ(r0 / width, g.ranks.back() / width) << where;
      for (int k = 0; k < d; ++k) EXPECT_EQ(g.ranks[static_cast<std::size_t>(k)], r0 + k) << where;
      for (int r : g.ranks) slots_of[static_cast<std::size_t>(r)].push_back(static_cast<int>(j));
    }
  for (int r = 0; r < P; ++r)
    EXPECT_EQ(slots_of[static_cast<std::size_t>(r)], slots_of[static_cast<std::size_t>(r / width * width)]) << where;
}
}  // namespace

// The units family (profile_units): by hand on tiny cases, then on random batches: valid plans of whole units, one
// count under equal counts, giants alone on blocks at the end of the pool, declines where it does not apply, and
// dynacp keeps the family as a candidate (it is never slower than a units plan and wins some batches with it).
TEST(Pipeline, ProfileUnits) {
  const CostModel cost;
  const Cluster cl = make_cluster(8, 4, 16384, cost);
  // one sequence: one microbatch on the first unit
  const Plan one = solve::profile_units(Batch({1000}), make_cluster(2, 2, 16384, cost), cost, 2, 2, false);
  ASSERT_EQ(one.microbatches.size(), 1u);
  EXPECT_EQ(one.microbatches[0], (std::vector<Group>{{{0, 1}, {0}}}));
  // two units of 4: the two sequences go one to each, alone (a single sequence cannot be split into halves)
  const Plan two = solve::profile_units(Batch({9000, 9000}), cl, cost, 4, 2, false);
  ASSERT_EQ(two.microbatches.size(), 1u);
  EXPECT_EQ(two.microbatches[0], (std::vector<Group>{{{0, 1, 2, 3}, {0}}, {{4, 5, 6, 7}, {1}}}));
  // declines: width 3 divides no node; 40,000 tokens need 3 ranks' memory, more than units of 2
  EXPECT_TRUE(solve::profile_units(Batch({100, 200}), cl, cost, 3, 4, false).microbatches.empty());
  EXPECT_TRUE(solve::profile_units(Batch({40000, 200}), cl, cost, 2, 4, false).microbatches.empty());
  EXPECT_THROW(solve::profile_units(Batch({100}), cl, cost, 0, 4, false), InvalidArgument);
  EXPECT_THROW(solve::profile_units(Batch({100}), cl, cost, 2, 4, false, -1), InvalidArgument);
  // a giant: the 40,000-token sequence alone on a block of the node-aligned sizes (4 or 8 ranks) at the end; a
  // target above twice its best time says it is no giant
  std::vector<std::int64_t> lengths{40000};
  for (int i = 0; i < 30; ++i) lengths.push_back(500 + 97 * i);
  const Batch with_giant(lengths);
  const double lb = lower_bound(with_giant, cl, cost, PlanOptions{.strategy = "dynacp", .pp = 2});
  const Plan giant = solve::profile_units(with_giant, cl, cost, 2, 2, false, 1, lb);
  ASSERT_FALSE(giant.microbatches.empty());
  ASSERT_NO_THROW(giant.validate(with_giant, cl, cost));
  int giant_slots = 0;
  for (const auto& slot : giant.microbatches)
    for (const auto& g : slot)
      if (std::find(g.sequences.begin(), g.sequences.end(), 0) != g.sequences.end()) {
        ++giant_slots;
        EXPECT_EQ(g.ranks.back(), 7);
        EXPECT_EQ(g.degree() % 4, 0);
      }
  EXPECT_EQ(giant_slots, 1);
  EXPECT_TRUE(solve::profile_units(with_giant, cl, cost, 2, 2, false, 1, 100.0).microbatches.empty());

  std::mt19937_64 rng(33);
  auto random_batch = [&rng](int n) {  // lognormal lengths (median about 3K), clamped to 16..30,000
    std::lognormal_distribution<double> logn(8.0, 1.0);
    std::vector<std::int64_t> ls;
    for (int i = 0; i < n; ++i) ls.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(logn(rng)), 16, 30000));
    return Batch(ls);
  };
  int won = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const int P = trial % 3 ? 16 : 8, pp = 2 + 2 * (trial % 2);
    const Cluster c = make_cluster(P, 8, 16384, cost);
    const Batch b = random_batch(6 * P);
    PlanOptions o;
    o.strategy = "dynacp";
    o.pp = pp;
    o.count_policy = trial % 4 == 3 ? CountPolicy::Equal : CountPolicy::Variable;
    o.tight_bound = false;  // step times only (the plans are the same either way)
    const double best = plan(b, c, cost, o).predicted.step_time;
    for (int w : {2, 4, 8}) {
      const std::string where = "trial " + std::to_string(trial) + " w " + std::to_string(w);
      const Plan p = solve::profile_units(b, c, cost, w, pp, o.count_policy == CountPolicy::Equal);
      if (p.microbatches.empty()) {
        EXPECT_LT(w, 4) << where;  // only a sequence over 2 ranks' capacity declines
        continue;
      }
      ASSERT_NO_THROW(p.validate(b, c, cost)) << where;
      expect_units(p, P, w, where);
      const std::vector<int> n = p.microbatch_counts(P);
      if (o.count_policy == CountPolicy::Equal)
        for (int k : n) EXPECT_EQ(k, n.front()) << where;
      const double step = predict(p, b, c, cost, o).step_time;
      EXPECT_LE(best, step * (1 + 1e-12)) << where;
      if (std::abs(best - step) <= 1e-12 * step) ++won;
    }
  }
  EXPECT_GT(won, 0);
  // interleaving: every unit's count a multiple of pp, and dynacp (vpp = 2) never slower than the units plan
  int interleaved = 0;
  for (int trial = 0; trial < 8; ++trial) {
    const int P = 16, pp = 2 + 2 * (trial % 2);
    const Cluster c = make_cluster(P, 8, 16384, cost);
    const Batch b = random_batch(8 * P);
    PlanOptions o;
    o.strategy = "dynacp";
    o.pp = pp;
    o.vpp = 2;
    o.tight_bound = false;
    const double best = plan(b, c, cost, o).predicted.step_time;
    for (int w : {2, 4, 8}) {
      const std::string where = "interleaved trial " + std::to_string(trial) + " w " + std::to_string(w);
      const Plan p = solve::profile_units(b, c, cost, w, pp, false, 0, 0.0, 2);
      if (p.microbatches.empty()) continue;
      ++interleaved;
      ASSERT_NO_THROW(p.validate(b, c, cost)) << where;
      expect_units(p, P, w, where);
      for (int k : p.microbatch_counts(P)) EXPECT_EQ(k % pp, 0) << where;
      EXPECT_LE(best, predict(p, b, c, cost, o).step_time * (1 + 1e-12)) << where;
    }
  }
  EXPECT_GT(interleaved, 12);
}

// Two half-pool rings share a slot, then the private microbatches, then a full-pool ring. No order of the three
// slots is as fast as letting ranks 0-1 run their ring after the full-pool one while ranks 2-3 keep theirs first,
// which only a move of one ring past the other half's (reorder_rings) reaches. Every rank keeps its groups.
// Rank classes (same list length, same wide rings by place) take one permutation each: two pairs of ranks, each
// with a ring of its own and two one-rank groups, start in the worst slot order; the polish reaches the best of all
// slot orders (a symmetric case, where that is the best per-class order), keeps every rank's groups, and leaves a
// plan it cannot better (one group per rank) as it was.
TEST(Pipeline, ClassOrderPolishReachesTheBestOrder) {
  CostModel cost;
  const Cluster cl = make_cluster(4, 4, 65536, cost);
  Batch b;
  b.lengths = {60000, 60000, 3000, 3000, 3000, 3000, 14000, 14000, 14000, 14000};
  const std::vector<std::vector<Group>> slots = {{Group{{0, 1}, {0}}, Group{{2, 3}, {1}}},
                                                 {Group{{0}, {2}}, Group{{1}, {3}}, Group{{2}, {4}}, Group{{3}, {5}}},
                                                 {Group{{0}, {6}}, Group{{1}, {7}}, Group{{2}, {8}}, Group{{3}, {9}}}};
  PlanOptions plain;
  plain.pp = 4;
  PlanOptions o = plain;
  o.score = [&](const Plan& p) { return predict(p, b, cl, cost, plain).step_time; };
  Plan start;  // the worst slot order
  double t = 0.0, best = std::numeric_limits<double>::infinity();
  std::vector<int> perm = {0, 1, 2};
  do {
    Plan p;
    p.strategy = "hand", p.num_ranks = 4;
    for (int k : perm) p.microbatches.push_back(slots[static_cast<std::size_t>(k)]);
    const double s = solve::score(p, b, cl, cost, o);
    best = std::min(best, s);
    if (s > t) t = s, start = p;
  } while (std::next_permutation(perm.begin(), perm.end()));
  ASSERT_LT(best, t * 0.99);
  const Plan polished = solve::reorder_classes(start, &t, b, cl, cost, o);
  polished.validate(b, cl, cost);
  EXPECT_NEAR(t, best, 1e-12);
  EXPECT_NEAR(solve::score(polished, b, cl, cost, o), t, 1e-12);
  EXPECT_EQ(polished.microbatch_counts(4), start.microbatch_counts(4));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(sequences_on(polished, r), sequences_on(start, r)) << "rank " << r;
  }
  Plan one;
  one.strategy = "hand", one.num_ranks = 4, one.microbatches = {slots[1]};
  double t1 = solve::score(one, b, cl, cost, o);
  EXPECT_EQ(solve::reorder_classes(one, &t1, b, cl, cost, o).digest(), one.digest());
}

// The class and ring order polish score several moves at once when given a parallel-for (the solve's threads): the
// plan and its score must be the ones the one-at-a-time loop reaches. The parallel-for here runs its tasks in reverse
// order on the calling thread, so a result that depended on which task ran first would show.
TEST(Pipeline, ClassAndRingPolishAreTheSameWhenMovesAreScoredTogether) {
  CostModel cost;
  std::mt19937_64 rng(20261202);
  std::lognormal_distribution<double> len(7.2, 1.1);
  const solve::ParallelFor backwards = [](std::size_t n, const std::function<void(std::size_t)>& f) {
    for (std::size_t i = n; i-- > 0;) f(i);
  };
  int moved = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const Cluster cl = make_cluster(trial % 2 ? 16 : 8, 4, 8192, cost);
    Batch b;
    for (int i = 0; i < 30 + trial; ++i)
      b.lengths.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(len(rng)), 64, 20000));
    PlanOptions o;
    o.strategy = trial % 3 ? "packing" : "fcp";
    o.pp = trial % 2 ? 4 : 2;
    o.tight_bound = false;  // predict's bound is not what is compared; the cover term would dominate the test's time
    const Plan start = plan(b, cl, cost, o);
    PlanOptions scored = o;
    scored.score = [&](const Plan& p) { return predict(p, b, cl, cost, o).step_time; };
    for (int threads : {2, 3}) {
      scored.threads = threads;
      double t_serial = solve::score(start, b, cl, cost, scored), t_parallel = t_serial;
      const Plan serial = solve::reorder_classes(start, &t_serial, b, cl, cost, scored);
      const Plan parallel = solve::reorder_classes(start, &t_parallel, b, cl, cost, scored, backwards);
      ASSERT_EQ(serial.digest(), parallel.digest()) << "trial " << trial << ", threads " << threads;
      ASSERT_EQ(t_serial, t_parallel);
      const Plan rings_serial = solve::reorder_rings(serial, t_serial, b, cl, cost, scored);
      const Plan rings_parallel = solve::reorder_rings(parallel, t_parallel, b, cl, cost, scored, backwards);
      ASSERT_EQ(rings_serial.digest(), rings_parallel.digest()) << "trial " << trial << ", threads " << threads;
      moved += rings_serial.digest() != start.digest();
    }
  }
  EXPECT_GT(moved, 3);  // the polish moved something often enough for the comparison to mean something
}

TEST(Pipeline, RingOrderPolishPassesOtherRanksRings) {
  CostModel cost;
  const Cluster cl = make_cluster(4, 4, 65536, cost);
  Batch b;
  b.lengths = {24000, 16000, 48000, 4000, 4000, 4000, 16000};
  const Group ring_a{{0, 1}, {0}}, ring_b{{2, 3}, {1}}, ring_all{{0, 1, 2, 3}, {2}};
  const std::vector<std::vector<Group>> slots = {
      {ring_a, ring_b}, {Group{{0}, {3}}, Group{{1}, {4}}, Group{{2}, {5}}, Group{{3}, {6}}}, {ring_all}};
  PlanOptions plain;
  plain.pp = 4;
  PlanOptions o = plain;  // scored by the pipeline simulator, as plan() does
  o.score = [&](const Plan& p) { return predict(p, b, cl, cost, plain).step_time; };
  Plan best;
  double best_t = std::numeric_limits<double>::infinity();
  std::vector<int> perm = {0, 1, 2};
  do {
    Plan p;
    p.strategy = "hand", p.num_ranks = 4;
    for (int k : perm) p.microbatches.push_back(slots[static_cast<std::size_t>(k)]);
    p.validate(b, cl, cost);
    if (const double t = solve::score(p, b, cl, cost, o); t < best_t) best_t = t, best = p;
  } while (std::next_permutation(perm.begin(), perm.end()));
  const Plan polished = solve::reorder_rings(best, best_t, b, cl, cost, o);
  polished.validate(b, cl, cost);
  const double t = solve::score(polished, b, cl, cost, o);
  EXPECT_LT(t, best_t * 0.99);  // 1.0979 s against 1.1611 s for the best slot order
  EXPECT_EQ(polished.microbatch_counts(4), best.microbatch_counts(4));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(sequences_on(polished, r), sequences_on(best, r)) << "rank " << r;
  }
  // nothing to move: one slot comes back as it was
  Plan one;
  one.strategy = "hand", one.num_ranks = 4;
  one.microbatches = {{Group{{0, 1, 2, 3}, {0}}}};  // sequence 0 of `single` (ring_all names id 2: out of range)
  Batch single;
  single.lengths = {48000};
  one.validate(single, cl, cost);
  PlanOptions o1 = plain;
  o1.score = [&](const Plan& p) { return predict(p, single, cl, cost, plain).step_time; };
  const Plan same = solve::reorder_rings(one, solve::score(one, single, cl, cost, o1), single, cl, cost, o1);
  EXPECT_EQ(same.digest(), one.digest());
}

namespace {

// Two single-sequence units on P = 4 ranks with the given fastest times per degree (index d = 0..4, infinite below
// the least degree), never in one group, and no other work: the cover term alone.
double two_unit_cover(const std::vector<double>& t, int pp) {
  const int P = 4;
  const double inf = std::numeric_limits<double>::infinity();
  dynacp::Cluster cluster;
  cluster.num_ranks = P;
  cluster.ranks_per_node = P;
  dynacp::solve::GiantShares shares;
  shares.time = {std::vector<double>(P + 1, inf), t, t, std::vector<double>(P + 1, inf)};
  shares.hid.assign(4, std::vector<double>(P + 1, 0.0));
  shares.load = shares.time;
  auto other = [&](double) {
    dynacp::solve::OtherWork w;
    w.capacity = 1e9;    // C(S): the most other work a rank may run
    w.budget = P * 1e9;  // P C(S) - W', with no other work W'
    w.loss.assign(4, std::vector<double>(P + 2, 0.0));
    return w;
  };
  return dynacp::solve::cover_term(cluster, pp, 2, other, 0.0, dynacp::solve::ChainRoom(pp), shares);
}

}  // namespace

// Rings of 3 of 4 ranks cannot sit apart, so they share a rank and run one after the other there: the term is the
// chain floor of their fastest times (found by bisection, within 1e-4 below it), not their longest time alone.
TEST(Cover, RingsTooWideToSitApartChain) {
  const double inf = std::numeric_limits<double>::infinity();
  const double floor = dynacp::solve::one_f_one_b_chain_floor(std::vector<double>{0.9, 0.9}, 2);
  ASSERT_NEAR(floor, 1.35, 1e-12);  // two microbatches of 0.9 s on 2 stages: 3 (f + b) = 3 * 0.45
  const double cover = two_unit_cover({inf, inf, inf, 1.0, 0.9}, 2);
  EXPECT_LE(cover, floor);
  EXPECT_GE(cover, floor * (1 - 1e-4));
}

// Rings of 2 of 4 ranks sit apart at 1.0 s each, sooner than sharing a rank (1.35 s at their fastest 0.9 s).
TEST(Cover, RingsThatFitApartRunSideBySide) {
  const double inf = std::numeric_limits<double>::infinity();
  const double cover = two_unit_cover({inf, inf, 1.0, 0.95, 0.9}, 2);
  EXPECT_LE(cover, 1.0);
  EXPECT_GE(cover, 1.0 - 1.35e-4);
}

// Bell numbers, each partition once, every block non-empty and the blocks covering all items.
TEST(Cover, SetPartitionsAreEveryGroupingOnce) {
  const int bell[] = {1, 1, 2, 5, 15, 52, 203, 877};
  for (int k = 0; k <= 7; ++k) {
    const auto parts = dynacp::solve::set_partitions(k);
    EXPECT_EQ(static_cast<int>(parts.size()), bell[k]) << k;
    std::set<std::vector<int>> seen;
    for (auto blocks : parts) {
      int all = 0;
      for (int m : blocks) {
        EXPECT_TRUE(m != 0 && (all & m) == 0);
        all |= m;
      }
      EXPECT_EQ(all, (1 << k) - 1);
      std::sort(blocks.begin(), blocks.end());
      EXPECT_TRUE(seen.insert(blocks).second);
    }
  }
  EXPECT_EQ(dynacp::solve::set_partitions(3).front(), std::vector<int>{7});  // all in one block first
}
