// The device-agnostic ring executor: one ring loop (kv hops, dk/dv hops, LSE merging order) written once against a
// RingDevice, the per-device half (element sizes, copies and the block kernels). CpuRingDevice<T> (Eigen, in
// attention.hpp) and cuda::CudaRingDevice (cuda.hpp) implement it, so the CPU tests run the very loop that drives the
// CUDA kernels. The schedule is schedule.hpp / ring_blocks, shared with cuda::SimulatedRing.
//
// Memory: every pointer handed to ring_forward / ring_backward is memory of the device (host memory for the CPU,
// device memory for CUDA). The loop takes all of its scratch memory (the kv buffers that travel the ring, dk/dv
// accumulators, the row dots and the block descriptors) from one `workspace` call, so a caller can allocate it with
// its own allocator (dynacp.torch uses a torch tensor and maps the P2P buffers back to slices of it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
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

/// The blocks of one ring step: `host` for sizes (and the CPU kernels), `device` the same descriptors in device
/// memory (what GPU kernels read), and the largest q and kv row counts of a block (grid sizes).
struct StepBlocks {
  std::span<const BlockDesc> host;
  const BlockDesc* device = nullptr;
  std::int64_t max_q = 0, max_k = 0;
};

/// The per-device half of the ring executor. Two element types: the input type (q, k, v, dout and the kv that
/// travels the ring) and the accumulation type (out, lse, dq, dk, dv and the dk/dv that travel the ring).
/// Kernels merge into / accumulate onto their outputs exactly like block_forward_cpu / block_backward_cpu.
class RingDevice {
 public:
  virtual ~RingDevice() = default;
  virtual std::size_t input_bytes() const = 0;
  virtual std::size_t acc_bytes() const = 0;
  /// Throws InvalidArgument when the kernels cannot run `shape` (e.g. a head dim above a kernel limit).
  virtual void validate(const AttnShape& shape) const = 0;

  /// Device-to-device copy.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  /// Host-to-device copy; `host_src` may be released when the call returns.
  virtual void upload(void* dst, const void* host_src, std::size_t bytes) = 0;
  /// Sets `count` accumulation-type elements to `value` (0 or -inf).
  virtual void fill(void* acc, std::size_t count, double value) = 0;

  virtual void forward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
                       double scale, void* out, void* lse) = 0;
  /// drow[i] = sum_d dout[i, d] * out[i, d] for i < rows (dout input type; out and drow accumulation type).
  virtual void row_dot(const void* dout, const void* out, std::int64_t rows, int dim, void* drow) = 0;
  virtual void backward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
                        const void* dout, const void* lse, const void* drow, double scale, void* dq, void* dk,
                        void* dv) = 0;

  /// Completes the work issued so far; called before buffers are handed to the communicator (CUDA: stream sync).
  virtual void synchronize() = 0;
};

/// Returns device memory of at least `bytes` bytes, aligned to 16, that stays valid until the ring call returns.
using WorkspaceFn = std::function<void*(std::size_t bytes)>;

/// Ring forward on this rank's zigzag shard; comm.size() must equal layout.cp. q/k/v in the device's input type;
/// writes out [T,H,D] and lse [T,H] in its accumulation type.
void ring_forward(Comm& comm, RingDevice& device, const ZigzagLayout& layout, const AttnShape& shape,
                  const RingOptions& opts, const void* q, const void* k, const void* v, void* out, void* lse,
                  const WorkspaceFn& workspace);

/// Ring backward from the saved final out and lse (accumulation type) and dout (input type); writes dq [T,H,D],
/// dk and dv [T,Hkv,D] in the accumulation type.
void ring_backward(Comm& comm, RingDevice& device, const ZigzagLayout& layout, const AttnShape& shape,
                   const RingOptions& opts, const void* q, const void* k, const void* v, const void* out,
                   const void* lse, const void* dout, void* dq, void* dk, void* dv, const WorkspaceFn& workspace);

}  // namespace dynacp::runtime
