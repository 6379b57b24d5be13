#include "dynacp/solve/microbatch.hpp"

#include <algorithm>

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
  if (pp == 1 || pp > kBoundPpMax || m > kBoundMMax) return 1.0;
  return kPipelineBound[pp - 2][m - 1];
}

}  // namespace dynacp::solve
