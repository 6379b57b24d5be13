// dynacp_gpu_check: the single-GPU check driven by tests/gpu/run.sh.
//  1. NCCL smoke test with world size 1 (unique id over a host communicator, grouped self send/recv, broadcast,
//     all-gather, split) when built with NCCL;
//  2. CUDA block kernels vs the CPU fp64 reference (fp32 and bf16 inputs; the reference uses the same rounded
//     inputs, so the tolerance measures fp32 accumulation only);
//  3. the ring over W = 2, 3, 5 simulated ranks on the one GPU vs the single-rank CPU reference;
//  4. forward/backward TFLOP/s of the ring next to a single-call attention baseline.
// Exit status 0 when every check passes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"
#include "dynacp/runtime/cuda.hpp"
#ifdef DYNACP_HAVE_NCCL
#include "dynacp/runtime/nccl_comm.hpp"
#endif

using namespace dynacp::runtime;
namespace cu = dynacp::runtime::cuda;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? " ok " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

/// Device buffer of floats or of `dt` elements.
struct Buf {
  void* p = nullptr;
  explicit Buf(std::size_t bytes) { cu::check(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

std::vector<float> download(const float* d, std::size_t n) {
  std::vector<float> h(n);
  cu::check(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), "download");
  return h;
}

/// Uploads host floats as dtype dt; `h` is replaced by the rounded values the GPU sees.
std::unique_ptr<Buf> upload(std::vector<float>& h, cu::DType dt) {
  Buf tmp(h.size() * 4);
  cu::check(cudaMemcpy(tmp.p, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "upload");
  auto out = std::make_unique<Buf>(h.size() * cu::dtype_size(dt));
  cu::cast_from_float(dt, tmp.f(), out->p, static_cast<std::int64_t>(h.size()), nullptr);
  cu::cast_to_float(dt, out->p, tmp.f(), static_cast<std::int64_t>(h.size()), nullptr);
  h = download(tmp.f(), h.size());
  return out;
}

double max_rel_err(const std::vector<float>& got, const std::vector<double>& want, double atol) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      if (got[i] != want[i]) return 1e30;
      continue;
    }
    worst = std::max(worst, std::abs(got[i] - want[i]) / (atol * (1 + std::abs(want[i]))));
  }
  return worst;  // <= 1 means |got - want| <= atol + rtol * |want| with rtol = atol
}

std::vector<float> randn(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(n);
  for (auto& e : x) e = d(g);
  return x;
}

struct Problem {
  std::vector<std::int64_t> cu;
  std::vector<std::uint8_t> causal;
  int H, Hkv, D;
  std::vector<float> q, k, v, dout;  // global, unpadded
};

Problem make_problem(std::vector<std::int64_t> lens, std::vector<std::uint8_t> causal, int H, int Hkv, int D) {
  Problem p{{0}, std::move(causal), H, Hkv, D, {}, {}, {}, {}};
  for (auto l : lens) p.cu.push_back(p.cu.back() + l);
  const auto T = static_cast<std::size_t>(p.cu.back());
  p.q = randn(T * H * D, 1), p.k = randn(T * Hkv * D, 2), p.v = randn(T * Hkv * D, 3), p.dout = randn(T * H * D, 4);
  return p;
}

/// Rows of `x` (width w) for the local rows of a shard (zeros for padding).
template <class T, class S>
std::vector<T> gather_rows(const std::vector<S>& x, const std::vector<std::int64_t>& rows, int w) {
  std::vector<T> out(rows.size() * w, T(0));
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i] >= 0) std::copy_n(x.begin() + rows[i] * w, w, out.begin() + i * w);
  return out;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // global unpadded rows
};

/// fp64 CPU ring with cp = 1 on the (rounded) inputs, scattered back to global rows.
Reference cpu_reference(const Problem& p) {
  const auto layout = make_zigzag_layout(p.cu, 1);
  const auto rows = zigzag_rows(layout, 0);
  const AttnShape s{layout.local_tokens(), p.H, p.Hkv, p.D};
  const auto q = gather_rows<double>(p.q, rows, p.H * p.D), k = gather_rows<double>(p.k, rows, p.Hkv * p.D),
             v = gather_rows<double>(p.v, rows, p.Hkv * p.D), dout = gather_rows<double>(p.dout, rows, p.H * p.D);
  std::vector<double> out(q.size()), lse(rows.size() * p.H), dq(q.size()), dk(k.size()), dv(k.size());
  auto comm = make_thread_comms(1, Millis(60000));
  RingOptions o;
  o.causal = p.causal;
  ring_attention_forward<double>(*comm[0], layout, s, q.data(), k.data(), v.data(), o, out.data(), lse.data());
  ring_attention_backward<double>(*comm[0], layout, s, q.data(), k.data(), v.data(), out.data(), lse.data(),
                                  dout.data(), o, dq.data(), dk.data(), dv.data());
  Reference r;
  const auto T = static_cast<std::size_t>(p.cu.back());
  r.out.resize(T * p.H * p.D), r.lse.resize(T * p.H), r.dq.resize(T * p.H * p.D);
  r.dk.resize(T * p.Hkv * p.D), r.dv.resize(T * p.Hkv * p.D);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0) continue;
    const auto g = static_cast<std::size_t>(rows[i]);
    std::copy_n(out.begin() + i * p.H * p.D, p.H * p.D, r.out.begin() + g * p.H * p.D);
    std::copy_n(dq.begin() + i * p.H * p.D, p.H * p.D, r.dq.begin() + g * p.H * p.D);
    std::copy_n(lse.begin() + i * p.H, p.H, r.lse.begin() + g * p.H);
    std::copy_n(dk.begin() + i * p.Hkv * p.D, p.Hkv * p.D, r.dk.begin() + g * p.Hkv * p.D);
    std::copy_n(dv.begin() + i * p.Hkv * p.D, p.Hkv * p.D, r.dv.begin() + g * p.Hkv * p.D);
  }
  return r;
}

/// Runs the simulated ring with cp ranks; compares every rank's rows against `ref` (or only times it).
double run_ring(const Problem& p0, int cp, cu::DType dt, const Reference* ref, double atol, const char* label,
                int iters = 0, double* fwd_ms = nullptr, double* bwd_ms = nullptr) {
  Problem p = p0;
  const auto layout = make_zigzag_layout(p.cu, cp);
  const AttnShape s{layout.local_tokens(), p.H, p.Hkv, p.D};
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<const void*> q, k, v, dout;
  std::vector<float*> out, lse, dq, dk, dv;
  // Round the global inputs to dt once so every rank and the reference see the same values.
  upload(p.q, dt), upload(p.k, dt), upload(p.v, dt), upload(p.dout, dt);
  std::vector<std::vector<std::int64_t>> rows(cp);
  for (int r = 0; r < cp; ++r) {
    rows[r] = zigzag_rows(layout, r);
    auto put = [&](const std::vector<float>& x, int w, std::vector<const void*>& dst) {
      auto h = gather_rows<float>(x, rows[r], w);
      bufs.push_back(upload(h, dt));
      dst.push_back(bufs.back()->p);
    };
    auto alloc = [&](std::size_t n, std::vector<float*>& dst) {
      bufs.push_back(std::make_unique<Buf>(n * 4));
      dst.push_back(bufs.back()->f());
    };
    put(p.q, p.H * p.D, q), put(p.k, p.Hkv * p.D, k), put(p.v, p.Hkv * p.D, v), put(p.dout, p.H * p.D, dout);
    const auto T = static_cast<std::size_t>(s.tokens);
    alloc(T * p.H * p.D, out), alloc(T * p.H, lse), alloc(T * p.H * p.D, dq);
    alloc(T * p.Hkv * p.D, dk), alloc(T * p.Hkv * p.D, dv);
  }
  cu::SimulatedRing ring(layout, s, dt, p.causal);
  std::vector<const float*> cout(out.begin(), out.end()), clse(lse.begin(), lse.end());
  ring.forward(q, k, v, out, lse, nullptr);
  ring.backward(q, k, v, cout, clse, dout, dq, dk, dv, nullptr);
  cu::check(cudaDeviceSynchronize(), "ring");
  double worst = 0;
  if (ref) {
    for (int r = 0; r < cp; ++r) {
      const auto T = static_cast<std::size_t>(s.tokens);
      auto cmp = [&](const float* d, const std::vector<double>& want, int w) {
        const auto got = download(d, T * w);
        std::vector<double> exp(T * w, 0.0);
        for (std::size_t i = 0; i < T; ++i)
          for (int e = 0; e < w; ++e)
            exp[i * w + e] = rows[r][i] >= 0 ? want[rows[r][i] * w + e] : (&want == &ref->lse ? -INFINITY : 0.0);
        worst = std::max(worst, max_rel_err(got, exp, atol));
      };
      cmp(out[r], ref->out, p.H * p.D), cmp(lse[r], ref->lse, p.H), cmp(dq[r], ref->dq, p.H * p.D);
      cmp(dk[r], ref->dk, p.Hkv * p.D), cmp(dv[r], ref->dv, p.Hkv * p.D);
    }
    expect(worst <= 1.0, std::string(label) + ": max |err| / (atol (1 + |ref|)) = " + std::to_string(worst) +
                             " (atol = rtol = " + std::to_string(atol) + ")");
  }
  if (iters > 0) {
    cudaEvent_t a, b, c;
    cudaEventCreate(&a), cudaEventCreate(&b), cudaEventCreate(&c);
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) ring.forward(q, k, v, out, lse, nullptr);
    cudaEventRecord(b);
    for (int i = 0; i < iters; ++i) ring.backward(q, k, v, cout, clse, dout, dq, dk, dv, nullptr);
    cudaEventRecord(c);
    cu::check(cudaEventSynchronize(c), "timing");
    float f = 0, g = 0;
    cudaEventElapsedTime(&f, a, b), cudaEventElapsedTime(&g, b, c);
    *fwd_ms = f / iters, *bwd_ms = g / iters;
    cudaEventDestroy(a), cudaEventDestroy(b), cudaEventDestroy(c);
  }
  return worst;
}

#ifdef DYNACP_HAVE_NCCL
void nccl_smoke() {
  std::printf("NCCL smoke test (world size 1)\n");
  auto host = make_thread_comms(1, Millis(30000));
  auto nccl = NcclComm::create(*host[0], 0, Millis(30000));
  const int n = 1024;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = float(i);
  Buf a(n * 4), b(n * 4), g(n * 4);
  cu::check(cudaMemcpy(a.p, h.data(), n * 4, cudaMemcpyHostToDevice), "upload");
  const P2POp ops[] = {send_op(0, a.p, n * 4), recv_op(0, b.p, n * 4)};
  nccl->exchange(ops, "self send/recv");
  expect(download(b.f(), n) == h, "grouped self send/recv");
  nccl->broadcast(a.p, n * 4, 0);
  nccl->all_gather(a.p, g.p, n * 4);
  expect(download(g.f(), n) == h, "broadcast + all_gather");
  auto sub = nccl->split(0, 0);
  expect(sub && sub->size() == 1, "ncclCommSplit to a 1-rank communicator");
  if (sub) sub->barrier();
  nccl->barrier();
  expect(true, "barrier");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::puts("usage: dynacp_gpu_check [bench_tokens_scale]  (runs NCCL smoke, kernel, ring and throughput checks)");
    return 0;
  }
  const double scale = argc > 1 ? std::atof(argv[1]) : 1.0;
  try {
    int devices = 0;
    cu::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    cudaDeviceProp prop{};
    cu::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("device 0 of %d: %s (sm_%d%d)\n", devices, prop.name, prop.major, prop.minor);
#ifdef DYNACP_HAVE_NCCL
    nccl_smoke();
#else
    std::printf("NCCL smoke test skipped: built without nccl.h\n");
#endif
    std::printf("CUDA kernels vs CPU fp64 reference (cp = 1)\n");
    const Problem small = make_problem({1, 100, 257, 64, 1000, 3}, {1, 1, 0, 1, 1, 0}, 8, 2, 64);
    for (auto [dt, name] : {std::pair{cu::DType::kF32, "fp32"}, std::pair{cu::DType::kBF16, "bf16"}}) {
      Problem rounded = small;
      upload(rounded.q, dt), upload(rounded.k, dt), upload(rounded.v, dt), upload(rounded.dout, dt);
      const auto ref = cpu_reference(rounded);
      run_ring(small, 1, dt, &ref, 1e-4, (std::string("kernel ") + name + " out/lse/dq/dk/dv").c_str());
      std::printf("Ring over simulated ranks, %s\n", name);
      for (int cp : {2, 3, 5})
        run_ring(small, cp, dt, &ref, 1e-4, (std::string("ring cp=") + std::to_string(cp) + " " + name).c_str());
    }
    std::printf("Throughput (bf16, causal, H=32, Hkv=8, D=128)\n");
    std::vector<std::int64_t> lens = {8192, 4096, 2048, 1024, 1024};
    for (auto& l : lens) l = std::max<std::int64_t>(64, static_cast<std::int64_t>(l * scale));
    const Problem big = make_problem(lens, {}, 32, 8, 128);
    double pairs = 0;
    for (auto l : lens) pairs += double(l) * double(l + 1) / 2;
    const double fwd_flops = 4.0 * big.H * big.D * pairs, bwd_flops = 2.5 * fwd_flops;
    for (int cp : {1, 4}) {
      double f = 0, b = 0;
      run_ring(big, cp, cu::DType::kBF16, nullptr, 0, "", 2, &f, &b);
      std::printf("  %-34s fwd %8.2f ms %7.2f TFLOP/s | bwd %8.2f ms %7.2f TFLOP/s\n",
                  cp == 1 ? "single-call attention (baseline)" : "zigzag ring, 4 simulated ranks", f,
                  fwd_flops / f / 1e9, b, bwd_flops / b / 1e9);
    }
    std::printf("  (ring numbers aggregate all simulated ranks, which run one after another on the one GPU)\n");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf(failures ? "%d check(s) FAILED\n" : "all GPU checks passed\n", failures);
  return failures ? 1 : 0;
}
