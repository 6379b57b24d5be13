// Ring attention on the thread backend vs a dense single-rank fp64 reference.
// Tolerances: fp64 ring |diff| <= 1e-10 + 1e-10|ref|; fp32 ring |diff| <= 1e-5 + 1e-5|ref| (anchors: 1e-5 for fp32).
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"
#include "run_ranks.hpp"

using namespace dynacp::runtime;
using dynacp::testing::run_ranks;

namespace {

struct Problem {
  std::vector<std::int64_t> cu;
  std::vector<std::uint8_t> causal;
  int H = 4, Hkv = 2, D = 8;
  std::vector<double> q, k, v, dout;  // unpadded global [T, H|Hkv, D]
  std::int64_t T() const { return cu.back(); }
};

Problem make_problem(const std::vector<std::int64_t>& lens, std::vector<std::uint8_t> causal, int H, int Hkv,
                     unsigned seed) {
  Problem p;
  p.H = H, p.Hkv = Hkv;
  p.cu = {0};
  for (auto l : lens) p.cu.push_back(p.cu.back() + l);
  p.causal = std::move(causal);
  std::mt19937 gen(seed);
  std::normal_distribution<double> n(0, 1);
  auto fill = [&](std::vector<double>& x, std::size_t size) {
    x.resize(size);
    for (auto& e : x) e = n(gen);
  };
  fill(p.q, p.T() * H * p.D);
  fill(p.k, p.T() * Hkv * p.D);
  fill(p.v, p.T() * Hkv * p.D);
  fill(p.dout, p.T() * H * p.D);
  return p;
}

struct Grads {
  std::vector<double> out, lse, dq, dk, dv;
};

/// Dense softmax attention per sequence and head with explicit probabilities (independent of the LSE machinery).
Grads reference(const Problem& p) {
  const int H = p.H, Hkv = p.Hkv, D = p.D;
  const double scale = 1.0 / std::sqrt(double(D));
  Grads g;
  g.out.assign(p.q.size(), 0);
  g.dq.assign(p.q.size(), 0);
  g.dk.assign(p.k.size(), 0);
  g.dv.assign(p.v.size(), 0);
  g.lse.assign(p.T() * H, -std::numeric_limits<double>::infinity());
  auto Q = [&](std::int64_t t, int h) { return &p.q[(t * H + h) * D]; };
  auto K = [&](std::int64_t t, int h) { return &p.k[(t * Hkv + h) * D]; };
  auto V = [&](std::int64_t t, int h) { return &p.v[(t * Hkv + h) * D]; };
  auto dot = [&](const double* a, const double* b) {
    double s = 0;
    for (int e = 0; e < D; ++e) s += a[e] * b[e];
    return s;
  };
  for (std::size_t b = 0; b + 1 < p.cu.size(); ++b) {
    const std::int64_t s0 = p.cu[b], n = p.cu[b + 1] - s0;
    const bool causal = p.causal.empty() || p.causal[b];
    for (int h = 0; h < H; ++h) {
      const int kh = h / (H / Hkv);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t kn = causal ? i + 1 : n;
        std::vector<double> s(kn), dp(kn);
        double m = -1e300, sum = 0;
        for (std::int64_t j = 0; j < kn; ++j) m = std::max(m, s[j] = scale * dot(Q(s0 + i, h), K(s0 + j, kh)));
        for (auto& x : s) sum += (x = std::exp(x - m));
        for (auto& x : s) x /= sum;
        g.lse[(s0 + i) * H + h] = m + std::log(sum);
        double* o = &g.out[((s0 + i) * H + h) * D];
        const double* dO = &p.dout[((s0 + i) * H + h) * D];
        double pdp = 0;
        for (std::int64_t j = 0; j < kn; ++j) {
          for (int e = 0; e < D; ++e) o[e] += s[j] * V(s0 + j, kh)[e];
          dp[j] = dot(dO, V(s0 + j, kh));
          pdp += s[j] * dp[j];
        }
        for (std::int64_t j = 0; j < kn; ++j) {
          const double ds = s[j] * (dp[j] - pdp);
          for (int e = 0; e < D; ++e) {
            g.dv[((s0 + j) * Hkv + kh) * D + e] += s[j] * dO[e];
            g.dq[((s0 + i) * H + h) * D + e] += scale * ds * K(s0 + j, kh)[e];
            g.dk[((s0 + j) * Hkv + kh) * D + e] += scale * ds * Q(s0 + i, h)[e];
          }
        }
      }
    }
  }
  return g;
}

/// Shards `x` ([T, heads, D]) for a rank; padding rows get junk (999) that must never leak into results.
template <class T>
std::vector<T> shard(const std::vector<double>& x, const std::vector<std::int64_t>& rows, int width) {
  std::vector<T> out(rows.size() * width, T(999));
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i] >= 0)
      for (int e = 0; e < width; ++e) out[i * width + e] = static_cast<T>(x[rows[i] * width + e]);
  return out;
}

template <class T>
void check_ring(const Problem& p, int cp, double tol) {
  const Grads ref = reference(p);
  const auto layout = make_zigzag_layout(p.cu, cp);
  const AttnShape shape{layout.local_tokens(), p.H, p.Hkv, p.D};
  RingOptions opts;
  opts.causal = p.causal;
  auto comms = make_thread_comms(cp, Millis(20000));
  std::vector<std::vector<T>> out(cp), lse(cp), dq(cp), dk(cp), dv(cp);
  run_ranks(cp, [&](int r) {
    const auto rows = zigzag_rows(layout, r);
    const auto q = shard<T>(p.q, rows, p.H * p.D), k = shard<T>(p.k, rows, p.Hkv * p.D),
               v = shard<T>(p.v, rows, p.Hkv * p.D), dout = shard<T>(p.dout, rows, p.H * p.D);
    out[r].resize(q.size()), lse[r].resize(rows.size() * p.H), dq[r].resize(q.size());
    dk[r].resize(k.size()), dv[r].resize(k.size());
    ring_attention_forward<T>(*comms[r], layout, shape, q.data(), k.data(), v.data(), opts, out[r].data(),
                              lse[r].data());
    ring_attention_backward<T>(*comms[r], layout, shape, q.data(), k.data(), v.data(), out[r].data(), lse[r].data(),
                               dout.data(), opts, dq[r].data(), dk[r].data(), dv[r].data());
  });
  auto close = [&](double got, double want, const char* what, int r, std::size_t i) {
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << what << " rank " << r << " index " << i;
    } else {
      EXPECT_LE(std::abs(got - want), tol + tol * std::abs(want)) << what << " rank " << r << " index " << i;
    }
  };
  for (int r = 0; r < cp; ++r) {
    const auto rows = zigzag_rows(layout, r);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (int h = 0; h < p.H; ++h) {
        const double l = lse[r][i * p.H + h];
        if (rows[i] < 0) {
          EXPECT_EQ(l, -std::numeric_limits<double>::infinity()) << "padding row must have LSE -inf";
        } else {
          close(l, ref.lse[rows[i] * p.H + h], "lse", r, i);
        }
        for (int e = 0; e < p.D; ++e) {
          const std::size_t li = (i * p.H + h) * p.D + e;
          const double want_o = rows[i] < 0 ? 0 : ref.out[(rows[i] * p.H + h) * p.D + e];
          const double want_dq = rows[i] < 0 ? 0 : ref.dq[(rows[i] * p.H + h) * p.D + e];
          close(out[r][li], want_o, "out", r, li);
          close(dq[r][li], want_dq, "dq", r, li);
        }
      }
      for (int e = 0; e < p.Hkv * p.D; ++e) {
        const std::size_t li = i * p.Hkv * p.D + e;
        close(dk[r][li], rows[i] < 0 ? 0 : ref.dk[rows[i] * p.Hkv * p.D + e], "dk", r, li);
        close(dv[r][li], rows[i] < 0 ? 0 : ref.dv[rows[i] * p.Hkv * p.D + e], "dv", r, li);
      }
    }
  }
}

const std::vector<std::int64_t> kMixed = {1, 13, 0, 24, 7, 2, 31};

}  // namespace

class RingCp : public ::testing::TestWithParam<int> {};

TEST_P(RingCp, CausalGqaFp32MatchesFp64Reference) {
  check_ring<float>(make_problem(kMixed, {}, 4, 2, 1), GetParam(), 1e-5);
}

TEST_P(RingCp, FullMaskFp32MatchesFp64Reference) {
  check_ring<float>(make_problem(kMixed, std::vector<std::uint8_t>(kMixed.size(), 0), 4, 1, 2), GetParam(), 1e-5);
}

TEST_P(RingCp, MixedMasksFp64IsExact) {
  check_ring<double>(make_problem(kMixed, {1, 0, 1, 0, 1, 1, 0}, 3, 3, 3), GetParam(), 1e-10);
}

TEST_P(RingCp, RanksHoldingOnlyPadding) {
  // Two tiny sequences: for cp >= 2 the high ranks hold nothing but padding and still take part in the ring.
  check_ring<double>(make_problem({1, 2}, {}, 2, 1, 4), GetParam(), 1e-10);
  check_ring<float>(make_problem({1}, {}, 2, 2, 5), GetParam(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Cp1To6, RingCp, ::testing::Values(1, 2, 3, 4, 5, 6));

TEST(ZigzagSchedule, CausalStepsCoverTheLowerTriangleExactlyOnce) {
  for (int cp = 1; cp <= 6; ++cp) {
    const std::int64_t len = 4 * cp;  // chunk 2
    const auto layout = make_zigzag_layout(std::vector<std::int64_t>{0, len}, cp);
    std::multiset<std::pair<std::int64_t, std::int64_t>> seen;
    for (int r = 0; r < cp; ++r)
      for (int t = 0; t < cp; ++t)
        for (const auto& d : ring_blocks(layout, r, t, {})) {
          for (auto i = d.q_lo; i < d.q_hi; ++i)
            for (auto j = d.k_lo; j < d.k_hi; ++j) {
              const auto qp = zigzag_position(d.q_holder, cp, d.chunk, i);
              const auto kp = zigzag_position(d.k_holder, cp, d.chunk, j);
              if (!d.causal) EXPECT_LE(kp, qp) << "unmasked block holds a future key: cp " << cp << " step " << t;
              if (d.visible(i, j)) seen.insert({qp, kp});
            }
        }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(len * (len + 1) / 2)) << "cp " << cp;
    EXPECT_EQ(std::set(seen.begin(), seen.end()).size(), seen.size()) << "a pair was computed twice, cp " << cp;
  }
}

TEST(ZigzagSchedule, WorkIsBalanced) {
  // One diagonal block plus cp-1 half blocks on every rank.
  for (int cp = 2; cp <= 6; ++cp) {
    const auto layout = make_zigzag_layout(std::vector<std::int64_t>{0, 8 * cp}, cp);
    for (int r = 0; r < cp; ++r) {
      std::int64_t cells = 0;
      for (int t = 1; t < cp; ++t)
        for (const auto& d : ring_blocks(layout, r, t, {})) cells += (d.q_hi - d.q_lo) * (d.k_hi - d.k_lo);
      EXPECT_EQ(cells, (cp - 1) * 8 * 4) << "rank " << r << " cp " << cp;
    }
  }
}

TEST(ZigzagLayout, PaddingRules) {
  const auto l = make_zigzag_layout(std::vector<std::int64_t>{0, 7, 7, 10}, 2);
  EXPECT_EQ(l.cu_seqlens_padded, (std::vector<std::int64_t>{0, 8, 8, 12}));
  EXPECT_EQ(l.local_tokens(), 6);
  EXPECT_EQ(zigzag_rows(l, 0), (std::vector<std::int64_t>{0, 1, 6, -1, 7, -1}));
  EXPECT_EQ(zigzag_rows(l, 1), (std::vector<std::int64_t>{2, 3, 4, 5, 8, 9}));
  // A caller-provided padding must not truncate and must be a multiple of 2cp.
  EXPECT_THROW(make_zigzag_layout(std::vector<std::int64_t>{0, 7}, 2, std::vector<std::int64_t>{0, 6}),
               dynacp::InvalidArgument);
  EXPECT_THROW(make_zigzag_layout(std::vector<std::int64_t>{0, 7}, 2, std::vector<std::int64_t>{0, 10}),
               dynacp::InvalidArgument);
  EXPECT_NO_THROW(make_zigzag_layout(std::vector<std::int64_t>{0, 7}, 2, std::vector<std::int64_t>{0, 12}));
  EXPECT_THROW(make_zigzag_layout(std::vector<std::int64_t>{0, 7, 3}, 2), dynacp::InvalidArgument);
  EXPECT_THROW(make_zigzag_layout(std::vector<std::int64_t>{0, 7}, 0), dynacp::InvalidArgument);
}

TEST(RingAttention, RejectsMismatchedShard) {
  const auto layout = make_zigzag_layout(std::vector<std::int64_t>{0, 8}, 2);
  auto comms = make_thread_comms(2, Millis(1000));
  std::vector<float> x(100);
  EXPECT_THROW(ring_attention_forward<float>(*comms[0], layout, AttnShape{3, 1, 1, 4}, x.data(), x.data(), x.data(), {},
                                             x.data(), x.data()),
               dynacp::InvalidArgument);
  EXPECT_THROW(ring_attention_forward<float>(*comms[0], layout, AttnShape{4, 3, 2, 4}, x.data(), x.data(), x.data(), {},
                                             x.data(), x.data()),
               dynacp::InvalidArgument);
}

TEST(RingAttention, MissingPeerTimesOut) {
  // cp = 2 but rank 1 never joins: rank 0 must fail with Timeout naming the peer, within the configured time.
  const auto layout = make_zigzag_layout(std::vector<std::int64_t>{0, 8}, 2);
  auto comms = make_thread_comms(2, Millis(300));
  std::vector<float> x(4 * 2 * 4, 1.f), out(x.size()), lse(4 * 2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    ring_attention_forward<float>(*comms[0], layout, AttnShape{4, 2, 2, 4}, x.data(), x.data(), x.data(), {},
                                  out.data(), lse.data());
    FAIL() << "expected a timeout";
  } catch (const dynacp::Timeout& e) {
    EXPECT_NE(std::string(e.what()).find("peer 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ring attention forward"), std::string::npos) << e.what();
  }
  const auto ms = std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(ms, 290);
  EXPECT_LT(ms, 3000);
}

TEST(RingExecutor, OneWorkspaceHoldsEveryExchangedBuffer) {
  // dynacp.torch maps P2P addresses back to slices of the one workspace it allocates: check that contract, and that
  // the device-agnostic loop (ring_forward/ring_backward with CpuRingDevice) equals the CPU wrappers bit for bit.
  const Problem p = make_problem(kMixed, {1, 0, 1, 1, 0, 1, 1}, 4, 2, 9);
  const int cp = 3;
  const auto layout = make_zigzag_layout(p.cu, cp);
  const AttnShape shape{layout.local_tokens(), p.H, p.Hkv, p.D};
  RingOptions opts;
  opts.causal = p.causal;
  auto threads = make_thread_comms(cp, Millis(20000));
  run_ranks(cp, [&](int r) {
    std::vector<std::byte> buffer;
    int allocations = 0, exchanges = 0;
    bool in_workspace = true;  // the CPU wrappers below use their own workspace
    const WorkspaceFn workspace = [&](std::size_t bytes) -> void* {
      ++allocations;
      buffer.assign(bytes, std::byte{0});
      return buffer.data();
    };
    auto comm =
        make_callback_comm(r, cp, Millis(20000), [&](std::span<const P2POp> ops, std::string_view what, Millis) {
          ++exchanges;
          for (const auto& op : ops) {
            const auto* b = static_cast<const std::byte*>(op.data);
            if (in_workspace && (b < buffer.data() || b + op.bytes > buffer.data() + buffer.size()))
              throw dynacp::Error(std::string(what) + ": buffer outside the workspace");
          }
          threads[r]->exchange(ops, what);
        });
    const auto rows = zigzag_rows(layout, r);
    const auto q = shard<double>(p.q, rows, p.H * p.D), k = shard<double>(p.k, rows, p.Hkv * p.D),
               v = shard<double>(p.v, rows, p.Hkv * p.D), dout = shard<double>(p.dout, rows, p.H * p.D);
    std::vector<double> out(q.size()), lse(rows.size() * p.H), dq(q.size()), dk(k.size()), dv(k.size());
    CpuRingDevice<double> device;
    ring_forward(*comm, device, layout, shape, opts, q.data(), k.data(), v.data(), out.data(), lse.data(), workspace);
    ring_backward(*comm, device, layout, shape, opts, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                  dq.data(), dk.data(), dv.data(), workspace);
    EXPECT_EQ(allocations, 2);
    EXPECT_EQ(exchanges, 2 * cp - 1);  // forward: cp-1 kv hops; backward: cp-1 kv+dkv hops and the final dkv hop
    in_workspace = false;
    std::vector<double> out2(out.size()), lse2(lse.size()), dq2(dq.size()), dk2(dk.size()), dv2(dv.size());
    ring_attention_forward<double>(*comm, layout, shape, q.data(), k.data(), v.data(), opts, out2.data(), lse2.data());
    ring_attention_backward<double>(*comm, layout, shape, q.data(), k.data(), v.data(), out2.data(), lse2.data(),
                                    dout.data(), opts, dq2.data(), dk2.data(), dv2.data());
    EXPECT_EQ(out, out2);
    EXPECT_EQ(lse, lse2);
    EXPECT_EQ(dq, dq2);
    EXPECT_EQ(dk, dk2);
    EXPECT_EQ(dv, dv2);
  });
}

TEST(RingExecutor, RejectsAMisalignedWorkspace) {
  const auto layout = make_zigzag_layout(std::vector<std::int64_t>{0, 4}, 1);
  auto comms = make_thread_comms(1, Millis(1000));
  std::vector<float> x(4 * 2 * 4, 1.f), out(x.size()), lse(4 * 2);
  std::vector<std::byte> buffer(1 << 16);
  CpuRingDevice<float> device;
  const WorkspaceFn misaligned = [&](std::size_t) -> void* { return buffer.data() + 1; };
  EXPECT_THROW(ring_forward(*comms[0], device, layout, AttnShape{4, 2, 2, 4}, {}, x.data(), x.data(), x.data(),
                            out.data(), lse.data(), misaligned),
               dynacp::Error);
}
