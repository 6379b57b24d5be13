#include "dynacp/model/plan.hpp"

#include <algorithm>

#include "dynacp/model/error.hpp"

namespace dynacp {

int Plan::microbatches_of(int rank) const {
  int n = 0;
  for (const auto& slot : microbatches)
    for (const auto& g : slot)
      if (std::find(g.ranks.begin(), g.ranks.end(), rank) != g.ranks.end()) ++n;
  return n;
}

std::vector<int> Plan::microbatch_counts(int num_ranks) const {
  std::vector<int> n(static_cast<std::size_t>(num_ranks), 0);
  for (const auto& slot : microbatches)
    for (const auto& g : slot)
      for (int r : g.ranks) ++n[static_cast<std::size_t>(r)];
  return n;
}

void Plan::validate(const Batch& batch, const Cluster& cluster, const CostModel& cost) const {
  if (version != kVersion) invalid("plan version ", version, " is not supported (expected ", kVersion, ")");
  if (num_ranks != cluster.num_ranks)
    invalid("plan is for ", num_ranks, " ranks but the cluster has ", cluster.num_ranks);
  const auto n = static_cast<std::int64_t>(batch.size());
  const std::int64_t cap = cost.token_capacity(cluster);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  std::vector<int> rank_slot(static_cast<std::size_t>(num_ranks), -1);
  for (std::size_t m = 0; m < microbatches.size(); ++m) {
    for (std::size_t gi = 0; gi < microbatches[m].size(); ++gi) {
      const Group& g = microbatches[m][gi];
      if (g.ranks.empty()) invalid("microbatch ", m, " group ", gi, " has no ranks");
      if (g.sequences.empty()) invalid("microbatch ", m, " group ", gi, " has no sequences");
      for (int r : g.ranks) {
        if (r < 0 || r >= num_ranks)
          invalid("microbatch ", m, " group ", gi, " names rank ", r, " outside [0, ", num_ranks, ")");
        if (rank_slot[static_cast<std::size_t>(r)] == static_cast<int>(m))
          invalid("rank ", r, " appears more than once in microbatch ", m);
        rank_slot[static_cast<std::size_t>(r)] = static_cast<int>(m);
      }
      for (auto id : g.sequences) {
        if (id < 0 || id >= n)
          invalid("microbatch ", m, " group ", gi, " names sequence ", id, " outside [0, ", n, ")");
        if (seen[static_cast<std::size_t>(id)]++) invalid("sequence ", id, " appears more than once in the plan");
      }
      const std::int64_t rows = group_rows(batch, cluster, g.sequences, g.degree());
      if (rows > cap)
        invalid("microbatch ", m, " group ", gi, " puts ", rows, " rows on each of its ", g.degree(),
                " ranks once its sequences are padded to multiples of ", cluster.seq_pad_multiple, " x ", g.degree(),
                "; the memory budget holds ", cap, " tokens per rank");
    }
  }
  for (std::int64_t i = 0; i < n; ++i)
    if (!seen[static_cast<std::size_t>(i)]) invalid("sequence ", i, " is missing from the plan");
}

namespace {
// Feeds a plan's assignment to `mix` in one fixed order: a marker per slot and per group, the group's ranks, a
// marker, its sequences. digest() and fingerprint() hash the same stream.
template <class Mix>
void feed_assignment(const Plan& p, Mix&& mix) {
  for (const auto& slot : p.microbatches) {
    mix(0xA5A5A5A5ull);
    for (const auto& g : slot) {
      mix(0x5A5A5A5Aull);
      for (int r : g.ranks) mix(static_cast<std::uint64_t>(r));
      mix(0xFFull);
      for (auto s : g.sequences) mix(static_cast<std::uint64_t>(s));
    }
  }
}
}  // namespace

std::uint64_t Plan::digest() const {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (char ch : strategy) mix(static_cast<unsigned char>(ch));
  mix(static_cast<std::uint64_t>(version));
  mix(static_cast<std::uint64_t>(num_ranks));
  feed_assignment(*this, mix);
  return h;
}

std::pair<std::uint64_t, std::uint64_t> Plan::fingerprint() const {
  std::uint64_t a = 1469598103934665603ull, b = 0x9E3779B97F4A7C15ull;
  feed_assignment(*this, [&](std::uint64_t v) {
    a = (a ^ v) * 1099511628211ull;
    b = (b ^ (v + 0x632BE59BD9B4E019ull)) * 0xFF51AFD7ED558CCDull, b ^= b >> 29;
  });
  return {a, b};
}

}  // namespace dynacp
