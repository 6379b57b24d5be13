// Packing metadata codec: what every pipeline stage and tensor-parallel peer must know about a step's microbatches.
// Wire format, all int64 (exact far beyond 2^24, unlike float32 shipping):
//   header  [version, num_microbatches, payload_length, checksum]
//   payload per microbatch: [num_seqs, cu_seqlens (num_seqs+1), cu_seqlens_padded (num_seqs+1), max_seqlen,
//                            cp_size, group_ranks (cp_size)]
// The checksum is FNV-1a 64 over version, count and payload. Decoding a buffer with another version, a wrong
// length or checksum, or an inconsistent payload throws dynacp::Error.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "dynacp/runtime/comm.hpp"

namespace dynacp::runtime {

inline constexpr std::int64_t kPackingVersion = 1;
inline constexpr std::size_t kPackingHeaderSize = 4;

struct MicrobatchMeta {
  std::vector<std::int64_t> cu_seqlens;
  std::vector<std::int64_t> cu_seqlens_padded;
  std::int64_t max_seqlen = 0;
  std::int64_t cp_size = 1;
  std::vector<std::int64_t> group_ranks;
  bool operator==(const MicrobatchMeta&) const = default;
};

/// Throws InvalidArgument for inconsistent metadata (cu arrays of different sizes, not starting at 0 or
/// decreasing, cp_size < 1, group_ranks.size() != cp_size).
std::vector<std::int64_t> encode_packing(std::span<const MicrobatchMeta> microbatches);
std::vector<MicrobatchMeta> decode_packing(std::span<const std::int64_t> buffer);

/// Root encodes `microbatches` and broadcasts header then payload over `comm` (each step under comm.timeout());
/// every rank returns the decoded metadata. Non-root ranks ignore `microbatches`.
std::vector<MicrobatchMeta> broadcast_packing(Comm& comm, int root, std::span<const MicrobatchMeta> microbatches);

}  // namespace dynacp::runtime
