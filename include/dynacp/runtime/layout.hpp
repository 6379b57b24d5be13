// Zigzag sharding of packed THD batches, with explicit padding.
//
// Padding rules (never silent truncation):
//  * every sequence must occupy a multiple of 2*cp tokens in the padded layout; by default a sequence of length L
//    is padded to ceil(L / 2cp) * 2cp (a sequence of length 0 stays empty). A caller may pass its own
//    cu_seqlens_padded (e.g. for cp*lcm(2, tp)); each padded length must be >= the real one and a multiple of 2cp.
//  * padding tokens sit at the end of their sequence; they are never attended to, their outputs are 0, their LSE
//    is -inf and their gradients are 0.
//  * a sequence shorter than 2*cp is padded to 2*cp, so some ranks hold only padding for it; a rank may hold only
//    padding for the whole batch and still takes part in the ring.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/runtime/schedule.hpp"

namespace dynacp::runtime {

struct ZigzagLayout {
  int cp = 1;
  std::vector<std::int64_t> cu_seqlens;         ///< global offsets of the real tokens
  std::vector<std::int64_t> cu_seqlens_padded;  ///< global offsets in the padded layout

  int num_seqs() const { return static_cast<int>(cu_seqlens.size()) - 1; }
  std::int64_t length(int b) const { return cu_seqlens[b + 1] - cu_seqlens[b]; }
  std::int64_t padded_length(int b) const { return cu_seqlens_padded[b + 1] - cu_seqlens_padded[b]; }
  /// Rows each rank holds (the same on every rank).
  std::int64_t local_tokens() const { return cu_seqlens_padded.back() / cp; }
  /// Local cu_seqlens (cu_seqlens_padded / cp), identical on every rank.
  std::vector<std::int64_t> local_cu_seqlens() const;
};

/// Validates cu_seqlens (starts at 0, non-decreasing) and cp >= 1, and derives or checks cu_seqlens_padded.
/// Throws InvalidArgument naming the offending sequence.
ZigzagLayout make_zigzag_layout(std::span<const std::int64_t> cu_seqlens, int cp,
                                std::span<const std::int64_t> cu_seqlens_padded = {});

/// For each local row of `rank`, the global row of the real token it holds in the unpadded packed batch, or -1
/// for a padding row. Used to shard inputs and to gather outputs.
std::vector<std::int64_t> zigzag_rows(const ZigzagLayout& layout, int rank);

/// The blocks rank `rank` computes at ring step `step`; causal[b] selects the mask of sequence b (empty = all
/// causal). Sequences with no rows in the block are left out.
std::vector<BlockDesc> ring_blocks(const ZigzagLayout& layout, int rank, int step,
                                   std::span<const std::uint8_t> causal);

}  // namespace dynacp::runtime
