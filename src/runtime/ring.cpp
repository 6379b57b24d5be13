// The ring loop of ring.hpp, written once for every RingDevice (CPU Eigen kernels, CUDA kernels).
#include "dynacp/runtime/ring.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

#include "dynacp/model/error.hpp"

namespace dynacp::runtime {

using detail::cat;

void AttnShape::validate() const {
  if (tokens < 0 || heads < 1 || kv_heads < 1 || dim < 1)
    invalid("attention shape needs tokens >= 0 and positive heads, kv_heads, dim; got tokens=", tokens,
            " heads=", heads, " kv_heads=", kv_heads, " dim=", dim);
  if (heads % kv_heads != 0) invalid("kv_heads (", kv_heads, ") must divide heads (", heads, ") for GQA");
}

namespace {

void check_ring_args(const Comm& comm, const RingDevice& device, const ZigzagLayout& layout, const AttnShape& shape) {
  shape.validate();
  device.validate(shape);
  if (comm.size() != layout.cp)
    invalid("ring attention: the communicator has ", comm.size(), " ranks but the layout is for cp = ", layout.cp);
  if (shape.tokens != layout.local_tokens())
    invalid("ring attention: the shard has ", shape.tokens, " rows but the layout gives each rank ",
            layout.local_tokens(), " (cu_seqlens_padded.back() / cp); shard with zigzag_rows()");
}

double softmax_scale(const RingOptions& o, const AttnShape& s) {
  return o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(s.dim));
}

/// Carves aligned regions out of one workspace allocation: reserve() them all, then allocate() once.
class Carver {
 public:
  std::size_t reserve(std::size_t bytes) {
    const std::size_t at = size_;
    size_ += (bytes + kAlign - 1) / kAlign * kAlign;
    return at;
  }
  void allocate(const WorkspaceFn& workspace) {
    if (!workspace) invalid("ring attention needs a workspace allocator");
    size_ = std::max(size_, kAlign);  // never ask for 0 bytes (an empty batch)
    base_ = static_cast<std::byte*>(workspace(size_));
    if (base_ == nullptr || reinterpret_cast<std::uintptr_t>(base_) % 16 != 0)
      throw Error(cat("ring attention: the workspace allocator returned ", static_cast<void*>(base_), " for ", size_,
                      " bytes; it must return memory aligned to 16 bytes"));
  }
  std::byte* at(std::size_t offset) const { return base_ + offset; }

 private:
  static constexpr std::size_t kAlign = 256;
  std::size_t size_ = 0;
  std::byte* base_ = nullptr;
};

/// The blocks of every step of this rank, uploaded to the device.
class Schedule {
 public:
  Schedule(const ZigzagLayout& layout, int rank, std::span<const std::uint8_t> causal, Carver& ws) {
    for (int t = 0; t < layout.cp; ++t) {
      host_.push_back(ring_blocks(layout, rank, t, causal));
      offsets_.push_back(ws.reserve(host_.back().size() * sizeof(BlockDesc)));
    }
  }
  void upload(RingDevice& device, const Carver& ws) {
    for (std::size_t t = 0; t < host_.size(); ++t) {
      StepBlocks s;
      s.host = host_[t];
      s.device = reinterpret_cast<const BlockDesc*>(ws.at(offsets_[t]));
      for (const auto& b : host_[t])
        s.max_q = std::max(s.max_q, b.q_hi - b.q_lo), s.max_k = std::max(s.max_k, b.k_hi - b.k_lo);
      if (!host_[t].empty()) device.upload(ws.at(offsets_[t]), host_[t].data(), host_[t].size() * sizeof(BlockDesc));
      steps_.push_back(s);
    }
  }
  const StepBlocks& operator[](int t) const { return steps_[t]; }

 private:
  std::vector<std::vector<BlockDesc>> host_;
  std::vector<std::size_t> offsets_;
  std::vector<StepBlocks> steps_;
};

}  // namespace

void ring_forward(Comm& comm, RingDevice& device, const ZigzagLayout& layout, const AttnShape& shape,
                  const RingOptions& opts, const void* q, const void* k, const void* v, void* out, void* lse,
                  const WorkspaceFn& workspace) {
  check_ring_args(comm, device, layout, shape);
  const int W = layout.cp, r = comm.rank();
  const std::size_t n_kv = static_cast<std::size_t>(shape.tokens) * shape.kv_heads * shape.dim;
  const std::size_t half = n_kv * device.input_bytes(), rows = static_cast<std::size_t>(shape.tokens) * shape.heads;
  Carver ws;
  const std::size_t kv_at = ws.reserve(2 * half), next_at = ws.reserve(W > 1 ? 2 * half : 0);
  Schedule steps(layout, r, opts.causal, ws);
  ws.allocate(workspace);
  steps.upload(device, ws);
  std::byte *kv = ws.at(kv_at), *next = ws.at(next_at);
  device.copy(kv, k, half);
  device.copy(kv + half, v, half);
  device.fill(out, rows * shape.dim, 0.0);
  device.fill(lse, rows, -std::numeric_limits<double>::infinity());
  const double scale = softmax_scale(opts, shape);
  for (int t = 0; t < W; ++t) {
    if (t + 1 < W) {
      device.synchronize();
      const P2POp ops[] = {send_op(ring_next(r, W), kv, 2 * half), recv_op(ring_prev(r, W), next, 2 * half)};
      comm.exchange(ops, cat("ring attention forward, kv step ", t));
    }
    device.forward(shape, steps[t], q, kv, kv + half, scale, out, lse);
    if (t + 1 < W) std::swap(kv, next);
  }
}

void ring_backward(Comm& comm, RingDevice& device, const ZigzagLayout& layout, const AttnShape& shape,
                   const RingOptions& opts, const void* q, const void* k, const void* v, const void* out,
                   const void* lse, const void* dout, void* dq, void* dk, void* dv, const WorkspaceFn& workspace) {
  check_ring_args(comm, device, layout, shape);
  const int W = layout.cp, r = comm.rank();
  const std::size_t n_kv = static_cast<std::size_t>(shape.tokens) * shape.kv_heads * shape.dim;
  const std::size_t half = n_kv * device.input_bytes(), acc_half = n_kv * device.acc_bytes();
  const std::size_t rows = static_cast<std::size_t>(shape.tokens) * shape.heads;
  Carver ws;
  const std::size_t kv_at = ws.reserve(2 * half), kv_next_at = ws.reserve(W > 1 ? 2 * half : 0);
  const std::size_t dkv_at = ws.reserve(2 * acc_half), dkv_next_at = ws.reserve(W > 1 ? 2 * acc_half : 0);
  const std::size_t drow_at = ws.reserve(rows * device.acc_bytes());
  Schedule steps(layout, r, opts.causal, ws);
  ws.allocate(workspace);
  steps.upload(device, ws);
  std::byte *kv = ws.at(kv_at), *kv_next = ws.at(kv_next_at), *dkv = ws.at(dkv_at), *dkv_next = ws.at(dkv_next_at);
  std::byte* drow = ws.at(drow_at);
  device.row_dot(dout, out, static_cast<std::int64_t>(rows), shape.dim, drow);
  device.copy(kv, k, half);
  device.copy(kv + half, v, half);
  device.fill(dkv, 2 * n_kv, 0.0);
  device.fill(dq, rows * shape.dim, 0.0);
  const double scale = softmax_scale(opts, shape);
  for (int t = 0; t < W; ++t) {
    device.backward(shape, steps[t], q, kv, kv + half, dout, lse, drow, scale, dq, dkv, dkv + acc_half);
    if (W == 1) break;
    // The dk/dv accumulated for the held kv travel with it; after the last step they reach their owner.
    device.synchronize();
    if (t + 1 < W) {
      const P2POp ops[] = {send_op(ring_next(r, W), kv, 2 * half), send_op(ring_next(r, W), dkv, 2 * acc_half),
                           recv_op(ring_prev(r, W), kv_next, 2 * half),
                           recv_op(ring_prev(r, W), dkv_next, 2 * acc_half)};
      comm.exchange(ops, cat("ring attention backward, kv+dkv step ", t));
      std::swap(kv, kv_next);
    } else {
      const P2POp ops[] = {send_op(ring_next(r, W), dkv, 2 * acc_half),
                           recv_op(ring_prev(r, W), dkv_next, 2 * acc_half)};
      comm.exchange(ops, "ring attention backward, final dkv");
    }
    std::swap(dkv, dkv_next);
  }
  device.copy(dk, dkv, acc_half);
  device.copy(dv, dkv + acc_half, acc_half);
}

}  // namespace dynacp::runtime
