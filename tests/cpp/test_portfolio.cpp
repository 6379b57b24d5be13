// The dynacp portfolio: its family registry, tuning, threads, time limit and interrupt hook.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>

#include "clusters.hpp"
#include "dynacp/api/planner.hpp"
#include "dynacp/model/error.hpp"

using namespace dynacp;
using dynacp::testing::make_cluster;

namespace {

Batch long_tailed(std::mt19937_64& rng, int n, std::int64_t max_len) {
  std::lognormal_distribution<double> logn(7.5, 1.4);
  Batch b;
  for (int i = 0; i < n; ++i)
    b.lengths.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(logn(rng)), 1, max_len));
  return b;
}

PlanOptions dynacp_options(int pp, int vpp, int threads) {
  PlanOptions o;
  o.strategy = "dynacp";
  o.pp = pp;
  o.vpp = vpp;
  o.threads = threads;
  return o;
}

}  // namespace

TEST(Portfolio, PlansAreBitIdenticalForEveryThreadCount) {
  std::mt19937_64 rng(11);
  CostModel cost;
  for (int trial = 0; trial < 24; ++trial) {
    const int rpn = 1 + static_cast<int>(rng() % 4), P = rpn * (1 + static_cast<int>(rng() % 4));
    const std::int64_t cap = 1024 + static_cast<std::int64_t>(rng() % 4096);
    const Cluster c = make_cluster(P, rpn, cap, cost);
    const Batch b = long_tailed(rng, 8 + static_cast<int>(rng() % 80), cap * P / 2);
    const int pp = trial % 3 == 0 ? 1 : trial % 3 == 1 ? 2 : 4;
    const int vpp = pp > 1 && trial % 4 == 0 ? 2 : 1;
    std::uint64_t first = 0;
    for (int threads : {1, 2, 3, 8}) {
      Plan p;
      try {
        p = plan(b, c, cost, dynacp_options(pp, vpp, threads));
      } catch (const InvalidArgument&) {  // no plan meets vpp's count rule: the same for every thread count
        ASSERT_EQ(threads, 1) << "trial " << trial;
        break;
      }
      if (threads == 1) first = p.digest();
      EXPECT_EQ(p.digest(), first) << "trial " << trial << " threads " << threads;
      EXPECT_FALSE(p.partial);
    }
  }
}

TEST(Portfolio, EveryPlanNamesARegisteredFamily) {
  std::mt19937_64 rng(5);
  CostModel cost;
  const auto names = solve::dynacp_families();
  const Cluster c = make_cluster(16, 4, 4096, cost);
  for (int pp : {1, 4}) {
    const Plan p = plan(long_tailed(rng, 120, 4096 * 8), c, cost, dynacp_options(pp, 1, 1));
    EXPECT_NE(std::find(names.begin(), names.end(), p.family), names.end()) << p.family;
  }
  PlanOptions packing;
  packing.strategy = "packing";
  EXPECT_EQ(plan(long_tailed(rng, 50, 4096), c, cost, packing).family, "");
}

TEST(Portfolio, OnlyTheAnchorsGiveTheBestOtherStrategy) {
  // With every family but the anchors switched off, dynacp returns the fastest of the other strategies' plans.
  std::mt19937_64 rng(9);
  CostModel cost;
  const Cluster c = make_cluster(16, 4, 4096, cost);
  const Batch b = long_tailed(rng, 150, 4096 * 8);
  PlanOptions o = dynacp_options(1, 1, 1);
  for (const auto& f : solve::dynacp_families())
    if (f != "anchors") o.tuning.skip_families.push_back(f);
  o.tuning.local_search.rebalance_solos = false;  // the one-rank rebalance may improve the anchor (tested below)
  const Plan p = plan(b, c, cost, o);
  EXPECT_EQ(p.family, "anchors");
  o.tuning.local_search.rebalance_solos = true;
  const Plan rebalanced = plan(b, c, cost, o);
  double best = 1e300;
  for (const auto& name : solve::strategy_names()) {
    if (name == "dynacp") continue;
    PlanOptions other;
    other.strategy = name;
    best = std::min(best, plan(b, c, cost, other).predicted.step_time);
  }
  EXPECT_DOUBLE_EQ(p.predicted.step_time, best);
  // With the rebalance on (the default), the anchor is kept only where it is not worse: here it moves solo work off
  // the busiest rank.
  EXPECT_LT(rebalanced.predicted.step_time, best);
}

TEST(Portfolio, TimeLimitReturnsAValidPartialPlan) {
  std::mt19937_64 rng(3);
  CostModel cost;
  const Cluster c = make_cluster(64, 8, 16384, cost);
  const Batch b = long_tailed(rng, 512, 16384 * 32);
  PlanOptions o = dynacp_options(4, 1, 1);
  o.time_limit_s = 1e-6;  // expires before the first pipelined family
  const Plan p = plan(b, c, cost, o);
  EXPECT_TRUE(p.partial);
  EXPECT_NO_THROW(p.validate(b, c, cost));
  const Plan full = plan(b, c, cost, dynacp_options(4, 1, 1));
  EXPECT_FALSE(full.partial);
  EXPECT_LE(full.predicted.step_time, p.predicted.step_time * (1 + 1e-12));
}

TEST(Portfolio, AnInterruptStopsTheSolve) {
  std::mt19937_64 rng(4);
  CostModel cost;
  const Cluster c = make_cluster(64, 8, 16384, cost);
  const Batch b = long_tailed(rng, 512, 16384 * 32);
  PlanOptions o = dynacp_options(4, 1, 2);
  int calls = 0;
  o.check_interrupt = [&calls] {
    if (++calls == 3) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(plan(b, c, cost, o), std::runtime_error);
  EXPECT_EQ(calls, 3);  // nothing ran the hook after it threw
}

TEST(Portfolio, BadTuningIsRejectedByName) {
  CostModel cost;
  const Cluster c = make_cluster(8, 4, 4096, cost);
  const Batch b{{100, 2000, 3000}};
  auto message = [&](auto edit) {
    PlanOptions o = dynacp_options(1, 1, 1);
    edit(o);
    try {
      plan(b, c, cost, o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([](PlanOptions& o) { o.tuning.mu_grid = 1; }).find("DynacpTuning.mu_grid"), std::string::npos);
  EXPECT_NE(message([](PlanOptions& o) { o.tuning.ring_targets.clear(); }).find("ring_targets is empty"),
            std::string::npos);
  EXPECT_NE(message([](PlanOptions& o) { o.tuning.skip_families = {"nope"}; }).find("known families: tau-scan"),
            std::string::npos);
  EXPECT_NE(message([](PlanOptions& o) { o.threads = -1; }).find("PlanOptions.threads"), std::string::npos);
  EXPECT_NE(message([](PlanOptions& o) { o.time_limit_s = -1; }).find("time_limit_s"), std::string::npos);
}

TEST(Portfolio, AnotherForwardBackwardSplitMovesTheSimulatorAndKeepsTheBound) {
  std::mt19937_64 rng(21);
  for (double ratio : {1.0, 3.0}) {
    CostModel cost;
    cost.backward_ratio = ratio;
    for (int trial = 0; trial < 12; ++trial) {
      const int rpn = 2 + static_cast<int>(rng() % 3), P = rpn * (1 + static_cast<int>(rng() % 3));
      const std::int64_t cap = 2048 + static_cast<std::int64_t>(rng() % 4096);
      const Cluster c = make_cluster(P, rpn, cap, cost);
      const Batch b = long_tailed(rng, 10 + static_cast<int>(rng() % 60), cap * P / 2);
      for (const auto& name : solve::strategy_names()) {
        PlanOptions o;
        o.strategy = name;
        o.pp = trial % 2 == 0 ? 2 : 4;
        Plan p;
        try {
          p = plan(b, c, cost, o);
        } catch (const Error&) {  // an anchor's pipelined plan that would deadlock
          continue;
        }
        EXPECT_GE(p.predicted.step_time, p.predicted.lower_bound * (1 - 1e-12))
            << name << " ratio " << ratio << " trial " << trial;
      }
    }
  }
  // the split itself: one group of time T on one rank at pp = 2 runs T (forward and backward on both stages)
  CostModel cost;
  cost.backward_ratio = 1.0;
  const Cluster c = make_cluster(1, 1, 4096, cost);
  Plan one;
  one.num_ranks = 1;
  one.microbatches = {{Group{{0}, {0}}}};
  const Batch b{{1000}};
  PlanOptions o;
  o.pp = 2;
  const double T = cost.group_time(one.microbatches[0][0], b, c);
  EXPECT_NEAR(cost.forward_time(T, 2), T / 4, 1e-15);
  EXPECT_NEAR(predict(one, b, c, cost, o).step_time, T, 1e-12);
}

// Part 8: with the inter-node link the faster one, the cross-node family plans on one rank per node and relabels, so
// its rings cross nodes; it is bit-identical for every thread count, and on the usual clusters (inter-node slower)
// it does not run.
TEST(Portfolio, CrossNodeRingsWhenTheInterNodeLinkIsFaster) {
  std::mt19937_64 rng(17);
  CostModel cost;
  int cross_wins = 0;
  for (int trial = 0; trial < 8; ++trial) {
    Cluster c = make_cluster(16, 4, 4096, cost);
    c.intra_node_bandwidth = 5e9, c.inter_node_bandwidth = 20e9;
    const Batch b = long_tailed(rng, 20 + static_cast<int>(rng() % 40), 4096 * 8);
    const int pp = trial % 2 == 0 ? 1 : 2;
    std::uint64_t first = 0;
    for (int threads : {1, 3}) {
      const Plan p = plan(b, c, cost, dynacp_options(pp, 1, threads));
      if (threads == 1) first = p.digest();
      EXPECT_EQ(p.digest(), first) << "trial " << trial;
      if (p.family != "cross-node") continue;
      ++cross_wins;
      for (const auto& slot : p.microbatches)
        for (const auto& g : slot)
          if (g.degree() >= 2) EXPECT_TRUE(c.crosses_nodes(g.ranks)) << "trial " << trial;
    }
    // the family's plan is never worse than the search without it
    PlanOptions without = dynacp_options(pp, 1, 1);
    without.tuning.skip_families = {"cross-node"};
    EXPECT_LE(plan(b, c, cost, dynacp_options(pp, 1, 1)).predicted.step_time,
              plan(b, c, cost, without).predicted.step_time * (1 + 1e-12));
  }
  EXPECT_GT(cross_wins, 0);
  // inter-node slower (the defaults): the family does not apply, so skipping it changes nothing
  const Cluster usual = make_cluster(16, 4, 4096, cost);
  const Batch b = long_tailed(rng, 60, 4096 * 8);
  PlanOptions without = dynacp_options(2, 1, 1);
  without.tuning.skip_families = {"cross-node"};
  EXPECT_EQ(plan(b, usual, cost, dynacp_options(2, 1, 1)).digest(), plan(b, usual, cost, without).digest());
}
