// NCCL backend (built into dynacp_cuda when nccl.h is found). Buffers are device memory on the communicator's
// device; every op is enqueued on the communicator's stream and then waited for on the host with a deadline:
// the communicator is non-blocking (ncclConfig.blocking = 0) and polled with ncclCommGetAsyncError, so a missing
// peer ends in ncclCommAbort + dynacp::Timeout instead of a hang.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>

#include "dynacp/runtime/comm.hpp"

namespace dynacp::runtime {

class NcclComm final : public Comm {
 public:
  /// Collective over `host`: host rank 0 creates the ncclUniqueId and broadcasts it over `host` (any host
  /// backend, e.g. gloo callbacks or a TCP store); every rank then joins a communicator of host.size() ranks on
  /// `device`. Operations run on `stream` (0 = a new non-blocking stream owned by the communicator).
  static std::unique_ptr<NcclComm> create(Comm& host, int device, Millis timeout, cudaStream_t stream = nullptr);
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  /// ncclGroupStart; ncclSend/ncclRecv per op; ncclGroupEnd; wait for completion under timeout().
  void exchange(std::span<const P2POp> ops, std::string_view what) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void all_gather(const void* send, void* recv, std::size_t bytes) override;
  void barrier() override;
  /// ncclCommSplit (collective over this communicator); kNoColor passes NCCL_SPLIT_NOCOLOR and returns nullptr.
  std::unique_ptr<Comm> split(int color, int key) override;
  void abort(const std::string& reason) override;

  ncclComm_t handle() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

 private:
  NcclComm(ncclComm_t comm, int device, cudaStream_t stream, bool owns_stream, Millis timeout);
  /// Polls until the communicator leaves ncclInProgress and the stream work is done, or the deadline passes.
  void wait(std::string_view what, std::string_view peers);

  ncclComm_t comm_;
  int device_, rank_ = 0, size_ = 1;
  cudaStream_t stream_;
  bool owns_stream_;
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;  // 1 byte per rank for barrier()
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace dynacp::runtime
