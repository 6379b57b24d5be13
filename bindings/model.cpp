#include <numeric>

#include "common.hpp"
#include "dynacp/model/calibrate.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/model/plan.hpp"
#include "dynacp/model/shapes.hpp"
#include "fields.hpp"

namespace dynacp::py {

void bind_model(py::module_& m) {
  py::enum_<Mask>(m, "Mask", "Attention mask of one sequence")
      .value("CAUSAL", Mask::Causal, "causal (decoder) attention: mask factor causal_factor")
      .value("FULL", Mask::Full, "full/bidirectional attention (vision tokens): mask factor full_factor");

  py::class_<Cluster> cluster(m, "Cluster", "The DP x CP rank pool that a plan schedules onto.");
  cluster.def(kw_init<Cluster>());
  Fields<Cluster>{cluster, {}}
      .add("num_ranks", &Cluster::num_ranks, "P: ranks in the DP x CP pool")
      .add("ranks_per_node", &Cluster::ranks_per_node, "ranks sharing a node's fast fabric; must divide num_ranks")
      .add("activation_budget", &Cluster::activation_budget, "activation bytes per rank for one microbatch")
      .add("tokens_per_rank", &Cluster::tokens_per_rank,
           "tokens one rank holds per microbatch; 0 = derive from activation_budget / CostModel.mem_per_token")
      .add("intra_node_bandwidth", &Cluster::intra_node_bandwidth, "bytes/s of one ring hop inside a node")
      .add("inter_node_bandwidth", &Cluster::inter_node_bandwidth, "bytes/s of one ring hop across nodes")
      .add("intra_node_latency", &Cluster::intra_node_latency, "seconds per ring hop inside a node")
      .add("inter_node_latency", &Cluster::inter_node_latency, "seconds per ring hop across nodes")
      .add("seq_pad_multiple", &Cluster::seq_pad_multiple,
           "k: each sequence of a d-rank ring is padded to a multiple of k*d rows (2 for zigzag; lcm(2, tp) with "
           "sequence parallelism)")
      .done();
  cluster.def_property_readonly("num_nodes", &Cluster::num_nodes)
      .def("validate", &Cluster::validate, "Raise ValueError naming the first bad field.");

  py::class_<StaticShapes> shapes(m, "StaticShapes",
                                  "CUDA-graph mode: the shapes a runtime captures ahead of time (plan(..., "
                                  "static_shapes=...)); see docs/cost_model.md, 'Static shapes'.");
  shapes.def(kw_init<StaticShapes>());
  Fields<StaticShapes>{shapes, {}}
      .add("token_buckets", &StaticShapes::token_buckets,
           "rows per rank of one group, ascending multiples of Cluster.seq_pad_multiple; each group is padded up to "
           "the smallest bucket >= its rows; the largest is the token capacity")
      .add("cp_sizes", &StaticShapes::cp_sizes,
           "allowed CP degrees in ranks, ascending, including 1, each dividing the pool; empty = any")
      .add("max_microbatches", &StaticShapes::max_microbatches,
           "microbatch slots any rank takes part in per step; 0 = unbounded")
      .add("max_sequences", &StaticShapes::max_sequences,
           "sequences per group (cu_seqlens has max_sequences + 1 entries); 0 = unbounded")
      .done();
  shapes.def("enabled", &StaticShapes::enabled, "True when any field is set (CUDA-graph mode on).")
      .def("bucket_of", &StaticShapes::bucket_of, py::arg("rows"),
           "The smallest bucket >= rows (rows per rank); ValueError above the largest.")
      .def("validate", &StaticShapes::validate, py::arg("cluster"), py::arg("cost"),
           "Raise ValueError naming the first bad field.")
      .def(py::self == py::self);

  py::class_<CostModel> cost(m, "CostModel",
                             "T(G,d) = (eta*a*sum s^2 + b*sum s)/d + c + T_comm - min(eta*a*sum s^2/d, T_comm) "
                             "[+ extended per-document terms]; "
                             "M(G,d) = m*sum s/d + static. See docs/cost_model.md.");
  cost.def(kw_init<CostModel>());
  Fields<CostModel>{cost, {}}
      .add("name", &CostModel::name, "preset or user label")
      .add("source", &CostModel::source, "where the coefficients come from, with the fit error")
      .add("attn_coef", &CostModel::attn_coef, "a: seconds per token^2 of full-mask attention (whole step)")
      .add("linear_coef", &CostModel::linear_coef, "b: seconds per token of linear work (whole step)")
      .add("group_overhead", &CostModel::group_overhead, "c: fixed seconds per group")
      .add("causal_factor", &CostModel::causal_factor, "eta for causal masks (about 0.5)")
      .add("full_factor", &CostModel::full_factor, "eta for full masks (1)")
      .add("kv_bytes_per_token", &CostModel::kv_bytes_per_token, "bytes per token per ring hop (whole step)")
      .add("mem_per_token", &CostModel::mem_per_token, "m: activation bytes per token on a rank")
      .add("mem_static", &CostModel::mem_static, "static bytes charged against the activation budget")
      .add("backward_ratio", &CostModel::backward_ratio,
           "backward time : forward time of a microbatch (the 1F1B split; 2 = forward T/3, backward 2T/3)")
      .add("attn_pow_coef", &CostModel::attn_pow_coef,
           "kp: seconds per eta*token^1.5, divided by d (extended form; 0 = classic)")
      .add("attn_log_coef", &CostModel::attn_log_coef,
           "kl: seconds per eta*token*log2(token), paid on every rank of the ring (extended form; 0 = classic)")
      .add("doc_overhead", &CostModel::doc_overhead, "c_doc: seconds per sequence of a group, any degree")
      .add("doc_hop_overhead", &CostModel::doc_hop_overhead, "c_hop: seconds per sequence per ring hop (d - 1 hops)")
      .add("doc_solo_overhead", &CostModel::doc_solo_overhead,
           "c_solo: seconds per sequence of a group on one rank (d = 1)")
      .add("comm_overlap", &CostModel::comm_overlap,
           "phi: share of min(attention, exchange) hidden behind attention, in [0, 1] (1 = classic form)")
      .add("node_overhead", &CostModel::node_overhead,
           "c_node: seconds per extra node a ring spans, part of the exchange (extended form; 0 = classic)")
      .add("intra_node_hops", &CostModel::intra_node_hops,
           "hop table of the intra-node link: [[ring size, latency s, bandwidth B/s], ...] in increasing ring size, "
           "latency non-decreasing, bandwidth non-increasing; interpolated in the ring size, clamped outside; "
           "[] = Cluster.intra_node_latency / intra_node_bandwidth on every ring (assign a whole list)")
      .add("inter_node_hops", &CostModel::inter_node_hops,
           "hop table of rings spanning nodes (as intra_node_hops; [] = Cluster.inter_node_latency / "
           "inter_node_bandwidth)")
      .done();
  cost.def_property_readonly("extended", &CostModel::extended,
                             "True when a per-document (extended-form) coefficient is non-zero.");
  cost.def_property_readonly("has_hop_tables", &CostModel::has_hop_tables,
                             "True when intra_node_hops or inter_node_hops has points.");
  cost.def("validate", &CostModel::validate, "Raise ValueError naming the first bad coefficient.")
      .def("hop_latency", &CostModel::hop_latency, py::arg("d"), py::arg("crosses_nodes"), py::arg("cluster"),
           "Seconds per hop of a ring of d ranks (the hop table's value, else the Cluster's).")
      .def_static("nodes_spanned", &CostModel::nodes_spanned, py::arg("d"), py::arg("crosses_nodes"),
                  py::arg("cluster"), "The least nodes a ring of d ranks spans (1 inside a node).")
      .def("hop_bandwidth", &CostModel::hop_bandwidth, py::arg("d"), py::arg("crosses_nodes"), py::arg("cluster"),
           "Bytes/s of one hop of a ring of d ranks (the hop table's value, else the Cluster's).")
      .def("token_capacity", &CostModel::token_capacity, py::arg("cluster"), "Tokens one rank can hold.")
      .def(
          "min_degree",
          [](const CostModel& c, std::int64_t tokens, const Cluster& cl) { return c.min_degree(tokens, cl); },
          py::arg("tokens"), py::arg("cluster"), "Smallest CP degree one sequence of `tokens` fits once padded.")
      .def(
          "rows",
          [](const CostModel& c, const py::object& lengths, int d, const Cluster& cl) {
            if (d < 1) throw InvalidArgument("degree must be >= 1, got " + std::to_string(d));
            Batch b;
            b.lengths = to_int64_vector(lengths, "lengths");
            std::vector<std::int64_t> ids(b.size());
            std::iota(ids.begin(), ids.end(), std::int64_t{0});
            return group_rows(b, cl, ids, d);
          },
          py::arg("lengths"), py::arg("degree"), py::arg("cluster"),
          "Rows each rank of a `degree`-rank ring holds for these sequences once padded (exact).")
      .def(
          "time",
          [](const CostModel& c, const py::object& lengths, int d, const Cluster& cl, Mask mask, py::object crosses) {
            GroupStats g;
            for (auto len : to_int64_vector(lengths, "lengths")) g.add(len, c.eta(mask));
            if (d < 1) throw InvalidArgument("degree must be >= 1, got " + std::to_string(d));
            return crosses.is_none() ? c.time(g, d, cl) : c.time(g, d, crosses.cast<bool>(), cl);
          },
          py::arg("lengths"), py::arg("d"), py::arg("cluster"), py::arg("mask") = Mask::Causal,
          py::arg("crosses_nodes") = py::none(),
          "T(G,d) in seconds for a group of `lengths` (one mask) on d ranks; crosses_nodes defaults to d > node.");

  m.def("preset_names", &preset_names, "Names of the built-in cost presets.");
  m.def("preset", &preset, py::arg("name"), "A built-in cost preset; its `source` names the data and fit error.");

  py::class_<FitReport>(m, "FitReport", "Least-squares fit quality (relative errors).")
      .def_readonly("rms_relative_error", &FitReport::rms_relative_error)
      .def_readonly("max_relative_error", &FitReport::max_relative_error)
      .def_readonly("samples", &FitReport::samples)
      .def("__repr__", [](const FitReport& r) {
        return "FitReport(samples=" + std::to_string(r.samples) +
               ", rms_relative_error=" + std::to_string(r.rms_relative_error) +
               ", max_relative_error=" + std::to_string(r.max_relative_error) + ")";
      });
  m.def(
      "fit_compute",
      [](const CostModel& base, const std::vector<std::vector<std::int64_t>>& lengths, const std::vector<int>& degrees,
         const std::vector<double>& seconds, Mask mask) {
        if (lengths.size() != degrees.size() || lengths.size() != seconds.size())
          throw InvalidArgument("fit_compute: lengths, degrees and seconds must have the same number of samples");
        std::vector<ComputeSample> s;
        for (std::size_t i = 0; i < lengths.size(); ++i) s.push_back({lengths[i], degrees[i], seconds[i], mask});
        FitReport rep;
        CostModel out;
        sync_log_level();
        {
          py::gil_scoped_release nogil;
          out = fit_compute(base, s, &rep);
        }
        return py::make_tuple(out, rep);
      },
      py::arg("base"), py::arg("lengths"), py::arg("degrees"), py::arg("seconds"), py::arg("mask") = Mask::Causal,
      "Least-squares fit of a, b, c from samples (group lengths, degree, seconds). Returns (CostModel, FitReport).");
  m.def(
      "fit_link",
      [](const std::vector<double>& bytes, const std::vector<double>& seconds) {
        if (bytes.size() != seconds.size()) throw InvalidArgument("fit_link: bytes and seconds differ in length");
        std::vector<TransferSample> s;
        for (std::size_t i = 0; i < bytes.size(); ++i) s.push_back({bytes[i], seconds[i]});
        FitReport rep;
        auto [lat, bw] = fit_link(s, &rep);
        return py::make_tuple(lat, bw, rep);
      },
      py::arg("bytes"), py::arg("seconds"),
      "Fit t = latency + bytes/bandwidth. Returns (latency, bandwidth, FitReport).");
}

}  // namespace dynacp::py
