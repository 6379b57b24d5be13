#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"

namespace dynacp::runtime {

namespace {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using CMap = Eigen::Map<const Mat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using MMap = Eigen::Map<Mat<T>, 0, Eigen::OuterStride<>>;

/// Rows [row, row + n) of head h in a [T, heads, dim] tensor.
template <class T>
CMap<T> rows(const T* x, std::int64_t row, std::int64_t n, int heads, int h, int dim) {
  return CMap<T>(x + (row * heads + h) * dim, n, dim, Eigen::OuterStride<>(heads * dim));
}
template <class T>
MMap<T> rows(T* x, std::int64_t row, std::int64_t n, int heads, int h, int dim) {
  return MMap<T>(x + (row * heads + h) * dim, n, dim, Eigen::OuterStride<>(heads * dim));
}

Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic> visibility(const BlockDesc& d) {
  Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic> m(d.q_hi - d.q_lo, d.k_hi - d.k_lo);
  for (std::int64_t i = 0; i < m.rows(); ++i)
    for (std::int64_t j = 0; j < m.cols(); ++j) m(i, j) = d.visible(d.q_lo + i, d.k_lo + j);
  return m;
}

}  // namespace

template <class T>
void block_forward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, std::span<const BlockDesc> blocks,
                       T scale, T* acc_out, T* acc_lse) {
  const int H = shape.heads, Hkv = shape.kv_heads, D = shape.dim, group = H / Hkv;
  for (const auto& d : blocks) {
    const std::int64_t nq = d.q_hi - d.q_lo, nk = d.k_hi - d.k_lo;
    if (nq <= 0 || nk <= 0) continue;
    const auto vis = visibility(d);
    for (int h = 0; h < H; ++h) {
      const int kh = h / group;
      Mat<T> s = scale * (rows(q, d.row0 + d.q_lo, nq, H, h, D) * rows(k, d.row0 + d.k_lo, nk, Hkv, kh, D).transpose());
      Eigen::Matrix<T, Eigen::Dynamic, 1> lse_b(nq);
      for (std::int64_t i = 0; i < nq; ++i) {
        T m = -std::numeric_limits<T>::infinity();
        for (std::int64_t j = 0; j < nk; ++j)
          if (vis(i, j)) m = std::max(m, s(i, j));
        T sum = 0;
        for (std::int64_t j = 0; j < nk; ++j) {
          s(i, j) = vis(i, j) ? std::exp(s(i, j) - m) : T(0);
          sum += s(i, j);
        }
        lse_b(i) = sum > 0 ? m + std::log(sum) : -std::numeric_limits<T>::infinity();
        if (sum > 0) s.row(i) /= sum;
      }
      const Mat<T> ob = s * rows(v, d.row0 + d.k_lo, nk, Hkv, kh, D);
      auto acc = rows(acc_out, d.row0 + d.q_lo, nq, H, h, D);
      for (std::int64_t i = 0; i < nq; ++i) {
        const T lb = lse_b(i);
        if (lb == -std::numeric_limits<T>::infinity()) continue;  // block saw no key for this row
        T& L = acc_lse[(d.row0 + d.q_lo + i) * H + h];
        if (L == -std::numeric_limits<T>::infinity()) {
          acc.row(i) = ob.row(i);
          L = lb;
          continue;
        }
        const T w = T(1) / (T(1) + std::exp(L - lb));  // sigmoid(lb - L)
        acc.row(i) -= w * (acc.row(i) - ob.row(i));
        L = std::max(L, lb) + std::log1p(std::exp(-std::abs(L - lb)));
      }
    }
  }
}

template <class T>
void block_backward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, const T* dout, const T* lse,
                        const T* drow, std::span<const BlockDesc> blocks, T scale, T* dq, T* dk, T* dv) {
  const int H = shape.heads, Hkv = shape.kv_heads, D = shape.dim, group = H / Hkv;
  for (const auto& d : blocks) {
    const std::int64_t nq = d.q_hi - d.q_lo, nk = d.k_hi - d.k_lo;
    if (nq <= 0 || nk <= 0) continue;
    const auto vis = visibility(d);
    const std::int64_t q0 = d.row0 + d.q_lo, k0 = d.row0 + d.k_lo;
    for (int h = 0; h < H; ++h) {
      const int kh = h / group;
      const auto Q = rows(q, q0, nq, H, h, D);
      const auto K = rows(k, k0, nk, Hkv, kh, D);
      const auto V = rows(v, k0, nk, Hkv, kh, D);
      const auto dO = rows(dout, q0, nq, H, h, D);
      Mat<T> p = scale * (Q * K.transpose());
      for (std::int64_t i = 0; i < nq; ++i) {
        const T L = lse[(q0 + i) * H + h];
        for (std::int64_t j = 0; j < nk; ++j) p(i, j) = (vis(i, j) && std::isfinite(L)) ? std::exp(p(i, j) - L) : T(0);
      }
      rows(dv, k0, nk, Hkv, kh, D).noalias() += p.transpose() * dO;
      Mat<T> ds = dO * V.transpose();
      for (std::int64_t i = 0; i < nq; ++i)
        ds.row(i) = p.row(i).cwiseProduct((ds.row(i).array() - drow[(q0 + i) * H + h]).matrix());
      rows(dq, q0, nq, H, h, D).noalias() += scale * (ds * K);
      rows(dk, k0, nk, Hkv, kh, D).noalias() += scale * (ds.transpose() * Q);
    }
  }
}

template <class T>
void CpuRingDevice<T>::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

template <class T>
void CpuRingDevice<T>::fill(void* acc, std::size_t count, double value) {
  std::fill_n(static_cast<T*>(acc), count, static_cast<T>(value));
}

template <class T>
void CpuRingDevice<T>::forward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k,
                               const void* v, double scale, void* out, void* lse) {
  block_forward_cpu<T>(shape, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), blocks.host,
                       static_cast<T>(scale), static_cast<T*>(out), static_cast<T*>(lse));
}

template <class T>
void CpuRingDevice<T>::row_dot(const void* dout, const void* out, std::int64_t rows, int dim, void* drow) {
  const T *d = static_cast<const T*>(dout), *o = static_cast<const T*>(out);
  T* r = static_cast<T*>(drow);
  for (std::int64_t i = 0; i < rows; ++i) {
    T acc = 0;
    for (int e = 0; e < dim; ++e) acc += d[i * dim + e] * o[i * dim + e];
    r[i] = acc;
  }
}

template <class T>
void CpuRingDevice<T>::backward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k,
                                const void* v, const void* dout, const void* lse, const void* drow, double scale,
                                void* dq, void* dk, void* dv) {
  block_backward_cpu<T>(shape, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                        static_cast<const T*>(dout), static_cast<const T*>(lse), static_cast<const T*>(drow),
                        blocks.host, static_cast<T>(scale), static_cast<T*>(dq), static_cast<T*>(dk),
                        static_cast<T*>(dv));
}

namespace {
/// Host workspace for the CPU convenience wrappers.
WorkspaceFn host_workspace(std::vector<std::byte>& buffer) {
  return [&buffer](std::size_t bytes) -> void* {
    buffer.resize(bytes);
    return buffer.data();
  };
}
}  // namespace

template <class T>
void ring_attention_forward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                            const T* v, const RingOptions& opts, T* out, T* lse) {
  CpuRingDevice<T> device;
  std::vector<std::byte> buffer;
  ring_forward(comm, device, layout, shape, opts, q, k, v, out, lse, host_workspace(buffer));
}

template <class T>
void ring_attention_backward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                             const T* v, const T* out, const T* lse, const T* dout, const RingOptions& opts, T* dq,
                             T* dk, T* dv) {
  CpuRingDevice<T> device;
  std::vector<std::byte> buffer;
  ring_backward(comm, device, layout, shape, opts, q, k, v, out, lse, dout, dq, dk, dv, host_workspace(buffer));
}

#define DYNACP_INSTANTIATE(T)                                                                                          \
  template class CpuRingDevice<T>;                                                                                     \
  template void block_forward_cpu<T>(const AttnShape&, const T*, const T*, const T*, std::span<const BlockDesc>, T,    \
                                     T*, T*);                                                                          \
  template void block_backward_cpu<T>(const AttnShape&, const T*, const T*, const T*, const T*, const T*, const T*,    \
                                      std::span<const BlockDesc>, T, T*, T*, T*);                                      \
  template void ring_attention_forward<T>(Comm&, const ZigzagLayout&, const AttnShape&, const T*, const T*, const T*,  \
                                          const RingOptions&, T*, T*);                                                 \
  template void ring_attention_backward<T>(Comm&, const ZigzagLayout&, const AttnShape&, const T*, const T*, const T*, \
                                           const T*, const T*, const T*, const RingOptions&, T*, T*, T*);
DYNACP_INSTANTIATE(float)
DYNACP_INSTANTIATE(double)
#undef DYNACP_INSTANTIATE

}  // namespace dynacp::runtime
