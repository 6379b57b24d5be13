// Ring attention over packed THD tensors: CPU reference block kernels (fp32, fp64; Eigen), the CPU device of the
// ring executor (ring.hpp) and the CPU ring over a Comm.
// Tensors are row-major: q/out/dq [T, H, D], k/v/dk/dv [T, Hkv, D], lse [T, H].
// The forward returns the output and the natural-log LSE; partial results are merged with the overflow-free form
//   L <- max(L, Lb) + log1p(exp(-|L - Lb|)),  O <- O - sigmoid(Lb - L_old)(O - Ob)
// skipping blocks whose LSE is -inf. The backward recomputes each block from the final output and LSE
// (P = exp(s q.k - L)), accumulates dq locally and rings the accumulated dk/dv back to their owner.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/runtime/comm.hpp"
#include "dynacp/runtime/layout.hpp"
#include "dynacp/runtime/ring.hpp"
#include "dynacp/runtime/schedule.hpp"

namespace dynacp::runtime {

/// Block forward: for every desc, attends q rows to kv rows and merges (O_b, L_b) into (acc_out, acc_lse).
/// Initialise acc_out to 0 and acc_lse to -inf; rows that see no key keep (0, -inf).
template <class T>
void block_forward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, std::span<const BlockDesc> blocks,
                       T scale, T* acc_out, T* acc_lse);

/// Block backward with the final lse and drow = sum_d dout * out ([T, H]); accumulates into dq, dk, dv.
template <class T>
void block_backward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, const T* dout, const T* lse,
                        const T* drow, std::span<const BlockDesc> blocks, T scale, T* dq, T* dk, T* dv);

/// The CPU half of the ring executor (ring.hpp): input and accumulation type T, host memory, the Eigen kernels.
template <class T>
class CpuRingDevice final : public RingDevice {
 public:
  std::size_t input_bytes() const override { return sizeof(T); }
  std::size_t acc_bytes() const override { return sizeof(T); }
  void validate(const AttnShape& shape) const override { shape.validate(); }
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void upload(void* dst, const void* host_src, std::size_t bytes) override { copy(dst, host_src, bytes); }
  void fill(void* acc, std::size_t count, double value) override;
  void forward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
               double scale, void* out, void* lse) override;
  void row_dot(const void* dout, const void* out, std::int64_t rows, int dim, void* drow) override;
  void backward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
                const void* dout, const void* lse, const void* drow, double scale, void* dq, void* dk,
                void* dv) override;
  void synchronize() override {}
};

/// ring_forward with CpuRingDevice<T> and a host workspace. Writes out [T,H,D] and lse [T,H].
template <class T>
void ring_attention_forward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                            const T* v, const RingOptions& opts, T* out, T* lse);

/// ring_backward with CpuRingDevice<T>: from the saved final out and lse, writes dq, dk, dv for this rank's shard.
template <class T>
void ring_attention_backward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                             const T* v, const T* out, const T* lse, const T* dout, const RingOptions& opts, T* dq,
                             T* dk, T* dv);

}  // namespace dynacp::runtime
