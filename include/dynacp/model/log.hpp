// Logging of the C++ core through spdlog.
//
// The core writes to one spdlog logger named "dynacp". It starts with no sink, so nothing is printed unless a
// program asks: a C++ program adds a sink (set_log_sink), the Python extension installs one that forwards every
// record to Python's `logging.getLogger("dynacp.core")`, so the Python logger's level and handlers decide what
// appears (docs/development.md, "Logging").
//
// Global state: the logger is a process-wide function-local static (spdlog::logger is thread-safe; its sink list is
// replaced only by set_log_sink, which callers run at start-up before any solve). Nothing else in the core is
// global and mutable.
#pragma once
#include <spdlog/logger.h>

#include <memory>

namespace dynacp {

/// The core's logger ("dynacp"). Log calls: `core_log().debug("... {}", x)`. Its level is off while it has no sink
/// (no formatting cost) and debug once one is set; the Python bridge then sets it from the Python logger's level
/// before each solve (bindings/log.cpp, sync_log_level).
spdlog::logger& core_log();

/// Replaces the logger's sinks with `sink` (nullptr: no sink, silent again). Call before solving, not concurrently.
void set_log_sink(std::shared_ptr<spdlog::sinks::sink> sink);

}  // namespace dynacp
