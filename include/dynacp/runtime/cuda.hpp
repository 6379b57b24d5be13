// CUDA side of the runtime (targets dynacp_cuda_kernels and dynacp_cuda, built when nvcc is found): tiled reference
// attention kernels with fp32 accumulation for fp32/bf16/fp16 inputs; CudaRingDevice, the CUDA half of the ring
// executor (ring.hpp: the same loop as the CPU executor, over any Comm); and a ring over simulated ranks on one GPU
// that drives the same schedule (schedule.hpp / ring_blocks). All pointers are device pointers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "dynacp/runtime/attention.hpp"
#include "dynacp/runtime/layout.hpp"
#include "dynacp/runtime/ring.hpp"

namespace dynacp::runtime::cuda {

enum class DType { kF32, kBF16, kF16 };
inline constexpr int kMaxHeadDim = 128;

/// Throws dynacp::Error naming `what` when `status` is not cudaSuccess.
void check(cudaError_t status, const char* what);

/// Block forward over device-resident `blocks`; merges into fp32 acc_out [T,H,D] / acc_lse [T,H] like
/// block_forward_cpu. max_q_rows bounds q_hi - q_lo over the blocks (grid size). dim <= kMaxHeadDim.
void block_forward(DType dt, const AttnShape& s, const void* q, const void* k, const void* v, const BlockDesc* blocks,
                   int num_blocks, std::int64_t max_q_rows, float scale, float* acc_out, float* acc_lse,
                   cudaStream_t stream);

/// Block backward: accumulates fp32 dq [T,H,D], dk/dv [T,Hkv,D] with the final lse and drow (see row_dot).
void block_backward(DType dt, const AttnShape& s, const void* q, const void* k, const void* v, const void* dout,
                    const float* lse, const float* drow, const BlockDesc* blocks, int num_blocks,
                    std::int64_t max_q_rows, std::int64_t max_k_rows, float scale, float* dq, float* dk, float* dv,
                    cudaStream_t stream);

/// drow[i] = sum_d dout[i, d] * out[i, d] over rows*dim elements.
void row_dot(DType dt, const void* dout, const float* out, std::int64_t rows, int dim, float* drow,
             cudaStream_t stream);

/// dst[i] = value for i < n.
void fill(float* dst, std::int64_t n, float value, cudaStream_t stream);

/// Element-wise conversions between fp32 and dt.
void cast_from_float(DType dt, const float* src, void* dst, std::int64_t n, cudaStream_t stream);
void cast_to_float(DType dt, const void* src, float* dst, std::int64_t n, cudaStream_t stream);
std::size_t dtype_size(DType dt);
/// "float32" / "bfloat16" / "float16" (also "fp32", "bf16", "fp16"); InvalidArgument otherwise.
DType parse_dtype(std::string_view name);

/// The CUDA half of the ring executor (ring.hpp): input type `dt`, fp32 accumulation (out, lse, dq, dk, dv and the
/// dk/dv that travel the ring), every kernel and copy on `stream` of `device`. synchronize() waits for the stream,
/// so the communicator may run on any stream (torch.distributed/NCCL, NcclComm, host staging).
class CudaRingDevice final : public RingDevice {
 public:
  /// Selects `device` (cudaSetDevice); throws dynacp::Error naming the CUDA error when no usable GPU is present.
  CudaRingDevice(DType dt, int device, cudaStream_t stream);
  std::size_t input_bytes() const override { return dtype_size(dt_); }
  std::size_t acc_bytes() const override { return sizeof(float); }
  void validate(const AttnShape& shape) const override;
  void copy(void* dst, const void* src, std::size_t bytes) override;
  void upload(void* dst, const void* host_src, std::size_t bytes) override;
  void fill(void* acc, std::size_t count, double value) override;
  void forward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
               double scale, void* out, void* lse) override;
  void row_dot(const void* dout, const void* out, std::int64_t rows, int dim, void* drow) override;
  void backward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k, const void* v,
                const void* dout, const void* lse, const void* drow, double scale, void* dq, void* dk,
                void* dv) override;
  void synchronize() override;

  DType dtype() const { return dt_; }
  int device() const { return device_; }

 private:
  DType dt_;
  int device_;
  cudaStream_t stream_;
};

/// W simulated ranks on one GPU: each rank's shard lives in its own buffers and kv hops between them with
/// device-to-device copies, following zigzag_step/ring_blocks exactly as ring_forward/ring_backward (ring.hpp) do.
class SimulatedRing {
 public:
  SimulatedRing(const ZigzagLayout& layout, const AttnShape& shape, DType dt, std::vector<std::uint8_t> causal,
                double scale = 0);
  ~SimulatedRing();
  SimulatedRing(const SimulatedRing&) = delete;
  SimulatedRing& operator=(const SimulatedRing&) = delete;

  /// q/k/v[r]: rank r's shard (device, dtype dt). Writes fp32 out[r] [T,H,D] and lse[r] [T,H].
  void forward(const std::vector<const void*>& q, const std::vector<const void*>& k, const std::vector<const void*>& v,
               const std::vector<float*>& out, const std::vector<float*>& lse, cudaStream_t stream);
  /// Writes fp32 dq[r], dk[r], dv[r] from the saved fp32 out/lse and dout[r] (dtype dt).
  void backward(const std::vector<const void*>& q, const std::vector<const void*>& k, const std::vector<const void*>& v,
                const std::vector<const float*>& out, const std::vector<const float*>& lse,
                const std::vector<const void*>& dout, const std::vector<float*>& dq, const std::vector<float*>& dk,
                const std::vector<float*>& dv, cudaStream_t stream);

 private:
  struct Step {
    BlockDesc* blocks = nullptr;  // device
    int count = 0;
    std::int64_t max_q = 0, max_k = 0;
  };
  ZigzagLayout layout_;
  AttnShape shape_;
  DType dt_;
  float scale_;
  std::vector<Step> steps_;             // [rank * cp + step]
  std::vector<void*> kv_, kv_next_;     // per rank: k then v, dtype dt
  std::vector<float*> dkv_, dkv_next_;  // per rank: dk then dv, fp32
  std::vector<float*> drow_;
};

}  // namespace dynacp::runtime::cuda
