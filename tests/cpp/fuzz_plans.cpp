// Fuzz target: random pools, cost models and batches through every strategy (pp 1, 2 and 4, and pp 2 with vpp 2);
// every plan must pass Plan::validate (every group within the cap once its sequences are padded, with the pad
// multiple 2 or 4) and never beat the lower bound; dynacp must never be slower than another
// strategy. The tight bound (with the cover term) is computed once per instance; the plans report the bound without
// it (tight_bound = false), which must not exceed it.
//   fuzz_plans [--instances N] [--seed S] [--extended 1] [--links 1] [--ring-sets 1] [--static-shapes 1]
//   (CTest runs short versions; docs/benchmarks.md the long ones)
// --extended 1 also draws the extended model form's per-document terms (CostModel::extended(): s^1.5 and s log s
// attention terms, per-document, per-hop and single-rank floors, partial overlap) at random, from their own random
// stream.
// --links 1 also draws the links at random, from a third stream: intra- and inter-node bandwidth and latency each
// over a wide range, so that in about half the instances the inter-node link is the faster in bandwidth or latency
// (where the cross-node family applies); without it every instance keeps the default links (NVLink faster).
// --ring-sets 1 also draws a ring set per instance (PlanOptions::ring_set), from a fourth stream: the power-of-two
// tilings of each node (or of the pool), a few random rings, and the whole pool; every multi-rank group of every
// strategy's plan must then be a ring of the set, in its ring order.
// --static-shapes 1 runs dynacp alone under random StaticShapes (CUDA-graph mode) on small instances (8-32 ranks, 8
// per node, up to 64 sequences, pp 1 or 2): 1-4 token buckets, CP sizes {1, 2, 4, 8} or a subset with 1, slot (3-8) and
// sequence (2-16) caps on or off; every plan must pass Plan::validate and StaticShapes::check_plan. Shapes no plan
// meets (InvalidArgument from the planner) count separately as infeasible. Anchor plans the simulator rejects - a 1F1B
// deadlock, or under vpp > 1 microbatch counts that are not multiples of pp (megatron raises when it cannot split to
// one) - count separately; dynacp must plan every instance where any other strategy does (under vpp > 1 a batch may
// have no plan whose counts are all multiples of pp).
// --small 1 draws small instances (at most 4 nodes of 4 ranks, at most 24 sequences), for long ring-set runs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "dynacp/api/planner.hpp"
#include "dynacp/model/error.hpp"

using namespace dynacp;

namespace {

// A random ring set: power-of-two sizes tiled per node (or over the pool when kept), random rings of random sizes
// (random ranks in random order), and the whole pool (so every sequence that fits the pool has a ring).
std::vector<std::vector<int>> draw_ring_set(const Cluster& c, std::mt19937_64& rng) {
  std::vector<std::vector<int>> out;
  auto add = [&](std::vector<int> ring) {
    std::vector<int> key = ring;
    std::sort(key.begin(), key.end());
    for (const auto& r : out) {
      std::vector<int> k2 = r;
      std::sort(k2.begin(), k2.end());
      if (k2 == key) return;
    }
    out.push_back(std::move(ring));
  };
  const int P = c.num_ranks, span = rng() % 2 ? c.ranks_per_node : P;
  for (int d = 2; d <= span; d *= 2)
    if (rng() % 4 != 0)
      for (int base = 0; base + span <= P; base += span)
        for (int a = 0; a + d <= span; a += d) {
          std::vector<int> ring(static_cast<std::size_t>(d));
          for (int j = 0; j < d; ++j) ring[static_cast<std::size_t>(j)] = base + a + j;
          add(ring);
        }
  std::vector<int> all(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) all[static_cast<std::size_t>(r)] = r;
  for (int k = static_cast<int>(rng() % 6); k > 0 && P >= 2; --k) {
    std::vector<int> perm = all;
    std::shuffle(perm.begin(), perm.end(), rng);
    perm.resize(static_cast<std::size_t>(2 + rng() % static_cast<std::uint64_t>(P - 1)));
    add(perm);
  }
  if (P >= 2) add(all);
  return out;
}

bool inside(const Plan& p, const std::vector<std::vector<int>>& rings) {
  for (const auto& slot : p.microbatches)
    for (const Group& g : slot)
      if (g.degree() > 1 && std::find(rings.begin(), rings.end(), g.ranks) == rings.end()) return false;
  return true;
}

// One random static-shape instance's pool, shapes, options and batch (run_static_shapes).
struct ShapeInstance {
  Cluster c;
  CostModel cost;
  PlanOptions o;
  Batch b;
};

ShapeInstance draw_shape_instance(std::mt19937_64& rng) {
  ShapeInstance x;
  x.c.ranks_per_node = 8;
  x.c.num_ranks = 8 * (1 + static_cast<int>(rng() % 4));
  x.cost.attn_coef *= std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
  x.cost.group_overhead *= std::uniform_real_distribution<double>(0, 2)(rng);
  const std::int64_t cap = 2 * (128 + static_cast<std::int64_t>(rng() % 4096));
  x.c.tokens_per_rank = cap;
  StaticShapes& s = x.o.static_shapes;
  for (int f = 8; f >= 1; f /= 2)  // buckets at cap / 8, / 4, / 2, / 1, each kept with probability 3/4 (cap always)
    if (f == 1 || rng() % 4 != 0) s.token_buckets.push_back(std::max<std::int64_t>(2, cap / f / 2 * 2));
  s.token_buckets.erase(std::unique(s.token_buckets.begin(), s.token_buckets.end()), s.token_buckets.end());
  s.cp_sizes = {1};
  for (int d = 2; d <= 8; d *= 2)
    if (rng() % 4 != 0) s.cp_sizes.push_back(d);
  s.max_microbatches = rng() % 3 == 0 ? 0 : 3 + static_cast<int>(rng() % 6);
  s.max_sequences = rng() % 3 == 0 ? 0 : 2 + static_cast<int>(rng() % 15);
  x.o.strategy = "dynacp";
  x.o.pp = rng() % 3 == 0 ? 2 : 1;
  x.o.tight_bound = false;
  const std::int64_t longest = cap * s.cp_sizes.back();
  const int n = 1 + static_cast<int>(rng() % 64);
  std::lognormal_distribution<double> logn(std::log(static_cast<double>(cap)) - 1.5, 1.5);
  for (int i = 0; i < n; ++i) {
    x.b.lengths.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(logn(rng)), 1, longest));
    x.b.masks.push_back(rng() % 6 == 0 ? Mask::Full : Mask::Causal);
  }
  return x;
}

// --static-shapes 1: dynacp under random static shapes; returns the process exit code.
int run_static_shapes(long instances, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x2545f4914f6cdd1dULL);
  long plans = 0, invalid_plans = 0, infeasible = 0, unplanned = 0, padded = 0;
  for (long it = 0; it < instances; ++it) {
    const ShapeInstance x = draw_shape_instance(rng);
    try {
      const Plan p = plan(x.b, x.c, x.cost, x.o);
      ++plans;
      try {
        p.validate(x.b, x.c, x.cost);
        x.o.static_shapes.check_plan(p, x.b, x.c);
        if (p.predicted.padding_fraction < 0 || p.predicted.padding_fraction >= 1)
          throw InvalidArgument("padding_fraction outside [0, 1)");
        if (p.predicted.padding_fraction > 0) ++padded;
      } catch (const InvalidArgument& e) {
        ++invalid_plans;
        std::fprintf(stderr, "instance %ld: invalid plan under %s: %s\n", it, x.o.static_shapes.describe().c_str(),
                     e.what());
      }
    } catch (const InvalidArgument& e) {  // shapes no plan can meet (check_feasible), or none the solver found
      ++(std::string(e.what()).rfind("StaticShapes:", 0) == 0 ? infeasible : unplanned);
      if (std::getenv("FUZZ_VERBOSE") != nullptr) std::fprintf(stderr, "instance %ld: %s\n", it, e.what());
    } catch (const std::exception& e) {
      ++invalid_plans;
      std::fprintf(stderr, "instance %ld: %s\n", it, e.what());
    }
  }
  std::printf(
      "fuzz (static shapes): %ld instances, %ld plans, %ld with padding, %ld infeasible shapes, %ld feasible by the "
      "counts but no plan found\n",
      instances, plans, padded, infeasible, unplanned);
  std::printf("fuzz: %ld passed, %ld failed\n", plans - invalid_plans, invalid_plans);
  return invalid_plans == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  long instances = 1000;
  std::uint64_t seed = 1;
  bool extended = false, links = false, ring_sets = false, static_shapes = false, small = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--instances"))
      instances = std::stol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seed"))
      seed = std::stoull(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--extended"))
      extended = std::stoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--links"))
      links = std::stoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--ring-sets"))
      ring_sets = std::stoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--static-shapes"))
      static_shapes = std::stoi(argv[i + 1]) != 0;
    else if (!std::strcmp(argv[i], "--small"))
      small = std::stoi(argv[i + 1]) != 0;
  }
  if (static_shapes) return run_static_shapes(instances, seed);
  std::mt19937_64 rng(seed), ext_rng(seed ^ 0x9e3779b97f4a7c15ULL), link_rng(seed ^ 0xc2b2ae3d27d4eb4fULL),
      ring_rng(seed ^ 0x165667b19e3779f9ULL);
  long plans = 0, failed = 0, deadlocks = 0, unaligned = 0, unplanned = 0, dynacp_worse = 0, inter_faster = 0;
  const auto names = solve::strategy_names();
  for (long it = 0; it < instances; ++it) {
    Cluster c;
    const std::uint64_t span = small ? 4 : 8;  // (--small 1)
    c.ranks_per_node = 1 + static_cast<int>(rng() % span);
    c.num_ranks = c.ranks_per_node * (1 + static_cast<int>(rng() % span));
    if (links) {  // defaults x e^u: intra u in [-2, 2], inter bandwidth u in [-1, 3], latencies u in [-2, 2]
      auto scale = [&](double lo, double hi) {
        return std::exp(std::uniform_real_distribution<double>(lo, hi)(link_rng));
      };
      c.intra_node_bandwidth *= scale(-2, 2);
      c.inter_node_bandwidth *= scale(-1, 3);
      c.intra_node_latency *= scale(-2, 2);
      c.inter_node_latency *= scale(-2, 2);
      if (c.num_nodes() > 1 &&
          (c.inter_node_bandwidth > c.intra_node_bandwidth || c.inter_node_latency < c.intra_node_latency))
        ++inter_faster;
    }
    CostModel cost;
    cost.attn_coef *= std::exp(std::uniform_real_distribution<double>(-2, 2)(rng));
    cost.group_overhead *= std::uniform_real_distribution<double>(0, 2)(rng);
    cost.kv_bytes_per_token *= std::uniform_real_distribution<double>(0, 3)(rng);
    if (extended) {  // each term off in about a quarter of the instances, else up to a few times the classic terms
      auto draw = [&](double hi) {
        const double u = std::uniform_real_distribution<double>(-0.33, 1)(ext_rng);
        return u > 0 ? u * hi : 0.0;
      };
      cost.attn_pow_coef = cost.attn_coef * draw(100.0);  // at most a s^2 from s = 10^4 on
      cost.attn_log_coef = cost.attn_coef * draw(500.0);  // at most a s^2 from s ~ 6,000 on
      cost.doc_overhead = CostModel{}.group_overhead * draw(0.5);
      cost.doc_hop_overhead = CostModel{}.group_overhead * draw(0.2);
      cost.doc_solo_overhead = CostModel{}.group_overhead * draw(0.5);
      cost.comm_overlap = 1.0 - draw(1.0);
    }
    const std::int64_t cap = 256 + static_cast<std::int64_t>(rng() % 8192);
    c.activation_budget = static_cast<double>(cap) * cost.mem_per_token;
    c.seq_pad_multiple = it % 7 == 3 ? 4 : 2;  // zigzag's 2, and lcm(2, tp) with sequence parallelism at tp = 4
    const std::int64_t longest = cap / c.seq_pad_multiple * c.seq_pad_multiple * c.num_ranks;  // fits once padded
    PlanOptions o;
    if (ring_sets) o.ring_set = draw_ring_set(c, ring_rng);
    o.pp = it % 5 == 0 ? 4 : (it % 5 == 1 || it % 5 == 2 ? 2 : 1);
    o.vpp = it % 5 == 2 ? 2 : 1;
    Batch b;  // under vpp > 1 at least pp sequences (fewer cannot give every rank a multiple of pp microbatches)
    const int n = std::max(1 + static_cast<int>(rng() % (small ? 24 : 96)), o.vpp > 1 ? o.pp : 1);
    std::lognormal_distribution<double> logn(std::log(static_cast<double>(cap)) - 1.5, 1.5);
    for (int i = 0; i < n; ++i) {
      b.lengths.push_back(std::clamp<std::int64_t>(static_cast<std::int64_t>(logn(rng)), 1, longest));
      b.masks.push_back(rng() % 6 == 0 ? Mask::Full : Mask::Causal);
    }
    double best_other = -1, dyn = -1;
    o.tight_bound = true;
    const double tight = lower_bound(b, c, cost, o);
    o.tight_bound = false;
    for (const auto& name : names) {
      o.strategy = name;
      ++plans;
      try {
        const Plan p = plan(b, c, cost, o);
        p.validate(b, c, cost);  // includes every group's padded rows per rank against the cap
        if (p.predicted.peak_tokens_per_rank > cap) throw Error("a group's padded rows per rank exceed the cap");
        if (p.predicted.step_time < tight * (1 - 1e-9)) throw Error("step time below the lower bound");
        if (p.predicted.lower_bound > tight * (1 + 1e-12)) throw Error("the bound without the cover term is higher");
        if (ring_sets && !inside(p, o.ring_set)) throw Error("a group is not a ring of the ring set");
        if (name == "dynacp")
          dyn = p.predicted.step_time;
        else
          best_other = best_other < 0 ? p.predicted.step_time : std::min(best_other, p.predicted.step_time);
      } catch (const Error& e) {
        if (o.pp > 1 && std::string(e.what()).find("cycle") != std::string::npos && name != "dynacp") {
          ++deadlocks;
          continue;
        }
        if (o.vpp > 1 && std::string(e.what()).find("multiple of pp") != std::string::npos && name != "dynacp") {
          ++unaligned;
          continue;
        }
        ++failed;
        std::fprintf(stderr, "instance %ld strategy %s pp %d vpp %d: %s\n", it, name.c_str(), o.pp, o.vpp, e.what());
      } catch (const InvalidArgument& e) {
        if (o.vpp > 1 && std::string(e.what()).find("multiple of pp") != std::string::npos && name != "dynacp") {
          ++unaligned;
          continue;
        }
        // dynacp runs last: it may find no interleavable plan only where no other strategy found one either (their
        // plans are its candidates), e.g. 3 sequences that each need the whole 2-rank pool
        if (name == "dynacp" && best_other < 0 && std::string(e.what()).find("no plan meets") != std::string::npos) {
          ++unplanned;
          continue;
        }
        ++failed;
        std::fprintf(stderr, "instance %ld strategy %s pp %d vpp %d: %s\n", it, name.c_str(), o.pp, o.vpp, e.what());
      } catch (const std::exception& e) {
        ++failed;
        std::fprintf(stderr, "instance %ld strategy %s pp %d vpp %d: %s\n", it, name.c_str(), o.pp, o.vpp, e.what());
      }
    }
    if (dyn >= 0 && best_other >= 0 && dyn > best_other * (1 + 1e-9)) {
      ++dynacp_worse;  // (with ring sets a quality count only: the others' plans are projected, not searched)
      std::fprintf(stderr, "instance %ld: dynacp %.6g slower than another strategy %.6g\n", it, dyn, best_other);
    }
  }
  std::printf(
      "fuzz%s%s%s: %ld instances, %ld plans, %ld anchor plans rejected as 1F1B deadlocks, %ld as not interleavable "
      "(vpp 2), %ld batches no strategy could interleave, %ld dynacp slower\n",
      extended ? " (extended form)" : "", ring_sets ? " (ring sets)" : "", small ? " (small)" : "", instances, plans,
      deadlocks, unaligned, unplanned, dynacp_worse);
  if (links)
    std::printf("fuzz (random links): %ld instances on more than one node with a faster inter-node link\n",
                inter_faster);
  const long fails = failed + (ring_sets ? 0 : dynacp_worse);
  std::printf("fuzz: %ld passed, %ld failed\n", plans - failed - deadlocks - unaligned - unplanned, fails);
  return fails == 0 ? 0 : 1;
}
