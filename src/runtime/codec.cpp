#include "dynacp/runtime/codec.hpp"

#include <bit>

#include "dynacp/model/error.hpp"

namespace dynacp::runtime {

using detail::cat;

namespace {

std::int64_t checksum(std::int64_t version, std::int64_t count, std::span<const std::int64_t> payload) {
  std::uint64_t h = 14695981039346656037ull;
  auto mix = [&](std::int64_t x) {
    auto u = static_cast<std::uint64_t>(x);
    for (int i = 0; i < 8; ++i, u >>= 8) h = (h ^ (u & 0xffu)) * 1099511628211ull;
  };
  mix(version);
  mix(count);
  for (auto x : payload) mix(x);
  return std::bit_cast<std::int64_t>(h);
}

/// Returns an empty string when valid, otherwise what is wrong.
std::string check(const MicrobatchMeta& m) {
  if (m.cu_seqlens.empty() || m.cu_seqlens.size() != m.cu_seqlens_padded.size())
    return cat("cu_seqlens (", m.cu_seqlens.size(), " entries) and cu_seqlens_padded (", m.cu_seqlens_padded.size(),
               ") must be non-empty and equally long");
  for (const auto* cu : {&m.cu_seqlens, &m.cu_seqlens_padded}) {
    if ((*cu)[0] != 0) return "cu_seqlens arrays must start at 0";
    for (std::size_t i = 1; i < cu->size(); ++i)
      if ((*cu)[i] < (*cu)[i - 1]) return cat("cu_seqlens arrays must be non-decreasing (entry ", i, ")");
  }
  if (m.max_seqlen < 0) return cat("max_seqlen must be >= 0, got ", m.max_seqlen);
  if (m.cp_size < 1) return cat("cp_size must be >= 1, got ", m.cp_size);
  if (static_cast<std::int64_t>(m.group_ranks.size()) != m.cp_size)
    return cat("group_ranks has ", m.group_ranks.size(), " ranks but cp_size is ", m.cp_size);
  return {};
}

}  // namespace

std::vector<std::int64_t> encode_packing(std::span<const MicrobatchMeta> microbatches) {
  std::vector<std::int64_t> out(kPackingHeaderSize, 0);
  for (std::size_t i = 0; i < microbatches.size(); ++i) {
    const auto& m = microbatches[i];
    if (auto why = check(m); !why.empty()) invalid("packing metadata, microbatch ", i, ": ", why);
    out.push_back(static_cast<std::int64_t>(m.cu_seqlens.size()) - 1);
    out.insert(out.end(), m.cu_seqlens.begin(), m.cu_seqlens.end());
    out.insert(out.end(), m.cu_seqlens_padded.begin(), m.cu_seqlens_padded.end());
    out.push_back(m.max_seqlen);
    out.push_back(m.cp_size);
    out.insert(out.end(), m.group_ranks.begin(), m.group_ranks.end());
  }
  const auto count = static_cast<std::int64_t>(microbatches.size());
  const std::span<const std::int64_t> payload(out.data() + kPackingHeaderSize, out.size() - kPackingHeaderSize);
  out[0] = kPackingVersion;
  out[1] = count;
  out[2] = static_cast<std::int64_t>(payload.size());
  out[3] = checksum(kPackingVersion, count, payload);
  return out;
}

std::vector<MicrobatchMeta> decode_packing(std::span<const std::int64_t> buf) {
  if (buf.size() < kPackingHeaderSize)
    throw Error(cat("packing metadata: buffer of ", buf.size(), " int64 is shorter than the ", kPackingHeaderSize,
                    "-entry header"));
  if (buf[0] != kPackingVersion)
    throw Error(cat("packing metadata: version ", buf[0], " but this build reads version ", kPackingVersion,
                    "; all ranks must run the same dynacp version"));
  const std::int64_t count = buf[1], len = buf[2];
  if (count < 0 || len != static_cast<std::int64_t>(buf.size() - kPackingHeaderSize))
    throw Error(cat("packing metadata: header announces ", count, " microbatches and ", len,
                    " payload entries but the buffer holds ", buf.size() - kPackingHeaderSize));
  const auto payload = buf.subspan(kPackingHeaderSize);
  if (checksum(buf[0], count, payload) != buf[3])
    throw Error("packing metadata: checksum mismatch (payload corrupted in transit or sender/receiver out of sync)");
  std::vector<MicrobatchMeta> out;
  std::size_t pos = 0;
  auto take = [&](std::int64_t n, const char* what) {
    if (n < 0 || pos + static_cast<std::size_t>(n) > payload.size())
      throw Error(cat("packing metadata: microbatch ", out.size(), " ", what, " runs past the payload"));
    auto s = payload.subspan(pos, static_cast<std::size_t>(n));
    pos += static_cast<std::size_t>(n);
    return std::vector<std::int64_t>(s.begin(), s.end());
  };
  for (std::int64_t i = 0; i < count; ++i) {
    MicrobatchMeta m;
    const auto b = take(1, "num_seqs")[0];
    m.cu_seqlens = take(b + 1, "cu_seqlens");
    m.cu_seqlens_padded = take(b + 1, "cu_seqlens_padded");
    m.max_seqlen = take(1, "max_seqlen")[0];
    m.cp_size = take(1, "cp_size")[0];
    m.group_ranks = take(m.cp_size, "group_ranks");
    if (auto why = check(m); !why.empty()) throw Error(cat("packing metadata, microbatch ", i, ": ", why));
    out.push_back(std::move(m));
  }
  if (pos != payload.size()) throw Error("packing metadata: trailing entries after the last microbatch");
  return out;
}

std::vector<MicrobatchMeta> broadcast_packing(Comm& comm, int root, std::span<const MicrobatchMeta> microbatches) {
  std::vector<std::int64_t> buf =
      comm.rank() == root ? encode_packing(microbatches) : std::vector<std::int64_t>(kPackingHeaderSize, 0);
  comm.broadcast(buf.data(), kPackingHeaderSize * sizeof(std::int64_t), root);
  if (buf[2] < 0 || buf[2] > (std::int64_t{1} << 40))
    throw Error(cat("packing metadata: implausible payload length ", buf[2], " in the broadcast header"));
  buf.resize(kPackingHeaderSize + static_cast<std::size_t>(buf[2]));
  comm.broadcast(buf.data() + kPackingHeaderSize, static_cast<std::size_t>(buf[2]) * sizeof(std::int64_t), root);
  return decode_packing(buf);
}

}  // namespace dynacp::runtime
