#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"

namespace dynacp::runtime {

void AttnShape::validate() const {
  if (tokens < 0 || heads < 1 || kv_heads < 1 || dim < 1)
    invalid("attention shape needs tokens >= 0 and positive heads, kv_heads, dim; got tokens=", tokens,
            " heads=", heads, " kv_heads=", kv_heads, " dim=", dim);
  if (heads % kv_heads != 0) invalid("kv_heads (", kv_heads, ") must divide heads (", heads, ") for GQA");
}

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

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

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

namespace {

void check_ring_args(const Comm& comm, const ZigzagLayout& layout, const AttnShape& shape) {
  shape.validate();
  if (comm.size() != layout.cp)
    invalid("ring attention: the communicator has ", comm.size(), " ranks but the layout is for cp = ", layout.cp);
  if (shape.tokens != layout.local_tokens())
    invalid("ring attention: the shard has ", shape.tokens, " rows but the layout gives each rank ",
            layout.local_tokens(), " (cu_seqlens_padded.back() / cp); shard with zigzag_rows()");
}

template <class T>
T softmax_scale(const RingOptions& o, const AttnShape& s) {
  return static_cast<T>(o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(s.dim)));
}

}  // namespace

template <class T>
void ring_attention_forward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                            const T* v, const RingOptions& opts, T* out, T* lse) {
  check_ring_args(comm, layout, shape);
  const int W = layout.cp, r = comm.rank();
  const std::size_t n_kv = static_cast<std::size_t>(shape.tokens) * shape.kv_heads * shape.dim;
  std::vector<T> kv(2 * n_kv), next(2 * n_kv);
  std::copy(k, k + n_kv, kv.begin());
  std::copy(v, v + n_kv, kv.begin() + n_kv);
  std::fill(out, out + shape.tokens * shape.heads * shape.dim, T(0));
  std::fill(lse, lse + shape.tokens * shape.heads, static_cast<T>(kNegInf));
  for (int t = 0; t < W; ++t) {
    if (t + 1 < W) {
      const P2POp ops[] = {send_op(ring_next(r, W), kv.data(), kv.size() * sizeof(T)),
                           recv_op(ring_prev(r, W), next.data(), next.size() * sizeof(T))};
      comm.exchange(ops, detail::cat("ring attention forward, kv step ", t));
    }
    const auto blocks = ring_blocks(layout, r, t, opts.causal);
    block_forward_cpu<T>(shape, q, kv.data(), kv.data() + n_kv, blocks, softmax_scale<T>(opts, shape), out, lse);
    if (t + 1 < W) kv.swap(next);
  }
}

template <class T>
void ring_attention_backward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                             const T* v, const T* out, const T* lse, const T* dout, const RingOptions& opts, T* dq,
                             T* dk, T* dv) {
  check_ring_args(comm, layout, shape);
  const int W = layout.cp, r = comm.rank(), H = shape.heads, D = shape.dim;
  const std::size_t n_kv = static_cast<std::size_t>(shape.tokens) * shape.kv_heads * D;
  std::vector<T> drow(static_cast<std::size_t>(shape.tokens) * H);
  for (std::size_t i = 0; i < drow.size(); ++i) {
    T acc = 0;
    for (int e = 0; e < D; ++e) acc += dout[i * D + e] * out[i * D + e];
    drow[i] = acc;
  }
  std::vector<T> kv(2 * n_kv), kv_next(2 * n_kv), dkv(2 * n_kv, T(0)), dkv_next(2 * n_kv);
  std::copy(k, k + n_kv, kv.begin());
  std::copy(v, v + n_kv, kv.begin() + n_kv);
  std::fill(dq, dq + shape.tokens * H * D, T(0));
  const std::size_t bytes = kv.size() * sizeof(T);
  for (int t = 0; t < W; ++t) {
    const auto blocks = ring_blocks(layout, r, t, opts.causal);
    block_backward_cpu<T>(shape, q, kv.data(), kv.data() + n_kv, dout, lse, drow.data(), blocks,
                          softmax_scale<T>(opts, shape), dq, dkv.data(), dkv.data() + n_kv);
    if (W == 1) break;
    // The dk/dv accumulated for the held kv travel with it; after the last step they reach their owner.
    if (t + 1 < W) {
      const P2POp ops[] = {send_op(ring_next(r, W), kv.data(), bytes), send_op(ring_next(r, W), dkv.data(), bytes),
                           recv_op(ring_prev(r, W), kv_next.data(), bytes),
                           recv_op(ring_prev(r, W), dkv_next.data(), bytes)};
      comm.exchange(ops, detail::cat("ring attention backward, kv+dkv step ", t));
      kv.swap(kv_next);
    } else {
      const P2POp ops[] = {send_op(ring_next(r, W), dkv.data(), bytes),
                           recv_op(ring_prev(r, W), dkv_next.data(), bytes)};
      comm.exchange(ops, "ring attention backward, final dkv");
    }
    dkv.swap(dkv_next);
  }
  std::copy(dkv.begin(), dkv.begin() + n_kv, dk);
  std::copy(dkv.begin() + n_kv, dkv.end(), dv);
}

#define DYNACP_INSTANTIATE(T)                                                                                          \
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
