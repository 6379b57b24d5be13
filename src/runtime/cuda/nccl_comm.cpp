#include "dynacp/runtime/nccl_comm.hpp"

#include <cstring>
#include <thread>

#include "dynacp/model/error.hpp"
#include "dynacp/runtime/cuda.hpp"

namespace dynacp::runtime {

using detail::cat;

namespace {
void nccl_check(ncclResult_t r, std::string_view what) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw Error(cat("NCCL error in ", what, ": ", ncclGetErrorString(r), " (", static_cast<int>(r), ")"));
}

/// Waits while a non-blocking NCCL call is in progress, up to the deadline.
void settle(ncclComm_t comm, std::chrono::steady_clock::time_point deadline, std::string_view what) {
  ncclResult_t state = ncclInProgress;
  while (true) {
    nccl_check(ncclCommGetAsyncError(comm, &state), what);
    if (state != ncclInProgress) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      throw Timeout(cat(what, ": NCCL did not finish before the deadline; communicator aborted"));
    }
    std::this_thread::yield();
  }
  nccl_check(state, what);
}
}  // namespace

NcclComm::NcclComm(ncclComm_t comm, int device, cudaStream_t stream, bool owns_stream, Millis timeout)
    : Comm(timeout), comm_(comm), device_(device), stream_(stream), owns_stream_(owns_stream) {
  nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
  nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
  cuda::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
  cuda::check(cudaMalloc(&scratch_, static_cast<std::size_t>(size_)), "cudaMalloc barrier scratch");
}

std::unique_ptr<NcclComm> NcclComm::create(Comm& host, int device, Millis timeout, cudaStream_t stream) {
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (host.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  host.broadcast(&id, sizeof id, 0);  // host channel bootstrap, under host.timeout()
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  nccl_check(ncclCommInitRankConfig(&comm, host.size(), id, host.rank(), &config), "ncclCommInitRankConfig");
  settle(comm, deadline, cat("rank ", host.rank(), ": NCCL init of ", host.size(), " ranks"));
  const bool own = stream == nullptr;
  if (own) cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::unique_ptr<NcclComm>(new NcclComm(comm, device, stream, own, timeout));
}

NcclComm::~NcclComm() {
  // Destroy is collective-free only after finalize; abort is always safe and never blocks on peers.
  if (!aborted_) ncclCommAbort(comm_);
  cudaEventDestroy(done_);
  cudaFree(scratch_);
  if (owns_stream_) cudaStreamDestroy(stream_);
}

void NcclComm::wait(std::string_view what, std::string_view peers) {
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  const auto label = cat("rank ", rank_, ": ", what);
  settle(comm_, deadline, label);
  cuda::check(cudaEventRecord(done_, stream_), "cudaEventRecord");
  while (true) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda::check(q, "cudaEventQuery");
    ncclResult_t state = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm_, &state), label);
    nccl_check(state, label);
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm_);
      aborted_ = true;
      reason_ = "timeout";
      throw Timeout(cat(label, ": timed out after ", timeout().count(), " ms waiting for ", peers,
                        "; the NCCL communicator was aborted"));
    }
    std::this_thread::yield();
  }
}

void NcclComm::exchange(std::span<const P2POp> ops, std::string_view what) {
  if (aborted_) throw Error(cat("rank ", rank_, ": ", what, ": communicator aborted (", reason_, ")"));
  std::string peers;
  cuda::check(cudaSetDevice(device_), "cudaSetDevice");
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (const auto& op : ops) {
    check_peer(op.peer, what);
    const bool send = op.kind == P2POp::Kind::kSend;
    peers += cat(peers.empty() ? "" : ", ", send ? "send to peer " : "recv from peer ", op.peer);
    nccl_check(send ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_)
                    : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_),
               what);
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait(what, peers);
}

void NcclComm::broadcast(void* data, std::size_t bytes, int root) {
  check_peer(root, "broadcast root");
  nccl_check(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  wait(cat("broadcast from root ", root), cat("root ", root));
}

void NcclComm::all_gather(const void* send, void* recv, std::size_t bytes) {
  nccl_check(ncclAllGather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
  wait("all_gather", "all peers");
}

void NcclComm::barrier() { all_gather(static_cast<std::byte*>(scratch_) + rank_, scratch_, 1); }

std::unique_ptr<Comm> NcclComm::split(int color, int key) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  nccl_check(ncclCommSplit(comm_, color == kNoColor ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config),
             "ncclCommSplit");
  settle(comm_, std::chrono::steady_clock::now() + timeout(), cat("rank ", rank_, ": ncclCommSplit"));
  if (color == kNoColor || child == nullptr) return nullptr;
  settle(child, std::chrono::steady_clock::now() + timeout(), cat("rank ", rank_, ": ncclCommSplit child"));
  return std::unique_ptr<Comm>(new NcclComm(child, device_, stream_, false, timeout()));
}

void NcclComm::abort(const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  reason_ = reason;
  ncclCommAbort(comm_);
}

}  // namespace dynacp::runtime
