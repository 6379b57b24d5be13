#include "dynacp/model/calibrate.hpp"

#include <Eigen/Dense>
#include <array>
#include <cmath>

#include "dynacp/model/error.hpp"
#include "dynacp/model/log.hpp"

namespace dynacp {
namespace {

// Least squares on relative error: minimise sum_i ((X_i . coef - t_i) / t_i)^2 with coef >= 0. Negative
// coefficients are removed one at a time (most negative first) and the rest refitted.
Eigen::VectorXd fit_nonneg_relative(const Eigen::MatrixXd& X, const Eigen::VectorXd& t, FitReport* report) {
  const Eigen::Index k = X.cols();
  std::vector<bool> active(static_cast<std::size_t>(k), true);
  Eigen::VectorXd coef = Eigen::VectorXd::Zero(k);
  for (;;) {
    std::vector<Eigen::Index> cols;
    for (Eigen::Index j = 0; j < k; ++j)
      if (active[static_cast<std::size_t>(j)]) cols.push_back(j);
    if (cols.empty()) break;
    Eigen::MatrixXd W(X.rows(), static_cast<Eigen::Index>(cols.size()));
    for (std::size_t c = 0; c < cols.size(); ++c) W.col(static_cast<Eigen::Index>(c)) = X.col(cols[c]).cwiseQuotient(t);
    const Eigen::VectorXd sol = W.colPivHouseholderQr().solve(Eigen::VectorXd::Ones(X.rows()));
    Eigen::Index worst = -1;
    double worst_v = 0.0;
    for (std::size_t c = 0; c < cols.size(); ++c)
      if (sol(static_cast<Eigen::Index>(c)) < worst_v) worst_v = sol(static_cast<Eigen::Index>(c)), worst = cols[c];
    if (worst < 0) {
      coef.setZero();
      for (std::size_t c = 0; c < cols.size(); ++c) coef(cols[c]) = sol(static_cast<Eigen::Index>(c));
      break;
    }
    active[static_cast<std::size_t>(worst)] = false;
  }
  if (report) {
    const Eigen::VectorXd rel = (X * coef - t).cwiseQuotient(t);
    report->samples = static_cast<int>(t.size());
    report->rms_relative_error = std::sqrt(rel.squaredNorm() / static_cast<double>(t.size()));
    report->max_relative_error = rel.cwiseAbs().maxCoeff();
  }
  return coef;
}

/// A compute fit whose rms relative error exceeds this is logged as a warning (the built-in presets fit within 15 %).
constexpr double kPoorFitRms = 0.2;

}  // namespace

CostModel fit_compute(const CostModel& base, const std::vector<ComputeSample>& samples, FitReport* report) {
  if (samples.size() < 3) invalid("fit_compute needs at least 3 samples, got ", samples.size());
  base.validate();
  Eigen::MatrixXd X(static_cast<Eigen::Index>(samples.size()), 3);
  Eigen::VectorXd t(static_cast<Eigen::Index>(samples.size()));
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    if (s.lengths.empty()) invalid("calibration sample ", i, " has no sequence lengths");
    if (s.degree < 1) invalid("calibration sample ", i, " has degree ", s.degree, "; it must be >= 1");
    if (!(s.seconds > 0) || !std::isfinite(s.seconds))
      invalid("calibration sample ", i, " has time ", s.seconds, "; it must be a positive number of seconds");
    GroupStats g;
    for (auto len : s.lengths) {
      if (len <= 0) invalid("calibration sample ", i, " has a length ", len, " <= 0");
      g.add(len, base.eta(s.mask));
    }
    const auto r = static_cast<Eigen::Index>(i);
    X(r, 0) = g.weighted_sq / s.degree;
    X(r, 1) = static_cast<double>(g.tokens) / s.degree;
    X(r, 2) = 1.0;
    t(r) = s.seconds;
  }
  FitReport local;
  FitReport* rep = report ? report : &local;
  const Eigen::VectorXd c = fit_nonneg_relative(X, t, rep);
  if (rep->rms_relative_error > kPoorFitRms)
    core_log().warn(
        "fit_compute: poor fit, rms relative error {:.1f}% (max {:.1f}%) over {} samples; the cost model "
        "predicts these samples badly (mixed masks or hardware, or too few lengths?)",
        100 * rep->rms_relative_error, 100 * rep->max_relative_error, rep->samples);
  CostModel out = base;
  out.attn_coef = c(0);
  out.linear_coef = c(1);
  out.group_overhead = c(2);
  return out;
}

std::pair<double, double> fit_link(const std::vector<TransferSample>& samples, FitReport* report) {
  if (samples.size() < 2) invalid("fit_link needs at least 2 samples, got ", samples.size());
  Eigen::MatrixXd X(static_cast<Eigen::Index>(samples.size()), 2);
  Eigen::VectorXd t(static_cast<Eigen::Index>(samples.size()));
  for (std::size_t i = 0; i < samples.size(); ++i) {
    if (!(samples[i].bytes > 0) || !(samples[i].seconds > 0))
      invalid("transfer sample ", i, " needs bytes > 0 and seconds > 0");
    X(static_cast<Eigen::Index>(i), 0) = 1.0;
    X(static_cast<Eigen::Index>(i), 1) = samples[i].bytes;
    t(static_cast<Eigen::Index>(i)) = samples[i].seconds;
  }
  const Eigen::VectorXd c = fit_nonneg_relative(X, t, report);
  if (!(c(1) > 0)) throw Error("fit_link: the samples show no dependence on message size; bandwidth is undefined");
  return {c(0), 1.0 / c(1)};
}

namespace {

// One whole training step = per-layer forward time x kLayers x 3 (backward ~ 2 x forward).
constexpr double kLayers = 32;
constexpr double kStepScale = kLayers * 3;

// ByteScale (arXiv 2502.21231) Fig. 6a, per-layer forward times read off the figure: length, attention ms, MLP ms.
constexpr std::array<std::array<double, 3>, 6> kByteScaleFig6a{{{4096, 0.8, 0.9},
                                                                {8192, 1.8, 1.8},
                                                                {16384, 4.8, 3.6},
                                                                {32768, 14.1, 7.5},
                                                                {65536, 48.2, 15.1},
                                                                {131072, 175.5, 28.2}}};

// hao-ai-lab/distca profiles/compute-attn-H100.csv, tp = 1: document length, CP degree, per-rank attention ms.
constexpr std::array<std::array<double, 3>, 44> kDistcaAttnH100{
    {{64, 1, 0.028433},      {64, 2, 0.020913},      {64, 4, 0.023159},     {64, 8, 0.025449},     {128, 1, 0.030415},
     {128, 2, 0.026248},     {128, 4, 0.027149},     {128, 8, 0.027613},    {256, 1, 0.036643},    {256, 2, 0.026124},
     {256, 4, 0.025369},     {256, 8, 0.026465},     {512, 1, 0.061332},    {512, 2, 0.041245},    {512, 4, 0.037164},
     {512, 8, 0.034978},     {1024, 1, 0.132740},    {1024, 2, 0.083221},   {1024, 4, 0.063999},   {1024, 8, 0.059524},
     {2048, 1, 0.355045},    {2048, 2, 0.206058},    {2048, 4, 0.139154},   {2048, 8, 0.111155},   {4096, 1, 1.055083},
     {4096, 2, 0.586705},    {4096, 4, 0.362788},    {4096, 8, 0.255321},   {8192, 1, 3.706723},   {8192, 2, 1.894049},
     {8192, 4, 1.080595},    {8192, 8, 0.684665},    {16384, 1, 13.503299}, {16384, 2, 6.850687},  {16384, 4, 3.616536},
     {16384, 8, 2.103287},   {32768, 1, 51.893895},  {32768, 2, 26.339693}, {32768, 4, 13.501856}, {32768, 8, 7.182446},
     {65536, 1, 206.286644}, {65536, 2, 103.063624}, {65536, 4, 51.688211}, {65536, 8, 25.727874}}};

std::string fmt_fit(const FitReport& r) {
  return detail::cat(r.samples, " points, rms relative error ", std::round(r.rms_relative_error * 1000) / 10, "%, max ",
                     std::round(r.max_relative_error * 1000) / 10, "%");
}

CostModel scaled(CostModel m, double k) {
  m.attn_coef *= k;
  m.linear_coef *= k;
  m.group_overhead *= k;
  return m;
}

CostModel bytescale_fig6a() {
  std::vector<ComputeSample> samples;
  for (const auto& row : kByteScaleFig6a)
    samples.push_back({{static_cast<std::int64_t>(row[0])}, 1, (row[1] + row[2]) * 1e-3, Mask::Causal});
  FitReport rep;
  CostModel m = scaled(fit_compute(CostModel{}, samples, &rep), kStepScale);
  m.name = "bytescale-fig6a";
  m.source = "ByteScale Fig. 6a per-layer attention+MLP forward times (4K-128K), fitted per layer (" + fmt_fit(rep) +
             "), scaled to a 32-layer fwd+bwd step";
  return m;
}

CostModel h100_distca() {
  std::vector<ComputeSample> samples;
  for (const auto& row : kDistcaAttnH100)
    samples.push_back({{static_cast<std::int64_t>(row[0])}, static_cast<int>(row[1]), row[2] * 1e-3, Mask::Causal});
  FitReport rep;
  CostModel attn = fit_compute(CostModel{}, samples, &rep);
  // The attention profile has no MLP; take the linear term from ByteScale's MLP column.
  std::vector<ComputeSample> mlp;
  for (const auto& row : kByteScaleFig6a)
    mlp.push_back({{static_cast<std::int64_t>(row[0])}, 1, row[2] * 1e-3, Mask::Causal});
  FitReport rep_mlp;
  CostModel lin = fit_compute(CostModel{}, mlp, &rep_mlp);
  CostModel m = attn;
  m.linear_coef = attn.linear_coef + lin.linear_coef;
  m.group_overhead = attn.group_overhead + lin.group_overhead;
  m = scaled(m, kStepScale);
  m.name = "h100-distca";
  m.source = "attention fitted to distca compute-attn-H100.csv (tp=1, cp 1-8; " + fmt_fit(rep) +
             "); MLP from ByteScale Fig. 6a (" + fmt_fit(rep_mlp) + "); scaled to a 32-layer fwd+bwd step";
  return m;
}

CostModel attention_only() {
  CostModel m;
  m.name = "attention-only";
  m.source = "Megatron-Core's workload proxy s^2/cp: attention only, no linear, overhead or communication terms";
  m.attn_coef = 1e-9;
  m.linear_coef = 0;
  m.group_overhead = 0;
  m.kv_bytes_per_token = 0;
  return m;
}

}  // namespace

std::vector<std::string> preset_names() { return {"bytescale-fig6a", "h100-distca", "attention-only"}; }

CostModel preset(const std::string& name) {
  if (name == "bytescale-fig6a" || name == "default") return bytescale_fig6a();
  if (name == "h100-distca") return h100_distca();
  if (name == "attention-only") return attention_only();
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  invalid("unknown cost preset '", name, "'; known presets: ", known);
}

}  // namespace dynacp
