#include "dynacp/solve/blocks/microbatch.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/search/small_lp.hpp"

namespace dynacp::solve {

namespace {
#include "pipeline_bound_table.inc"
#include "pipeline_profile_table.inc"

// A list of microbatch times on pp stages: pp >= 1, every time finite and >= 0.
void check_list(const char* what, std::span<const double> times, int pp) {
  if (pp < 1) invalid(what, ": pp must be >= 1, got ", pp);
  for (std::size_t i = 0; i < times.size(); ++i)
    if (!std::isfinite(times[i]) || times[i] < 0)
      invalid(what, ": microbatch ", i, " has time ", times[i], "; need finite and >= 0");
}
}  // namespace

std::vector<double> workload_quotas(double total, const std::vector<int>& counts, int pp, int vpp) {
  if (pp < 1 || vpp < 1) invalid("workload_quotas: pp and vpp must be >= 1, got ", pp, " and ", vpp);
  double denom = 0.0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 1) invalid("workload_quotas: rank ", i, " has ", counts[i], " microbatches; need >= 1");
    denom += static_cast<double>(counts[i]) / (static_cast<double>(counts[i]) * vpp + pp - 1);
  }
  std::vector<double> out;
  for (int m : counts) out.push_back(total / denom / (static_cast<double>(m) * vpp + pp - 1));
  return out;
}

int knee_microbatches(double total, double largest, int ranks, int pp, int kmax, double flat) {
  if (ranks < 1 || pp < 1 || kmax < 1) invalid("knee_microbatches: ranks, pp and kmax must be >= 1");
  auto budget = [&](int m) { return std::max(total / (static_cast<double>(ranks) * m), largest); };
  for (int k = 1; k < kmax; ++k) {
    const double now = budget(k * pp), next = budget((k + 1) * pp);
    if (now <= 0 || (now - next) / now < flat) return k * pp;
  }
  return kmax * pp;
}

double one_f_one_b_floor(int m, int pp) {
  if (m < 1 || pp < 1) invalid("one_f_one_b_floor: m and pp must be >= 1, got ", m, " and ", pp);
  if (pp == 1 || pp > kBoundPpMax || m > kBoundMMax) return 1.0;
  return kPipelineBound[pp - 2][m - 1];
}

double one_f_one_b_work_floor(double W, double c, int pp) {
  constexpr int kM = 64;
  double g = (W + (kM + pp) * c) / pp;
  for (int m = 1; m <= kM; ++m) g = std::min(g, one_f_one_b_floor(m, pp) * (W + m * c) / pp);
  return g;
}

std::vector<double> one_f_one_b_profile(int m, int pp) {
  if (m < 1 || pp < 1) invalid("one_f_one_b_profile: m and pp must be >= 1, got ", m, " and ", pp);
  std::vector<double> out(static_cast<std::size_t>(m), 1.0);
  if (pp == 1 || pp > kBoundPpMax || m > kProfileMMax) return out;
  const float* row = kPipelineProfile[pp - 2] + m * (m - 1) / 2;
  for (int i = 0; i < m; ++i) out[static_cast<std::size_t>(i)] = row[i];
  return out;
}

double one_f_one_b_chain_floor(std::span<const double> times, int pp, double backward_ratio) {
  OneFOneBScratch scratch;
  return one_f_one_b_chain_floor(times, pp, backward_ratio, scratch);
}

double one_f_one_b_chain_floor(std::span<const double> times, int pp, double backward_ratio, OneFOneBScratch& scratch) {
  check_list("one_f_one_b_chain_floor", times, pp);
  // Longest path, microbatch by microbatch: its forwards from stage 0 up, then its backwards from the last stage
  // down. fwd[k] / bwd[k]: when the latest microbatch's forward / backward on stage k ends at the earliest.
  const auto P = static_cast<std::size_t>(pp);
  auto& fwd = scratch.fwd;
  auto& bwd = scratch.bwd;
  fwd.assign(P, 0.0), bwd.assign(P, 0.0);
  const double f_share = 1.0 / ((1.0 + backward_ratio) * pp), b_share = backward_ratio / ((1.0 + backward_ratio) * pp);
  for (double t : times) {
    double ready = 0.0;  // the forward on the stage before
    for (std::size_t k = 0; k < P; ++k) {
      // on the last stage, the previous microbatch's backward comes first
      const double prev = k + 1 == P ? std::max(fwd[k], bwd[k]) : fwd[k];
      fwd[k] = std::max(prev, ready) + t * f_share;
      ready = fwd[k];
    }
    for (std::size_t k = P; k-- > 0;) {
      bwd[k] = std::max(bwd[k], ready) + t * b_share;
      ready = bwd[k];
    }
  }
  return times.empty() ? 0.0 : bwd[0];
}

namespace {
constexpr int kRoomVars = 2 * ChainRoom::kMaxGiants + 1;
struct RoomPath {  // value = base + slope . x at the point it was built for
  double value = 0.0, base = 0.0;
  std::array<double, kRoomVars> slope{};
};
const RoomPath& longer(const RoomPath& a, const RoomPath& b) { return b.value > a.value ? b : a; }

// The fluid chain floor of ChainRoom at x (x[0..j]: the fluid before giant 1 and after each giant; x[j + 1 + i]:
// giant i's growth), with the affine form of its longest path.
RoomPath fluid_chain(std::span<const double> t, const std::array<double, kRoomVars>& x, int pp) {
  const auto P = static_cast<std::size_t>(pp);
  const std::size_t last = P - 1;
  const int j = static_cast<int>(t.size());
  const double fs = 1.0 / (3.0 * pp), bs = 2.0 / (3.0 * pp);
  std::vector<RoomPath> fwd(P), bwd(P);
  auto add = [&](RoomPath p, double constant, int var, double share) {  // p + share (constant + x[var])
    p.base += share * constant, p.value += share * constant;
    if (var >= 0) p.slope[static_cast<std::size_t>(var)] += share, p.value += share * x[static_cast<std::size_t>(var)];
    return p;
  };
  auto fluid = [&](int var) {  // a stream of x[var] crossing every stage
    RoomPath start, end;
    for (std::size_t k = 0; k < last; ++k) {
      start = longer(start, fwd[k]);
      end = longer(add(start, 0.0, var, fs), end);
      fwd[k] = end;
    }
    start = longer(start, longer(fwd[last], bwd[last]));
    end = longer(add(start, 0.0, var, 1.0 / pp), end);  // the last stage runs each bit's forward and backward
    fwd[last] = bwd[last] = end;
    for (std::size_t k = last; k-- > 0;) {
      start = longer(start, bwd[k]);
      end = longer(add(start, 0.0, var, bs), end);
      bwd[k] = end;
    }
  };
  fluid(0);
  for (int i = 0; i < j; ++i) {
    const int grow = j + 1 + i;
    RoomPath ready;
    for (std::size_t k = 0; k < P; ++k) {  // as one_f_one_b_chain_floor
      const RoomPath& prev = k == last ? longer(fwd[k], bwd[k]) : fwd[k];
      fwd[k] = add(longer(prev, ready), t[static_cast<std::size_t>(i)], grow, fs);
      ready = fwd[k];
    }
    for (std::size_t k = P; k-- > 0;) {
      bwd[k] = add(longer(bwd[k], ready), t[static_cast<std::size_t>(i)], grow, bs);
      ready = bwd[k];
    }
    fluid(i + 1);
  }
  return bwd[0];
}
}  // namespace

ChainRoom::ChainRoom(int pp) : pp_(pp) {
  if (pp < 1) invalid("ChainRoom: pp must be >= 1, got ", pp);
  table_.assign(kGrid + 1, std::numeric_limits<double>::quiet_NaN()), optimal_.assign(kGrid + 1, 0);
}

double ChainRoom::at(std::size_t i) const {  // r(i / kGrid), solved on first use
  if (std::isnan(table_[i])) {
    const double t[1] = {static_cast<double>(i) / kGrid};
    bool optimal = false;
    table_[i] = exact(t, 1.0, &optimal);
    optimal_[i] = optimal ? 1 : 0;
  }
  return table_[i];
}

double ChainRoom::operator()(double t, double S) const {
  if (!(t <= S) || !(S > 0.0)) return -1.0;
  const double tau = t / S * kGrid;
  const auto i = static_cast<std::size_t>(std::clamp(static_cast<int>(std::floor(tau)), 0, kGrid));
  double r = at(i);
  // r is concave: a chord extended beyond its two points lies above it (both solved to the optimum)
  if (i > 0) {
    const double left = at(i - 1);
    if (optimal_[i] && optimal_[i - 1]) r = std::min(r, r + (r - left) * (tau - static_cast<double>(i)));
  }
  if (i + 2 <= kGrid) {
    const double near = at(i + 1), far = at(i + 2);
    if (optimal_[i + 1] && optimal_[i + 2]) r = std::min(r, near + (near - far) * (static_cast<double>(i + 1) - tau));
  }
  return S * std::max(0.0, r);
}

double ChainRoom::operator()(std::span<const double> t, double S) const {
  return t.size() == 1 ? (*this)(t[0], S) : exact(t, S);
}

double ChainRoom::exact(std::span<const double> t, double S, bool* optimal) const {
  check_list("ChainRoom", t, pp_);
  if (t.empty() || t.size() > static_cast<std::size_t>(kMaxGiants))
    invalid("ChainRoom: need 1 to ", kMaxGiants, " giants, got ", t.size());
  if (optimal) *optimal = false;
  const int vars = 2 * static_cast<int>(t.size()) + 1;
  std::array<double, kRoomVars> x{};
  const RoomPath zero = fluid_chain(t, x, pp_);
  if (!(zero.value <= S)) return -1.0;
  // every variable lengthens each path by at least its forward share on one stage: the first cut
  const double slack = S - zero.value;
  std::vector<double> A(static_cast<std::size_t>(vars), 1.0 / (3.0 * pp_)), b{slack},
      c(static_cast<std::size_t>(vars), 1.0), point;
  double room = 3.0 * pp_ * slack;
  for (int it = 0; it < 40; ++it) {
    const double v = small_lp_max(A, b, c, &point);
    if (!std::isfinite(v)) break;  // keep the last bound
    room = std::min(room, v);
    for (int k = 0; k < vars; ++k) x[static_cast<std::size_t>(k)] = point[static_cast<std::size_t>(k)];
    const RoomPath p = fluid_chain(t, x, pp_);
    if (p.value <= S * (1.0 + 1e-12)) {  // the LP optimum meets S: exact
      if (optimal) *optimal = true;
      break;
    }
    for (int k = 0; k < vars; ++k) A.push_back(p.slope[static_cast<std::size_t>(k)]);
    b.push_back(std::max(0.0, S - p.base));
  }
  return room;
}

double one_f_one_b_makespan(std::span<const double> times, int pp, double backward_ratio) {
  OneFOneBScratch scratch;
  return one_f_one_b_makespan(times, pp, backward_ratio, scratch);
}

double one_f_one_b_makespan(std::span<const double> times, int pp, double backward_ratio, OneFOneBScratch& scratch) {
  check_list("one_f_one_b_makespan", times, pp);
  const int m = static_cast<int>(times.size());
  if (m == 0) return 0.0;
  // Stage k runs min(pp - k - 1, m) warm-up forwards, then forward/backward pairs, then the remaining backwards.
  // An op waits for the previous op of its stage and for its microbatch on the neighbouring stage (the forward on
  // stage k - 1, the backward on stage k + 1; the last stage's backward follows its own forward). Stages are
  // advanced in turn until every op has run; each pass runs at least one op, as the schedule has no deadlock.
  const auto M = static_cast<std::size_t>(m);
  auto& [fwd, bwd, clock, done] = scratch;
  fwd.assign(static_cast<std::size_t>(pp) * M, -1.0), bwd.assign(fwd.size(), -1.0);
  done.assign(static_cast<std::size_t>(pp), 0);
  clock.assign(static_cast<std::size_t>(pp), 0.0);
  auto op_of = [&](int k, int a) {  // (is_backward, microbatch) of stage k's a-th op
    const int w = std::min(pp - k - 1, m);
    if (a < w) return std::pair<bool, int>{false, a};
    if (a < w + 2 * (m - w)) return std::pair<bool, int>{(a - w) % 2 == 1, w + (a - w) / 2 - ((a - w) % 2 ? w : 0)};
    return std::pair<bool, int>{true, a - w - (m - w)};
  };
  const double f_share = 1.0 / ((1.0 + backward_ratio) * pp), b_share = backward_ratio / ((1.0 + backward_ratio) * pp);
  for (bool progress = true; progress;) {
    progress = false;
    for (int k = 0; k < pp; ++k) {
      const auto K = static_cast<std::size_t>(k);
      while (done[K] < 2 * m) {
        const auto [back, i] = op_of(k, done[K]);
        const auto I = static_cast<std::size_t>(i);
        double ready = 0.0;
        if (!back && k > 0) ready = fwd[(K - 1) * M + I];
        if (back) ready = k + 1 < pp ? bwd[(K + 1) * M + I] : fwd[K * M + I];
        if (ready < 0) break;
        const double t = std::max(clock[K], ready) + times[I] * (back ? b_share : f_share);
        (back ? bwd : fwd)[K * M + I] = t;
        clock[K] = t;
        ++done[K];
        progress = true;
      }
    }
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace dynacp::solve
