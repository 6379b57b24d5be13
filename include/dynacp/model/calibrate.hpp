// Least-squares calibration of the cost model from measurements, and the named presets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dynacp/model/cost.hpp"

namespace dynacp {

/// One measured compute sample: a group (its sequence lengths, all with the same mask) run on d ranks.
struct ComputeSample {
  std::vector<std::int64_t> lengths;
  int degree = 1;
  double seconds = 0.0;
  Mask mask = Mask::Causal;
};

/// One measured point-to-point / collective transfer: bytes moved per hop and its time.
struct TransferSample {
  double bytes = 0.0;
  double seconds = 0.0;
};

struct FitReport {
  double rms_relative_error = 0.0;  ///< sqrt(mean((pred - meas)^2 / meas^2))
  double max_relative_error = 0.0;
  int samples = 0;
};

/// Fits attn_coef (a), linear_coef (b) and group_overhead (c) of `base` by least squares on relative error of
/// T_compute = (eta*a*sum s^2 + b*sum s)/d + c. Coefficients are clamped at 0 (refit without the offending
/// term). Throws InvalidArgument if fewer than 3 samples or a sample is malformed.
CostModel fit_compute(const CostModel& base, const std::vector<ComputeSample>& samples, FitReport* report = nullptr);

/// Fits latency and bandwidth of t = latency + bytes / bandwidth. Returns {latency, bandwidth}.
std::pair<double, double> fit_link(const std::vector<TransferSample>& samples, FitReport* report = nullptr);

/// Names of the built-in presets, in a fixed order.
std::vector<std::string> preset_names();
/// A built-in preset by name; its `source` field names the data it was fitted to and the fit error.
CostModel preset(const std::string& name);

}  // namespace dynacp
