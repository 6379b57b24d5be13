#include "dynacp/runtime/layout.hpp"

#include "dynacp/model/error.hpp"

namespace dynacp::runtime {

std::vector<std::int64_t> ZigzagLayout::local_cu_seqlens() const {
  std::vector<std::int64_t> out;
  for (auto x : cu_seqlens_padded) out.push_back(x / cp);
  return out;
}

ZigzagLayout make_zigzag_layout(std::span<const std::int64_t> cu_seqlens, int cp,
                                std::span<const std::int64_t> cu_seqlens_padded) {
  if (cp < 1) invalid("CP size must be >= 1, got ", cp);
  if (cu_seqlens.empty() || cu_seqlens[0] != 0) invalid("cu_seqlens must start with 0 (got an empty or shifted array)");
  const std::int64_t unit = 2 * static_cast<std::int64_t>(cp);
  ZigzagLayout L;
  L.cp = cp;
  L.cu_seqlens.assign(cu_seqlens.begin(), cu_seqlens.end());
  for (std::size_t b = 1; b < cu_seqlens.size(); ++b)
    if (cu_seqlens[b] < cu_seqlens[b - 1])
      invalid("cu_seqlens must be non-decreasing; sequence ", b - 1, " has negative length");
  if (cu_seqlens_padded.empty()) {
    L.cu_seqlens_padded.push_back(0);
    for (int b = 0; b < L.num_seqs(); ++b)
      L.cu_seqlens_padded.push_back(L.cu_seqlens_padded.back() + (L.length(b) + unit - 1) / unit * unit);
    return L;
  }
  if (cu_seqlens_padded.size() != cu_seqlens.size())
    invalid("cu_seqlens_padded has ", cu_seqlens_padded.size(), " entries but cu_seqlens has ", cu_seqlens.size());
  if (cu_seqlens_padded[0] != 0) invalid("cu_seqlens_padded must start with 0");
  L.cu_seqlens_padded.assign(cu_seqlens_padded.begin(), cu_seqlens_padded.end());
  for (int b = 0; b < L.num_seqs(); ++b) {
    const auto p = L.padded_length(b);
    if (p < L.length(b))
      invalid("sequence ", b, ": padded length ", p, " is shorter than its length ", L.length(b),
              " (tokens would be truncated)");
    if (p % unit != 0)
      invalid("sequence ", b, ": padded length ", p, " is not a multiple of 2*cp = ", unit,
              "; pad each sequence to a multiple of 2*cp");
  }
  return L;
}

std::vector<std::int64_t> zigzag_rows(const ZigzagLayout& layout, int rank) {
  if (rank < 0 || rank >= layout.cp) invalid("rank ", rank, " is outside the CP group of size ", layout.cp);
  std::vector<std::int64_t> rows;
  rows.reserve(static_cast<std::size_t>(layout.local_tokens()));
  for (int b = 0; b < layout.num_seqs(); ++b) {
    const std::int64_t chunk = layout.padded_length(b) / (2 * layout.cp);
    for (std::int64_t j = 0; j < 2 * chunk; ++j) {
      const std::int64_t pos = zigzag_position(rank, layout.cp, chunk, j);
      rows.push_back(pos < layout.length(b) ? layout.cu_seqlens[b] + pos : -1);
    }
  }
  return rows;
}

std::vector<BlockDesc> ring_blocks(const ZigzagLayout& layout, int rank, int step,
                                   std::span<const std::uint8_t> causal) {
  if (!causal.empty() && static_cast<int>(causal.size()) != layout.num_seqs())
    invalid("causal flags: got ", causal.size(), " for ", layout.num_seqs(), " sequences");
  std::vector<BlockDesc> out;
  for (int b = 0; b < layout.num_seqs(); ++b) {
    const std::int64_t chunk = layout.padded_length(b) / (2 * layout.cp);
    if (chunk == 0) continue;
    const bool c = causal.empty() || causal[b] != 0;
    const RingStep s = zigzag_step(rank, layout.cp, step, c);
    out.push_back({layout.cu_seqlens_padded[b] / layout.cp, chunk, part_lo(s.q, chunk), part_hi(s.q, chunk),
                   part_lo(s.kv, chunk), part_hi(s.kv, chunk), layout.length(b), rank, s.src, layout.cp,
                   s.mask == BlockMask::kCausal ? 1 : 0});
  }
  return out;
}

}  // namespace dynacp::runtime
