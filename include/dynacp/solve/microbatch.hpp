// Pipeline-aware microbatching helpers after the Megatron Dynamic-CP blog (seed 002, eqs. 1-3 and figure 7).
#pragma once
#include <vector>

namespace dynacp::solve {

/// Per-microbatch workload quotas W_i for ranks running counts[i] microbatches of a pipeline with p stages and
/// v virtual stages, so that all ranks finish together: W_i (m_i v + p - 1) is the same for every rank (eq. 1-2)
/// and sum_i W_i m_i = total (eq. 3). Ranks with more microbatches get smaller ones. Throws on counts < 1.
std::vector<double> workload_quotas(double total, const std::vector<int>& counts, int pp, int vpp);

/// The knee of the per-microbatch budget over the grid m = pp, 2 pp, ..., kmax pp (figure 7): budget(m) is the
/// equal-count quota total / (ranks m), floored at the largest single item (a microbatch cannot be smaller).
/// Returns the first grid m whose next grid point lowers the budget by less than `flat` (relative), else the last.
int knee_microbatches(double total, double largest, int ranks, int pp, int kmax, double flat = 0.1);

}  // namespace dynacp::solve
