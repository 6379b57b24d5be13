// Error types. Every error names the offending input and what to do about it.
// Bindings map InvalidArgument -> ValueError and Error/Timeout -> RuntimeError.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dynacp {

/// Bad input from the caller (lengths, cluster shape, cost coefficients, plan files).
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// A failure at run time that is not the caller's input (solver infeasibility, communication failure).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A blocking wait that ran past its deadline.
struct Timeout : Error {
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

/// Throw InvalidArgument with a message built from the streamed arguments.
template <class... Args>
[[noreturn]] void invalid(Args&&... args) {
  throw InvalidArgument(detail::cat(std::forward<Args>(args)...));
}

}  // namespace dynacp
