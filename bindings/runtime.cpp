// Thin bindings for the CPU runtime: layouts, ring attention over a host-callback communicator, packing codec.
#include <chrono>

#include "common.hpp"
#include "dynacp/model/error.hpp"
#include "dynacp/runtime/attention.hpp"
#include "dynacp/runtime/codec.hpp"
#include "dynacp/runtime/comm.hpp"
#include "dynacp/runtime/layout.hpp"

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

template <class T>
using Arr = py::array_t<T, py::array::c_style>;

template <class T>
rt::AttnShape shape_of(const Arr<T>& q, const Arr<T>& k, const Arr<T>& v) {
  if (q.ndim() != 3 || k.ndim() != 3 || v.ndim() != 3) invalid("q, k, v must be [tokens, heads, dim] arrays");
  if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0) || k.shape(1) != v.shape(1) || k.shape(2) != q.shape(2) ||
      v.shape(2) != q.shape(2))
    invalid("q [T,H,D], k and v [T,Hkv,D] shapes disagree");
  rt::AttnShape s{q.shape(0), static_cast<int>(q.shape(1)), static_cast<int>(k.shape(1)), static_cast<int>(q.shape(2))};
  s.validate();
  return s;
}

template <class T>
py::tuple forward(rt::Comm& comm, const rt::ZigzagLayout& layout, const rt::RingOptions& o, const py::array& qa,
                  const py::array& ka, const py::array& va) {
  const auto q = Arr<T>::ensure(qa), k = Arr<T>::ensure(ka), v = Arr<T>::ensure(va);
  const auto s = shape_of<T>(q, k, v);
  Arr<T> out({q.shape(0), q.shape(1), q.shape(2)}), lse({q.shape(0), q.shape(1)});
  rt::ring_attention_forward<T>(comm, layout, s, q.data(), k.data(), v.data(), o, out.mutable_data(),
                                lse.mutable_data());
  return py::make_tuple(out, lse);
}

template <class T>
py::tuple backward(rt::Comm& comm, const rt::ZigzagLayout& layout, const rt::RingOptions& o, const py::array& qa,
                   const py::array& ka, const py::array& va, const py::array& outa, const py::array& lsea,
                   const py::array& douta) {
  const auto q = Arr<T>::ensure(qa), k = Arr<T>::ensure(ka), v = Arr<T>::ensure(va);
  const auto out = Arr<T>::ensure(outa), lse = Arr<T>::ensure(lsea), dout = Arr<T>::ensure(douta);
  const auto s = shape_of<T>(q, k, v);
  if (out.size() != q.size() || dout.size() != q.size() || lse.size() != q.shape(0) * q.shape(1))
    invalid("out and dout must match q, lse must be [tokens, heads]");
  Arr<T> dq({q.shape(0), q.shape(1), q.shape(2)}), dk({k.shape(0), k.shape(1), k.shape(2)}),
      dv({k.shape(0), k.shape(1), k.shape(2)});
  rt::ring_attention_backward<T>(comm, layout, s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), o,
                                 dq.mutable_data(), dk.mutable_data(), dv.mutable_data());
  return py::make_tuple(dq, dk, dv);
}

/// Dispatches on q's dtype (float32 or float64); the other arrays are converted to it.
template <class F32, class F64>
py::tuple dispatch(const py::array& q, F32 f32, F64 f64) {
  if (q.dtype().is(py::dtype::of<float>())) return f32();
  if (q.dtype().is(py::dtype::of<double>())) return f64();
  invalid("CPU ring attention supports float32 and float64, got ", std::string(py::str(q.dtype())));
}

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
        // Called with the GIL held (from the ring running on the Python thread): hands Python zero-copy uint8 views.
        auto fn = [exchange](std::span<const rt::P2POp> ops, std::string_view what, rt::Millis timeout) {
          py::list items;
          for (const auto& op : ops) {
            py::capsule owner(op.data, [](void*) {});
            py::array_t<std::uint8_t> view({static_cast<py::ssize_t>(op.bytes)}, {1},
                                           static_cast<std::uint8_t*>(op.data), owner);
            items.append(py::make_tuple(op.kind == rt::P2POp::Kind::kSend ? "send" : "recv", op.peer, view));
          }
          exchange(items, std::string(what), timeout.count() / 1000.0);
        };
        return rt::make_callback_comm(rank, size, rt::Millis(static_cast<std::int64_t>(timeout_s * 1000)), fn);
      },
      py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("exchange"),
      "Communicator whose grouped P2P calls exchange(ops, what, timeout_s); ops are (kind, peer, uint8 view).");

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
      "ring_attention_forward",
      [](rt::Comm& comm, const py::array& q, const py::array& k, const py::array& v, const py::handle& cu,
         const py::handle& cu_padded, const py::handle& causal, double scale) {
        const auto layout = layout_from(cu, comm.size(), cu_padded);
        const auto o = options(layout, causal, scale);
        return dispatch(
            q, [&] { return forward<float>(comm, layout, o, q, k, v); },
            [&] { return forward<double>(comm, layout, o, q, k, v); });
      },
      py::arg("comm"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"),
      py::arg("cu_seqlens_padded") = py::none(), py::arg("causal") = true, py::arg("scale") = 0.0,
      "Zigzag ring attention forward on this rank's shard; returns (out [T,H,D], lse [T,H]).");
  m.def(
      "ring_attention_backward",
      [](rt::Comm& comm, const py::array& q, const py::array& k, const py::array& v, const py::array& out,
         const py::array& lse, const py::array& dout, const py::handle& cu, const py::handle& cu_padded,
         const py::handle& causal, double scale) {
        const auto layout = layout_from(cu, comm.size(), cu_padded);
        const auto o = options(layout, causal, scale);
        return dispatch(
            q, [&] { return backward<float>(comm, layout, o, q, k, v, out, lse, dout); },
            [&] { return backward<double>(comm, layout, o, q, k, v, out, lse, dout); });
      },
      py::arg("comm"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"),
      py::arg("cu_seqlens"), py::arg("cu_seqlens_padded") = py::none(), py::arg("causal") = true,
      py::arg("scale") = 0.0, "Ring attention backward from the saved out and lse; returns (dq, dk, dv).");

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
