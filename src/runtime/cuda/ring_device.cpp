// CudaRingDevice: the CUDA half of the ring executor (ring.hpp). The ring loop itself is ring.cpp, shared with the
// CPU device; this file only maps its calls onto the CUDA kernels of attention.cu and stream-ordered copies.

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/cuda.hpp"

namespace dynacp::runtime::cuda {

CudaRingDevice::CudaRingDevice(DType dt, int device, cudaStream_t stream) : dt_(dt), device_(device), stream_(stream) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount (is an NVIDIA GPU with a CUDA 13 capable driver present?)");
  if (device < 0 || device >= count)
    invalid("CUDA ring attention: device ", device, " does not exist (", count, " CUDA device(s) visible)");
  check(cudaSetDevice(device), "cudaSetDevice");
}

void CudaRingDevice::validate(const AttnShape& shape) const {
  shape.validate();
  if (shape.dim > kMaxHeadDim)
    invalid("CUDA ring attention supports head dim <= ", kMaxHeadDim, " (reference kernels), got ", shape.dim);
}

void CudaRingDevice::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes) check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "ring device copy");
}

void CudaRingDevice::upload(void* dst, const void* host_src, std::size_t bytes) {
  // From pageable host memory the copy is staged before the call returns, so host_src may go away afterwards.
  if (bytes) check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "ring block upload");
}

void CudaRingDevice::fill(void* acc, std::size_t count, double value) {
  if (count == 0) return;
  if (value == 0.0) {
    check(cudaMemsetAsync(acc, 0, count * sizeof(float), stream_), "ring device zero");
    return;
  }
  cuda::fill(static_cast<float*>(acc), static_cast<std::int64_t>(count), static_cast<float>(value), stream_);
}

void CudaRingDevice::forward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k,
                             const void* v, double scale, void* out, void* lse) {
  block_forward(dt_, shape, q, k, v, blocks.device, static_cast<int>(blocks.host.size()), blocks.max_q,
                static_cast<float>(scale), static_cast<float*>(out), static_cast<float*>(lse), stream_);
}

void CudaRingDevice::row_dot(const void* dout, const void* out, std::int64_t rows, int dim, void* drow) {
  cuda::row_dot(dt_, dout, static_cast<const float*>(out), rows, dim, static_cast<float*>(drow), stream_);
}

void CudaRingDevice::backward(const AttnShape& shape, const StepBlocks& blocks, const void* q, const void* k,
                              const void* v, const void* dout, const void* lse, const void* drow, double scale,
                              void* dq, void* dk, void* dv) {
  block_backward(dt_, shape, q, k, v, dout, static_cast<const float*>(lse), static_cast<const float*>(drow),
                 blocks.device, static_cast<int>(blocks.host.size()), blocks.max_q, blocks.max_k,
                 static_cast<float>(scale), static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv),
                 stream_);
}

void CudaRingDevice::synchronize() { check(cudaStreamSynchronize(stream_), "ring device stream synchronize"); }

}  // namespace dynacp::runtime::cuda
