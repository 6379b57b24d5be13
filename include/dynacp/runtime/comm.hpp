// Communicators: one interface for the in-process thread backend (CPU tests), host callbacks (torch.distributed)
// and NCCL (src/runtime/cuda). Every blocking call honours timeout() and throws dynacp::Timeout naming the peer
// and the operation; abort() wakes every waiter of the communicator with dynacp::Error.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dynacp::runtime {

using Millis = std::chrono::milliseconds;

/// One side of a grouped point-to-point exchange. Buffers are host memory for host backends and device memory for
/// NCCL. `peer` is a rank of the communicator the op is posted on.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind;
  int peer;
  void* data;
  std::size_t bytes;
};
inline P2POp send_op(int peer, const void* data, std::size_t bytes) {
  return {P2POp::Kind::kSend, peer, const_cast<void*>(data), bytes};
}
inline P2POp recv_op(int peer, void* data, std::size_t bytes) { return {P2POp::Kind::kRecv, peer, data, bytes}; }

/// `split` colour for ranks that join no sub-communicator (NCCL_SPLIT_NOCOLOR).
inline constexpr int kNoColor = -1;

/// A communicator. Like NCCL, all ranks must issue collectives (and matching P2P ops) in the same order.
class Comm {
 public:
  explicit Comm(Millis timeout) : timeout_(timeout) {}
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  /// Posts all sends and receives together (an NCCL group) and returns when every op has completed.
  /// `what` names the operation in error messages (e.g. "ring kv step 2").
  virtual void exchange(std::span<const P2POp> ops, std::string_view what) = 0;
  void send(int peer, const void* data, std::size_t bytes, std::string_view what = "send");
  void recv(int peer, void* data, std::size_t bytes, std::string_view what = "recv");

  /// Collectives. The defaults are grouped P2P over exchange(); backends may override them with native ones.
  virtual void broadcast(void* data, std::size_t bytes, int root);
  /// `recv` holds size() * bytes; rank i's contribution lands at offset i * bytes.
  virtual void all_gather(const void* send, void* recv, std::size_t bytes);
  virtual void barrier();

  /// Collective over this communicator: ranks passing the same colour form a sub-communicator ordered by
  /// (key, rank); kNoColor returns nullptr. The default returns a view that runs P2P on this (parent)
  /// communicator with translated ranks, so the parent must outlive it.
  virtual std::unique_ptr<Comm> split(int color, int key);

  /// Marks the communicator failed: current and future blocking calls on every rank throw dynacp::Error.
  virtual void abort(const std::string& reason) = 0;

  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t);

 protected:
  /// Throws InvalidArgument unless 0 <= peer < size().
  void check_peer(int peer, std::string_view what) const;

 private:
  Millis timeout_;
};

/// Creates `size` in-process communicators sharing one set of mailboxes; give one to each thread.
/// Sends copy eagerly into a per-(src, dst) FIFO; receives block until a message arrives, the timeout passes
/// (dynacp::Timeout) or any rank aborts (dynacp::Error). Self send/recv works.
std::vector<std::unique_ptr<Comm>> make_thread_comms(int size, Millis timeout);

/// Host-callback backend (used by dynacp.torch over torch.distributed): `exchange` must post all ops together,
/// wait at most `timeout` and throw (dynacp::Timeout or any exception) on failure.
using ExchangeFn = std::function<void(std::span<const P2POp> ops, std::string_view what, Millis timeout)>;
std::unique_ptr<Comm> make_callback_comm(int rank, int size, Millis timeout, ExchangeFn exchange);

/// A view of `parent` restricted to `ranks` (parent ranks, in ring order); this rank must be among them.
/// P2P and the default collectives run on the parent with translated ranks; no new communicator is created.
std::unique_ptr<Comm> make_group_view(Comm& parent, std::vector<int> ranks);

}  // namespace dynacp::runtime
