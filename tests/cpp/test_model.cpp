// Cost model, calibration, batch/cluster validation and the plan invariants.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "dynacp/model/calibrate.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/model/log.hpp"
#include "dynacp/model/plan.hpp"

using namespace dynacp;

namespace {
Cluster small_cluster() {
  Cluster c;
  c.num_ranks = 8;
  c.ranks_per_node = 4;
  c.activation_budget = 1000.0;
  c.intra_node_bandwidth = 100.0;
  c.inter_node_bandwidth = 10.0;
  c.intra_node_latency = 1.0;
  c.inter_node_latency = 2.0;
  return c;
}
CostModel unit_cost() {
  CostModel m;
  m.attn_coef = 1.0;
  m.linear_coef = 10.0;
  m.group_overhead = 5.0;
  m.kv_bytes_per_token = 2.0;
  m.mem_per_token = 10.0;  // capacity 100 tokens per rank
  m.mem_static = 0.0;
  return m;
}
// piece_minima of h from degree 1 equals a brute-force scan of each piece (ties: the smaller degree).
void expect_scanned_minima(const CostModel& m, const GroupStats& h, const Cluster& c) {
  const auto arg = m.piece_minima(h, 1, c);
  for (int k = 0; k < 2; ++k) {
    const int lo = k == 0 ? 1 : c.ranks_per_node + 1, hi = k == 0 ? c.ranks_per_node : c.num_ranks;
    int want = lo;
    for (int d = lo + 1; d <= hi; ++d)
      if (m.time(h, d, c) < m.time(h, want, c)) want = d;
    EXPECT_EQ(arg[static_cast<std::size_t>(k)], want);
  }
}
}  // namespace

TEST(CostModel, HandComputedTimes) {
  const Cluster c = small_cluster();
  const CostModel m = unit_cost();
  GroupStats g;
  g.add(10, m.causal_factor);  // 0.5 * 100 = 50 weighted s^2
  g.add(20, m.full_factor);    // 400
  // d = 1: (450 + 10*30)/1 + 5 = 755, no communication
  EXPECT_DOUBLE_EQ(m.time(g, 1, c), 755.0);
  // d = 3 intra: compute = 750/3 + 5 = 255; attn = 150; comm = 2 * (1 + 10*2/100) = 2.4; T = 255 + 2.4 - 2.4
  EXPECT_DOUBLE_EQ(m.comm_time(g, 3, false, c), 2.4);
  EXPECT_DOUBLE_EQ(m.time(g, 3, false, c), 255.0);
  // d = 5 crosses (5 > 4 per node): comm = 4 * (2 + 6*2/10) = 12.8, attn = 90: T = 150 + 5 + 12.8 - 12.8
  EXPECT_DOUBLE_EQ(m.time(g, 5, c), 155.0);
  // communication-bound: make attention tiny so the ring exchange is exposed
  CostModel lin = m;
  lin.attn_coef = 0.001;
  const double comm = lin.comm_time(g, 5, true, c);
  EXPECT_NEAR(lin.time(g, 5, c), lin.compute_time(g, 5) + comm - lin.attn_time(g, 5), 1e-12);
  EXPECT_EQ(m.token_capacity(c), 100);
  EXPECT_EQ(m.min_degree(100, c), 1);
  EXPECT_EQ(m.min_degree(101, c), 2);
  // 10 and 20 tokens on 3 ranks pad to multiples of 2 x 3 = 6: 12 + 24 tokens, 4 + 8 = 12 rows per rank
  const Batch b10_20({10, 20});
  EXPECT_EQ(group_rows(b10_20, c, std::vector<std::int64_t>{0, 1}, 3), 12);
  EXPECT_DOUBLE_EQ(m.memory(12), 10.0 * 12);
}

// One sequence's least degree once padded, k * ceil(s / (k d)) <= cap, against brute force over degrees.
TEST(CostModel, MinDegreeOfOnePaddedSequence) {
  CostModel m = unit_cost();
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 4000; ++trial) {
    Cluster c;
    c.num_ranks = 64, c.ranks_per_node = 8;
    c.seq_pad_multiple = 1 + static_cast<int>(rng() % 4);
    c.activation_budget = m.mem_static + static_cast<double>(8 + rng() % 200) * m.mem_per_token;
    const std::int64_t cap = m.token_capacity(c);
    const auto s = static_cast<std::int64_t>(rng() % 400);
    int d1 = 1;
    while (c.padded_rows(s, d1) > cap) ++d1;
    ASSERT_EQ(m.min_degree(s, c), d1) << "s=" << s << " cap=" << cap << " k=" << c.seq_pad_multiple;
  }
  Cluster bad;
  bad.seq_pad_multiple = 0;
  EXPECT_THROW(bad.validate(), InvalidArgument);
}

TEST(CostModel, RejectsBadCoefficients) {
  CostModel m = unit_cost();
  m.attn_coef = -1;
  EXPECT_THROW(m.validate(), InvalidArgument);
  m = unit_cost();
  m.linear_coef = std::nan("");
  try {
    m.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("linear_coef"), std::string::npos);
  }
  m = unit_cost();
  m.mem_per_token = 0;
  EXPECT_THROW(m.validate(), InvalidArgument);
}

TEST(CostModel, ExtendedFormTermsAndScannedMinima) {
  const Cluster c = small_cluster();
  CostModel m = unit_cost();
  EXPECT_FALSE(m.extended());
  GroupStats g;
  g.add(16, 0.5);
  g.add(4, 1.0);
  const double classic = m.time(g, 2, false, c);
  m.doc_overhead = 1.0, m.doc_hop_overhead = 2.0, m.doc_solo_overhead = 3.0;
  m.attn_pow_coef = 0.25, m.attn_log_coef = 0.5, m.comm_overlap = 0.5;
  ASSERT_TRUE(m.extended());
  // by hand: pow = 0.5*64 + 8 = 40, log = 0.5*16*4 + 4*2 = 40; attn = (0.5*256 + 16) / 2 = 72;
  // comm = 1 * (1 + 10 * 2 / 100) = 1.2; compute = (144 + 200 + 0.25*40) / 2 + 5 + 0.5*40 + 2*(1 + 2) = 208
  EXPECT_DOUBLE_EQ(m.time(g, 2, false, c), 208.0 + 1.2 - 0.5 * 1.2);
  EXPECT_GT(m.time(g, 2, false, c), classic);
  // one rank: the solo floor, no hops, no exchange
  EXPECT_DOUBLE_EQ(m.time(g, 1, false, c), 144.0 + 200.0 + 10.0 + 5.0 + 20.0 + 2 * (1.0 + 3.0));
  // work: what one sequence costs at least in rank-seconds besides c
  EXPECT_DOUBLE_EQ(m.work(16, Mask::Causal), 0.5 * 256 + 160 + 0.5 * (0.25 * 64 + 0.5 * 64) + 1.0);
  // piece_minima scans every degree under the extended form: compare with a brute-force scan
  std::mt19937_64 rng(5);
  for (int it = 0; it < 200; ++it) {
    m.doc_hop_overhead = std::uniform_real_distribution<double>(0, 40)(rng);
    m.comm_overlap = std::uniform_real_distribution<double>(0, 1)(rng);
    GroupStats h;
    h.add(1 + static_cast<std::int64_t>(rng() % 700), 0.5);
    expect_scanned_minima(m, h, c);
  }
  m.comm_overlap = 1.5;
  EXPECT_THROW(m.validate(), InvalidArgument);
}

// Hop tables: latency and 1/bandwidth interpolated linearly in the ring size between points, clamped outside; an
// empty table reads the Cluster; validate() names a point that is out of order or faster than a smaller ring.
TEST(CostModel, HopTablesInterpolateClampAndValidate) {
  const Cluster c = small_cluster();
  CostModel m = unit_cost();
  GroupStats g;
  g.add(40, 1.0);
  const double before = m.comm_time(g, 3, false, c);
  m.inter_node_hops = {{2.0, 1.0, 20.0}, {6.0, 5.0, 5.0}};
  EXPECT_TRUE(m.has_hop_tables());
  EXPECT_EQ(m.comm_time(g, 3, false, c), before);  // the intra-node link has no table: the Cluster's fields
  EXPECT_DOUBLE_EQ(m.hop_latency(2, true, c), 1.0);
  EXPECT_DOUBLE_EQ(m.hop_latency(4, true, c), 3.0);            // half way from 2 to 6
  EXPECT_DOUBLE_EQ(1.0 / m.hop_bandwidth(4, true, c), 0.125);  // 1/bw half way from 1/20 to 1/5
  EXPECT_DOUBLE_EQ(m.hop_latency(8, true, c), 5.0);            // clamped above the last point
  EXPECT_DOUBLE_EQ(m.hop_bandwidth(1, true, c), 20.0);         // and below the first
  // d = 4 across nodes: 3 hops of (3 + 10 tokens * 2 B * 0.125 s/B) = 3 * 5.5
  EXPECT_DOUBLE_EQ(m.comm_time(g, 4, true, c), 16.5);
  m.validate();
  m.inter_node_hops = {{4.0, 1.0, 20.0}, {2.0, 2.0, 10.0}};
  EXPECT_THROW(m.validate(), InvalidArgument);  // not in increasing size
  m.inter_node_hops = {{2.0, 2.0, 20.0}, {4.0, 1.0, 10.0}};
  EXPECT_THROW(m.validate(), InvalidArgument);  // latency falls with the size
  m.inter_node_hops = {{2.0, 1.0, 10.0}, {4.0, 1.0, 20.0}};
  EXPECT_THROW(m.validate(), InvalidArgument);  // bandwidth rises with the size
  m.inter_node_hops = {{1.5, 1.0, 10.0}};
  EXPECT_THROW(m.validate(), InvalidArgument);  // not an integer ring size >= 2
  m.inter_node_hops = {{2.0, 1.0, 0.0}};
  EXPECT_THROW(m.validate(), InvalidArgument);  // bandwidth must be > 0
  // with a table, piece_minima scans: compare with a brute-force scan over a table that makes T non-unimodal
  m.inter_node_hops = {{5.0, 0.0, 1e9}, {6.0, 400.0, 1e9}, {8.0, 400.0, 1e9}};
  m.intra_node_hops = {{2.0, 0.0, 1e9}, {3.0, 300.0, 1e9}};
  std::mt19937_64 rng(9);
  for (int it = 0; it < 100; ++it) {
    GroupStats h;
    h.add(1 + static_cast<std::int64_t>(rng() % 900), 0.5);
    expect_scanned_minima(m, h, c);
  }
}

// node_overhead: c_node per extra node a ring spans, inside T_comm (so the overlap hides part of it).
TEST(CostModel, NodeOverheadIsPaidPerExtraNodeInsideTheExchange) {
  const Cluster c = small_cluster();  // 4 ranks per node
  CostModel m = unit_cost();
  m.attn_coef = 1e-6;  // the exchange is exposed
  GroupStats g;
  g.add(40, 1.0);
  const double base3 = m.comm_time(g, 3, true, c), base8 = m.comm_time(g, 8, true, c);
  m.node_overhead = 7.0;
  EXPECT_TRUE(m.extended());
  EXPECT_EQ(CostModel::nodes_spanned(3, false, c), 1);
  EXPECT_EQ(CostModel::nodes_spanned(3, true, c), 2);  // a small ring across a node boundary spans 2
  EXPECT_EQ(CostModel::nodes_spanned(8, true, c), 2);
  EXPECT_EQ(CostModel::nodes_spanned(9, true, c), 3);
  EXPECT_DOUBLE_EQ(m.comm_time(g, 3, false, c), unit_cost().comm_time(g, 3, false, c));  // inside a node: none
  EXPECT_DOUBLE_EQ(m.comm_time(g, 3, true, c), base3 + 7.0);
  EXPECT_DOUBLE_EQ(m.comm_time(g, 8, true, c), base8 + 7.0);
  m.comm_overlap = 0.5;
  EXPECT_DOUBLE_EQ(m.time(g, 8, true, c), m.compute_time(g, 8) + (base8 + 7.0) - 0.5 * m.attn_time(g, 8));
  m.node_overhead = -1.0;
  EXPECT_THROW(m.validate(), InvalidArgument);
}

// The scorer's group time from per-sequence stats (merge in member order) is group_time bit for bit, in the classic
// and the extended form, inside a node and across nodes.
TEST(CostModel, GroupTimeFromSingleStatsIsBitIdentical) {
  std::mt19937_64 rng(8);
  const Cluster c = small_cluster();
  for (bool extended : {false, true}) {
    CostModel m;
    if (extended) m.attn_pow_coef = 1e-7, m.attn_log_coef = 2e-7, m.doc_overhead = 1e-4, m.comm_overlap = 0.7;
    Batch b;
    for (int i = 0; i < 40; ++i) b.lengths.push_back(1 + static_cast<std::int64_t>(rng() % 9000));
    for (int i = 0; i < 40; ++i) b.masks.push_back(rng() % 2 ? Mask::Full : Mask::Causal);
    const std::vector<GroupStats> single = single_stats(b, m);
    for (int it = 0; it < 200; ++it) {
      Group g;
      const int d = 1 + static_cast<int>(rng() % static_cast<unsigned>(c.num_ranks));
      for (int r = 0; r < d; ++r) g.ranks.push_back((r * 3 + it) % c.num_ranks);
      std::sort(g.ranks.begin(), g.ranks.end());
      g.ranks.erase(std::unique(g.ranks.begin(), g.ranks.end()), g.ranks.end());
      for (int k = 1 + static_cast<int>(rng() % 6); k > 0; --k)
        g.sequences.push_back(static_cast<std::int64_t>(rng() % 40));
      EXPECT_EQ(m.group_time(g, single, c), m.group_time(g, b, c));
    }
  }
}

TEST(Cluster, RejectsBadShapes) {
  Cluster c = small_cluster();
  c.num_ranks = 0;
  EXPECT_THROW(c.validate(), InvalidArgument);
  c = small_cluster();
  c.ranks_per_node = 3;
  try {
    c.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not divide"), std::string::npos);
  }
  c = small_cluster();
  c.inter_node_bandwidth = 0;
  EXPECT_THROW(c.validate(), InvalidArgument);
}

TEST(Batch, RejectsEmptyAndNonPositive) {
  EXPECT_THROW(Batch(std::vector<std::int64_t>{}).validate(), InvalidArgument);
  try {
    Batch({5, 0, 3}).validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 1"), std::string::npos);
  }
  EXPECT_THROW(Batch({5, 3}, {Mask::Full}).validate(), InvalidArgument);
}

TEST(Calibrate, RecoversKnownCoefficients) {
  CostModel truth = unit_cost();
  truth.attn_coef = 2e-9;
  truth.linear_coef = 3e-6;
  truth.group_overhead = 1e-3;
  std::vector<ComputeSample> samples;
  for (int d : {1, 2, 3, 8})
    for (std::int64_t s : {512, 4096, 32768, 100000}) {
      GroupStats g;
      g.add(s, truth.causal_factor);
      g.add(s / 2, truth.causal_factor);
      samples.push_back({{s, s / 2}, d, truth.compute_time(g, d), Mask::Causal});
    }
  FitReport rep;
  const CostModel fit = fit_compute(CostModel{}, samples, &rep);
  EXPECT_NEAR(fit.attn_coef / truth.attn_coef, 1.0, 1e-6);
  EXPECT_NEAR(fit.linear_coef / truth.linear_coef, 1.0, 1e-6);
  EXPECT_NEAR(fit.group_overhead / truth.group_overhead, 1.0, 1e-6);
  EXPECT_LT(rep.rms_relative_error, 1e-9);
  EXPECT_EQ(rep.samples, 16);
  EXPECT_THROW(fit_compute(CostModel{}, {samples[0]}, nullptr), InvalidArgument);
}

TEST(Calibrate, LinkFit) {
  std::vector<TransferSample> s;
  for (double b : {1e3, 1e5, 1e7, 1e9}) s.push_back({b, 20e-6 + b / 200e9});
  auto [lat, bw] = fit_link(s);
  EXPECT_NEAR(lat, 20e-6, 1e-12);
  EXPECT_NEAR(bw / 200e9, 1.0, 1e-9);
}

TEST(Presets, DefaultEqualsByteScalePresetAndSourcesNameTheirFit) {
  const CostModel p = preset("bytescale-fig6a");
  const CostModel d;
  EXPECT_NEAR(p.attn_coef / d.attn_coef, 1.0, 1e-6);
  EXPECT_NEAR(p.linear_coef / d.linear_coef, 1.0, 1e-6);
  EXPECT_NEAR(p.group_overhead / d.group_overhead, 1.0, 1e-6);
  for (const auto& name : preset_names()) {
    const CostModel m = preset(name);
    EXPECT_EQ(m.name, name);
    EXPECT_FALSE(m.source.empty());
    m.validate();
  }
  EXPECT_NE(preset("h100-distca").source.find("rms relative error"), std::string::npos);
  EXPECT_THROW(preset("nope"), InvalidArgument);
}

TEST(Plan, ValidateCatchesEveryViolation) {
  const Cluster c = small_cluster();
  const CostModel m = unit_cost();
  const Batch b({50, 60, 150});
  Plan p;
  p.strategy = "hand";
  p.num_ranks = 8;
  p.microbatches = {{Group{{0}, {0}}, Group{{1, 2}, {2}}}, {Group{{0}, {1}}}};
  EXPECT_NO_THROW(p.validate(b, c, m));
  EXPECT_EQ(p.microbatches_of(0), 2);
  EXPECT_EQ(p.microbatches_of(3), 0);

  Plan dup = p;
  dup.microbatches[1][0].sequences = {0};
  EXPECT_THROW(dup.validate(b, c, m), InvalidArgument);  // id 0 twice, id 1 missing
  Plan missing = p;
  missing.microbatches.pop_back();
  EXPECT_THROW(missing.validate(b, c, m), InvalidArgument);
  Plan rank_twice = p;
  rank_twice.microbatches[0][1].ranks = {0, 2};
  EXPECT_THROW(rank_twice.validate(b, c, m), InvalidArgument);
  Plan out_of_range = p;
  out_of_range.microbatches[0][0].ranks = {8};
  EXPECT_THROW(out_of_range.validate(b, c, m), InvalidArgument);
  Plan memory = p;
  memory.microbatches[0][1].ranks = {1};  // 150 tokens on one rank, capacity 100
  EXPECT_THROW(memory.validate(b, c, m), InvalidArgument);
  Plan empty = p;
  empty.microbatches[0][0].ranks.clear();
  EXPECT_THROW(empty.validate(b, c, m), InvalidArgument);
}

TEST(Plan, DigestIgnoresTimingsButSeesAssignment) {
  Plan a;
  a.strategy = "x";
  a.num_ranks = 4;
  a.microbatches = {{Group{{0, 1}, {0, 1}}}};
  Plan b = a;
  b.solve_ms = 12.0;
  b.predicted.step_time = 3.0;
  EXPECT_EQ(a.digest(), b.digest());
  b.microbatches[0][0].ranks = {1, 0};
  EXPECT_NE(a.digest(), b.digest());
}

TEST(Cluster, TokensPerRankSetsTheCapacityDirectly) {
  Cluster c = small_cluster();
  const CostModel m = unit_cost();
  EXPECT_EQ(m.token_capacity(c), 100);  // 0 = derived: 1000 B / 10 B per token
  c.tokens_per_rank = 37;
  EXPECT_EQ(m.token_capacity(c), 37);  // set: the byte budget is not read
  c.activation_budget = 1.0;           // would hold no token in bytes
  EXPECT_EQ(m.token_capacity(c), 37);
  EXPECT_EQ(m.min_degree(75, c), 3);
  c.tokens_per_rank = -1;
  try {
    c.validate();
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tokens_per_rank"), std::string::npos);
  }
}

TEST(Log, SilentWithoutSinkAndOneSinkReceivesRecordsAtTheirLevel) {
  EXPECT_EQ(core_log().level(), spdlog::level::off);  // no sink: nothing formatted, nothing printed
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  set_log_sink(sink);
  core_log().debug("solve {}", 1);
  core_log().warn("near capacity");
  const auto got = sink->last_formatted();
  set_log_sink(nullptr);
  core_log().warn("dropped");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[0].find("[debug] solve 1"), std::string::npos);
  EXPECT_NE(got[1].find("[warning] near capacity"), std::string::npos);
  EXPECT_EQ(sink->last_formatted().size(), 2u);
  EXPECT_EQ(core_log().level(), spdlog::level::off);
}
