// Shared helpers for the thin pybind11 layer.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

namespace dynacp::py {
namespace py = pybind11;

void bind_model(py::module_& m);
void bind_solve(py::module_& m);
void bind_sim(py::module_& m);
void bind_runtime(py::module_& m);
void bind_pipeline(py::module_& m);

/// Copies a 1-D integer array-like into int64 values, naming `what` in errors.
std::vector<std::int64_t> to_int64_vector(const py::handle& obj, const char* what);
void bind_balance(py::module_& m);
void bind_log(py::module_& m);
/// Sets the core logger's level from Python's `dynacp.core` logger (call with the GIL held, before releasing it), so
/// a solve formats and forwards only the records Python would keep: no GIL round trip for a discarded DEBUG line.
void sync_log_level();
}  // namespace dynacp::py
