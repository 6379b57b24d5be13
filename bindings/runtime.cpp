#include "common.hpp"

namespace dynacp::py {
void bind_runtime(py::module_& m) { (void)m; }
}  // namespace dynacp::py
