// Ring attention over W simulated ranks on one GPU: the CUDA executor of the shared zigzag schedule. Each rank's
// shard has its own buffers; a ring hop is a device-to-device copy into the next rank's receive buffer. Ranks run
// one after another on one stream, so throughput is the aggregate over ranks.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/cuda.hpp"

namespace dynacp::runtime::cuda {

namespace {
template <class T>
T* device_alloc(std::size_t count) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}
}  // namespace

SimulatedRing::SimulatedRing(const ZigzagLayout& layout, const AttnShape& shape, DType dt,
                             std::vector<std::uint8_t> causal, double scale)
    : layout_(layout), shape_(shape), dt_(dt) {
  shape_.validate();
  if (shape_.tokens != layout_.local_tokens())
    invalid("simulated ring: shard has ", shape_.tokens, " rows, layout gives ", layout_.local_tokens());
  scale_ = static_cast<float>(scale > 0 ? scale : 1.0 / std::sqrt(double(shape_.dim)));
  const int W = layout_.cp;
  for (int r = 0; r < W; ++r)
    for (int t = 0; t < W; ++t) {
      const auto blocks = ring_blocks(layout_, r, t, causal);
      Step s;
      s.count = static_cast<int>(blocks.size());
      for (const auto& b : blocks)
        s.max_q = std::max(s.max_q, b.q_hi - b.q_lo), s.max_k = std::max(s.max_k, b.k_hi - b.k_lo);
      s.blocks = device_alloc<BlockDesc>(blocks.size());
      if (!blocks.empty())
        check(cudaMemcpy(s.blocks, blocks.data(), blocks.size() * sizeof(BlockDesc), cudaMemcpyHostToDevice),
              "upload ring blocks");
      steps_.push_back(s);
    }
  const std::size_t n_kv = static_cast<std::size_t>(shape_.tokens) * shape_.kv_heads * shape_.dim;
  for (int r = 0; r < W; ++r) {
    kv_.push_back(device_alloc<std::byte>(2 * n_kv * dtype_size(dt_)));
    kv_next_.push_back(device_alloc<std::byte>(2 * n_kv * dtype_size(dt_)));
    dkv_.push_back(device_alloc<float>(2 * n_kv));
    dkv_next_.push_back(device_alloc<float>(2 * n_kv));
    drow_.push_back(device_alloc<float>(static_cast<std::size_t>(shape_.tokens) * shape_.heads));
  }
}

SimulatedRing::~SimulatedRing() {
  for (auto& s : steps_) cudaFree(s.blocks);
  for (auto* p : kv_) cudaFree(p);
  for (auto* p : kv_next_) cudaFree(p);
  for (auto* p : dkv_) cudaFree(p);
  for (auto* p : dkv_next_) cudaFree(p);
  for (auto* p : drow_) cudaFree(p);
}

void SimulatedRing::forward(const std::vector<const void*>& q, const std::vector<const void*>& k,
                            const std::vector<const void*>& v, const std::vector<float*>& out,
                            const std::vector<float*>& lse, cudaStream_t stream) {
  const int W = layout_.cp;
  const std::size_t half = static_cast<std::size_t>(shape_.tokens) * shape_.kv_heads * shape_.dim * dtype_size(dt_);
  const std::size_t rows = static_cast<std::size_t>(shape_.tokens) * shape_.heads;
  const std::vector<float> neg_inf(rows, -std::numeric_limits<float>::infinity());
  for (int r = 0; r < W; ++r) {
    auto* kv = static_cast<std::byte*>(kv_[r]);
    check(cudaMemcpyAsync(kv, k[r], half, cudaMemcpyDeviceToDevice, stream), "copy k");
    check(cudaMemcpyAsync(kv + half, v[r], half, cudaMemcpyDeviceToDevice, stream), "copy v");
    check(cudaMemsetAsync(out[r], 0, rows * shape_.dim * sizeof(float), stream), "zero out");
    check(cudaMemcpyAsync(lse[r], neg_inf.data(), rows * sizeof(float), cudaMemcpyHostToDevice, stream), "init lse");
  }
  check(cudaStreamSynchronize(stream), "init sync");  // neg_inf is pageable host memory
  for (int t = 0; t < W; ++t) {
    for (int r = 0; r < W; ++r) {
      const Step& s = steps_[r * W + t];
      auto* kv = static_cast<std::byte*>(kv_[r]);
      block_forward(dt_, shape_, q[r], kv, kv + half, s.blocks, s.count, s.max_q, scale_, out[r], lse[r], stream);
    }
    if (t + 1 == W) break;
    for (int r = 0; r < W; ++r)
      check(cudaMemcpyAsync(kv_next_[ring_next(r, W)], kv_[r], 2 * half, cudaMemcpyDeviceToDevice, stream), "kv hop");
    kv_.swap(kv_next_);
  }
}

void SimulatedRing::backward(const std::vector<const void*>& q, const std::vector<const void*>& k,
                             const std::vector<const void*>& v, const std::vector<const float*>& out,
                             const std::vector<const float*>& lse, const std::vector<const void*>& dout,
                             const std::vector<float*>& dq, const std::vector<float*>& dk,
                             const std::vector<float*>& dv, cudaStream_t stream) {
  const int W = layout_.cp;
  const std::size_t n_kv = static_cast<std::size_t>(shape_.tokens) * shape_.kv_heads * shape_.dim;
  const std::size_t half = n_kv * dtype_size(dt_);
  const std::size_t rows = static_cast<std::size_t>(shape_.tokens) * shape_.heads;
  for (int r = 0; r < W; ++r) {
    auto* kv = static_cast<std::byte*>(kv_[r]);
    check(cudaMemcpyAsync(kv, k[r], half, cudaMemcpyDeviceToDevice, stream), "copy k");
    check(cudaMemcpyAsync(kv + half, v[r], half, cudaMemcpyDeviceToDevice, stream), "copy v");
    check(cudaMemsetAsync(dkv_[r], 0, 2 * n_kv * sizeof(float), stream), "zero dkv");
    check(cudaMemsetAsync(dq[r], 0, rows * shape_.dim * sizeof(float), stream), "zero dq");
    row_dot(dt_, dout[r], out[r], static_cast<std::int64_t>(rows), shape_.dim, drow_[r], stream);
  }
  for (int t = 0; t < W; ++t) {
    for (int r = 0; r < W; ++r) {
      const Step& s = steps_[r * W + t];
      auto* kv = static_cast<std::byte*>(kv_[r]);
      block_backward(dt_, shape_, q[r], kv, kv + half, dout[r], lse[r], drow_[r], s.blocks, s.count, s.max_q, s.max_k,
                     scale_, dq[r], dkv_[r], dkv_[r] + n_kv, stream);
    }
    if (W == 1) break;
    // dk/dv accumulated for the held kv travel with it; after the last step they reach their owner.
    for (int r = 0; r < W; ++r) {
      const int to = ring_next(r, W);
      if (t + 1 < W) check(cudaMemcpyAsync(kv_next_[to], kv_[r], 2 * half, cudaMemcpyDeviceToDevice, stream), "kv hop");
      check(cudaMemcpyAsync(dkv_next_[to], dkv_[r], 2 * n_kv * sizeof(float), cudaMemcpyDeviceToDevice, stream),
            "dkv hop");
    }
    if (t + 1 < W) kv_.swap(kv_next_);
    dkv_.swap(dkv_next_);
  }
  for (int r = 0; r < W; ++r) {
    check(cudaMemcpyAsync(dk[r], dkv_[r], n_kv * sizeof(float), cudaMemcpyDeviceToDevice, stream), "copy dk");
    check(cudaMemcpyAsync(dv[r], dkv_[r] + n_kv, n_kv * sizeof(float), cudaMemcpyDeviceToDevice, stream), "copy dv");
  }
}

}  // namespace dynacp::runtime::cuda
