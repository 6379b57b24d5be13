#include <chrono>

#include "common.hpp"
#include "dynacp/api/planner.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/solve/blocks/degrees.hpp"
#include "dynacp/solve/blocks/evaluate.hpp"
#include "dynacp/solve/blocks/packing.hpp"
#include "dynacp/solve/blocks/placement.hpp"
#include "dynacp/solve/bounds/lower_bound.hpp"
#include "dynacp/solve/search/local_search.hpp"
#include "fields.hpp"

namespace dynacp::py {
namespace {

Batch make_batch(const py::object& lengths, const py::object& masks) {
  Batch b(to_int64_vector(lengths, "lengths"));
  if (!masks.is_none()) {
    for (auto v : to_int64_vector(masks, "masks")) {
      if (v != 0 && v != 1) throw InvalidArgument("masks must be 0 (causal) or 1 (full), got " + std::to_string(v));
      b.masks.push_back(static_cast<Mask>(v));
    }
  }
  return b;
}

template <class T>
T get(const py::dict& d, const char* key, const char* where) {
  if (!d.contains(key)) throw InvalidArgument(std::string(where) + " is missing the field '" + key + "'");
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    throw InvalidArgument(std::string(where) + " field '" + key + "' has the wrong type");
  }
}

py::dict predicted_to_dict(const Predicted& p) {
  py::dict d;
  d["step_time"] = p.step_time;
  d["lower_bound"] = p.lower_bound;
  d["per_rank_time"] = p.per_rank_time;
  d["peak_tokens_per_rank"] = p.peak_tokens_per_rank;
  d["bubble_fraction"] = p.bubble_fraction;
  if (p.padding_fraction != 0) d["padding_fraction"] = p.padding_fraction;  // CUDA-graph mode only
  return d;
}

py::dict plan_to_dict(const Plan& p) {
  py::dict d;
  d["version"] = p.version;
  d["strategy"] = p.strategy;
  d["num_ranks"] = p.num_ranks;
  d["solve_ms"] = p.solve_ms;
  d["family"] = p.family;
  d["partial"] = p.partial;
  py::list mbs;
  for (const auto& slot : p.microbatches) {
    py::list s;
    for (const auto& g : slot) {
      py::dict gd;
      gd["ranks"] = g.ranks;
      gd["sequences"] = g.sequences;
      s.append(gd);
    }
    mbs.append(s);
  }
  d["microbatches"] = mbs;
  d["predicted"] = predicted_to_dict(p.predicted);
  return d;
}

Plan plan_from_dict(const py::object& obj) {
  if (!py::isinstance<py::dict>(obj))
    throw InvalidArgument("Plan.from_dict expects a dict (the JSON object Plan.to_dict writes), got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  const auto d = obj.cast<py::dict>();
  Plan p;
  p.version = get<int>(d, "version", "plan");
  if (p.version != Plan::kVersion)
    throw InvalidArgument("plan version " + std::to_string(p.version) + " is not supported (expected " +
                          std::to_string(Plan::kVersion) + ")");
  p.strategy = get<std::string>(d, "strategy", "plan");
  p.num_ranks = get<int>(d, "num_ranks", "plan");
  p.solve_ms = d.contains("solve_ms") ? get<double>(d, "solve_ms", "plan") : 0.0;
  p.family = d.contains("family") ? get<std::string>(d, "family", "plan") : "";
  p.partial = d.contains("partial") ? get<bool>(d, "partial", "plan") : false;
  auto mbs = get<py::list>(d, "microbatches", "plan");
  for (std::size_t m = 0; m < mbs.size(); ++m) {
    std::vector<Group> slot;
    py::list groups;
    try {
      groups = mbs[m].cast<py::list>();
    } catch (const py::cast_error&) {
      throw InvalidArgument("plan microbatch " + std::to_string(m) + " is not a list of groups");
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::string where = "plan microbatch " + std::to_string(m) + " group " + std::to_string(g);
      py::dict gd;
      try {
        gd = groups[g].cast<py::dict>();
      } catch (const py::cast_error&) {
        throw InvalidArgument(where + " is not an object");
      }
      slot.push_back({get<std::vector<int>>(gd, "ranks", where.c_str()),
                      get<std::vector<std::int64_t>>(gd, "sequences", where.c_str())});
    }
    p.microbatches.push_back(std::move(slot));
  }
  if (d.contains("predicted")) {
    if (!py::isinstance<py::dict>(d["predicted"])) throw InvalidArgument("plan field 'predicted' is not an object");
    auto pd = d["predicted"].cast<py::dict>();
    p.predicted.step_time = get<double>(pd, "step_time", "plan.predicted");
    p.predicted.lower_bound = get<double>(pd, "lower_bound", "plan.predicted");
    p.predicted.per_rank_time = get<std::vector<double>>(pd, "per_rank_time", "plan.predicted");
    p.predicted.peak_tokens_per_rank = get<std::int64_t>(pd, "peak_tokens_per_rank", "plan.predicted");
    if (pd.contains("bubble_fraction")) p.predicted.bubble_fraction = pd["bubble_fraction"].cast<double>();
    if (pd.contains("padding_fraction")) p.predicted.padding_fraction = pd["padding_fraction"].cast<double>();
  }
  return p;
}

}  // namespace

void bind_solve(py::module_& m) {
  py::enum_<CountPolicy>(m, "CountPolicy", "How many microbatches each pipeline runs")
      .value("EQUAL", CountPolicy::Equal, "every rank runs the same number of microbatches (Megatron)")
      .value("VARIABLE", CountPolicy::Variable, "ranks with cheaper microbatches run more of them (ByteScale HDP)");

  py::class_<solve::LocalSearchTuning> ls(m, "LocalSearchTuning",
                                          "dynacp's last stage, the local search (include/dynacp/solve/search/"
                                          "local_search.hpp documents each field); DynacpTuning.local_search.");
  ls.def(kw_init<solve::LocalSearchTuning>());
  Fields<solve::LocalSearchTuning>{ls, {}}
      .add("max_evaluations", &solve::LocalSearchTuning::max_evaluations, "most score() calls in one search")
      .add("max_work", &solve::LocalSearchTuning::max_work, "most plan-size units (groups + ranks + sequences)")
      .add("max_sequences", &solve::LocalSearchTuning::max_sequences, "runs only on batches up to this many")
      .add("max_ranks", &solve::LocalSearchTuning::max_ranks, "... on pools up to this many ranks")
      .add("min_gain", &solve::LocalSearchTuning::min_gain, "a move must lower the score by this fraction")
      .add("hot_ranks", &solve::LocalSearchTuning::hot_ranks, "the busiest ranks whose groups moves start from")
      .add("split_all_up_to", &solve::LocalSearchTuning::split_all_up_to, "every two-way split up to this size")
      .add("kicks", &solve::LocalSearchTuning::kicks, "forced moves once the climb stalls")
      .done();

  py::class_<DynacpTuning> tuning(
      m, "DynacpTuning",
      "Every tuning constant of the dynacp strategy (include/dynacp/solve/"
      "strategies/dynacp/tuning.hpp documents each); the defaults are the benchmarked ones.");
  tuning.def(kw_init<DynacpTuning>());
  Fields<DynacpTuning>{tuning, {}}
      .add("tau_grid", &DynacpTuning::tau_grid, "pp = 1: grid points of the makespan target tau")
      .add("tau_refine_steps", &DynacpTuning::tau_refine_steps, "pp = 1: refinement steps around the best tau")
      .add("tau_refine_division", &DynacpTuning::tau_refine_division, "pp = 1: refinement step = grid step / this")
      .add("flat_local_search_rounds", &DynacpTuning::flat_local_search_rounds, "pp = 1: per-rank search rounds")
      .add("ring_orders", &DynacpTuning::ring_orders, "ring placement orders tried when rings span nodes (1-3)")
      .add("wide_nodes", &DynacpTuning::wide_nodes, "pools up to this many nodes search wide rings fully")
      .add("neighbour_degrees", &DynacpTuning::neighbour_degrees, "degrees tried either side of a ring's target")
      .add("gap_tries", &DynacpTuning::gap_tries, "idle gaps tried per short sequence")
      .add("search_receivers", &DynacpTuning::search_receivers, "per-rank search: receiver ranks tried")
      .add("search_items", &DynacpTuning::search_items, "per-rank search: sequences examined per rank")
      .add("shelf_saturation", &DynacpTuning::shelf_saturation, "flat shelves: rank-time factor a ring may grow by")
      .add("knee_max_multiple", &DynacpTuning::knee_max_multiple, "slotted: counts up to this many x pp")
      .add("slot_edges", &DynacpTuning::slot_edges, "slotted: shares of the first and last slot")
      .add("slot_tau_grid", &DynacpTuning::slot_tau_grid, "slotted: targets tried per slot")
      .add("mu_grid", &DynacpTuning::mu_grid, "microbatch targets mu on the grid")
      .add("mu_floor", &DynacpTuning::mu_floor, "smallest mu as a fraction of the bound's scale")
      .add("walk_mus", &DynacpTuning::walk_mus, "extra-target and tiled walks at the best this many mus (0 = all)")
      .add("ring_targets", &DynacpTuning::ring_targets, "degree rules for rings that cannot reach mu")
      .add("extra_threshold", &DynacpTuning::extra_threshold, "whole bound / mu scale that enables extra targets")
      .add("extra_targets", &DynacpTuning::extra_targets, "extra targets as fractions of the whole bound")
      .add("break_low", &DynacpTuning::break_low, "breakpoints: lowest fraction of the whole bound")
      .add("break_high", &DynacpTuning::break_high, "breakpoints: highest fraction of the whole bound")
      .add("break_mus", &DynacpTuning::break_mus, "breakpoints: the best extra-target mus tried")
      .add("coarse_rules", &DynacpTuning::coarse_rules, "plain walk: rules over the whole mu grid (0 = all)")
      .add("coarse_min_ranks", &DynacpTuning::coarse_min_ranks,
           "the coarse plain walk only on pools of this many ranks")
      .add("break_points", &DynacpTuning::break_points, "breakpoints: at most this many, nearest the bound (0 = all)")
      .add("mu_refine", &DynacpTuning::mu_refine, "mu refinement exponents of the grid step")
      .add("variant_trials", &DynacpTuning::variant_trials, "best plain builds that get variants")
      .add("lead_counts", &DynacpTuning::lead_counts, "lead microbatch counts tried")
      .add("lead_fractions", &DynacpTuning::lead_fractions, "lead sizes as fractions of the first ring's time")
      .add("profile_ratios", &DynacpTuning::profile_ratios, "profile leads: rising ratios")
      .add("isolate", &DynacpTuning::isolate, "isolated builds: rings this close to the slowest keep their ranks")
      .add("shelf_giants", &DynacpTuning::shelf_giants, "shelves: the most giants laid out")
      .add("shelf_orders", &DynacpTuning::shelf_orders, "shelves: the most shelves whose every order is tried")
      .add("shelf_layouts", &DynacpTuning::shelf_layouts, "shelves: layouts built into plans")
      .add("shelf_mu_factors", &DynacpTuning::shelf_mu_factors, "shelves: factors of the best plain build's mu")
      .add("shelf_lead_fractions", &DynacpTuning::shelf_lead_fractions, "shelf leads: fractions of the first shelf")
      .add("shelf_profile_ratio", &DynacpTuning::shelf_profile_ratio, "shelves: profile lead ratio")
      .add("shelf_drops", &DynacpTuning::shelf_drops, "shelves: smallest giants left out, per family")
      .add("shelf_stride_ranks", &DynacpTuning::shelf_stride_ranks, "shelves: degrees step by P / this")
      .add("unit_giants", &DynacpTuning::unit_giants, "units: the most giants on blocks of their own")
      .add("reorder_budget", &DynacpTuning::reorder_budget, "slot-order polish: simulations per plan")
      .add("polish_plans", &DynacpTuning::polish_plans, "slot-order polish: at most this many plans (0 = all)")
      .add("polish_within", &DynacpTuning::polish_within, "slot-order polish: pooled plans within this x the best")
      .add("local_search", &DynacpTuning::local_search, "the last stage's LocalSearchTuning")
      .add("skip_families", &DynacpTuning::skip_families, "families left out (names from dynacp_families())")
      .done();
  tuning.def("validate", &DynacpTuning::validate, "Raise ValueError naming the first bad field.");

  py::class_<PlanOptions>(m, "PlanOptions", "Strategy and pipeline options of one planning call.")
      .def(py::init([](std::string strategy, int pp, int vpp, CountPolicy count_policy, bool tight_bound, int threads,
                       double time_limit_s, const py::object& tuning, std::vector<std::vector<int>> ring_set,
                       const py::object& static_shapes) {
             PlanOptions o;
             o.strategy = std::move(strategy);
             o.pp = pp;
             o.vpp = vpp;
             o.count_policy = count_policy;
             o.tight_bound = tight_bound;
             o.threads = threads;
             o.time_limit_s = time_limit_s;
             if (!tuning.is_none()) o.tuning = tuning.cast<DynacpTuning>();
             o.ring_set = std::move(ring_set);
             if (!static_shapes.is_none()) o.static_shapes = static_shapes.cast<StaticShapes>();
             return o;
           }),
           py::arg("strategy") = "dynacp", py::arg("pp") = 1, py::arg("vpp") = 1,
           py::arg("count_policy") = CountPolicy::Variable, py::arg("tight_bound") = true, py::arg("threads") = 0,
           py::arg("time_limit_s") = 0.0, py::arg("tuning") = py::none(),
           py::arg("ring_set") = std::vector<std::vector<int>>{}, py::arg("static_shapes") = py::none())
      .def_readwrite("ring_set", &PlanOptions::ring_set,
                     "rings (pool ranks, ring order) every multi-rank group must use; empty = any ring")
      .def_readwrite("static_shapes", &PlanOptions::static_shapes,
                     "CUDA-graph mode: StaticShapes every group must have; StaticShapes() = off")
      .def_readwrite("threads", &PlanOptions::threads, "dynacp: solver threads; 0 = every hardware thread")
      .def_readwrite("time_limit_s", &PlanOptions::time_limit_s,
                     "dynacp: seconds after which the best plan so far is returned (Plan.partial); 0 = none")
      .def_readwrite("tuning", &PlanOptions::tuning, "dynacp: DynacpTuning")
      .def_readwrite("strategy", &PlanOptions::strategy, "registry name (see strategy_names())")
      .def_readwrite("pp", &PlanOptions::pp, "pipeline stages per rank of the pool")
      .def_readwrite("vpp", &PlanOptions::vpp, "virtual stages per pipeline stage")
      .def_readwrite("count_policy", &PlanOptions::count_policy, "equal or variable microbatch counts")
      .def_readwrite("tight_bound", &PlanOptions::tight_bound,
                     "include the lower bound's cover term (pp > 1): tightest, slowest; the plan is the same")
      .def("__repr__", [](const PlanOptions& o) {
        return "PlanOptions(strategy='" + o.strategy + "', pp=" + std::to_string(o.pp) +
               ", vpp=" + std::to_string(o.vpp) +
               ", count_policy=" + (o.count_policy == CountPolicy::Equal ? "EQUAL" : "VARIABLE") +
               ", tight_bound=" + (o.tight_bound ? "True" : "False") + ")";
      });

  py::class_<Group>(m, "Group", "One CP group: a ring of ranks over a THD pack of sequence ids.")
      .def(py::init([](std::vector<int> ranks, std::vector<std::int64_t> sequences) {
             return Group{ranks, sequences};
           }),
           py::arg("ranks"), py::arg("sequences"))
      .def_readwrite("ranks", &Group::ranks, "ring order; its length is the CP degree")
      .def_readwrite("sequences", &Group::sequences, "input ids packed into this group")
      .def_property_readonly("degree", &Group::degree)
      .def(py::self == py::self)
      .def("__repr__", [](const Group& g) {
        return "Group(ranks=" + std::string(py::repr(py::cast(g.ranks))) +
               ", sequences=" + std::string(py::repr(py::cast(g.sequences))) + ")";
      });

  py::class_<Predicted>(m, "Predicted", "Predicted timeline of a plan (seconds).")
      .def_readonly("step_time", &Predicted::step_time)
      .def_readonly("lower_bound", &Predicted::lower_bound)
      .def_readonly("per_rank_time", &Predicted::per_rank_time)
      .def_readonly("peak_tokens_per_rank", &Predicted::peak_tokens_per_rank)
      .def_readonly("bubble_fraction", &Predicted::bubble_fraction)
      .def_readonly("padding_fraction", &Predicted::padding_fraction,
                    "CUDA-graph mode: padded rows the token buckets add / all rows the ranks hold; 0 when off")
      .def_property_readonly(
          "gap", [](const Predicted& p) { return p.lower_bound > 0 ? p.step_time / p.lower_bound - 1 : 0.0; },
          "step_time / lower_bound - 1")
      .def("to_dict", &predicted_to_dict)
      .def("__repr__", [](const Predicted& p) {
        return "Predicted(step_time=" + std::to_string(p.step_time) + ", lower_bound=" + std::to_string(p.lower_bound) +
               ", peak_tokens_per_rank=" + std::to_string(p.peak_tokens_per_rank) + ")";
      });

  py::class_<Plan>(m, "Plan", "Execution plan of one global batch (see docs/plan_format.md).")
      .def_readonly("version", &Plan::version)
      .def_readonly("strategy", &Plan::strategy)
      .def_readonly("num_ranks", &Plan::num_ranks)
      .def_readonly("solve_ms", &Plan::solve_ms)
      .def_readonly("microbatches", &Plan::microbatches, "slots in run order; each a list of Group")
      .def_readonly("predicted", &Plan::predicted)
      .def_readonly("family", &Plan::family, "dynacp: the candidate family of the plan (empty for other strategies)")
      .def_readonly("partial", &Plan::partial, "dynacp: the solve hit time_limit_s; the best plan found so far")
      .def("microbatches_of", &Plan::microbatches_of, py::arg("rank"), "Number of slots rank takes part in.")
      .def("digest", &Plan::digest, "Stable 64-bit digest of the assignment (timings excluded).")
      .def(
          "validate",
          [](const Plan& p, const py::object& lengths, const Cluster& c, const CostModel& cost, const py::object& masks,
             const py::object& static_shapes) {
            const Batch b = make_batch(lengths, masks);
            p.validate(b, c, cost);
            if (!static_shapes.is_none()) static_shapes.cast<StaticShapes>().check_plan(p, b, c);
          },
          py::arg("lengths"), py::arg("cluster"), py::arg("cost"), py::arg("masks") = py::none(),
          py::arg("static_shapes") = py::none(),
          "Check the invariants (and, given static_shapes, that every group has a declared shape: degree, rows, "
          "sequences, slots per rank); raise ValueError describing the first violation.")
      .def("to_dict", &plan_to_dict, "The fixed JSON-able plan format.")
      .def_static("from_dict", &plan_from_dict, py::arg("d"), "Inverse of to_dict (structure only; call validate).")
      .def(py::pickle([](const Plan& p) { return plan_to_dict(p); }, [](py::dict d) { return plan_from_dict(d); }))
      .def("__repr__", [](const Plan& p) {
        return "Plan(strategy='" + p.strategy + "', num_ranks=" + std::to_string(p.num_ranks) +
               ", microbatches=" + std::to_string(p.microbatches.size()) +
               ", step_time=" + std::to_string(p.predicted.step_time) + ")";
      });

  m.def("strategy_names", &solve::strategy_names, "Registered strategy names in a fixed order.");
  m.def("dynacp_families", &solve::dynacp_families,
        "dynacp's candidate families in registry order (the values Plan.family takes, and 'pool-slots').");
  m.def("strategy_summaries", [] {
    py::dict d;
    for (const auto& s : solve::strategies()) d[s.name] = s.summary;
    return d;
  });

  m.def(
      "plan",
      [](const py::object& lengths, const Cluster& cluster, const CostModel& cost, const PlanOptions& options,
         const py::object& masks) {
        Batch b = make_batch(lengths, masks);
        sync_log_level();
        // Ctrl-C: the solver calls this between candidate builds on this thread; it looks at Python's signals at
        // most every 50 ms and raises KeyboardInterrupt (error_already_set) through the solve.
        PlanOptions opts = options;
        auto last = std::chrono::steady_clock::now();
        opts.check_interrupt = [&last] {
          const auto now = std::chrono::steady_clock::now();
          if (now - last < std::chrono::milliseconds(50)) return;
          last = now;
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        };
        py::gil_scoped_release nogil;
        return plan(b, cluster, cost, opts);
      },
      py::arg("lengths"), py::arg("cluster"), py::arg("cost"), py::arg("options"), py::arg("masks") = py::none(),
      "Plan one global batch (releases the GIL).");
  m.def(
      "predict",
      [](const Plan& p, const py::object& lengths, const Cluster& cluster, const CostModel& cost,
         const PlanOptions& options, const py::object& masks) {
        Batch b = make_batch(lengths, masks);
        py::gil_scoped_release nogil;
        return predict(p, b, cluster, cost, options);
      },
      py::arg("plan"), py::arg("lengths"), py::arg("cluster"), py::arg("cost"), py::arg("options"),
      py::arg("masks") = py::none());
  m.def(
      "lower_bound",
      [](const py::object& lengths, const Cluster& cluster, const CostModel& cost, const py::object& masks, int pp,
         int vpp, bool tight_bound) {
        if (pp < 1 || vpp < 1) throw InvalidArgument("lower_bound: pp and vpp must be >= 1");
        const Batch b = make_batch(lengths, masks);
        py::gil_scoped_release nogil;
        return solve::lower_bound(b, cluster, cost, pp, vpp, tight_bound);
      },
      py::arg("lengths"), py::arg("cluster"), py::arg("cost"), py::arg("masks") = py::none(), py::arg("pp") = 1,
      py::arg("vpp") = 1, py::arg("tight_bound") = true);

  // Low-level pieces, exposed for tests and notebooks.
  m.def(
      "allocate_degrees",
      [](const std::vector<std::vector<double>>& times, const std::vector<int>& min_degree, int ranks,
         const std::string& method) {
        solve::DegreeProblem p;
        p.ranks = ranks;
        p.min_degree = min_degree;
        if (times.size() != min_degree.size()) throw InvalidArgument("times and min_degree differ in length");
        for (std::size_t i = 0; i < times.size(); ++i)
          if (static_cast<int>(times[i].size()) < ranks + 1)
            throw InvalidArgument("times[" + std::to_string(i) + "] must have ranks + 1 entries (index = degree)");
        p.time = [&times](std::size_t i, int d) { return times[i][static_cast<std::size_t>(d)]; };
        solve::DegreeResult r;
        if (method == "dp")
          r = solve::allocate_degrees_dp(p);
        else if (method == "threshold")
          r = solve::allocate_degrees_threshold(p);
        else if (method == "auto")
          r = solve::allocate_degrees(p);
        else
          throw InvalidArgument("method must be 'dp', 'threshold' or 'auto', got '" + method + "'");
        return py::make_tuple(r.degrees, r.makespan);
      },
      py::arg("times"), py::arg("min_degree"), py::arg("ranks"), py::arg("method") = "auto",
      "Degree allocation on an explicit table times[i][d]. Returns (degrees, makespan).");
  m.def("place_groups", &solve::place_groups, py::arg("degrees"), py::arg("cluster"));
}

}  // namespace dynacp::py
