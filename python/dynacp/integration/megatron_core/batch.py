"""A dynacp microbatch as the inputs of a Megatron-Core ``GPTModel``, and as the tuple of Megatron-LM main's
``get_batch_on_this_rank_for_sequence_packing``.

The microbatches of :func:`dynacp.integration.wrap_data_iterator` are already zigzag-sliced for this rank's ring
(every rank of a ring holds ``cu_seqlens_padded[-1] / cp`` rows); Megatron-LM main's own
``get_batch_on_this_rank_for_sequence_packing`` slices a whole packed microbatch by the *static* CP group, so it
cannot take them. :func:`get_batch_on_this_rank_for_sequence_packing` here has its signature and returns its tuple
``(tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params, padding_mask)`` for a dynacp
microbatch; ``packed_seq_params`` (:func:`ring_packed_seq_params`) carries the ring.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import torch

from dynacp.integration.config import CPRing
from dynacp.integration.layout import zigzag_rows
from dynacp.integration.megatron_core.cpu import import_megatron_quietly
from dynacp.integration.packed import TEContextParallel

import_megatron_quietly()

from megatron.core.packed_seq_params import PackedSeqParams  # noqa: E402


@dataclasses.dataclass
class RingPackedSeqParams(PackedSeqParams):
    """Megatron's ``PackedSeqParams`` (THD, ``cu_seqlens_q/kv`` of the real tokens, ``cu_seqlens_q/kv_padded`` of
    the zigzag layout, ``max_seqlen_q/kv`` the longest padded sequence, ``local_cp_size`` the ring size,
    ``cp_group`` the ring's own group or ``None``) plus what a per-microbatch ring needs beyond it. Megatron's code
    reads only the base fields (TransformerEngine's wrapper forwards exactly those)."""

    cp_rank: Optional[int] = None
    """This rank's ring position = its zigzag chunk index (what :class:`~.model.RingCPGroup` answers as ``rank()``)."""
    cp_ring: Optional[CPRing] = None
    """How the ring communicates (``mb["cp_ring"]``): with ``cp_groups="pool"`` the pool group and pool indices."""
    te: Optional[TEContextParallel] = None
    """TransformerEngine's CP parameters of the microbatch (``mb["te"]``), set on TE attention by
    :class:`~.model.RingSelfAttention`."""


def _device(device: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def ring_packed_seq_params(mb: dict, device: Any = None) -> RingPackedSeqParams:
    """:class:`RingPackedSeqParams` of a dynacp microbatch (offsets as int32 tensors on ``device``; default the
    current CUDA device, or the CPU without CUDA)."""
    p, dev = mb["packed_seq_params"], _device(device)
    cu = torch.as_tensor(p.cu_seqlens_q, dtype=torch.int32).to(dev)
    cup = torch.as_tensor(p.cu_seqlens_q_padded, dtype=torch.int32).to(dev)
    return RingPackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cup,
                               cu_seqlens_kv_padded=cup, max_seqlen_q=int(p.max_seqlen_q),
                               max_seqlen_kv=int(p.max_seqlen_kv), local_cp_size=int(p.local_cp_size),
                               cp_group=p.cp_group, cp_rank=int(mb["cp_rank"]), cp_ring=mb.get("cp_ring"),
                               te=mb.get("te"))


def padding_mask(mb: dict, device: Any = None) -> torch.Tensor:
    """``[1, T]`` bool, True on this rank's padding rows (Megatron's convention: True = padding, excluded). Computed
    from the packing metadata alone, so pipeline stages without the token tensors have it too."""
    rows = zigzag_rows(mb["cu_seqlens"], len(mb["ring"]), int(mb["cp_rank"]), mb["cu_seqlens_padded"])
    return (rows < 0).reshape(1, -1).to(_device(device))


def _row(t: Optional[torch.Tensor], dtype: torch.dtype, dev: torch.device) -> Optional[torch.Tensor]:
    return None if t is None else t.to(device=dev, dtype=dtype).reshape(1, -1)


def megatron_inputs(mb: dict, device: Any = None) -> dict:
    """Keyword arguments of ``GPTModel.forward`` for a dynacp microbatch: ``input_ids``, ``position_ids`` and
    ``labels`` ``[1, T]`` int64, ``loss_mask`` ``[1, T]`` float32, ``attention_mask=None`` (THD masks are per
    document), ``packed_seq_params`` (:func:`ring_packed_seq_params`) and ``padding_mask`` ``[1, T]``. Token tensors
    are ``None`` on pipeline stages without data."""
    dev = _device(device)
    return {"input_ids": _row(mb["tokens"], torch.int64, dev),
            "position_ids": _row(mb["position_ids"], torch.int64, dev),
            "attention_mask": None,
            "labels": _row(mb["labels"], torch.int64, dev),
            "loss_mask": _row(mb["loss_mask"], torch.float32, dev),
            "packed_seq_params": ring_packed_seq_params(mb, dev),
            "padding_mask": padding_mask(mb, dev)}


def get_batch_on_this_rank_for_sequence_packing(
    data_iterator: Optional[Iterator[dict]],
    vpp_size: Optional[int] = None,
    mtp_on_this_rank: bool = False,
    vp_stage: Optional[int] = None,
    pg_collection: Any = None,
) -> tuple:
    """Megatron-LM main's ``get_batch_on_this_rank_for_sequence_packing`` for the iterator returned by
    :func:`~dynacp.integration.megatron_core.entry.wrap_data_iterator`: the next microbatch as
    ``(tokens, labels, loss_mask, attention_mask, position_ids, packed_seq_params, padding_mask)`` -- ``[1, T]``
    tensors of this rank's ring rows, ``attention_mask`` ``None``, ``packed_seq_params`` a
    :class:`RingPackedSeqParams`, ``padding_mask`` True on padding rows. dynacp has already sent every TP peer and
    pipeline stage its microbatch, so nothing is broadcast here (``vpp_size``, ``mtp_on_this_rank``, ``vp_stage``
    and ``pg_collection`` are accepted for parity).

    Raises:
        ValueError: ``data_iterator`` is None (every rank of a dynacp run has one).
    """
    if data_iterator is None:
        raise ValueError("get_batch_on_this_rank_for_sequence_packing: data_iterator is None; dynacp's "
                         "wrap_data_iterator gives every rank (TP peers and every pipeline stage) an iterator")
    x = megatron_inputs(next(data_iterator))
    return (x["input_ids"], x["labels"], x["loss_mask"], None, x["position_ids"], x["packed_seq_params"],
            x["padding_mask"])
