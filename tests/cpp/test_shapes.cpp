// Static shapes (CUDA-graph mode, issue 35): bucket_of, validation messages, the padding price, the sequence split
// and dynacp planning under the shapes.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "dynacp/api/planner.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/model/shapes.hpp"
#include "dynacp/solve/blocks/shapes.hpp"

using namespace dynacp;

namespace {
Cluster pool(int P, std::int64_t cap) {
  Cluster c;
  c.num_ranks = P;
  c.ranks_per_node = std::min(P, 8);
  c.tokens_per_rank = cap;
  return c;
}

StaticShapes four_buckets() {
  StaticShapes s;
  s.token_buckets = {1024, 2048, 4096, 8192};
  s.cp_sizes = {1, 2, 4, 8};
  s.max_microbatches = 8;
  return s;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(StaticShapes, BucketOf) {
  const StaticShapes s = four_buckets();
  EXPECT_EQ(s.bucket_of(1), 1024);
  EXPECT_EQ(s.bucket_of(1024), 1024);
  EXPECT_EQ(s.bucket_of(1025), 2048);
  EXPECT_EQ(s.bucket_of(8192), 8192);
  EXPECT_NE(message_of([&] { s.bucket_of(8193); }).find("8193 rows per rank exceed the largest"), std::string::npos);
  EXPECT_EQ(StaticShapes{}.bucket_of(77), 77);
  EXPECT_TRUE(s.enabled());
  EXPECT_FALSE(StaticShapes{}.enabled());
}

TEST(StaticShapes, ValidationNamesTheField) {
  const Cluster c = pool(16, 8192);
  const CostModel cost;
  StaticShapes s = four_buckets();
  s.validate(c, cost);
  s.token_buckets = {1024, 1024};
  EXPECT_NE(message_of([&] { s.validate(c, cost); }).find("token_buckets must be strictly ascending"),
            std::string::npos);
  s.token_buckets = {16384};
  EXPECT_NE(message_of([&] { s.validate(c, cost); }).find("exceeds the token capacity of 8192"), std::string::npos);
  s = four_buckets();
  s.cp_sizes = {1, 3};
  EXPECT_NE(message_of([&] { s.validate(c, cost); }).find("cp_sizes[1] is 3 ranks"), std::string::npos);
  s.cp_sizes = {2};
  EXPECT_NE(message_of([&] { s.validate(c, cost); }).find("must include 1"), std::string::npos);
}

TEST(StaticShapes, InfeasibleShapesNameTheNumbers) {
  const Cluster c = pool(16, 8192);
  const CostModel cost;
  StaticShapes s = four_buckets();
  Batch b;
  b.lengths = {70000};  // 8 ranks x 8192 rows hold 65,536 tokens of one sequence
  EXPECT_NE(message_of([&] { s.check_feasible(b, c, cost); }).find("sequence 0 has 70000 tokens"), std::string::npos);
  s.max_microbatches = 1;
  b.lengths.assign(17, 8000);  // 136,000 tokens > 16 x 1 x 8192
  EXPECT_NE(message_of([&] { s.check_feasible(b, c, cost); }).find("hold at most 131072"), std::string::npos);
}

TEST(StaticShapes, PaddingIsLinearWorkAndRingTraffic) {
  const Cluster c = pool(8, 8192);
  const CostModel cost;
  const StaticShapes s = four_buckets();
  Batch b;
  b.lengths = {3000};
  const std::vector<GroupStats> single = single_stats(b, cost);
  // On 2 ranks: 1500 rows per rank, bucket 2048: (2048 - 1500) x 2 = 1096 padding tokens.
  const Group g{{0, 1}, {0}};
  GroupStats want = single[0];
  want.tokens = 3000 + 1096;
  EXPECT_EQ(s.priced(single[0], 1500, 2).tokens, 4096);
  EXPECT_EQ(s.priced(single[0], 1500, 2).weighted_sq, single[0].weighted_sq);  // no attention work
  EXPECT_DOUBLE_EQ(s.group_time(cost, g, single, b, c), cost.time(want, 2, false, c));
  Plan p;
  p.num_ranks = 8;
  p.microbatches = {{g}};
  EXPECT_DOUBLE_EQ(s.padding_fraction(p, b, c), 1096.0 / 4096.0);
}

TEST(StaticShapes, SplitSequencesKeepsRanksAndAddsASlot) {
  const Cluster c = pool(8, 8192);
  StaticShapes s;
  s.max_sequences = 2;
  Batch b;
  b.lengths = {10, 400, 30, 200, 50};
  Plan p;
  p.num_ranks = 8;
  p.microbatches = {{Group{{0}, {0, 1, 2, 3, 4}}}};
  const Plan q = solve::split_sequences(p, b, c, s);
  // LPT by rows onto 3 parts of at most 2: 400 | 200 | 50, then 30 -> part 2 (50), 10 -> part 1 (200).
  ASSERT_EQ(q.microbatches.size(), 3u);
  EXPECT_EQ(q.microbatches[0][0], (Group{{0}, {1}}));
  EXPECT_EQ(q.microbatches[1][0], (Group{{0}, {0, 3}}));
  EXPECT_EQ(q.microbatches[2][0], (Group{{0}, {2, 4}}));
}

TEST(StaticShapes, DynacpPlansUnderTheShapes) {
  const Cluster c = pool(16, 8192);
  const CostModel cost;
  Batch b;
  for (int i = 0; i < 60; ++i) b.lengths.push_back(100 + (i * 7919) % 20000);
  PlanOptions o;
  o.strategy = "dynacp";
  o.threads = 1;
  o.static_shapes = four_buckets();
  o.static_shapes.max_sequences = 3;
  const Plan p = plan(b, c, cost, o);
  o.static_shapes.check_plan(p, b, c);
  EXPECT_GT(p.predicted.padding_fraction, 0.0);
  o.strategy = "fcp";
  EXPECT_NE(message_of([&] { plan(b, c, cost, o); }).find("strategy fcp cannot plan under static_shapes"),
            std::string::npos);
}
