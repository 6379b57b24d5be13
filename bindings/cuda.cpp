// dynacp._cuda: the CUDA ring device for dynacp._core's ring executor. Built only when CMake finds nvcc
// (DYNACP_CUDA=AUTO/ON); links the CUDA runtime statically, so it imports without a GPU and fails on first use with
// the CUDA error. The ring loop, the communicator and the layouts stay in _core (ring_forward / ring_backward).
#include "dynacp/runtime/cuda.hpp"

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

namespace py = pybind11;
namespace rt = dynacp::runtime;
namespace cu = dynacp::runtime::cuda;

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "dynacp CUDA runtime: the CUDA ring device (reference kernels) for dynacp._core.ring_forward/backward";
  py::module_::import("dynacp._core");  // registers the RingDevice base class
  py::class_<cu::CudaRingDevice, rt::RingDevice>(
      m, "CudaRingDevice",
      "CUDA half of the ring executor: inputs of `dtype` (float32, bfloat16, float16), fp32 accumulation, kernels "
      "and copies on `stream` (a cudaStream_t address, e.g. torch.cuda.current_stream().cuda_stream) of `device`.")
      .def(py::init([](const std::string& dtype, int device, std::uintptr_t stream) {
             return std::make_unique<cu::CudaRingDevice>(cu::parse_dtype(dtype), device,
                                                         reinterpret_cast<cudaStream_t>(stream));
           }),
           py::arg("dtype"), py::arg("device"), py::arg("stream"))
      .def_property_readonly("device", &cu::CudaRingDevice::device);
  m.attr("MAX_HEAD_DIM") = cu::kMaxHeadDim;
  m.def(
      "device_count",
      [] {
        int n = 0;
        cu::check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
        return n;
      },
      "Number of CUDA devices the CUDA runtime sees; RuntimeError naming the CUDA error when none is usable.");
}
