// Config structs as Python classes: a keyword constructor that rejects unknown names, and documented read/write
// fields recorded in `_fields` (to_dict, repr, pickle). Used for Cluster, CostModel and DynacpTuning.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "dynacp/model/error.hpp"

namespace dynacp::py {

/// Keyword constructor for a config struct: T(**fields); unknown names raise ValueError naming them.
template <class T>
auto kw_init() {
  return py::init([](const py::kwargs& kw) {
    auto obj = std::make_unique<T>();
    py::object view = py::cast(obj.get(), py::return_value_policy::reference);
    py::tuple fields = view.attr("_fields");
    for (auto item : kw) {
      const auto key = item.first.cast<std::string>();
      bool known = false;
      for (auto f : fields) known = known || f.cast<std::string>() == key;
      if (!known)
        throw InvalidArgument(std::string(py::str(py::type::of(view).attr("__name__"))) + " has no field '" + key +
                              "'; fields: " + std::string(py::str(fields)));
      view.attr(key.c_str()) = item.second;
    }
    return obj;
  });
}

/// Registers read/write fields with docs and records their names in `_fields` (used by to_dict and repr).
template <class T>
struct Fields {
  py::class_<T>& cls;
  std::vector<std::string> names;
  template <class M>
  Fields& add(const char* name, M T::*member, const char* doc) {
    cls.def_readwrite(name, member, doc);
    names.emplace_back(name);
    return *this;
  }
  void done() {
    py::tuple t(names.size());
    for (std::size_t i = 0; i < names.size(); ++i) t[i] = py::str(names[i]);
    cls.attr("_fields") = t;
    cls.def(
        "to_dict",
        [](py::object self) {
          py::dict d;
          for (auto f : py::tuple(self.attr("_fields"))) d[f] = self.attr(f.cast<std::string>().c_str());
          return d;
        },
        "Fields as a plain dict");
    cls.def("__repr__", [](py::object self) {
      std::string s = std::string(py::str(py::type::of(self).attr("__name__"))) + "(";
      bool first = true;
      for (auto f : py::tuple(self.attr("_fields"))) {
        const auto n = f.cast<std::string>();
        s += (first ? "" : ", ") + n + "=" + std::string(py::repr(self.attr(n.c_str())));
        first = false;
      }
      return s + ")";
    });
    cls.def(py::pickle([](py::object self) { return self.attr("to_dict")(); },
                       [](py::dict d) {
                         auto obj = T{};
                         py::object view = py::cast(&obj, py::return_value_policy::reference);
                         for (auto item : d) view.attr(item.first.cast<std::string>().c_str()) = item.second;
                         return obj;
                       }));
  }
};

}  // namespace dynacp::py
