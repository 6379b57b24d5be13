// Test helper: run one function per rank on its own thread, as the thread communicator backend expects.
#pragma once
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace dynacp::testing {

/// Runs fn(rank) on one thread per rank, joins them all, then rethrows the first exception (by rank).
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dynacp::testing
