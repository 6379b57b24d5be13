// Cost model: time and memory of a group of packed sequences running as one CP ring on d ranks.
//
//   T(G,d)   = T_compute + T_comm - phi * min(T_attn, T_comm)  phi = comm_overlap: the share of the exchange
//                                                              that attention hides (1 in the presets)
//   T_compute = (eta * a * sum s^2 + b * sum s) / d + c       eta = causal_factor or full_factor per sequence
//               + kp * sum eta s^1.5 / d + kl * sum eta s log2 s                          (short-sequence
//               + n * (c_doc + c_hop (d - 1) + [d = 1] c_solo)    attention and per-document terms, n = count;
//                                                                  all 0 in the presets: the classic form)
//   T_attn    = eta * a * sum s^2 / d                          (the part the ring exchange overlaps with)
//   T_comm    = (d - 1) * (latency(d) + (sum s / d) * kv_bytes_per_token / bandwidth(d))     0 when d = 1
//               + c_node * (nodes(d) - 1)     (nodes(d): the least nodes the ring spans; c_node 0 in the presets)
//               latency/bandwidth are intra-node when all d ranks share a node, inter-node otherwise; per ring
//               size d from the link's hop table (intra_node_hops / inter_node_hops) when it has points, else the
//               Cluster's fields (the same on every d: the classic form)
//   M(G,d)   = m * R(G,d) + static                             must be <= Cluster::activation_budget
//   R(G,d)   = sum_i k * ceil(s_i / (k d))                      rows per rank after the runtime's padding
//               (k = Cluster::seq_pad_multiple); plans keep R(G,d) <= token_capacity on every group
//
// All coefficients describe one whole training step of one microbatch (all layers, forward + backward).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dynacp/model/batch.hpp"
#include "dynacp/model/cluster.hpp"

namespace dynacp {

struct Group;

/// One point of a ring-size hop table (CostModel::intra_node_hops / inter_node_hops): {ring size in ranks, seconds
/// of latency per hop, bytes/s of one hop} measured on rings of that size (the profile's p2p table).
using HopPoint = std::array<double, 3>;

/// Aggregate statistics of a group of sequences: all the cost model needs.
struct GroupStats {
  std::int64_t tokens = 0;    ///< sum s
  double weighted_sq = 0.0;   ///< sum eta(s) * s^2
  std::int64_t max_len = 0;   ///< longest member
  std::int64_t count = 0;     ///< number of sequences
  double weighted_pow = 0.0;  ///< sum eta(s) * s^1.5
  double weighted_log = 0.0;  ///< sum eta(s) * s * log2(s)

  void add(std::int64_t len, double eta);
  /// Adds another group's members (the same sums as adding them one by one, in that group's order, to an empty
  /// GroupStats and then combining: for one member exactly add(len, eta)).
  void merge(const GroupStats& o) {
    tokens += o.tokens, weighted_sq += o.weighted_sq, max_len = std::max(max_len, o.max_len), count += o.count;
    weighted_pow += o.weighted_pow, weighted_log += o.weighted_log;
  }
};

struct CostModel {
  // Defaults equal preset("bytescale-fig6a") (a test checks it); see docs/cost_model.md.
  std::string name = "bytescale-fig6a";
  std::string source = "ByteScale Fig. 6a, scaled to a 32-layer fwd+bwd step (see preset())";
  double attn_coef = 1.7651565e-9;       ///< a: seconds per token^2 of full-mask attention (fwd+bwd, all layers)
  double linear_coef = 3.4156556e-5;     ///< b: seconds per token of linear/MLP work (fwd+bwd, all layers)
  double group_overhead = 8.2022295e-3;  ///< c: fixed seconds per group (launches, synchronisation)
  double causal_factor = 0.5;            ///< eta for causal masks
  double full_factor = 1.0;              ///< eta for full (bidirectional) masks
  /// Bytes per token per ring hop over the whole step: 8 KV heads x 128 dims x (K,V) x bf16 x 32 layers x 3
  /// (forward sends KV; backward sends KV and dKV).
  double kv_bytes_per_token = 8.0 * 128 * 2 * 2 * 32 * 3;
  double mem_per_token = 2.44140625e6;  ///< m: activation bytes per token on a rank (40 GB holds 16,384 tokens)
  double mem_static = 0.0;              ///< static bytes per rank charged against the activation budget
  /// Backward time : forward time of a microbatch (the 1F1B split): a group of time T runs T / (1 + r) forward and
  /// r T / (1 + r) backward. 2 is the usual rule (the backward computes gradients of inputs and of weights).
  double backward_ratio = 2.0;
  // The per-document ("extended") terms of the model form; all 0 by default and in every built-in preset, which
  // keeps the classic form above bit for bit. `dynacp calibrate fit` fits them (docs/cost_model.md, "Extended form").
  double attn_pow_coef = 0.0;      ///< kp: seconds per eta*token^1.5, divided by d (attention efficiency, mid lengths)
  double attn_log_coef = 0.0;      ///< kl: seconds per eta*token*log2(token) on EVERY rank of the ring (not / d)
  double doc_overhead = 0.0;       ///< c_doc: seconds per sequence of the group (kernel launch floor), any d
  double doc_hop_overhead = 0.0;   ///< c_hop: seconds per sequence per ring hop (d - 1 hops)
  double doc_solo_overhead = 0.0;  ///< c_solo: seconds per sequence of a group run on one rank (d = 1)
  /// phi: the share of min(T_attn, T_comm) that attention hides, in [0, 1]; 1 (fully hidden) is the classic form.
  double comm_overlap = 1.0;
  /// c_node: seconds per extra node a ring spans, part of T_comm (nodes_spanned(d) - 1 of them; the extended form).
  double node_overhead = 0.0;
  /// Hop latency and bandwidth per ring size of the intra-node link: points {ring size, s, B/s} in increasing ring
  /// size, latency non-decreasing and bandwidth non-increasing in the size (validate() checks it). A ring of d ranks
  /// reads latency and 1/bandwidth linearly interpolated in d between the points and clamped to the end points
  /// outside them (docs/cost_model.md, "Hop tables"). Empty (the default, every built-in preset): the Cluster's
  /// intra_node_latency / intra_node_bandwidth on every ring size, bit for bit.
  std::vector<HopPoint> intra_node_hops;
  /// The same for rings whose ranks span nodes (the Cluster's inter_node_latency / inter_node_bandwidth when empty).
  std::vector<HopPoint> inter_node_hops;

  /// True when a per-document term is non-zero (then T(G,d) need not be unimodal in d: piece_minima scans).
  bool extended() const {
    return attn_pow_coef != 0 || attn_log_coef != 0 || doc_overhead != 0 || doc_hop_overhead != 0 ||
           doc_solo_overhead != 0 || comm_overlap != 1 || node_overhead != 0;
  }

  double eta(Mask m) const { return m == Mask::Full ? full_factor : causal_factor; }

  /// True when a hop table has points (then T(G,d) need not be unimodal in d: piece_minima scans).
  bool has_hop_tables() const { return !intra_node_hops.empty() || !inter_node_hops.empty(); }
  /// Seconds per hop of a ring of d ranks over the intra-node (crosses_nodes false) or inter-node link: the hop
  /// table's value at d when the link has one, else the Cluster's field. The one place the latency is read.
  double hop_latency(int d, bool crosses_nodes, const Cluster& cluster) const {
    const auto& table = crosses_nodes ? inter_node_hops : intra_node_hops;
    if (table.empty()) return crosses_nodes ? cluster.inter_node_latency : cluster.intra_node_latency;
    return hop_lookup(table, d, 1);
  }
  /// Bytes/s of one hop of a ring of d ranks (as hop_latency). The one place the bandwidth is read.
  double hop_bandwidth(int d, bool crosses_nodes, const Cluster& cluster) const {
    const auto& table = crosses_nodes ? inter_node_hops : intra_node_hops;
    if (table.empty()) return crosses_nodes ? cluster.inter_node_bandwidth : cluster.intra_node_bandwidth;
    return 1.0 / hop_lookup(table, d, 2);
  }
  /// The least nodes a ring of d ranks spans: 1 inside a node, else max(2, ceil(d / ranks_per_node)) (compact
  /// placement; node_overhead is paid on each but the first).
  static int nodes_spanned(int d, bool crosses_nodes, const Cluster& cluster) {
    return crosses_nodes ? std::max(2, (d + cluster.ranks_per_node - 1) / cluster.ranks_per_node) : 1;
  }
  /// True when a ring across nodes can be faster than one inside a node of the same size d <= ranks_per_node (the
  /// inter-node link has the lower latency or the higher bandwidth at some such d).
  bool crossing_can_be_faster(const Cluster& cluster) const;

  /// Throws InvalidArgument for a negative, NaN or infinite coefficient (naming it), or mem_per_token <= 0.
  void validate() const;

  /// Tokens one rank can hold: Cluster::tokens_per_rank when it is set (> 0), else floor((budget - static) / m).
  /// Throws if the budget cannot hold one token.
  std::int64_t token_capacity(const Cluster& cluster) const;
  /// Smallest CP degree on which ONE sequence of `tokens` fits the budget once padded: the least d with
  /// k * ceil(tokens / (k d)) <= capacity (k = seq_pad_multiple); ceil(tokens / capacity) when the capacity is a
  /// multiple of k. For a group of several sequences it is a lower bound on the group's least degree.
  int min_degree(std::int64_t tokens, const Cluster& cluster) const;

  // Inline: the searches price groups millions of times per plan (docs/cost_model.md has the formulas).
  double compute_time(const GroupStats& g, int d) const {
    const double classic =
        (attn_coef * g.weighted_sq + linear_coef * static_cast<double>(g.tokens)) / d + group_overhead;
    if (!extended()) return classic;  // the classic form, bit for bit
    const double per_doc = doc_overhead + doc_hop_overhead * (d - 1) + (d == 1 ? doc_solo_overhead : 0.0);
    return classic + attn_pow_coef * g.weighted_pow / d + attn_log_coef * g.weighted_log +
           per_doc * static_cast<double>(g.count);
  }
  double attn_time(const GroupStats& g, int d) const { return attn_coef * g.weighted_sq / d; }
  double comm_time(const GroupStats& g, int d, bool crosses_nodes, const Cluster& cluster) const {
    if (d <= 1) return 0.0;
    const double lat = hop_latency(d, crosses_nodes, cluster), bw = hop_bandwidth(d, crosses_nodes, cluster);
    const double hops = (d - 1) * (lat + static_cast<double>(g.tokens) / d * kv_bytes_per_token / bw);
    if (node_overhead == 0) return hops;  // the classic form, bit for bit
    return hops + node_overhead * (nodes_spanned(d, crosses_nodes, cluster) - 1);
  }
  /// T(G,d); crosses_nodes selects the inter-node link for the ring.
  double time(const GroupStats& g, int d, bool crosses_nodes, const Cluster& cluster) const {
    const double comm = comm_time(g, d, crosses_nodes, cluster);
    return compute_time(g, d) + comm - comm_overlap * std::min(attn_time(g, d), comm);
  }
  /// T(G,d) when the group is placed as compactly as possible: crosses nodes only if d > ranks_per_node.
  double time(const GroupStats& g, int d, const Cluster& cluster) const;
  /// The minimisers of T(G,d) under compact placement on the two pieces of [dmin, P]: d <= ranks_per_node (one
  /// node) and d > ranks_per_node (across nodes); 0 for an empty piece; ties go to the smaller d. The classic form
  /// is unimodal in d on each piece and uses integer ternary search: O(log P); the extended form (extended()) and a
  /// model with hop tables (has_hop_tables()) need not be, so they scan every degree: O(P).
  std::array<int, 2> piece_minima(const GroupStats& g, int dmin, const Cluster& cluster) const;
  /// The better of piece_minima (ties: the smaller degree).
  int best_degree(const GroupStats& g, int dmin, const Cluster& cluster) const;
  /// T of one planned group: its sequences' stats on its degree, over the inter-node link when its ranks span nodes.
  /// The one place a placed group's time is computed (evaluators, simulator input, polish passes).
  double group_time(const Group& group, const Batch& batch, const Cluster& cluster) const;
  /// The same from each sequence's stats alone (`single[i]`: group_stats of sequence i), summed in member order:
  /// bit for bit the value above, without the per-member powers and logarithms (for scorers pricing many plans).
  double group_time(const Group& group, std::span<const GroupStats> single, const Cluster& cluster) const;
  /// The forward and the backward part of a microbatch of time t (backward_ratio), per stage-chunk of `chunks`.
  double forward_time(double t, double chunks = 1.0) const { return t / ((1.0 + backward_ratio) * chunks); }
  double backward_time(double t, double chunks = 1.0) const {
    return backward_ratio * t / ((1.0 + backward_ratio) * chunks);
  }
  /// Per-rank activation bytes M(G,d) = m * R + static of a rank holding R padded rows (group_rows).
  double memory(std::int64_t rows) const;
  /// Work of one sequence in rank-seconds when run alone on one rank without overheads: eta*a*s^2 + b*s (classic
  /// form), plus eta*kp*s^1.5 + eta*kl*s*log2(s) + c_doc (extended form): a lower bound on d * T(G,d) - c d for
  /// the sequence's share of any group on any d (docs/cost_model.md).
  double work(std::int64_t len, Mask mask) const;

  std::string describe() const;

 private:
  /// Column `col` of `table` at ring size d: 1 = latency, 2 = seconds per byte (1 / bandwidth); linear in d between
  /// points, clamped outside.
  static double hop_lookup(const std::vector<HopPoint>& table, int d, int col);
  /// Throws InvalidArgument naming `field` and the point unless the table is a valid hop table (see the fields).
  static void validate_hops(const char* field, const std::vector<HopPoint>& table);
};

/// Stats of the sequences `ids` of `batch`.
GroupStats group_stats(const Batch& batch, const CostModel& cost, std::span<const std::int64_t> ids);
/// Each sequence's stats alone: element i is group_stats of {i}.
std::vector<GroupStats> single_stats(const Batch& batch, const CostModel& cost);
/// group_stats of `ids` from single_stats, merged in the order of `ids` (the same sums, bit for bit).
inline GroupStats sum_stats(std::span<const GroupStats> single, std::span<const std::int64_t> ids) {
  GroupStats g;
  for (auto id : ids) g.merge(single[static_cast<std::size_t>(id)]);
  return g;
}
/// R(G,d): the rows each rank of a d-rank ring holds for the sequences `ids` once padded (Cluster::padded_rows).
std::int64_t group_rows(const Batch& batch, const Cluster& cluster, std::span<const std::int64_t> ids, int d);

}  // namespace dynacp
