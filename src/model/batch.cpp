#include "dynacp/model/batch.hpp"

#include <algorithm>
#include <numeric>

#include "dynacp/model/error.hpp"

namespace dynacp {

Batch::Batch(std::vector<std::int64_t> l, std::vector<Mask> m) : lengths(std::move(l)), masks(std::move(m)) {}

std::int64_t Batch::total_tokens() const { return std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0}); }

std::int64_t Batch::max_length() const {
  return lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
}

void Batch::validate() const {
  if (lengths.empty()) invalid("empty batch: a global batch needs at least one sequence");
  if (!masks.empty() && masks.size() != lengths.size())
    invalid("masks has ", masks.size(), " entries but lengths has ", lengths.size(),
            "; give one mask per sequence or none");
  for (std::size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] <= 0) invalid("sequence ", i, " has length ", lengths[i], "; lengths must be >= 1");
}

}  // namespace dynacp
