#include "dynacp/runtime/comm.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "dynacp/model/error.hpp"

namespace dynacp::runtime {

using detail::cat;

void Comm::send(int peer, const void* data, std::size_t bytes, std::string_view what) {
  const P2POp op = send_op(peer, data, bytes);
  exchange({&op, 1}, what);
}

void Comm::recv(int peer, void* data, std::size_t bytes, std::string_view what) {
  const P2POp op = recv_op(peer, data, bytes);
  exchange({&op, 1}, what);
}

void Comm::set_timeout(Millis t) {
  if (t.count() <= 0) invalid("communicator timeout must be positive, got ", t.count(), " ms");
  timeout_ = t;
}

void Comm::check_peer(int peer, std::string_view what) const {
  if (peer < 0 || peer >= size()) invalid(what, ": peer ", peer, " is outside the communicator of size ", size());
}

void Comm::broadcast(void* data, std::size_t bytes, int root) {
  check_peer(root, "broadcast root");
  std::vector<P2POp> ops;
  if (rank() == root) {
    for (int p = 0; p < size(); ++p)
      if (p != root) ops.push_back(send_op(p, data, bytes));
  } else {
    ops.push_back(recv_op(root, data, bytes));
  }
  exchange(ops, cat("broadcast from root ", root));
}

void Comm::all_gather(const void* send, void* recv, std::size_t bytes) {
  auto* out = static_cast<std::byte*>(recv);
  if (out + rank() * bytes != send) std::memcpy(out + rank() * bytes, send, bytes);
  std::vector<P2POp> ops;
  for (int p = 0; p < size(); ++p)
    if (p != rank()) ops.push_back(send_op(p, send, bytes));
  for (int p = 0; p < size(); ++p)
    if (p != rank()) ops.push_back(recv_op(p, out + p * bytes, bytes));
  exchange(ops, "all_gather");
}

void Comm::barrier() {
  std::byte token{1};
  std::vector<std::byte> all(static_cast<std::size_t>(size()));
  all_gather(&token, all.data(), 1);
}

std::unique_ptr<Comm> Comm::split(int color, int key) {
  if (color < kNoColor) invalid("split colour must be >= 0 or kNoColor, got ", color);
  const int mine[3] = {color, key, rank()};
  std::vector<int> all(static_cast<std::size_t>(3 * size()));
  all_gather(mine, all.data(), sizeof(mine));
  if (color == kNoColor) return nullptr;
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int p = 0; p < size(); ++p)
    if (all[3 * p] == color) members.emplace_back(all[3 * p + 1], all[3 * p + 2]);
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (auto& m : members) ranks.push_back(m.second);
  return make_group_view(*this, std::move(ranks));
}

namespace {

/// Rank translation over a parent communicator.
class GroupView final : public Comm {
 public:
  GroupView(Comm& parent, std::vector<int> ranks, int rank)
      : Comm(parent.timeout()), parent_(parent), ranks_(std::move(ranks)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  void exchange(std::span<const P2POp> ops, std::string_view what) override {
    std::vector<P2POp> translated(ops.begin(), ops.end());
    for (auto& op : translated) {
      check_peer(op.peer, what);
      op.peer = ranks_[static_cast<std::size_t>(op.peer)];
    }
    const Millis saved = parent_.timeout();
    parent_.set_timeout(timeout());
    try {
      parent_.exchange(translated, what);
    } catch (...) {
      parent_.set_timeout(saved);
      throw;
    }
    parent_.set_timeout(saved);
  }
  void abort(const std::string& reason) override { parent_.abort(reason); }

 private:
  Comm& parent_;
  std::vector<int> ranks_;
  int rank_;
};

/// Mailboxes shared by the ranks of one thread world.
struct Hub {
  explicit Hub(int n) : size(n), boxes(static_cast<std::size_t>(n) * n) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<std::vector<std::byte>>> boxes;  // index src * size + dst
  bool aborted = false;
  std::string reason;
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Hub> hub, int rank, Millis timeout) : Comm(timeout), hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size; }

  void exchange(std::span<const P2POp> ops, std::string_view what) override {
    for (const auto& op : ops) check_peer(op.peer, what);
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    std::unique_lock lock(hub_->mu);
    throw_if_aborted(what);
    for (const auto& op : ops) {
      if (op.kind != P2POp::Kind::kSend) continue;
      const auto* p = static_cast<const std::byte*>(op.data);
      box(rank_, op.peer).emplace_back(p, p + op.bytes);
    }
    hub_->cv.notify_all();
    for (const auto& op : ops) {
      if (op.kind != P2POp::Kind::kRecv) continue;
      auto& q = box(op.peer, rank_);
      const bool ready = hub_->cv.wait_until(lock, deadline, [&] { return hub_->aborted || !q.empty(); });
      throw_if_aborted(what);
      if (!ready)
        throw Timeout(cat("rank ", rank_, ": ", what, ": timed out after ", timeout().count(),
                          " ms waiting to receive ", op.bytes, " bytes from peer ", op.peer,
                          " (the peer never sent; check that every rank runs the same schedule)"));
      if (q.front().size() != op.bytes)
        throw Error(cat("rank ", rank_, ": ", what, ": peer ", op.peer, " sent ", q.front().size(), " bytes but ",
                        op.bytes, " were expected (mismatched op order or shapes)"));
      if (op.bytes) std::memcpy(op.data, q.front().data(), op.bytes);
      q.pop_front();
    }
  }

  void abort(const std::string& reason) override {
    std::lock_guard lock(hub_->mu);
    if (!hub_->aborted) hub_->reason = cat("rank ", rank_, ": ", reason);
    hub_->aborted = true;
    hub_->cv.notify_all();
  }

 private:
  std::deque<std::vector<std::byte>>& box(int src, int dst) {
    return hub_->boxes[static_cast<std::size_t>(src) * hub_->size + dst];
  }
  void throw_if_aborted(std::string_view what) const {
    if (hub_->aborted) throw Error(cat("rank ", rank_, ": ", what, ": communicator aborted (", hub_->reason, ")"));
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
};

class CallbackComm final : public Comm {
 public:
  CallbackComm(int rank, int size, Millis timeout, ExchangeFn fn)
      : Comm(timeout), rank_(rank), size_(size), fn_(std::move(fn)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void exchange(std::span<const P2POp> ops, std::string_view what) override {
    if (aborted_) throw Error(cat("rank ", rank_, ": ", what, ": communicator aborted (", reason_, ")"));
    for (const auto& op : ops) check_peer(op.peer, what);
    fn_(ops, what, timeout());
  }
  void abort(const std::string& reason) override { aborted_ = true, reason_ = reason; }

 private:
  int rank_, size_;
  ExchangeFn fn_;
  bool aborted_ = false;
  std::string reason_;
};

}  // namespace

std::unique_ptr<Comm> make_callback_comm(int rank, int size, Millis timeout, ExchangeFn exchange) {
  if (size < 1 || rank < 0 || rank >= size) invalid("callback communicator: rank ", rank, " of size ", size);
  if (timeout.count() <= 0) invalid("communicator timeout must be positive, got ", timeout.count(), " ms");
  if (!exchange) invalid("callback communicator needs an exchange function");
  return std::make_unique<CallbackComm>(rank, size, timeout, std::move(exchange));
}

std::vector<std::unique_ptr<Comm>> make_thread_comms(int size, Millis timeout) {
  if (size < 1) invalid("a thread world needs at least one rank, got ", size);
  if (timeout.count() <= 0) invalid("communicator timeout must be positive, got ", timeout.count(), " ms");
  auto hub = std::make_shared<Hub>(size);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<ThreadComm>(hub, r, timeout));
  return comms;
}

std::unique_ptr<Comm> make_group_view(Comm& parent, std::vector<int> ranks) {
  if (ranks.empty()) invalid("a group view needs at least one rank");
  int me = -1;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= parent.size())
      invalid("group rank ", ranks[i], " is outside the parent communicator of size ", parent.size());
    if (std::count(ranks.begin(), ranks.end(), ranks[i]) > 1) invalid("group rank ", ranks[i], " is listed twice");
    if (ranks[i] == parent.rank()) me = static_cast<int>(i);
  }
  if (me < 0) invalid("rank ", parent.rank(), " is not a member of the group it tries to view");
  return std::make_unique<GroupView>(parent, std::move(ranks), me);
}

}  // namespace dynacp::runtime
