#include "dynacp/model/cost.hpp"

#include <algorithm>
#include <cmath>

#include "dynacp/model/error.hpp"
#include "dynacp/model/plan.hpp"

namespace dynacp {

void GroupStats::add(std::int64_t len, double eta) {
  tokens += len;
  weighted_sq += eta * static_cast<double>(len) * static_cast<double>(len);
  max_len = std::max(max_len, len);
  ++count;
  const double x = static_cast<double>(len);
  weighted_pow += eta * x * std::sqrt(x);
  weighted_log += eta * x * std::log2(x);
}

void CostModel::validate() const {
  auto check = [](const char* field, double v) {
    if (!std::isfinite(v) || v < 0)
      invalid("CostModel.", field, " is ", v, "; cost coefficients must be finite and >= 0");
  };
  check("attn_coef", attn_coef);
  check("linear_coef", linear_coef);
  check("group_overhead", group_overhead);
  check("causal_factor", causal_factor);
  check("full_factor", full_factor);
  check("kv_bytes_per_token", kv_bytes_per_token);
  check("mem_per_token", mem_per_token);
  check("mem_static", mem_static);
  check("backward_ratio", backward_ratio);
  check("attn_pow_coef", attn_pow_coef);
  check("attn_log_coef", attn_log_coef);
  check("doc_overhead", doc_overhead);
  check("doc_hop_overhead", doc_hop_overhead);
  check("doc_solo_overhead", doc_solo_overhead);
  check("comm_overlap", comm_overlap);
  check("node_overhead", node_overhead);
  if (comm_overlap > 1)
    invalid("CostModel.comm_overlap is ", comm_overlap, "; it is the share of the exchange hidden, in [0, 1]");
  if (!(mem_per_token > 0)) invalid("CostModel.mem_per_token is ", mem_per_token, "; it must be > 0");
  validate_hops("intra_node_hops", intra_node_hops);
  validate_hops("inter_node_hops", inter_node_hops);
}

void CostModel::validate_hops(const char* field, const std::vector<HopPoint>& table) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto [size, lat, bw] = table[i];
    if (!(std::isfinite(size) && size >= 2 && size == std::floor(size)))
      invalid("CostModel.", field, "[", i, "] has ring size ", size, "; ring sizes are integers >= 2");
    if (!(std::isfinite(lat) && lat >= 0))
      invalid("CostModel.", field, "[", i, "] has latency ", lat, " s; it must be finite and >= 0");
    if (!(std::isfinite(bw) && bw > 0))
      invalid("CostModel.", field, "[", i, "] has bandwidth ", bw, " B/s; it must be finite and > 0");
    if (i == 0) continue;
    const auto& prev = table[i - 1];
    if (!(size > prev[0]))
      invalid("CostModel.", field, "[", i, "] has ring size ", size, " after ", prev[0],
              "; the points must be in increasing ring size");
    if (lat < prev[1] || bw > prev[2])
      invalid("CostModel.", field, "[", i, "] (ring size ", size, ": ", lat, " s, ", bw, " B/s) is faster than the ",
              "smaller ring before it (", prev[0], ": ", prev[1], " s, ", prev[2],
              " B/s); the latency must not fall and the bandwidth must not rise with the ring size");
  }
}

double CostModel::hop_lookup(const std::vector<HopPoint>& table, int d, int col) {
  auto value = [col](const HopPoint& p) { return col == 1 ? p[1] : 1.0 / p[2]; };
  const double x = d;
  if (x <= table.front()[0]) return value(table.front());
  if (x >= table.back()[0]) return value(table.back());
  const auto hi = std::upper_bound(table.begin(), table.end(), x, [](double v, const HopPoint& p) { return v < p[0]; });
  const auto lo = hi - 1;
  const double w = (x - (*lo)[0]) / ((*hi)[0] - (*lo)[0]);
  return value(*lo) + w * (value(*hi) - value(*lo));
}

bool CostModel::crossing_can_be_faster(const Cluster& c) const {
  for (int d = 2; d <= c.ranks_per_node; ++d)
    if (hop_latency(d, true, c) < hop_latency(d, false, c) || hop_bandwidth(d, true, c) > hop_bandwidth(d, false, c))
      return true;
  return false;
}

std::int64_t CostModel::token_capacity(const Cluster& cluster) const {
  if (cluster.tokens_per_rank > 0) return cluster.tokens_per_rank;  // set directly: the budget in bytes is not read
  const double cap = std::floor((cluster.activation_budget - mem_static) / mem_per_token);
  if (!(cap >= 1))
    invalid("activation budget ", cluster.activation_budget, " B minus static ", mem_static,
            " B cannot hold one token at ", mem_per_token, " B/token; raise Cluster.activation_budget");
  return static_cast<std::int64_t>(std::min(cap, 9.0e18));
}

int CostModel::min_degree(std::int64_t tokens, const Cluster& cluster) const {
  const std::int64_t k = cluster.seq_pad_multiple;
  const std::int64_t per_rank = token_capacity(cluster) / k * k;  // padded rows come in multiples of k
  if (per_rank < 1)
    invalid("the token capacity ", token_capacity(cluster), " per rank is below Cluster.seq_pad_multiple = ", k,
            "; no padded sequence fits a rank: raise Cluster.activation_budget");
  const std::int64_t d = (tokens + per_rank - 1) / per_rank;
  return static_cast<int>(std::min<std::int64_t>(std::max<std::int64_t>(d, 1), 1 << 30));
}

double CostModel::group_time(const Group& group, const Batch& batch, const Cluster& cluster) const {
  return time(group_stats(batch, *this, group.sequences), group.degree(), cluster.crosses_nodes(group.ranks), cluster);
}

double CostModel::group_time(const Group& group, std::span<const GroupStats> single, const Cluster& cluster) const {
  return time(sum_stats(single, group.sequences), group.degree(), cluster.crosses_nodes(group.ranks), cluster);
}

double CostModel::time(const GroupStats& g, int d, const Cluster& c) const {
  return time(g, d, d > c.ranks_per_node, c);
}

std::array<int, 2> CostModel::piece_minima(const GroupStats& g, int dmin, const Cluster& c) const {
  const int P = c.num_ranks, rpn = c.ranks_per_node;
  const int lo[2] = {dmin, std::max(dmin, rpn + 1)}, hi[2] = {std::min(rpn, P), P};
  std::array<int, 2> arg{0, 0};
  const bool scan = extended() || has_hop_tables();  // T need not be unimodal in d: scan (docs/cost_model.md)
  for (int k = 0; k < 2; ++k) {
    int a = lo[k], z = hi[k];
    if (a > z) continue;
    while (!scan && z - a > 2) {
      const int m1 = a + (z - a) / 3, m2 = z - (z - a) / 3;
      if (time(g, m1, c) <= time(g, m2, c))
        z = m2;
      else
        a = m1;
    }
    arg[static_cast<std::size_t>(k)] = a;
    double best = time(g, a, c);
    for (int d = a + 1; d <= z; ++d)
      if (const double t = time(g, d, c); t < best) arg[static_cast<std::size_t>(k)] = d, best = t;
  }
  return arg;
}

int CostModel::best_degree(const GroupStats& g, int dmin, const Cluster& c) const {
  const auto arg = piece_minima(g, dmin, c);
  if (arg[0] == 0) return arg[1] == 0 ? dmin : arg[1];
  if (arg[1] == 0) return arg[0];
  return time(g, arg[1], c) < time(g, arg[0], c) ? arg[1] : arg[0];
}

double CostModel::memory(std::int64_t rows) const { return mem_per_token * static_cast<double>(rows) + mem_static; }

double CostModel::work(std::int64_t len, Mask mask) const {
  const double s = static_cast<double>(len);
  const double classic = eta(mask) * attn_coef * s * s + linear_coef * s;
  if (!extended()) return classic;
  // d T(G,d) - c d >= this for the sequence's share on any d >= 1: the s^1.5 term is divided by d, and the
  // per-rank terms kl s log2 s + c_doc (+ hop/solo terms >= 0) are paid on each of d >= 1 ranks
  return classic + eta(mask) * (attn_pow_coef * s * std::sqrt(s) + attn_log_coef * s * std::log2(s)) + doc_overhead;
}

namespace {
std::string hops_text(const std::vector<HopPoint>& table) {
  std::string out = "[";
  for (const auto& p : table) out += detail::cat(out.size() > 1 ? ", " : "", "(", p[0], ", ", p[1], ", ", p[2], ")");
  return out + "]";
}
}  // namespace

std::string CostModel::describe() const {
  return detail::cat("CostModel(name='", name, "', attn_coef=", attn_coef, ", linear_coef=", linear_coef,
                     ", group_overhead=", group_overhead, ", causal_factor=", causal_factor,
                     ", full_factor=", full_factor, ", kv_bytes_per_token=", kv_bytes_per_token,
                     ", mem_per_token=", mem_per_token, ", mem_static=", mem_static,
                     extended() ? detail::cat(", attn_pow_coef=", attn_pow_coef, ", attn_log_coef=", attn_log_coef,
                                              ", doc_overhead=", doc_overhead, ", doc_hop_overhead=", doc_hop_overhead,
                                              ", doc_solo_overhead=", doc_solo_overhead,
                                              ", comm_overlap=", comm_overlap, ", node_overhead=", node_overhead)
                                : std::string(),
                     has_hop_tables() ? detail::cat(", intra_node_hops=", hops_text(intra_node_hops),
                                                    ", inter_node_hops=", hops_text(inter_node_hops))
                                      : std::string(),
                     ")");
}

GroupStats group_stats(const Batch& batch, const CostModel& cost, std::span<const std::int64_t> ids) {
  GroupStats g;
  for (auto id : ids)
    g.add(batch.lengths[static_cast<std::size_t>(id)], cost.eta(batch.mask(static_cast<std::size_t>(id))));
  return g;
}

std::vector<GroupStats> single_stats(const Batch& batch, const CostModel& cost) {
  std::vector<GroupStats> out(batch.size());
  for (std::size_t i = 0; i < batch.size(); ++i) out[i].add(batch.lengths[i], cost.eta(batch.mask(i)));
  return out;
}

std::int64_t group_rows(const Batch& batch, const Cluster& cluster, std::span<const std::int64_t> ids, int d) {
  std::int64_t rows = 0;
  for (auto id : ids) rows += cluster.padded_rows(batch.lengths[static_cast<std::size_t>(id)], d);
  return rows;
}

}  // namespace dynacp
