#include "dynacp/solve/microbatch.hpp"

#include <algorithm>
#include <cmath>

#include "dynacp/model/error.hpp"

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

double one_f_one_b_chain_floor(std::span<const double> times, int pp) {
  check_list("one_f_one_b_chain_floor", times, pp);
  // Longest path, microbatch by microbatch: its forwards from stage 0 up, then its backwards from the last stage
  // down. fwd[k] / bwd[k]: when the latest microbatch's forward / backward on stage k ends at the earliest.
  const auto P = static_cast<std::size_t>(pp);
  std::vector<double> fwd(P, 0.0), bwd(P, 0.0);
  const double f_share = 1.0 / (3.0 * pp), b_share = 2.0 / (3.0 * pp);
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

double one_f_one_b_makespan(std::span<const double> times, int pp) {
  check_list("one_f_one_b_makespan", times, pp);
  const int m = static_cast<int>(times.size());
  if (m == 0) return 0.0;
  // Stage k runs min(pp - k - 1, m) warm-up forwards, then forward/backward pairs, then the remaining backwards.
  // An op waits for the previous op of its stage and for its microbatch on the neighbouring stage (the forward on
  // stage k - 1, the backward on stage k + 1; the last stage's backward follows its own forward). Stages are
  // advanced in turn until every op has run; each pass runs at least one op, as the schedule has no deadlock.
  const auto M = static_cast<std::size_t>(m);
  std::vector<double> fwd(static_cast<std::size_t>(pp) * M, -1.0), bwd(fwd.size(), -1.0);
  std::vector<int> done(static_cast<std::size_t>(pp), 0);
  std::vector<double> clock(static_cast<std::size_t>(pp), 0.0);
  auto op_of = [&](int k, int a) {  // (is_backward, microbatch) of stage k's a-th op
    const int w = std::min(pp - k - 1, m);
    if (a < w) return std::pair<bool, int>{false, a};
    if (a < w + 2 * (m - w)) return std::pair<bool, int>{(a - w) % 2 == 1, w + (a - w) / 2 - ((a - w) % 2 ? w : 0)};
    return std::pair<bool, int>{true, a - w - (m - w)};
  };
  const double f_share = 1.0 / (3.0 * pp), b_share = 2.0 / (3.0 * pp);
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
