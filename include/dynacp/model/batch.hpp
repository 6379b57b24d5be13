// A global batch: sequence lengths with their attention mask kind. Sequence ids are positions.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace dynacp {

/// Attention mask of one sequence. Causal attention does about half the work of full attention.
enum class Mask : std::uint8_t { Causal = 0, Full = 1 };

struct Batch {
  std::vector<std::int64_t> lengths;  ///< tokens per sequence, > 0; id i is lengths[i]
  std::vector<Mask> masks;            ///< per-sequence mask; empty means all causal

  Batch() = default;
  explicit Batch(std::vector<std::int64_t> lengths, std::vector<Mask> masks = {});

  std::size_t size() const { return lengths.size(); }
  Mask mask(std::size_t i) const { return masks.empty() ? Mask::Causal : masks[i]; }
  std::int64_t total_tokens() const;
  std::int64_t max_length() const;

  /// Throws InvalidArgument for an empty batch, a length <= 0 (naming its id) or a masks/lengths size mismatch.
  void validate() const;
};

}  // namespace dynacp
