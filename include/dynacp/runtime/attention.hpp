// Ring attention over packed THD tensors: CPU reference block kernels (fp32, fp64; Eigen) and the CPU ring
// executor over a Comm. Tensors are row-major: q/out/dq [T, H, D], k/v/dk/dv [T, Hkv, D], lse [T, H].
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
#include "dynacp/runtime/schedule.hpp"

namespace dynacp::runtime {

struct AttnShape {
  std::int64_t tokens = 0;  ///< local rows of q (and of k, v)
  int heads = 1;            ///< q heads
  int kv_heads = 1;         ///< kv heads; must divide heads (GQA)
  int dim = 1;              ///< head dimension of q, k and v

  /// Throws InvalidArgument if any field is non-positive or kv_heads does not divide heads.
  void validate() const;
};

struct RingOptions {
  std::vector<std::uint8_t> causal;  ///< per sequence: 1 causal, 0 full; empty = all causal
  double scale = 0;                  ///< softmax scale; 0 = 1/sqrt(dim)
};

/// Block forward: for every desc, attends q rows to kv rows and merges (O_b, L_b) into (acc_out, acc_lse).
/// Initialise acc_out to 0 and acc_lse to -inf; rows that see no key keep (0, -inf).
template <class T>
void block_forward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, std::span<const BlockDesc> blocks,
                       T scale, T* acc_out, T* acc_lse);

/// Block backward with the final lse and drow = sum_d dout * out ([T, H]); accumulates into dq, dk, dv.
template <class T>
void block_backward_cpu(const AttnShape& shape, const T* q, const T* k, const T* v, const T* dout, const T* lse,
                        const T* drow, std::span<const BlockDesc> blocks, T scale, T* dq, T* dk, T* dv);

/// Ring forward on this rank's zigzag shard; comm.size() must equal layout.cp. Writes out [T,H,D] and lse [T,H].
template <class T>
void ring_attention_forward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                            const T* v, const RingOptions& opts, T* out, T* lse);

/// Ring backward from the saved final out and lse; writes dq, dk, dv for this rank's shard.
template <class T>
void ring_attention_backward(Comm& comm, const ZigzagLayout& layout, const AttnShape& shape, const T* q, const T* k,
                             const T* v, const T* out, const T* lse, const T* dout, const RingOptions& opts, T* dq,
                             T* dk, T* dv);

}  // namespace dynacp::runtime
