// Python binding of the pipeline simulator (dynacp::sim::simulate).
#include "dynacp/sim/pipeline.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "common.hpp"

namespace dynacp::py {
namespace {

py::array_t<double> to_array(const std::vector<double>& v) {
  py::array_t<double> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

}  // namespace

void bind_pipeline(py::module_& m) {
  using sim::PipelineResult;
  py::class_<PipelineResult>(m, "PipelineResult", "Pipeline simulation of one step (seconds; see docs/simulator.md).")
      .def_readonly("step_time", &PipelineResult::step_time, "Compute makespan + grad_sync.")
      .def_readonly("bubble_fraction", &PipelineResult::bubble_fraction,
                    "1 - sum(busy) / (makespan * P * pp); makespan excludes grad_sync.")
      .def_property_readonly(
          "busy", [](const PipelineResult& r) { return to_array(r.busy); },
          "Per rank: busy seconds summed over its pp stages.")
      .def_property_readonly(
          "idle", [](const PipelineResult& r) { return to_array(r.idle); }, "Per rank: pp * makespan - busy.")
      .def_property_readonly(
          "peak_memory", [](const PipelineResult& r) { return to_array(r.peak_memory); },
          "Per rank: max over stages of in-flight activation bytes.")
      .def_property_readonly(
          "ops",
          [](const PipelineResult& r) {
            py::list out(r.ops.size());
            for (std::size_t i = 0; i < r.ops.size(); ++i) {
              const auto& o = r.ops[i];
              out[i] = py::make_tuple(o.rank, o.stage, o.chunk, o.group, o.backward, o.start, o.end);
            }
            return out;
          },
          "Timeline (when keep_timeline): (rank, stage, chunk, group, backward, start, end) per op, "
          "per rank and stage in op order.")
      .def("__repr__", [](const PipelineResult& r) {
        return "PipelineResult(step_time=" + std::to_string(r.step_time) +
               ", bubble_fraction=" + std::to_string(r.bubble_fraction) + ")";
      });

  m.def(
      "simulate_pipeline",
      [](std::vector<std::vector<int>> rank_microbatches, std::vector<std::vector<int>> group_ranks,
         std::vector<double> group_forward, std::vector<double> group_backward,
         std::optional<std::vector<double>> group_memory, int pp, int vpp, double grad_sync, bool keep_timeline) {
        sim::PipelineProblem p;
        p.num_ranks = static_cast<int>(rank_microbatches.size());
        p.pp = pp;
        p.vpp = vpp;
        p.rank_microbatches = std::move(rank_microbatches);
        p.group_ranks = std::move(group_ranks);
        p.group_forward = std::move(group_forward);
        p.group_backward = std::move(group_backward);
        if (group_memory) p.group_memory = std::move(*group_memory);
        p.grad_sync = grad_sync;
        py::gil_scoped_release nogil;
        return sim::simulate(p, keep_timeline);
      },
      py::arg("rank_microbatches"), py::arg("group_ranks"), py::arg("group_forward"), py::arg("group_backward"),
      py::arg("group_memory") = py::none(), py::arg("pp") = 1, py::arg("vpp") = 1, py::arg("grad_sync") = 0.0,
      py::arg("keep_timeline") = false,
      "Simulates 1F1B (vpp == 1) or interleaved 1F1B (vpp > 1) over len(rank_microbatches) pipelines of pp stages.\n"
      "rank_microbatches[r]: group ids in run order on rank r; group_ranks[g]: the ranks of CP group g;\n"
      "group_forward/backward[g]: seconds of one stage-chunk; group_memory[g]: activation bytes per stage-chunk.\n"
      "Raises ValueError for bad input and RuntimeError when ranks order shared groups inconsistently.");
}

}  // namespace dynacp::py
