#include "common.hpp"

namespace dynacp::py {
void bind_sim(py::module_& m) { (void)m; }
}  // namespace dynacp::py
