#include "dynacp/model/log.hpp"

#include <spdlog/sinks/sink.h>

namespace dynacp {

namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto lg = std::make_shared<spdlog::logger>("dynacp");  // no sink: silent until one is set
  lg->set_level(spdlog::level::off);                     // and no formatting cost while silent
  return lg;
}
}  // namespace

spdlog::logger& core_log() {
  static const std::shared_ptr<spdlog::logger> logger = make_logger();
  return *logger;
}

void set_log_sink(std::shared_ptr<spdlog::sinks::sink> sink) {
  auto& sinks = core_log().sinks();
  sinks.clear();
  if (sink) sinks.push_back(std::move(sink));
  core_log().set_level(sinks.empty() ? spdlog::level::off : spdlog::level::debug);
}

}  // namespace dynacp
