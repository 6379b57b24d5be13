// The zigzag ring schedule: which q-chunk meets which kv-chunk at which step, with which mask. Header-only and
// free of host-only code so the CPU executor (ring.cpp) and the CUDA executor (cuda/) share it verbatim.
//
// Each sequence (padded to a multiple of 2*cp) is cut into 2*cp chunks of c tokens; rank r holds chunk r ("front")
// and chunk 2*cp-1-r ("back"), stored front then back. KV travels r -> r+1, so at step t rank r holds the kv of
// src = (r - t) mod cp. For a causal sequence:
//   t == 0         : all local q x all local kv, causal (diagonal) mask
//   src < r        : all local q x front half of src kv, no mask (every key precedes every query)
//   src > r        : back half of local q x all src kv, no mask
// Every rank does one diagonal block and cp-1 half blocks. A full-mask sequence uses all q x all kv at every step.
// Key padding (positions >= the sequence's valid length) is masked in every block; padded query rows attend to
// nothing (output 0, LSE -inf).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DYNACP_HD __host__ __device__
#else
#define DYNACP_HD
#endif

namespace dynacp::runtime {

enum class Part : std::uint8_t { kAll, kFront, kBack };
enum class BlockMask : std::uint8_t { kCausal, kNone };

struct RingStep {
  int src;  ///< rank whose kv is held at this step
  Part q;
  Part kv;
  BlockMask mask;
};

constexpr int ring_next(int rank, int cp) { return (rank + 1) % cp; }
constexpr int ring_prev(int rank, int cp) { return (rank + cp - 1) % cp; }

constexpr RingStep zigzag_step(int rank, int cp, int step, bool causal) {
  const int src = ((rank - step) % cp + cp) % cp;
  if (!causal) return {src, Part::kAll, Part::kAll, BlockMask::kNone};
  if (step == 0) return {src, Part::kAll, Part::kAll, BlockMask::kCausal};
  if (src < rank) return {src, Part::kAll, Part::kFront, BlockMask::kNone};
  return {src, Part::kBack, Part::kAll, BlockMask::kNone};
}

/// Local offsets [lo, hi) of a part within a sequence of 2*chunk local tokens.
constexpr std::int64_t part_lo(Part p, std::int64_t chunk) { return p == Part::kBack ? chunk : 0; }
constexpr std::int64_t part_hi(Part p, std::int64_t chunk) { return p == Part::kFront ? chunk : 2 * chunk; }

/// Position within its sequence of local offset j (0 <= j < 2*chunk) on the rank `holder` of a cp-ring.
DYNACP_HD constexpr std::int64_t zigzag_position(int holder, int cp, std::int64_t chunk, std::int64_t j) {
  return j < chunk ? holder * chunk + j : (2 * cp - 1 - holder) * chunk + (j - chunk);
}

/// One sequence's share of a ring step: q rows [row0+q_lo, row0+q_hi) of the local q meet kv rows
/// [row0+k_lo, row0+k_hi) of the held kv buffer (every rank stores a sequence at the same local row0).
struct BlockDesc {
  std::int64_t row0;
  std::int64_t chunk;
  std::int64_t q_lo, q_hi, k_lo, k_hi;
  std::int64_t len;  ///< valid (unpadded) tokens of the sequence
  std::int32_t q_holder, k_holder, cp;
  std::int32_t causal;  ///< 1: mask keys after the query (by position); 0: no causal mask

  DYNACP_HD bool visible(std::int64_t qj, std::int64_t kj) const {
    const std::int64_t qp = zigzag_position(q_holder, cp, chunk, qj);
    const std::int64_t kp = zigzag_position(k_holder, cp, chunk, kj);
    return qp < len && kp < len && (!causal || kp <= qp);
  }
  DYNACP_HD bool row_valid(std::int64_t qj) const { return zigzag_position(q_holder, cp, chunk, qj) < len; }
};

}  // namespace dynacp::runtime
