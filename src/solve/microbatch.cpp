#include "dynacp/solve/microbatch.hpp"

#include <algorithm>
#include <cstdint>

#include "dynacp/model/error.hpp"

namespace dynacp::solve {

namespace {
#include "pipeline_bound_table.inc"
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
  if (pp == 1) return 1.0;
  if (pp > kBoundPpMax || m > kBoundMMax) return 1.0;
  return kPipelineBound[pp - 2][m - 1];
}

double one_f_one_b(std::span<const double> times, int pp) {
  if (pp < 1) invalid("one_f_one_b: pp must be >= 1, got ", pp);
  for (std::size_t i = 0; i < times.size(); ++i)
    if (!(times[i] >= 0)) invalid("one_f_one_b: microbatch ", i, " has time ", times[i], "; need >= 0");
  const auto m = static_cast<std::int64_t>(times.size());
  if (m == 0) return 0.0;
  // Stage k runs min(pp - k - 1, m) warm-up forwards, then forward/backward pairs, then the remaining backwards.
  // Each op waits for its stage's previous op and for the same microbatch on the neighbouring stage (forward from
  // k - 1, backward from k + 1; the last stage's backward follows its own forward, the op before it).
  const auto P = static_cast<std::int64_t>(pp);
  std::vector<double> fwd(static_cast<std::size_t>(P * m), -1.0), bwd(fwd.size(), -1.0), clock(P, 0.0);
  std::vector<std::int64_t> next(P, 0), stack;
  for (std::int64_t k = P - 1; k >= 0; --k) stack.push_back(k);
  const double scale = 1.0 / (3.0 * static_cast<double>(pp));
  while (!stack.empty()) {
    const std::int64_t k = stack.back();
    stack.pop_back();
    const std::int64_t w = std::min(P - k - 1, m);
    for (; next[k] < 2 * m; ++next[k]) {
      const std::int64_t a = next[k];
      bool backward;
      std::int64_t i;
      if (a < w) {
        backward = false, i = a;
      } else if (a - w < 2 * (m - w)) {
        backward = (a - w) % 2 == 1, i = backward ? (a - w) / 2 : w + (a - w) / 2;
      } else {
        backward = true, i = a - w - (m - w);
      }
      const auto at = static_cast<std::size_t>(k * m + i);
      double ready;
      if (!backward)
        ready = k == 0 ? 0.0 : fwd[static_cast<std::size_t>((k - 1) * m + i)];
      else
        ready = k == P - 1 ? fwd[at] : bwd[static_cast<std::size_t>((k + 1) * m + i)];
      if (ready < 0) break;  // resumed when that op finishes
      const double t = std::max(clock[k], ready) + (backward ? 2.0 : 1.0) * scale * times[static_cast<std::size_t>(i)];
      clock[k] = t;
      (backward ? bwd : fwd)[at] = t;
      if (!backward && k + 1 < P) stack.push_back(k + 1);
      if (backward && k > 0) stack.push_back(k - 1);
    }
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace dynacp::solve
