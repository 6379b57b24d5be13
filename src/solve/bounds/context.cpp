// What the lower bound's terms share: the batch's totals, HideCap, the giants and the BoundContext that holds them.
#include "context.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace dynacp::solve::bounds {

double fastest(const CostModel& cost, const Cluster& cluster, const GroupStats& g, int d) {
  const double t = cost.time(g, d, true, cluster);
  return d <= cluster.ranks_per_node ? std::min(t, cost.time(g, d, false, cluster)) : t;
}

HideCap::HideCap(const Batch& batch, const Cluster& cluster, const CostModel& cost)
    : cluster_(cluster), cost_(cost), cap_(static_cast<double>(cost.token_capacity(cluster))) {
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const double v = cost.eta(batch.mask(i)) * static_cast<double>(batch.lengths[i]);
    if (v > top_[0])
      top_[1] = top_[0], top_[0] = v;
    else
      top_[1] = std::max(top_[1], v);
  }
}

double HideCap::operator()(std::int64_t len, Mask mask, int d) const {
  const double own = cost_.eta(mask) * static_cast<double>(len);
  return (*this)(len, d, own >= top_[0] ? top_[1] : top_[0]);  // the best other member
}

double HideCap::operator()(std::int64_t len, int d, double eta_s) const {
  if (d <= 1) return 0.0;
  const double room = std::max(0.0, d * cap_ - static_cast<double>(len)) / d;
  double per_token = -1.0;
  auto layout = [&](double bw) {
    per_token = std::max(per_token, cost_.attn_coef * eta_s - (d - 1) * cost_.kv_bytes_per_token / bw);
  };
  layout(cluster_.inter_node_bandwidth);
  if (d <= cluster_.ranks_per_node) layout(cluster_.intra_node_bandwidth);
  return room * std::max(0.0, per_token);
}

BatchTotals::BatchTotals(const Batch& batch, const Cluster& cluster, const CostModel& cost) {
  const std::int64_t cap = cost.token_capacity(cluster);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const double w = cost.work(batch.lengths[i], batch.mask(i));
    work += w;
    if (2 * ((batch.lengths[i] + cap - 1) / cap) > cluster.num_ranks) wide_work += w;
    auto& m = longest[static_cast<int>(batch.mask(i))];
    m = std::max(m, batch.lengths[i]);
    min_work = min_work < 0 ? w : std::min(min_work, w);
  }
}

BoundContext::BoundContext(const Batch& batch, const Cluster& cluster, const CostModel& cost, int pp, int vpp,
                           bool with_cover)
    : batch(batch),
      cluster(cluster),
      cost(cost),
      pp(pp),
      vpp(vpp),
      with_cover(with_cover),
      totals(batch, cluster, cost),
      one_f_one_b(pp > 1 && vpp <= 1 && cost.backward_ratio == 2.0 && one_f_one_b_floor(2, pp) > 1.0) {
  if (one_f_one_b) hide_.emplace(batch, cluster, cost);
}

BoundContext::~BoundContext() = default;

double BoundContext::plain_average() const { return totals.work / cluster.num_ranks + cost.group_overhead; }

double BoundContext::G(double W) const { return one_f_one_b_work_floor(W, cost.group_overhead, pp); }

const Giants& BoundContext::giants() const {
  if (!giants_) giants_ = std::make_unique<Giants>(*this);
  return *giants_;
}

double BoundContext::shared() const {
  if (!shared_) shared_ = shared_floor(*this);
  return *shared_;
}

Giants::Giants(const BoundContext& ctx)
    : fluid_room(ctx.pp),
      total_work(std::max(0.0, ctx.plain_average() - ctx.cost.group_overhead) *
                 static_cast<double>(ctx.cluster.num_ranks)),
      ctx_(ctx) {
  const Batch& batch = ctx.batch;
  const CostModel& cost = ctx.cost;
  const int P = ctx.cluster.num_ranks;
  ids.resize(batch.size());
  std::iota(ids.begin(), ids.end(), std::size_t{0});
  k = std::min(kGiants, ids.size());
  if (k < 2) return;
  auto work = [&](std::size_t i) { return cost.work(batch.lengths[i], batch.mask(i)); };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                    [&](std::size_t x, std::size_t y) { return work(x) > work(y) || (work(x) == work(y) && x < y); });
  // member[m]: the largest eta s outside the first m giants - all a giant's co-members may be when none of the
  // first m shares its group
  auto eta_s = [&](std::size_t i) { return cost.eta(batch.mask(i)) * static_cast<double>(batch.lengths[i]); };
  member.assign(k + 1, 0.0);
  for (std::size_t j = k; j < ids.size(); ++j) member[k] = std::max(member[k], eta_s(ids[j]));
  for (std::size_t m = k; m-- > 0;) member[m] = std::max(member[m + 1], eta_s(ids[m]));
  time.resize(k), dmin.resize(k), w.resize(k), stats.resize(k);
  best.assign(k, std::numeric_limits<double>::infinity());
  for (std::size_t i = 0; i < k; ++i) {
    stats[i].add(batch.lengths[ids[i]], cost.eta(batch.mask(ids[i])));
    dmin[i] = cost.min_degree(batch.lengths[ids[i]], ctx.cluster);
    w[i] = work(ids[i]);
    if (dmin[i] > P) return;  // plan() rejects the batch
    for (int d = dmin[i]; d <= P; ++d)
      time[i].push_back(fastest(cost, ctx.cluster, stats[i], d)), best[i] = std::min(best[i], time[i].back());
  }
  usable = true;
}

double Giants::capacity(double S) const {
  if (ctx_.G(0.0) > S) return -1.0;
  double lo = 0.0, hi = std::max(1e-9, S * static_cast<double>(ctx_.pp));
  while (ctx_.G(hi) <= S) hi *= 2;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    (ctx_.G(mid) <= S ? lo : hi) = mid;
  }
  return hi;
}

double Giants::hidden_in(double work, std::int64_t tokens, int d, double t, std::size_t m) const {
  return std::min(std::max(0.0, t - work / d - ctx_.cost.group_overhead), ctx_.hide()(tokens, d, member[m]));
}

double Giants::room_beside(double t, double E, double S, double C) const {
  const double fluid = fluid_room(t, S);
  return fluid < 0.0 ? -1.0 : std::min(fluid + E, C - (t - ctx_.cost.group_overhead - E));
}

double Giants::room(std::size_t i, int d, double t, double S, double C, std::size_t m) const {
  return room_beside(t, hidden_in(w[i], ctx_.batch.lengths[ids[i]], d, t, m), S, C);
}

}  // namespace dynacp::solve::bounds
