#include "dynacp/model/shapes.hpp"

#include <algorithm>
#include <sstream>

#include "dynacp/model/error.hpp"

namespace dynacp {

namespace {
template <class T>
std::string list(const std::vector<T>& v) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}
}  // namespace

std::int64_t StaticShapes::bucket_of(std::int64_t rows) const {
  if (token_buckets.empty()) return rows;
  const auto it = std::lower_bound(token_buckets.begin(), token_buckets.end(), rows);
  if (it == token_buckets.end())
    invalid("StaticShapes: ", rows, " rows per rank exceed the largest of token_buckets ", list(token_buckets));
  return *it;
}

bool StaticShapes::allows_degree(int d) const {
  return cp_sizes.empty() || std::binary_search(cp_sizes.begin(), cp_sizes.end(), d);
}

void StaticShapes::validate(const Cluster& cluster, const CostModel& cost) const {
  const std::int64_t cap = cost.token_capacity(cluster);
  for (std::size_t i = 0; i < token_buckets.size(); ++i) {
    const std::int64_t b = token_buckets[i];
    if (b <= 0) invalid("StaticShapes.token_buckets[", i, "] is ", b, " rows per rank; buckets must be > 0");
    if (b % cluster.seq_pad_multiple != 0)
      invalid("StaticShapes.token_buckets[", i, "] is ", b, " rows per rank; buckets must be multiples of ",
              "Cluster.seq_pad_multiple = ", cluster.seq_pad_multiple);
    if (i > 0 && b <= token_buckets[i - 1])
      invalid("StaticShapes.token_buckets must be strictly ascending, got ", list(token_buckets));
  }
  if (!token_buckets.empty() && token_buckets.back() > cap)
    invalid("StaticShapes.token_buckets: the largest bucket, ", token_buckets.back(),
            " rows per rank, exceeds the token capacity of ", cap, " tokens per rank");
  for (std::size_t i = 0; i < cp_sizes.size(); ++i) {
    const int d = cp_sizes[i];
    if (d < 1 || d > cluster.num_ranks || cluster.num_ranks % d != 0)
      invalid("StaticShapes.cp_sizes[", i, "] is ", d, " ranks; CP sizes must divide the pool of ", cluster.num_ranks,
              " ranks");
    if (i > 0 && d <= cp_sizes[i - 1])
      invalid("StaticShapes.cp_sizes must be strictly ascending, got ", list(cp_sizes));
  }
  if (!cp_sizes.empty() && cp_sizes.front() != 1)
    invalid("StaticShapes.cp_sizes ", list(cp_sizes), " must include 1 (short sequences run on one rank)");
  if (max_microbatches < 0)
    invalid("StaticShapes.max_microbatches is ", max_microbatches, " slots; it must be >= 0 (0 = unbounded)");
  if (max_sequences < 0)
    invalid("StaticShapes.max_sequences is ", max_sequences, " sequences; it must be >= 0 (0 = unbounded)");
}

void StaticShapes::check_feasible(const Batch& batch, const Cluster& cluster, const CostModel& cost) const {
  const std::int64_t cap = max_bucket(cost.token_capacity(cluster));
  const int dmax = max_cp(cluster.num_ranks);
  for (std::size_t i = 0; i < batch.size(); ++i)
    if (cluster.padded_rows(batch.lengths[i], dmax) > cap)
      invalid("StaticShapes: sequence ", i, " has ", batch.lengths[i], " tokens, more than the largest bucket (", cap,
              " rows per rank) x the largest CP size (", dmax, " ranks) hold once padded to multiples of ",
              cluster.seq_pad_multiple, " x ", dmax, "; add a larger bucket or CP size");
  if (max_microbatches <= 0) return;
  const std::int64_t slots = static_cast<std::int64_t>(cluster.num_ranks) * max_microbatches;
  if (batch.total_tokens() > slots * cap)
    invalid("StaticShapes: the batch has ", batch.total_tokens(), " tokens but ", cluster.num_ranks, " ranks x ",
            max_microbatches, " max_microbatches x ", cap, " rows per rank (largest bucket) hold at most ",
            slots * cap);
  if (max_sequences > 0 && static_cast<std::int64_t>(batch.size()) > slots * max_sequences)
    invalid("StaticShapes: the batch has ", batch.size(), " sequences but ", cluster.num_ranks, " ranks x ",
            max_microbatches, " max_microbatches x ", max_sequences, " max_sequences hold at most ",
            slots * max_sequences);
}

void StaticShapes::check_plan(const Plan& plan, const Batch& batch, const Cluster& cluster) const {
  for (std::size_t m = 0; m < plan.microbatches.size(); ++m)
    for (std::size_t gi = 0; gi < plan.microbatches[m].size(); ++gi) {
      const Group& g = plan.microbatches[m][gi];
      if (!allows_degree(g.degree()))
        invalid("microbatch ", m, " group ", gi, " has CP degree ", g.degree(), ", not one of StaticShapes.cp_sizes ",
                list(cp_sizes));
      const std::int64_t rows = group_rows(batch, cluster, g.sequences, g.degree());
      if (!token_buckets.empty() && rows > token_buckets.back())
        invalid("microbatch ", m, " group ", gi, " puts ", rows, " rows on each rank, above the largest of ",
                "StaticShapes.token_buckets ", list(token_buckets));
      if (max_sequences > 0 && g.sequences.size() > static_cast<std::size_t>(max_sequences))
        invalid("microbatch ", m, " group ", gi, " packs ", g.sequences.size(),
                " sequences, above StaticShapes.max_sequences = ", max_sequences);
    }
  if (max_microbatches <= 0) return;
  const auto counts = plan.microbatch_counts(cluster.num_ranks);
  for (std::size_t r = 0; r < counts.size(); ++r)
    if (counts[r] > max_microbatches)
      invalid("rank ", r, " takes part in ", counts[r],
              " microbatch slots, above StaticShapes.max_microbatches = ", max_microbatches);
}

double StaticShapes::group_time(const CostModel& cost, const Group& group, std::span<const GroupStats> single,
                                const Batch& batch, const Cluster& cluster) const {
  if (token_buckets.empty()) return cost.group_time(group, single, cluster);
  const std::int64_t rows = group_rows(batch, cluster, group.sequences, group.degree());
  return cost.time(priced(sum_stats(single, group.sequences), rows, group.degree()), group.degree(),
                   cluster.crosses_nodes(group.ranks), cluster);
}

double StaticShapes::padding_fraction(const Plan& plan, const Batch& batch, const Cluster& cluster) const {
  if (token_buckets.empty()) return 0.0;
  double pad = 0.0, held = 0.0;
  for (const auto& slot : plan.microbatches)
    for (const Group& g : slot) {
      const std::int64_t rows = group_rows(batch, cluster, g.sequences, g.degree());
      const std::int64_t b = rows <= token_buckets.back() ? bucket_of(rows) : rows;
      pad += static_cast<double>((b - rows) * g.degree());
      held += static_cast<double>(b * g.degree());
    }
  return held > 0 ? pad / held : 0.0;
}

std::string StaticShapes::describe() const {
  std::ostringstream os;
  os << "StaticShapes(token_buckets=" << list(token_buckets) << ", cp_sizes=" << list(cp_sizes)
     << ", max_microbatches=" << max_microbatches << ", max_sequences=" << max_sequences << ")";
  return os.str();
}

}  // namespace dynacp
