// Thin bindings for the runtime: layouts, the ring executor over a host-callback communicator with the CPU ring
// device (the CUDA device is in cuda.cpp, module dynacp._cuda), packing codec.
#include <chrono>

#include "common.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"
#include "dynacp/runtime/codec.hpp"
#include "dynacp/runtime/comm.hpp"
#include "dynacp/runtime/layout.hpp"
#include "dynacp/runtime/ring.hpp"

namespace dynacp::py {
namespace rt = dynacp::runtime;
namespace {

rt::ZigzagLayout layout_from(const py::handle& cu, int cp, const py::handle& cu_padded) {
  const auto c = to_int64_vector(cu, "cu_seqlens");
  const auto p = cu_padded.is_none() ? std::vector<std::int64_t>{} : to_int64_vector(cu_padded, "cu_seqlens_padded");
  return rt::make_zigzag_layout(c, cp, p);
}

std::vector<std::uint8_t> causal_flags(const py::handle& causal, int num_seqs) {
  if (py::isinstance<py::bool_>(causal)) return std::vector<std::uint8_t>(num_seqs, causal.cast<bool>() ? 1 : 0);
  auto flags = to_int64_vector(causal, "causal");
  if (static_cast<int>(flags.size()) != num_seqs)
    invalid("causal: got ", flags.size(), " per-sequence flags for ", num_seqs, " sequences");
  return {flags.begin(), flags.end()};
}

rt::AttnShape shape_from(const py::sequence& shape) {
  if (py::len(shape) != 4) invalid("shape must be (tokens, heads, kv_heads, dim)");
  rt::AttnShape s{shape[0].cast<std::int64_t>(), shape[1].cast<int>(), shape[2].cast<int>(), shape[3].cast<int>()};
  s.validate();
  return s;
}

/// The loop asks for its workspace once; `alloc(nbytes)` returns the address of device memory it keeps alive.
rt::WorkspaceFn workspace_from(const py::function& alloc) {
  return [alloc](std::size_t bytes) { return reinterpret_cast<void*>(alloc(bytes).cast<std::uintptr_t>()); };
}

const void* ptr(std::uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mut(std::uintptr_t p) { return reinterpret_cast<void*>(p); }

rt::RingOptions options(const rt::ZigzagLayout& layout, const py::handle& causal, double scale) {
  rt::RingOptions o;
  o.causal = causal_flags(causal, layout.num_seqs());
  o.scale = scale;
  return o;
}

py::dict meta_to_dict(const rt::MicrobatchMeta& m) {
  py::dict d;
  d["cu_seqlens"] = py::array_t<std::int64_t>(m.cu_seqlens.size(), m.cu_seqlens.data());
  d["cu_seqlens_padded"] = py::array_t<std::int64_t>(m.cu_seqlens_padded.size(), m.cu_seqlens_padded.data());
  d["max_seqlen"] = m.max_seqlen;
  d["cp_size"] = m.cp_size;
  d["group_ranks"] = py::array_t<std::int64_t>(m.group_ranks.size(), m.group_ranks.data());
  return d;
}

rt::MicrobatchMeta meta_from(const py::handle& h) {
  const auto d = py::reinterpret_borrow<py::dict>(h);
  rt::MicrobatchMeta m;
  m.cu_seqlens = to_int64_vector(d["cu_seqlens"], "cu_seqlens");
  m.cu_seqlens_padded = to_int64_vector(d["cu_seqlens_padded"], "cu_seqlens_padded");
  m.max_seqlen = d["max_seqlen"].cast<std::int64_t>();
  m.cp_size = d["cp_size"].cast<std::int64_t>();
  m.group_ranks = to_int64_vector(d["group_ranks"], "group_ranks");
  return m;
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<rt::Comm>(m, "Comm", "A dynacp runtime communicator (see include/dynacp/runtime/comm.hpp).")
      .def_property_readonly("rank", &rt::Comm::rank)
      .def_property_readonly("size", &rt::Comm::size)
      .def_property_readonly("timeout", [](const rt::Comm& c) { return c.timeout().count() / 1000.0; });

  m.def(
      "make_callback_comm",
      [](int rank, int size, double timeout_s, py::function exchange) {
        // Called with the GIL held (from the ring running on the Python thread). Buffers are device memory (host
        // memory for the CPU), so Python gets addresses; dynacp.torch maps them back to slices of its workspace.
        auto fn = [exchange](std::span<const rt::P2POp> ops, std::string_view what, rt::Millis timeout) {
          py::list items;
          for (const auto& op : ops)
            items.append(py::make_tuple(op.kind == rt::P2POp::Kind::kSend ? "send" : "recv", op.peer,
                                        reinterpret_cast<std::uintptr_t>(op.data), op.bytes));
          exchange(items, std::string(what), timeout.count() / 1000.0);
        };
        return rt::make_callback_comm(rank, size, rt::Millis(static_cast<std::int64_t>(timeout_s * 1000)), fn);
      },
      py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("exchange"),
      "Communicator whose grouped P2P calls exchange(ops, what, timeout_s); ops are (kind, peer, address, nbytes).");

  m.def(
      "zigzag_layout",
      [](const py::handle& cu, int cp, const py::handle& cu_padded) {
        const auto l = layout_from(cu, cp, cu_padded);
        return py::array_t<std::int64_t>(l.cu_seqlens_padded.size(), l.cu_seqlens_padded.data());
      },
      py::arg("cu_seqlens"), py::arg("cp"), py::arg("cu_seqlens_padded") = py::none(),
      "Validated cu_seqlens_padded (each sequence padded to a multiple of 2*cp unless given).");
  m.def(
      "zigzag_rows",
      [](const py::handle& cu, int cp, int rank, const py::handle& cu_padded) {
        const auto rows = rt::zigzag_rows(layout_from(cu, cp, cu_padded), rank);
        return py::array_t<std::int64_t>(rows.size(), rows.data());
      },
      py::arg("cu_seqlens"), py::arg("cp"), py::arg("rank"), py::arg("cu_seqlens_padded") = py::none(),
      "Global token row of each local row of `rank` (-1 for padding).");

  m.def(
      "ring_blocks",
      [](const py::handle& cu, int cp, int rank, int step, const py::handle& causal, const py::handle& cu_padded) {
        const auto layout = layout_from(cu, cp, cu_padded);
        if (rank < 0 || rank >= cp || step < 0 || step >= cp)
          invalid("ring_blocks: rank ", rank, " and step ", step, " must lie in [0, cp = ", cp, ")");
        const auto flags = causal_flags(causal, layout.num_seqs());
        const auto blocks = rt::ring_blocks(layout, rank, step, flags);
        py::array_t<std::int64_t> out({static_cast<py::ssize_t>(blocks.size()), py::ssize_t{10}});
        auto a = out.mutable_unchecked<2>();
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          const auto& b = blocks[i];
          const std::int64_t row[10] = {b.row0, b.chunk, b.q_lo,     b.q_hi,     b.k_lo,
                                        b.k_hi, b.len,   b.q_holder, b.k_holder, b.causal};
          for (int j = 0; j < 10; ++j) a(static_cast<py::ssize_t>(i), j) = row[j];
        }
        return out;
      },
      py::arg("cu_seqlens"), py::arg("cp"), py::arg("rank"), py::arg("step"), py::arg("causal") = true,
      py::arg("cu_seqlens_padded") = py::none(),
      "The C++ schedule (runtime::ring_blocks) of one rank and ring step: int64 [blocks, 10] rows of (row0, chunk, "
      "q_lo, q_hi, k_lo, k_hi, len, q_holder, k_holder, causal); the oracle of dynacp.torch's Python ring loop.");

  py::class_<rt::RingDevice>(m, "RingDevice",
                             "The per-device half of the ring executor (runtime/ring.hpp): element sizes and kernels.")
      .def_property_readonly("input_bytes", &rt::RingDevice::input_bytes)
      .def_property_readonly("acc_bytes", &rt::RingDevice::acc_bytes);
  m.def(
      "cpu_ring_device",
      [](const std::string& dtype) -> std::unique_ptr<rt::RingDevice> {
        if (dtype == "float32") return std::make_unique<rt::CpuRingDevice<float>>();
        if (dtype == "float64") return std::make_unique<rt::CpuRingDevice<double>>();
        invalid("CPU ring attention supports float32 and float64, got '", dtype, "'");
      },
      py::arg("dtype"), "The CPU ring device (Eigen kernels; input and accumulation type = dtype).");

  // The ring loop over any RingDevice. Tensors are passed as addresses of contiguous device memory with the
  // documented shapes (dynacp.torch checks them); shape = (tokens, heads, kv_heads, dim).
  m.def(
      "ring_forward",
      [](rt::Comm& comm, rt::RingDevice& device, const py::sequence& shape, std::uintptr_t q, std::uintptr_t k,
         std::uintptr_t v, std::uintptr_t out, std::uintptr_t lse, const py::handle& cu, const py::handle& cu_padded,
         const py::handle& causal, double scale, const py::function& alloc) {
        const auto layout = layout_from(cu, comm.size(), cu_padded);
        rt::ring_forward(comm, device, layout, shape_from(shape), options(layout, causal, scale), ptr(q), ptr(k),
                         ptr(v), mut(out), mut(lse), workspace_from(alloc));
      },
      py::arg("comm"), py::arg("device"), py::arg("shape"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
      py::arg("lse"), py::arg("cu_seqlens"), py::arg("cu_seqlens_padded"), py::arg("causal"), py::arg("scale"),
      py::arg("workspace"),
      "Zigzag ring attention forward on this rank's shard: writes out [T,H,D] and lse [T,H] (accumulation type).");
  m.def(
      "ring_backward",
      [](rt::Comm& comm, rt::RingDevice& device, const py::sequence& shape, std::uintptr_t q, std::uintptr_t k,
         std::uintptr_t v, std::uintptr_t out, std::uintptr_t lse, std::uintptr_t dout, std::uintptr_t dq,
         std::uintptr_t dk, std::uintptr_t dv, const py::handle& cu, const py::handle& cu_padded,
         const py::handle& causal, double scale, const py::function& alloc) {
        const auto layout = layout_from(cu, comm.size(), cu_padded);
        rt::ring_backward(comm, device, layout, shape_from(shape), options(layout, causal, scale), ptr(q), ptr(k),
                          ptr(v), ptr(out), ptr(lse), ptr(dout), mut(dq), mut(dk), mut(dv), workspace_from(alloc));
      },
      py::arg("comm"), py::arg("device"), py::arg("shape"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
      py::arg("lse"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("cu_seqlens"),
      py::arg("cu_seqlens_padded"), py::arg("causal"), py::arg("scale"), py::arg("workspace"),
      "Ring attention backward from the saved out and lse: writes dq, dk, dv (accumulation type).");

  m.attr("PACKING_VERSION") = rt::kPackingVersion;
  m.attr("PACKING_HEADER_SIZE") = rt::kPackingHeaderSize;
  m.def(
      "encode_packing",
      [](const py::list& mbs) {
        std::vector<rt::MicrobatchMeta> v;
        for (const auto& h : mbs) v.push_back(meta_from(h));
        const auto buf = rt::encode_packing(v);
        return py::array_t<std::int64_t>(buf.size(), buf.data());
      },
      py::arg("microbatches"),
      "Encodes a list of dicts (cu_seqlens, cu_seqlens_padded, max_seqlen, cp_size, group_ranks) to int64.");
  m.def(
      "decode_packing",
      [](const py::handle& buf) {
        py::list out;
        for (const auto& mb : rt::decode_packing(to_int64_vector(buf, "packing buffer"))) out.append(meta_to_dict(mb));
        return out;
      },
      py::arg("buffer"), "Decodes an int64 packing buffer; raises RuntimeError on version/length/checksum mismatch.");
}

}  // namespace dynacp::py
