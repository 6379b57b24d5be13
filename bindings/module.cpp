#include <pybind11/pybind11.h>

#include "common.hpp"
#include "dynacp/model/error.hpp"

namespace dynacp::py {

std::vector<std::int64_t> to_int64_vector(const py::handle& obj, const char* what) {
  auto arr = py::array::ensure(obj);
  if (!arr) throw InvalidArgument(std::string(what) + " must be a 1-D array of integers");
  if (arr.ndim() != 1)
    throw InvalidArgument(std::string(what) + " must be 1-D, got " + std::to_string(arr.ndim()) + " dimensions");
  if (arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')
    throw InvalidArgument(std::string(what) + " must hold integers, got dtype " + std::string(py::str(arr.dtype())));
  auto a = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  return {a.data(), a.data() + a.size()};
}

}  // namespace dynacp::py

PYBIND11_MODULE(_core, m) {
  m.doc() = "dynacp C++ core: cost model, solvers, simulator and CPU runtime";
  namespace py = pybind11;
  py::register_exception<dynacp::Timeout>(m, "TimeoutError", PyExc_TimeoutError);
  // InvalidArgument derives from std::invalid_argument -> ValueError; Error from std::runtime_error -> RuntimeError.
  dynacp::py::bind_log(m);  // first: the core logs through Python's `logging` from here on
  dynacp::py::bind_model(m);
  dynacp::py::bind_solve(m);
  dynacp::py::bind_balance(m);
  dynacp::py::bind_sim(m);
  dynacp::py::bind_runtime(m);
  dynacp::py::bind_pipeline(m);
}
