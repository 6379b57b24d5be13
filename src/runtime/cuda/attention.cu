// Tiled reference attention kernels: one thread per query row (forward, dq) or key row (dk/dv), K/V (or Q/dO)
// tiles staged in shared memory, fp32 accumulation, natural-log LSE. Correctness first: they are the GPU mirror
// of block_forward_cpu / block_backward_cpu and share BlockDesc::visible with them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/cuda.hpp"

namespace dynacp::runtime::cuda {
namespace {

constexpr int kRows = 64;  // threads per block = rows per tile
constexpr int kTile = 32;  // staged keys (or queries) per shared-memory tile
constexpr int D_MAX = kMaxHeadDim;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half(x);
}

/// Stages keys [k0, k0 + n) of block d (KV head kh) into shared memory, all threads of the block cooperating.
template <class T>
__device__ __forceinline__ void stage_kv(const AttnShape& s, const BlockDesc& d, const T* __restrict__ k,
                                         const T* __restrict__ v, int kh, std::int64_t k0, int n, float (*ks)[D_MAX],
                                         float (*vs)[D_MAX]) {
  const int D = s.dim;
  for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
    const int j = idx / D, e = idx % D;
    const std::int64_t krow = d.row0 + k0 + j;
    ks[j][e] = to_f(k[(krow * s.kv_heads + kh) * D + e]);
    vs[j][e] = to_f(v[(krow * s.kv_heads + kh) * D + e]);
  }
}

template <class T>
__global__ void forward_kernel(AttnShape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                               const BlockDesc* __restrict__ blocks, float scale, float* __restrict__ acc_out,
                               float* __restrict__ acc_lse) {
  const BlockDesc d = blocks[blockIdx.z];
  const int h = blockIdx.y, kh = h / (s.heads / s.kv_heads), D = s.dim;
  const std::int64_t qj = d.q_lo + std::int64_t(blockIdx.x) * kRows + threadIdx.x;
  const bool active = qj < d.q_hi;
  if (d.q_lo + std::int64_t(blockIdx.x) * kRows >= d.q_hi) return;  // whole tile past this block's rows
  __shared__ float ks[kTile][D_MAX], vs[kTile][D_MAX];
  float qr[D_MAX], acc[D_MAX];
  const std::int64_t qrow = d.row0 + qj;
  for (int e = 0; e < D; ++e) {
    qr[e] = active ? to_f(q[(qrow * s.heads + h) * D + e]) * scale : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (std::int64_t k0 = d.k_lo; k0 < d.k_hi; k0 += kTile) {
    const int n = int((d.k_hi - k0 < kTile ? d.k_hi - k0 : kTile));
    __syncthreads();
    stage_kv(s, d, k, v, kh, k0, n, ks, vs);
    __syncthreads();
    if (!active) continue;
    float sc[kTile];
    float mt = -INFINITY;
    for (int j = 0; j < n; ++j) {
      sc[j] = -INFINITY;
      if (!d.visible(qj, k0 + j)) continue;
      float dot = 0.f;
      for (int e = 0; e < D; ++e) dot += qr[e] * ks[j][e];
      sc[j] = dot;
      mt = fmaxf(mt, dot);
    }
    if (mt == -INFINITY) continue;
    const float mn = fmaxf(m, mt), corr = m == -INFINITY ? 0.f : __expf(m - mn);
    l *= corr;
    for (int e = 0; e < D; ++e) acc[e] *= corr;
    for (int j = 0; j < n; ++j) {
      if (sc[j] == -INFINITY) continue;
      const float p = __expf(sc[j] - mn);
      l += p;
      for (int e = 0; e < D; ++e) acc[e] += p * vs[j][e];
    }
    m = mn;
  }
  if (!active || l == 0.f) return;  // no visible key: the block leaves (O, L) untouched
  const float lb = m + logf(l);
  float* o = acc_out + (qrow * s.heads + h) * D;
  float& L = acc_lse[qrow * s.heads + h];
  if (L == -INFINITY) {
    for (int e = 0; e < D; ++e) o[e] = acc[e] / l;
  } else {
    const float w = 1.f / (1.f + expf(L - lb));  // sigmoid(lb - L)
    for (int e = 0; e < D; ++e) o[e] -= w * (o[e] - acc[e] / l);
  }
  L = L == -INFINITY ? lb : fmaxf(L, lb) + log1pf(expf(-fabsf(L - lb)));
}

template <class T>
__global__ void dq_kernel(AttnShape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ drow,
                          const BlockDesc* __restrict__ blocks, float scale, float* __restrict__ dq) {
  const BlockDesc d = blocks[blockIdx.z];
  const int h = blockIdx.y, kh = h / (s.heads / s.kv_heads), D = s.dim;
  const std::int64_t qj = d.q_lo + std::int64_t(blockIdx.x) * kRows + threadIdx.x;
  if (d.q_lo + std::int64_t(blockIdx.x) * kRows >= d.q_hi) return;
  const std::int64_t qrow = d.row0 + qj;
  const bool active = qj < d.q_hi && isfinite(lse[qrow * s.heads + h]);
  __shared__ float ks[kTile][D_MAX], vs[kTile][D_MAX];
  float qr[D_MAX], dor[D_MAX], acc[D_MAX];
  const float L = active ? lse[qrow * s.heads + h] : 0.f, Di = active ? drow[qrow * s.heads + h] : 0.f;
  for (int e = 0; e < D; ++e) {
    qr[e] = active ? to_f(q[(qrow * s.heads + h) * D + e]) : 0.f;
    dor[e] = active ? to_f(dout[(qrow * s.heads + h) * D + e]) : 0.f;
    acc[e] = 0.f;
  }
  for (std::int64_t k0 = d.k_lo; k0 < d.k_hi; k0 += kTile) {
    const int n = int((d.k_hi - k0 < kTile ? d.k_hi - k0 : kTile));
    __syncthreads();
    stage_kv(s, d, k, v, kh, k0, n, ks, vs);
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < n; ++j) {
      if (!d.visible(qj, k0 + j)) continue;
      float sc = 0.f, dp = 0.f;
      for (int e = 0; e < D; ++e) sc += qr[e] * ks[j][e], dp += dor[e] * vs[j][e];
      const float ds = __expf(sc * scale - L) * (dp - Di);
      for (int e = 0; e < D; ++e) acc[e] += ds * ks[j][e];
    }
  }
  if (!active) return;
  for (int e = 0; e < D; ++e) dq[(qrow * s.heads + h) * D + e] += scale * acc[e];
}

/// One thread per key row of one kv head; loops over the q heads of its GQA group. Key rows of different blocks
/// (sequences) are disjoint, so plain += is race-free and deterministic.
template <class T>
__global__ void dkdv_kernel(AttnShape s, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                            const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ drow,
                            const BlockDesc* __restrict__ blocks, float scale, float* __restrict__ dk,
                            float* __restrict__ dv) {
  const BlockDesc d = blocks[blockIdx.z];
  const int kh = blockIdx.y, group = s.heads / s.kv_heads, D = s.dim;
  const std::int64_t kj = d.k_lo + std::int64_t(blockIdx.x) * kRows + threadIdx.x;
  if (d.k_lo + std::int64_t(blockIdx.x) * kRows >= d.k_hi) return;
  const bool active = kj < d.k_hi;
  const std::int64_t krow = d.row0 + kj;
  __shared__ float qs[kTile][D_MAX], dos[kTile][D_MAX], ls[kTile], dis[kTile];
  float kr[D_MAX], vr[D_MAX], dka[D_MAX], dva[D_MAX];
  for (int e = 0; e < D; ++e) {
    kr[e] = active ? to_f(k[(krow * s.kv_heads + kh) * D + e]) : 0.f;
    vr[e] = active ? to_f(v[(krow * s.kv_heads + kh) * D + e]) : 0.f;
    dka[e] = dva[e] = 0.f;
  }
  for (int g = 0; g < group; ++g) {
    const int h = kh * group + g;
    for (std::int64_t q0 = d.q_lo; q0 < d.q_hi; q0 += kTile) {
      const int n = int((d.q_hi - q0 < kTile ? d.q_hi - q0 : kTile));
      __syncthreads();
      for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) {
        const int i = idx / D, e = idx % D;
        const std::int64_t qrow = d.row0 + q0 + i;
        qs[i][e] = to_f(q[(qrow * s.heads + h) * D + e]);
        dos[i][e] = to_f(dout[(qrow * s.heads + h) * D + e]);
      }
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const std::int64_t qrow = d.row0 + q0 + i;
        ls[i] = lse[qrow * s.heads + h];
        dis[i] = drow[qrow * s.heads + h];
      }
      __syncthreads();
      if (!active) continue;
      for (int i = 0; i < n; ++i) {
        if (!isfinite(ls[i]) || !d.visible(q0 + i, kj)) continue;
        float sc = 0.f, dp = 0.f;
        for (int e = 0; e < D; ++e) sc += qs[i][e] * kr[e], dp += dos[i][e] * vr[e];
        const float p = __expf(sc * scale - ls[i]), ds = p * (dp - dis[i]);
        for (int e = 0; e < D; ++e) dva[e] += p * dos[i][e], dka[e] += ds * qs[i][e];
      }
    }
  }
  if (!active) return;
  for (int e = 0; e < D; ++e) {
    dk[(krow * s.kv_heads + kh) * D + e] += scale * dka[e];
    dv[(krow * s.kv_heads + kh) * D + e] += dva[e];
  }
}

template <class T>
__global__ void row_dot_kernel(const T* __restrict__ dout, const float* __restrict__ out, std::int64_t rows, int dim,
                               float* __restrict__ drow) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  float acc = 0.f;
  for (int e = 0; e < dim; ++e) acc += to_f(dout[i * dim + e]) * out[i * dim + e];
  drow[i] = acc;
}

__global__ void fill_kernel(float* dst, std::int64_t n, float value) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = value;
}

template <class T>
__global__ void cast_from_kernel(const float* src, T* dst, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = from_f<T>(src[i]);
}
template <class T>
__global__ void cast_to_kernel(const T* src, float* dst, std::int64_t n) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = to_f(src[i]);
}

/// Calls f(T{}) with the element type of dt.
template <class F>
void with_type(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(__nv_bfloat16{});
    case DType::kF16:
      return f(__half{});
  }
}

unsigned blocks_for(std::int64_t n, int per) { return static_cast<unsigned>((n + per - 1) / per); }

void check_shape(const AttnShape& s) {
  s.validate();
  if (s.dim > kMaxHeadDim) invalid("CUDA reference kernels support head dim <= ", kMaxHeadDim, ", got ", s.dim);
  if (s.heads > 65535) invalid("CUDA reference kernels support at most 65535 heads (grid y), got ", s.heads);
}

/// Blocks of one launch are the grid's z dimension.
void check_blocks(int num_blocks) {
  if (num_blocks > 65535)
    invalid("CUDA reference kernels take at most 65535 sequences per ring step (grid z), got ", num_blocks,
            "; split the microbatch");
}

}  // namespace

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

std::size_t dtype_size(DType dt) { return dt == DType::kF32 ? 4 : 2; }

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "fp32") return DType::kF32;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float16" || name == "fp16") return DType::kF16;
  invalid("CUDA ring attention supports float32, bfloat16 and float16 inputs, got '", name, "'");
}

void block_forward(DType dt, const AttnShape& s, const void* q, const void* k, const void* v, const BlockDesc* blocks,
                   int num_blocks, std::int64_t max_q_rows, float scale, float* acc_out, float* acc_lse,
                   cudaStream_t stream) {
  check_shape(s);
  check_blocks(num_blocks);
  if (num_blocks == 0 || max_q_rows == 0) return;
  const dim3 grid(blocks_for(max_q_rows, kRows), s.heads, num_blocks);
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    forward_kernel<T><<<grid, kRows, 0, stream>>>(s, static_cast<const T*>(q), static_cast<const T*>(k),
                                                  static_cast<const T*>(v), blocks, scale, acc_out, acc_lse);
  });
  check(cudaGetLastError(), "forward_kernel launch");
}

void block_backward(DType dt, const AttnShape& s, const void* q, const void* k, const void* v, const void* dout,
                    const float* lse, const float* drow, const BlockDesc* blocks, int num_blocks,
                    std::int64_t max_q_rows, std::int64_t max_k_rows, float scale, float* dq, float* dk, float* dv,
                    cudaStream_t stream) {
  check_shape(s);
  check_blocks(num_blocks);
  if (num_blocks == 0 || max_q_rows == 0 || max_k_rows == 0) return;
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    const auto *qt = static_cast<const T*>(q), *kt = static_cast<const T*>(k), *vt = static_cast<const T*>(v),
               *dt_ = static_cast<const T*>(dout);
    dq_kernel<T><<<dim3(blocks_for(max_q_rows, kRows), s.heads, num_blocks), kRows, 0, stream>>>(
        s, qt, kt, vt, dt_, lse, drow, blocks, scale, dq);
    dkdv_kernel<T><<<dim3(blocks_for(max_k_rows, kRows), s.kv_heads, num_blocks), kRows, 0, stream>>>(
        s, qt, kt, vt, dt_, lse, drow, blocks, scale, dk, dv);
  });
  check(cudaGetLastError(), "backward kernels launch");
}

void row_dot(DType dt, const void* dout, const float* out, std::int64_t rows, int dim, float* drow,
             cudaStream_t stream) {
  if (rows == 0) return;
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    row_dot_kernel<T><<<blocks_for(rows, 256), 256, 0, stream>>>(static_cast<const T*>(dout), out, rows, dim, drow);
  });
  check(cudaGetLastError(), "row_dot launch");
}

void fill(float* dst, std::int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(dst, n, value);
  check(cudaGetLastError(), "fill launch");
}

void cast_from_float(DType dt, const float* src, void* dst, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    cast_from_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(src, static_cast<T*>(dst), n);
  });
  check(cudaGetLastError(), "cast launch");
}

void cast_to_float(DType dt, const void* src, float* dst, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_type(dt, [&](auto t) {
    using T = decltype(t);
    cast_to_kernel<T><<<blocks_for(n, 256), 256, 0, stream>>>(static_cast<const T*>(src), dst, n);
  });
  check(cudaGetLastError(), "cast launch");
}

}  // namespace dynacp::runtime::cuda
