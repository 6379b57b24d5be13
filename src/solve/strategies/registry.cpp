// The strategy registry (one row per strategy: name, solver, summary) and PlanOptions::validate.
#include <cmath>
#include <string>

#include "dynacp/model/error.hpp"
#include "dynacp/solve/strategies.hpp"

namespace dynacp {

void PlanOptions::validate() const {
  if (pp < 1) invalid("PlanOptions.pp is ", pp, "; it must be >= 1");
  if (vpp < 1) invalid("PlanOptions.vpp is ", vpp, "; it must be >= 1");
  if (threads < 0) invalid("PlanOptions.threads is ", threads, "; it must be >= 0 (0 = every hardware thread)");
  if (!(time_limit_s >= 0) || !std::isfinite(time_limit_s))
    invalid("PlanOptions.time_limit_s is ", time_limit_s, " s; it must be finite and >= 0 (0 = no limit)");
  tuning.validate();
}

namespace solve {

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> registry = {
      {"packing", &packing,
       "static CP (smallest degree that holds the longest sequence), first-fit packs dealt to DP replicas"},
      {"fcp", &fcp, "FCP: memory-aware BFD atomic groups, 2D DP over any-integer CP degrees, waves"},
      {"megatron", &megatron,
       "Megatron-Core packing-aware dynamic CP: power-of-two aligned groups, greedy global-max scoring, equal counts"},
      {"bytescale", &bytescale,
       "ByteScale HDP balance scheduler: any rank count per sequence, FLOP-equal buckets, variable counts"},
      {"dynacp", &dynacp,
       "time-driven joint CP degree, packing and placement with local search; never worse than the others"},
  };
  return registry;
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> out;
  for (const auto& s : strategies()) out.emplace_back(s.name);
  return out;
}

const StrategyInfo& find_strategy(const std::string& name) {
  for (const auto& s : strategies())
    if (name == s.name) return s;
  std::string known;
  for (const auto& s : strategies()) known += (known.empty() ? "" : ", ") + std::string(s.name);
  invalid("unknown strategy '", name, "'; known strategies: ", known);
}

}  // namespace solve
}  // namespace dynacp
