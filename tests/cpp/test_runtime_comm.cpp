// Thread backend, CP group pool and packing codec.
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <numeric>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/codec.hpp"
#include "dynacp/runtime/comm.hpp"
#include "dynacp/runtime/group_pool.hpp"
#include "run_ranks.hpp"

using namespace dynacp::runtime;
using dynacp::testing::run_ranks;

TEST(ThreadComm, GroupedRingExchangeAndCollectives) {
  for (int n : {1, 2, 3, 5}) {
    auto comms = make_thread_comms(n, Millis(5000));
    run_ranks(n, [&](int r) {
      Comm& c = *comms[r];
      EXPECT_EQ(c.rank(), r);
      EXPECT_EQ(c.size(), n);
      int got = -1, mine = 100 + r;
      const P2POp ops[] = {recv_op((r + n - 1) % n, &got, sizeof got), send_op((r + 1) % n, &mine, sizeof mine)};
      c.exchange(ops, "ring");  // recv listed first: grouped ops must still not deadlock
      EXPECT_EQ(got, 100 + (r + n - 1) % n);
      std::int64_t value = r == n - 1 ? (std::int64_t{1} << 40) + 3 : 0;
      c.broadcast(&value, sizeof value, n - 1);
      EXPECT_EQ(value, (std::int64_t{1} << 40) + 3);
      std::vector<int> all(n);
      const int x = r * r;
      c.all_gather(&x, all.data(), sizeof x);
      for (int p = 0; p < n; ++p) EXPECT_EQ(all[p], p * p);
      c.barrier();
    });
  }
}

TEST(ThreadComm, SplitBuildsSubCommunicators) {
  auto comms = make_thread_comms(5, Millis(5000));
  run_ranks(5, [&](int r) {
    // Even ranks form one group ordered by descending rank, odd ranks another, rank 4 opts out.
    const int color = r == 4 ? kNoColor : r % 2;
    auto sub = comms[r]->split(color, -r);
    if (r == 4) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), r < 2 ? 1 : 0);
    int v = r;
    sub->broadcast(&v, sizeof v, 0);
    EXPECT_EQ(v, r % 2 == 0 ? 2 : 3);
  });
}

TEST(ThreadComm, PeerThatNeverSendsTimesOut) {
  auto comms = make_thread_comms(2, Millis(200));
  int buf = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    comms[1]->recv(0, &buf, sizeof buf, "pipeline activations");
    FAIL() << "expected a timeout";
  } catch (const dynacp::Timeout& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("peer 0"), std::string::npos) << what;
    EXPECT_NE(what.find("pipeline activations"), std::string::npos) << what;
    EXPECT_NE(what.find("200 ms"), std::string::npos) << what;
  }
  const auto ms = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 190);
  EXPECT_LT(ms, 2000);
  // Collectives time out too.
  EXPECT_THROW(comms[0]->barrier(), dynacp::Timeout);
}

TEST(ThreadComm, AbortWakesWaiters) {
  auto comms = make_thread_comms(2, Millis(60000));
  const auto t0 = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(Millis(50));
    comms[0]->abort("loss is NaN");
  });
  int buf = 0;
  try {
    comms[1]->recv(0, &buf, sizeof buf);
    ADD_FAILURE() << "expected an abort";
  } catch (const dynacp::Timeout&) {
    ADD_FAILURE() << "abort must not look like a timeout";
  } catch (const dynacp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss is NaN"), std::string::npos) << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0).count(), 5000);
  EXPECT_THROW(comms[0]->barrier(), dynacp::Error);
}

TEST(ThreadComm, SizeMismatchAndBadPeerAreErrors) {
  auto comms = make_thread_comms(2, Millis(1000));
  int a = 1;
  std::int64_t b = 0;
  comms[0]->send(1, &a, sizeof a);
  EXPECT_THROW(comms[1]->recv(0, &b, sizeof b), dynacp::Error);
  EXPECT_THROW(comms[1]->recv(2, &b, sizeof b), dynacp::InvalidArgument);
  EXPECT_THROW(make_thread_comms(0, Millis(1)), dynacp::InvalidArgument);
  EXPECT_THROW(comms[0]->set_timeout(Millis(0)), dynacp::InvalidArgument);
}

TEST(CpGroupPool, TilingIsNodeContiguousWherePossible) {
  using V = std::vector<std::vector<int>>;
  EXPECT_EQ(CpGroupPool::tiling(8, 4, 2), (V{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  // Size 3 on 4-rank nodes: one group per node, leftovers 3 and 7 cannot form a group.
  EXPECT_EQ(CpGroupPool::tiling(8, 4, 3), (V{{0, 1, 2}, {4, 5, 6}}));
  // Size 3 on 8-rank nodes, 16 ranks: two per node, leftovers {6,7,14,15} give one cross-node group.
  EXPECT_EQ(CpGroupPool::tiling(16, 8, 3), (V{{0, 1, 2}, {3, 4, 5}, {8, 9, 10}, {11, 12, 13}, {6, 7, 14}}));
  EXPECT_EQ(CpGroupPool::tiling(12, 4, 6), (V{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}));
  EXPECT_THROW(CpGroupPool::tiling(8, 3, 2), dynacp::InvalidArgument);
  EXPECT_THROW(CpGroupPool::tiling(8, 4, 9), dynacp::InvalidArgument);
  EXPECT_EQ(CpGroupPool::power_of_two_sizes(6), (std::vector<int>{1, 2, 4}));
}

TEST(CpGroupPool, BuildsLooksUpAndCounts) {
  const int P = 8;
  auto comms = make_thread_comms(P, Millis(5000));
  run_ranks(P, [&](int r) {
    CpGroupPool pool(*comms[r], 4, {3, 1, 2, 3, 5});
    EXPECT_EQ(pool.sizes(), (std::vector<int>{1, 2, 3, 5}));
    // Sizes 2, 3, 5 -> 4 + 2 + 1 groups with communicators; size 1 needs none.
    EXPECT_EQ(pool.total_communicators(), 7);
    const int expected_mine = 1 + (r % 4 != 3 ? 1 : 0) + (r < 5 ? 1 : 0);
    EXPECT_EQ(pool.num_communicators(), expected_mine);
    const auto& g = pool.find(4, 3);
    EXPECT_EQ(g.ranks, (std::vector<int>{4, 5, 6}));
    const std::vector<int> plan_ranks = {0, 1, 2, 3, 4};
    const auto& g5 = pool.find(plan_ranks);
    EXPECT_EQ(g5.comm != nullptr, r < 5);
    if (g5.comm) {
      // The pooled communicator works: all-gather over the group.
      std::vector<int> all(5);
      g5.comm->all_gather(&r, all.data(), sizeof r);
      EXPECT_EQ(all, plan_ranks);
    }
    EXPECT_THROW(pool.find(1, 3), dynacp::InvalidArgument);
    EXPECT_THROW(pool.find(std::vector<int>{0, 2}), dynacp::InvalidArgument);
    // A plan group not in the pool still gets a P2P ring over the world.
    if (r == 1 || r == 3) {
      auto ring = pool.view({1, 3});
      int got = -1, mine = r;
      const P2POp ops[] = {send_op(1 - ring->rank(), &mine, sizeof mine), recv_op(1 - ring->rank(), &got, sizeof got)};
      ring->exchange(ops, "view ring");
      EXPECT_EQ(got, r == 1 ? 3 : 1);
    }
  });
}

TEST(PackingCodec, RoundTripAboveTwoToThe24) {
  const std::int64_t big = (std::int64_t{1} << 24) + 1;  // not representable in float32
  std::vector<MicrobatchMeta> mbs = {
      {{0, big, 2 * big + 1}, {0, big + 5, 2 * big + 11}, big + 1, 3, {5, 6, 7}},
      {{0}, {0}, 0, 1, {0}},
      {{0, 3, (std::int64_t{1} << 40)}, {0, 4, (std::int64_t{1} << 40) + 4}, std::int64_t{1} << 40, 2, {8, 9}}};
  const auto buf = encode_packing(mbs);
  EXPECT_EQ(buf[0], kPackingVersion);
  EXPECT_EQ(buf[1], 3);
  EXPECT_EQ(buf[2], static_cast<std::int64_t>(buf.size() - kPackingHeaderSize));
  EXPECT_EQ(decode_packing(buf), mbs);
  EXPECT_TRUE(decode_packing(encode_packing(std::vector<MicrobatchMeta>{})).empty());
}

TEST(PackingCodec, CorruptionIsRejected) {
  std::vector<MicrobatchMeta> mbs = {{{0, 5, 9}, {0, 8, 12}, 5, 2, {0, 1}}};
  const auto good = encode_packing(mbs);
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 1 << 3;
    EXPECT_THROW(decode_packing(bad), dynacp::Error) << "flipped entry " << i;
  }
  auto truncated = good;
  truncated.pop_back();
  EXPECT_THROW(decode_packing(truncated), dynacp::Error);
  auto wrong_version = good;
  wrong_version[0] = kPackingVersion + 1;
  try {
    decode_packing(wrong_version);
    FAIL();
  } catch (const dynacp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("version"), std::string::npos);
  }
  std::vector<MicrobatchMeta> inconsistent = {{{0, 5}, {0, 8}, 5, 2, {0}}};
  EXPECT_THROW(encode_packing(inconsistent), dynacp::InvalidArgument);
}

TEST(PackingCodec, BroadcastAcrossStages) {
  const std::int64_t big = (std::int64_t{1} << 33) + 7;
  std::vector<MicrobatchMeta> mbs = {{{0, big}, {0, big + 1}, big, 6, {0, 1, 2, 3, 4, 5}}};
  auto comms = make_thread_comms(4, Millis(5000));
  run_ranks(4, [&](int r) {
    const auto got = broadcast_packing(*comms[r], 2, r == 2 ? mbs : std::vector<MicrobatchMeta>{});
    EXPECT_EQ(got, mbs);
  });
  // A root that never sends: receivers time out instead of hanging.
  auto lonely = make_thread_comms(2, Millis(150));
  EXPECT_THROW(broadcast_packing(*lonely[1], 0, {}), dynacp::Timeout);
}
