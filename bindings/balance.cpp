// Python bindings of the DP balancing kernels (dynacp/solve/blocks/balance.hpp).
#include "dynacp/solve/blocks/balance.hpp"

#include <string>

#include "common.hpp"
#include "dynacp/model/error.hpp"

namespace dynacp::py {
namespace {

std::vector<double> to_weights(const py::handle& obj) {
  auto arr = py::array::ensure(obj);
  if (!arr) throw InvalidArgument("balance: weights must be a 1-D array of numbers");
  if (arr.ndim() != 1)
    throw InvalidArgument("balance: weights must be 1-D, got " + std::to_string(arr.ndim()) + " dimensions");
  const char kind = arr.dtype().kind();
  if (kind != 'i' && kind != 'u' && kind != 'f')
    throw InvalidArgument("balance: weights must hold integers or floats, got dtype " +
                          std::string(py::str(arr.dtype())));
  auto a = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
  return {a.data(), a.data() + a.size()};
}

}  // namespace

void bind_balance(py::module_& m) {
  m.def(
      "balance",
      [](const py::object& weights, int k, bool equal_count, const std::string& method) {
        const auto w = to_weights(weights);
        const auto mth = solve::parse_balance_method(method);
        py::gil_scoped_release nogil;
        return solve::balance(w, k, equal_count, mth);
      },
      py::arg("weights"), py::arg("k"), py::arg("equal_count") = false, py::arg("method") = "best",
      "Split weights into k parts minimising the heaviest part; returns k sorted index lists "
      "(see dynacp.balance.balance). Releases the GIL.");
  m.def(
      "balance_lower_bound",
      [](const py::object& weights, int k, bool equal_count) {
        return solve::balance_lower_bound(to_weights(weights), k, equal_count);
      },
      py::arg("weights"), py::arg("k"), py::arg("equal_count") = false,
      "Lower bound on the optimal max part sum of balance(weights, k, equal_count).");
}

}  // namespace dynacp::py
