// The bridge from the core's spdlog logger to Python's `logging`: one sink that forwards every record to
// logging.getLogger("dynacp.core"), so the Python logger's level and handlers are the only ones that matter.
#include "dynacp/model/log.hpp"

#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>

#include <string>

#include "common.hpp"

namespace dynacp::py {
namespace {

int python_level(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace:
      return 5;
    case spdlog::level::debug:
      return 10;
    case spdlog::level::info:
      return 20;
    case spdlog::level::warn:
      return 30;
    case spdlog::level::err:
      return 40;
    default:
      return 50;
  }
}

/// Forwards records to Python. No mutex of its own (null_mutex): the GIL it takes serialises the records, and a
/// second lock taken before the GIL could deadlock against a thread that holds the GIL and logs.
class PythonSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    try {
      const int level = python_level(msg.level);
      py::object logger = py::module_::import("logging").attr("getLogger")("dynacp.core");
      if (logger.attr("isEnabledFor")(level).cast<bool>())
        logger.attr("log")(level, std::string(msg.payload.data(), msg.payload.size()));
    } catch (py::error_already_set&) {  // a failing handler must not abort a solve; logging reports its own errors
    }
  }
  void flush_() override {}
};

spdlog::level::level_enum spdlog_level(int python) {
  if (python <= 5) return spdlog::level::trace;
  if (python <= 10) return spdlog::level::debug;
  if (python <= 20) return spdlog::level::info;
  if (python <= 30) return spdlog::level::warn;
  if (python <= 40) return spdlog::level::err;
  return spdlog::level::critical;
}

}  // namespace

void sync_log_level() {
  if (core_log().sinks().empty()) return;  // detached (interpreter shutting down): stays off
  const int level =
      py::module_::import("logging").attr("getLogger")("dynacp.core").attr("getEffectiveLevel")().cast<int>();
  core_log().set_level(spdlog_level(level));
}

void bind_log(py::module_& m) {
  set_log_sink(std::make_shared<PythonSink>());
  // Detach before the interpreter shuts down: a record logged after that has nowhere to go.
  py::module_::import("atexit").attr("register")(py::cpp_function([] { set_log_sink(nullptr); }));
  m.def(
      "_log_test",
      [](const std::string& level, const std::string& message) {
        sync_log_level();
        py::gil_scoped_release nogil;  // as a solve does: the sink must take the GIL itself
        core_log().log(spdlog::level::from_str(level), "{}", message);
      },
      py::arg("level"), py::arg("message"),
      "Log `message` at `level` (trace, debug, info, warning, error) through the core's spdlog logger (for tests).");
}

}  // namespace dynacp::py
