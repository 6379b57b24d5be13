// Pipeline simulator as a longest path over the op DAG (Kahn's algorithm, flat arrays, O(total ops)).
//
// Nodes are joint ops: one node per (group, direction, chunk, stage), shared by every rank of the group, so CP
// synchronisation is simply "a node waits for all its predecessors". Edges:
//   * data: the per-group chain F(c=0,k=0) -> ... -> F(c=0,k=pp-1) -> F(c=1,k=0) -> ... -> F(vpp-1,pp-1)
//           -> B(vpp-1,pp-1) -> ... -> B(vpp-1,0) -> B(vpp-2,pp-1) -> ... -> B(0,0)   (implicit, by index);
//   * order: on every rank-stage, consecutive ops of its Megatron op order (stored per slot).
#include "dynacp/sim/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <span>
#include <sstream>
#include <string>

#include "dynacp/model/error.hpp"

namespace dynacp::sim {
namespace {

using Node = std::int32_t;  // node ids (validate() guards groups x 2 x pp x vpp < 2^31)
constexpr Node kNone = -1;

/// Node numbering: group g owns the ids [g * len, (g + 1) * len), len = 2 * vpp * pp, in data-chain order: position
/// c * pp + k is F(chunk c, stage k) and len - 1 - (c * pp + k) is B(chunk c, stage k). So the data predecessor of
/// a node is n - 1 and its successor n + 1 (within the group's block).
struct Layout {
  std::int64_t pp, vpp, len;
  Layout(std::int64_t pp_, std::int64_t vpp_) : pp(pp_), vpp(vpp_), len(2 * pp_ * vpp_) {}
  Node id(std::int64_t g, int dir, std::int64_t c, std::int64_t k) const {
    const std::int64_t q = c * pp + k;
    return static_cast<Node>(g * len + (dir ? len - 1 - q : q));
  }
  std::int64_t pos(Node n) const { return static_cast<std::int64_t>(n) % len; }
  int dir(Node n) const { return pos(n) >= len / 2 ? 1 : 0; }
  std::int64_t fwd_pos(Node n) const { return dir(n) ? len - 1 - pos(n) : pos(n); }
  std::int64_t stage(Node n) const { return fwd_pos(n) % pp; }
  std::int64_t chunk(Node n) const { return fwd_pos(n) / pp; }
  std::int64_t group(Node n) const { return static_cast<std::int64_t>(n) / len; }
  Node data_pred(Node n) const { return pos(n) > 0 ? n - 1 : kNone; }
  std::string describe(Node n) const {
    return detail::cat("group ", group(n), " ", dir(n) ? "backward" : "forward", " chunk ", chunk(n), " stage ",
                       stage(n));
  }
};

/// Appends the Megatron op order of one rank-stage (m microbatches `mbs`, stage k) as nodes to `out`.
void append_op_order(std::span<const std::int32_t> mbs, int pp, int vpp, int k, const Layout& L,
                     std::vector<Node>& out) {
  const std::int64_t m = static_cast<std::int64_t>(mbs.size());
  const std::int64_t total = m * vpp;
  std::int64_t warmup;
  if (vpp == 1) {
    warmup = std::min<std::int64_t>(pp - k - 1, m);
  } else {
    // Megatron-Core forward_backward_pipelining_with_interleaving (microbatch group size = pp).
    warmup = std::min<std::int64_t>(static_cast<std::int64_t>(pp - k - 1) * 2 + static_cast<std::int64_t>(vpp - 1) * pp,
                                    total);
  }
  const std::int64_t remaining = total - warmup;
  if (vpp == 1) {  // plain 1F1B: virtual index = microbatch index, chunk 0
    for (std::int64_t i = 0; i < warmup; ++i) out.push_back(L.id(mbs[i], 0, 0, k));
    for (std::int64_t i = 0; i < remaining; ++i) {
      out.push_back(L.id(mbs[warmup + i], 0, 0, k));
      out.push_back(L.id(mbs[i], 1, 0, k));
    }
    for (std::int64_t j = remaining; j < total; ++j) out.push_back(L.id(mbs[j], 1, 0, k));
    return;
  }
  const std::int64_t group_size = static_cast<std::int64_t>(pp) * vpp;
  auto fwd = [&](std::int64_t i) {
    const std::int64_t in = i % group_size;
    const std::int64_t mb = (i / group_size) * pp + in % pp;
    out.push_back(L.id(mbs[mb], 0, in / pp, k));
  };
  auto bwd = [&](std::int64_t j) {
    const std::int64_t in = j % group_size;
    const std::int64_t mb = (j / group_size) * pp + in % pp;
    out.push_back(L.id(mbs[mb], 1, vpp - 1 - in / pp, k));
  };
  for (std::int64_t i = 0; i < warmup; ++i) fwd(i);
  for (std::int64_t i = 0; i < remaining; ++i) {
    fwd(warmup + i);
    bwd(i);
  }
  for (std::int64_t j = remaining; j < total; ++j) bwd(j);
}

void validate(const PipelineProblem& p) {
  if (p.num_ranks < 1) invalid("num_ranks must be >= 1, got ", p.num_ranks);
  if (p.pp < 1) invalid("pp must be >= 1, got ", p.pp);
  if (p.vpp < 1) invalid("vpp must be >= 1, got ", p.vpp);
  if (p.rank_microbatches.size() != static_cast<std::size_t>(p.num_ranks))
    invalid("rank_microbatches has ", p.rank_microbatches.size(), " entries but num_ranks is ", p.num_ranks);
  const std::size_t G = p.group_ranks.size();
  if (p.group_forward.size() != G || p.group_backward.size() != G)
    invalid("group_forward (", p.group_forward.size(), ") and group_backward (", p.group_backward.size(),
            ") must have one entry per group (", G, " groups in group_ranks)");
  if (!p.group_memory.empty() && p.group_memory.size() != G)
    invalid("group_memory has ", p.group_memory.size(), " entries; expected ", G, " (one per group) or none");
  for (std::size_t g = 0; g < G; ++g) {
    if (!std::isfinite(p.group_forward[g]) || p.group_forward[g] < 0)
      invalid("group_forward[", g, "] must be finite and >= 0, got ", p.group_forward[g]);
    if (!std::isfinite(p.group_backward[g]) || p.group_backward[g] < 0)
      invalid("group_backward[", g, "] must be finite and >= 0, got ", p.group_backward[g]);
    if (!p.group_memory.empty() && (!std::isfinite(p.group_memory[g]) || p.group_memory[g] < 0))
      invalid("group_memory[", g, "] must be finite and >= 0, got ", p.group_memory[g]);
  }
  if (!std::isfinite(p.grad_sync) || p.grad_sync < 0) invalid("grad_sync must be finite and >= 0, got ", p.grad_sync);
  // Node ids are 32-bit (half the memory traffic of the hot loop); 2^31 joint ops is far beyond any real step.
  if (static_cast<double>(G) * p.pp * p.vpp * 2 >= 2147483647.0)
    invalid("problem too large: groups x 2 x pp x vpp = ", static_cast<double>(G) * p.pp * p.vpp * 2,
            " joint ops exceeds 2^31 - 1");

  // Rank -> group lists: known ids, no duplicates; group -> rank lists: known ranks, no duplicates; and the two
  // must describe the same membership. O(total memberships) with stamp arrays.
  std::vector<std::int64_t> group_stamp(G, -1);
  for (int r = 0; r < p.num_ranks; ++r) {
    const auto& mbs = p.rank_microbatches[r];
    if (p.vpp > 1 && mbs.size() % static_cast<std::size_t>(p.pp) != 0)
      invalid("interleaved 1F1B (vpp = ", p.vpp,
              ") needs every rank's microbatch count to be a multiple of pp = ", p.pp, "; rank ", r, " has ",
              mbs.size());
    for (int g : mbs) {
      if (g < 0 || static_cast<std::size_t>(g) >= G)
        invalid("rank ", r, " lists unknown group id ", g, " (", G, " groups)");
      if (group_stamp[g] == r) invalid("rank ", r, " lists group ", g, " more than once");
      group_stamp[g] = r;
    }
  }
  std::vector<std::int64_t> rank_stamp(p.num_ranks, -1);
  for (std::size_t g = 0; g < G; ++g) {
    if (p.group_ranks[g].empty()) invalid("group ", g, " has no ranks");
    for (int r : p.group_ranks[g]) {
      if (r < 0 || r >= p.num_ranks) invalid("group ", g, " lists unknown rank ", r, " (num_ranks ", p.num_ranks, ")");
      if (rank_stamp[r] == static_cast<std::int64_t>(g)) invalid("group ", g, " lists rank ", r, " more than once");
      rank_stamp[r] = static_cast<std::int64_t>(g);
    }
  }
  // Every (r, g) of group_ranks must appear in rank r's list; with equal totals and no duplicates the reverse holds.
  // Re-stamp per rank: mark rank r's groups, then check the groups that list r.
  std::vector<std::size_t> gor_off(static_cast<std::size_t>(p.num_ranks) + 1, 0);  // groups of rank, CSR
  for (std::size_t g = 0; g < G; ++g)
    for (int r : p.group_ranks[g]) ++gor_off[r + 1];
  for (int r = 0; r < p.num_ranks; ++r) gor_off[r + 1] += gor_off[r];
  std::vector<int> gor(gor_off.back());
  {
    std::vector<std::size_t> cur(gor_off.begin(), gor_off.end() - 1);
    for (std::size_t g = 0; g < G; ++g)
      for (int r : p.group_ranks[g]) gor[cur[r]++] = static_cast<int>(g);
  }
  std::fill(group_stamp.begin(), group_stamp.end(), -1);
  for (int r = 0; r < p.num_ranks; ++r) {
    const auto first = gor.begin() + gor_off[r], last = gor.begin() + gor_off[r + 1];
    for (int g : p.rank_microbatches[r]) group_stamp[g] = r;
    for (auto it = first; it != last; ++it)
      if (group_stamp[*it] != r)
        invalid("group ", *it, " lists rank ", r, " but rank ", r, " does not list group ", *it);
    if (static_cast<std::size_t>(last - first) != p.rank_microbatches[r].size()) {
      for (auto it = first; it != last; ++it) group_stamp[*it] = -2;
      for (int g : p.rank_microbatches[r])
        if (group_stamp[g] != -2) invalid("rank ", r, " lists group ", g, " but group ", g, " does not list rank ", r);
    }
  }
}

[[noreturn]] void throw_cycle(const Layout& L, int pp, const std::vector<Node>& seq,
                              const std::vector<std::size_t>& seg_off, const std::vector<std::int32_t>& indeg) {
  const Node N = static_cast<Node>(indeg.size());
  // Every unprocessed node has an unprocessed predecessor; following them must close a cycle.
  std::vector<Node> pred(N, kNone);
  std::vector<std::int64_t> pred_slot(N, -1);  // -1: data edge
  for (std::size_t seg = 0; seg + 1 < seg_off.size(); ++seg) {
    for (std::size_t s = seg_off[seg]; s + 1 < seg_off[seg + 1]; ++s) {
      const Node u = seq[s], v = seq[s + 1];
      if (indeg[u] > 0 && indeg[v] > 0 && pred[v] == kNone) {
        pred[v] = u;
        pred_slot[v] = static_cast<std::int64_t>(s);
      }
    }
  }
  Node start = kNone;
  for (Node v = 0; v < N; ++v) {
    if (indeg[v] <= 0) continue;
    if (start == kNone) start = v;
    const Node d = L.data_pred(v);
    if (pred[v] == kNone && d != kNone && indeg[d] > 0) pred[v] = d;
  }
  std::vector<std::int64_t> seen(N, -1);
  std::vector<Node> path;
  Node v = start;
  while (v != kNone && seen[v] < 0) {
    seen[v] = static_cast<std::int64_t>(path.size());
    path.push_back(v);
    v = pred[v];
  }
  if (v == kNone) throw Error("pipeline simulator: dependency cycle detected but could not be traced (a bug)");
  // path[seen[v]..] is the cycle in reverse edge order: path[i+1] -> path[i].
  std::vector<Node> cycle(path.begin() + seen[v], path.end());
  std::reverse(cycle.begin(), cycle.end());  // now cycle[i] -> cycle[i+1] (wrapping)
  std::set<int> ranks, groups;
  std::ostringstream edges;
  const std::size_t shown = 12;
  for (std::size_t i = 0; i < cycle.size(); ++i) {
    const Node a = cycle[i], b = cycle[(i + 1) % cycle.size()];
    groups.insert(static_cast<int>(L.group(a)));
    const std::int64_t s = pred_slot[b];
    const bool order_edge = pred[b] == a && s >= 0;
    int rank = -1;
    if (order_edge) {
      const auto seg = static_cast<std::size_t>(
          std::upper_bound(seg_off.begin(), seg_off.end(), static_cast<std::size_t>(s)) - seg_off.begin() - 1);
      rank = static_cast<int>(seg / static_cast<std::size_t>(pp));
      ranks.insert(rank);
    }
    if (i < shown) {
      if (i) edges << "; ";
      if (order_edge)
        edges << "rank " << rank << " runs " << L.describe(a) << " before " << L.describe(b);
      else
        edges << L.describe(a) << " feeds " << L.describe(b);
    } else if (i == shown) {
      edges << "; ... (" << cycle.size() << " edges)";
    }
  }
  auto join = [](const std::set<int>& s) {
    std::ostringstream os;
    std::size_t i = 0;
    for (int x : s) {
      if (i == 32) {
        os << ", ...";
        break;
      }
      os << (i++ ? ", " : "") << x;
    }
    return os.str();
  };
  throw Error(
      detail::cat("pipeline simulator: ranks order shared CP groups inconsistently (dependency cycle) - ranks {",
                  join(ranks), "}, groups {", join(groups), "}: ", edges.str(),
                  ". Give every rank of a group the same relative order of the groups it shares."));
}

// Consistency of a flat problem (simulate's validate covers the nested form): what the longest path relies on.
void validate_flat(const FlatProblem& p) {
  if (p.num_ranks < 1 || p.pp < 1 || p.vpp < 1)
    invalid("num_ranks, pp and vpp must be >= 1, got ", p.num_ranks, ", ", p.pp, " and ", p.vpp);
  const std::size_t G = p.group_size.size();
  if (p.rank_off.size() != static_cast<std::size_t>(p.num_ranks) + 1 || p.rank_off.front() != 0 ||
      p.rank_off.back() != static_cast<std::int32_t>(p.rank_groups.size()))
    invalid("rank_off must hold num_ranks + 1 offsets from 0 to rank_groups.size()");
  if (p.group_forward.size() != G || p.group_backward.size() != G)
    invalid("group_forward and group_backward must have one entry per group (", G, ")");
  if (static_cast<double>(G) * p.pp * p.vpp * 2 >= 2147483647.0)
    invalid("problem too large: groups x 2 x pp x vpp exceeds 2^31 - 1");
  for (std::size_t g = 0; g < G; ++g)
    if (!std::isfinite(p.group_forward[g]) || p.group_forward[g] < 0 || !std::isfinite(p.group_backward[g]) ||
        p.group_backward[g] < 0)
      invalid("group ", g, " has forward ", p.group_forward[g], " and backward ", p.group_backward[g],
              "; need finite and >= 0");
  std::vector<std::int32_t> seen(G, 0);
  for (int r = 0; r < p.num_ranks; ++r) {
    const auto n = p.rank_off[r + 1] - p.rank_off[r];
    if (n < 0) invalid("rank_off decreases at rank ", r);
    if (p.vpp > 1 && n % p.pp != 0)
      invalid("interleaved 1F1B (vpp = ", p.vpp,
              ") needs every rank's microbatch count to be a multiple of pp = ", p.pp, "; rank ", r, " has ", n);
  }
  for (std::int32_t g : p.rank_groups) {
    if (g < 0 || static_cast<std::size_t>(g) >= G) invalid("unknown group id ", g, " (", G, " groups)");
    ++seen[static_cast<std::size_t>(g)];
  }
  for (std::size_t g = 0; g < G; ++g)
    if (seen[g] != p.group_size[g] || seen[g] < 1)
      invalid("group ", g, " is listed by ", seen[g], " ranks but its size is ", p.group_size[g]);
}

// The op DAG of a step and its longest path: per-node durations, the op orders (one segment per rank-stage, index
// r * pp + k), order successors (CSR) and, after run(), each node's start.
struct Dag {
  Layout L;
  Node N = 0;
  std::vector<double> dur, start;
  std::vector<Node> seq, succ, queue;
  std::vector<std::size_t> seg_off, succ_off;
  std::vector<std::int32_t> indeg;
  double makespan = 0.0;

  explicit Dag(const FlatProblem& p) : L(p.pp, p.vpp) {
    const int P = p.num_ranks, pp = p.pp, vpp = p.vpp;
    const auto G = static_cast<std::int64_t>(p.group_size.size());
    N = static_cast<Node>(G * L.len);
    dur.resize(static_cast<std::size_t>(N));
    succ_off.assign(static_cast<std::size_t>(N) + 1, 0);
    const std::int64_t half = L.len / 2;
    std::size_t acc = 0;
    for (std::int64_t g = 0; g < G; ++g)
      for (std::int64_t j = 0; j < L.len; ++j) {
        const Node n = static_cast<Node>(g * L.len + j);
        dur[n] = j < half ? p.group_forward[g] : p.group_backward[g];
        succ_off[n] = acc;  // one slot per rank of its group: at most that many order successors
        acc += static_cast<std::size_t>(p.group_size[g]);
      }
    succ_off[N] = acc;
    seq.reserve(p.rank_groups.size() * static_cast<std::size_t>(L.len));
    seg_off.assign(static_cast<std::size_t>(P) * pp + 1, 0);
    for (int r = 0; r < P; ++r) {
      const std::span<const std::int32_t> mbs(p.rank_groups.data() + p.rank_off[r],
                                              static_cast<std::size_t>(p.rank_off[r + 1] - p.rank_off[r]));
      for (int k = 0; k < pp; ++k) {
        append_op_order(mbs, pp, vpp, k, L, seq);
        seg_off[static_cast<std::size_t>(r) * pp + k + 1] = seq.size();
      }
    }
  }

  // Kahn's algorithm with longest-path relaxation; FIFO seeded in node-id order, hence deterministic. False on a
  // dependency cycle (the nodes left with in-degree > 0 lie on or behind it).
  bool run() {
    succ.assign(succ_off[N], kNone);
    std::vector<std::size_t> cursor(succ_off.begin(), succ_off.end() - 1);
    indeg.assign(static_cast<std::size_t>(N), 1);
    for (Node g0 = 0; g0 < N; g0 += static_cast<Node>(L.len)) indeg[g0] = 0;
    for (std::size_t sg = 0; sg + 1 < seg_off.size(); ++sg)
      for (std::size_t s = seg_off[sg]; s + 1 < seg_off[sg + 1]; ++s) {
        succ[cursor[seq[s]]++] = seq[s + 1];
        ++indeg[seq[s + 1]];
      }
    start.assign(static_cast<std::size_t>(N), 0.0);
    queue.clear();
    queue.reserve(static_cast<std::size_t>(N));
    for (Node n = 0; n < N; ++n)
      if (indeg[n] == 0) queue.push_back(n);
    makespan = 0.0;
    const auto len32 = static_cast<std::uint32_t>(L.len);
    for (std::size_t head = 0; head < queue.size(); ++head) {
      const Node u = queue[head];
      const double end = start[u] + dur[u];
      makespan = std::max(makespan, end);
      auto relax = [&](Node v) {
        start[v] = std::max(start[v], end);
        if (--indeg[v] == 0) queue.push_back(v);
      };
      if ((static_cast<std::uint32_t>(u) + 1) % len32 != 0) relax(u + 1);  // data successor (32-bit: N < 2^31)
      for (std::size_t e = succ_off[u]; e < succ_off[u + 1] && succ[e] != kNone; ++e) relax(succ[e]);
    }
    return static_cast<Node>(queue.size()) == N;
  }
};

}  // namespace

FlatProblem flatten(const PipelineProblem& p) {
  FlatProblem f;
  f.num_ranks = p.num_ranks, f.pp = p.pp, f.vpp = p.vpp;
  f.rank_off.reserve(static_cast<std::size_t>(p.num_ranks) + 1);
  f.rank_off.push_back(0);
  for (const auto& mbs : p.rank_microbatches) {
    f.rank_groups.insert(f.rank_groups.end(), mbs.begin(), mbs.end());
    f.rank_off.push_back(static_cast<std::int32_t>(f.rank_groups.size()));
  }
  for (const auto& ranks : p.group_ranks) f.group_size.push_back(static_cast<std::int32_t>(ranks.size()));
  f.group_forward = p.group_forward, f.group_backward = p.group_backward;
  return f;
}

double step_time(const FlatProblem& p) {
  validate_flat(p);
  Dag d(p);
  if (!d.run()) throw_cycle(d.L, p.pp, d.seq, d.seg_off, d.indeg);
  return d.makespan;
}

PipelineResult simulate(const PipelineProblem& p, bool keep_timeline) {
  validate(p);
  const int P = p.num_ranks, pp = p.pp;
  Dag d(flatten(p));
  if (!d.run()) throw_cycle(d.L, pp, d.seq, d.seg_off, d.indeg);
  const Layout& L = d.L;
  const double makespan = d.makespan;
  const std::vector<Node>& seq = d.seq;
  const std::vector<std::size_t>& seg_off = d.seg_off;
  const std::vector<double>&dur = d.dur, &start = d.start;
  const std::size_t total_slots = seq.size();
  auto delta = [&](Node n) {  // activation change at node n: +mem at a forward, -mem at a backward
    const double mem = p.group_memory.empty() ? 0.0 : p.group_memory[static_cast<std::size_t>(L.group(n))];
    return L.dir(n) ? -mem : mem;
  };

  PipelineResult res;
  res.step_time = makespan + p.grad_sync;
  res.busy.assign(P, 0.0);
  res.idle.assign(P, 0.0);
  res.peak_memory.assign(P, 0.0);
  if (keep_timeline) res.ops.reserve(total_slots);
  double total_busy = 0.0;
  for (int r = 0; r < P; ++r) {
    double busy = 0.0, peak = 0.0;
    for (int k = 0; k < pp; ++k) {
      const std::size_t seg = static_cast<std::size_t>(r) * pp + k;
      double inflight = 0.0;
      for (std::size_t s = seg_off[seg]; s < seg_off[seg + 1]; ++s) {
        const Node n = seq[s];
        busy += dur[n];
        inflight += delta(n);
        peak = std::max(peak, inflight);  // a backward only lowers it, so checking every op is harmless
        if (keep_timeline)
          res.ops.push_back({r, k, static_cast<int>(L.chunk(n)), static_cast<int>(L.group(n)), L.dir(n) == 1, start[n],
                             start[n] + dur[n]});
      }
    }
    res.busy[r] = busy;
    res.idle[r] = std::max(0.0, pp * makespan - busy);
    res.peak_memory[r] = peak;
    total_busy += busy;
  }
  const double capacity = makespan * static_cast<double>(P) * pp;
  res.bubble_fraction = capacity > 0 ? std::max(0.0, 1.0 - total_busy / capacity) : 0.0;
  return res;
}

}  // namespace dynacp::sim
