"""CP slicing and packing: one sample's zigzag slice as int64 rows, and rows back into a packed THD microbatch.

The re-route stage (:mod:`dynacp.integration.reroute`) moves samples as rows of ``WIDTH`` int64 values -- the
``FIELDS`` in their bit patterns, then the global sequence id (-1 on padding). Here:

* :func:`slice_rows` cuts the rows one ring position of a CP group holds of one sequence (zigzag, padded to a
  multiple of ``pad * cp``), straight into a send buffer;
* :func:`build_microbatch` turns the received rows of one microbatch back into its fields (in their own dtypes) with
  the THD packing metadata (``cu_seqlens``, ``cu_seqlens_padded``, ``max_seqlen``, ...);
* :func:`attach_groups` makes each microbatch runnable once the metadata is shared: its CP group or ring, Megatron's
  ``PackedSeqParams`` and TransformerEngine's CP parameters.

Hands to the metadata stage (:mod:`dynacp.integration.metadata`) the microbatch dicts of a global batch; the
iterator calls :func:`attach_groups` last, on every rank.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dynacp.integration.config import ProcessGroups
from dynacp.integration.gather import FIELDS
from dynacp.integration.layout import cumulative, padded_length, zigzag_rows
from dynacp.integration.packed import make_packed_seq_params, make_te_context_parallel
from dynacp.integration.shapes import active, fixed_length, shape_of

_PAD = {"tokens": 0, "labels": 0, "loss_mask": 0, "position_ids": 0}
#: int64 columns of one re-routed row: the fields, then the global sequence id (-1 for padding).
WIDTH = len(FIELDS) + 1
#: The packing metadata of one microbatch (what pipeline stages and TP peers receive without the tensors).
META_KEYS = ("slot", "ring", "cp_rank", "sequences", "cu_seqlens", "cu_seqlens_padded", "max_seqlen",
             "num_local_tokens")


def to_i64(t: torch.Tensor) -> torch.Tensor:
    """Bit-exact int64 view of a field (floats travel as float64 bit patterns)."""
    return t.to(torch.float64).view(torch.int64) if t.is_floating_point() else t.to(torch.int64)


def from_i64(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The field :func:`to_i64` encoded, in ``dtype``."""
    return t.view(torch.float64).to(dtype) if dtype.is_floating_point else t.to(dtype)


def slice_rows(sample: dict, seq_id: int, cp: int, rank: int, out: torch.Tensor, pad: int = 2,
               padded: Optional[int] = None) -> None:
    """Write into ``out`` (``(padded/cp, WIDTH)`` int64) the rows ring position ``rank`` of a ``cp`` group holds of one
    sequence, padded to ``padded`` tokens (default: the next multiple of ``pad * cp``): its fields, then ``seq_id``
    (-1 on padding rows)."""
    n = sample["tokens"].numel()
    rows = zigzag_rows([0, n], cp, rank, [0, padded_length(n, cp, pad) if padded is None else padded])
    real = rows >= 0
    safe = torch.where(real, rows, torch.zeros_like(rows))
    for f, name in enumerate(FIELDS):
        col = to_i64(sample[name])[safe] if n else torch.zeros(rows.numel(), dtype=torch.int64)
        fill = to_i64(torch.tensor([_PAD[name]], dtype=sample[name].dtype))
        out[:, f] = torch.where(real, col, fill)
    out[:, len(FIELDS)] = torch.where(real, torch.full_like(rows, seq_id), torch.full_like(rows, -1))


def microbatch_meta(slot: int, ring: tuple[int, ...], cp_rank: Optional[int], seqs: Optional[list[int]],
                    seq_lens: list[int], padded: list[int], static_shapes: Optional[Any] = None) -> dict:
    """The packing metadata (:data:`META_KEYS`) of one microbatch of sequences of ``seq_lens`` tokens, each padded to
    ``padded`` rows. In CUDA-graph mode (``static_shapes``) both offset lists have ``max_sequences + 1`` entries
    (empty tail sequences) and ``max_seqlen`` is the shape's fixed bound, rows per rank x cp."""
    rows = sum(padded) // len(ring)
    return {"slot": slot, "ring": ring, "cp_rank": cp_rank, "sequences": seqs,
            "cu_seqlens": fixed_length(cumulative(seq_lens), static_shapes),
            "cu_seqlens_padded": fixed_length(cumulative(padded), static_shapes),
            "max_seqlen": rows * len(ring) if active(static_shapes) else max(padded, default=0),
            "num_local_tokens": rows}


def build_microbatch(recv: torch.Tensor, dtypes: dict[str, torch.dtype], lengths: list[int], padded: list[int],
                     static_shapes: Optional[Any], slot: int, ring: tuple[int, ...], cp_rank: int, seqs: list[int],
                     pieces: list[tuple[int, int]]) -> dict:
    """One microbatch from the rows ``pieces`` (row ranges of ``recv``, in sequence order): its fields in ``dtypes``,
    ``sequence_ids`` (int64, -1 on padding) and its packing metadata; ``lengths`` is every global sequence's,
    ``padded`` the padded length of each of ``seqs`` (:func:`~dynacp.integration.shapes.group_padded`), plus, in
    CUDA-graph mode, a last entry for the padding-only sequence up to the bucket, whose rows are made here."""
    blocks = [recv[a:b] for a, b in pieces]
    seq_lens = [lengths[s] for s in seqs]
    if len(padded) > len(seqs):  # the padding-only tail sequence: nothing travelled for it
        empty = {name: torch.empty(0, dtype=dtypes[name]) for name in FIELDS}
        tail = torch.empty(padded[-1] // len(ring), WIDTH, dtype=torch.int64)
        slice_rows(empty, -1, len(ring), cp_rank, tail, padded=padded[-1])
        blocks.append(tail)
        seq_lens.append(0)
    rows = torch.cat(blocks)
    mb = {name: from_i64(rows[:, f].contiguous(), dtypes[name]) for f, name in enumerate(FIELDS)}
    mb.update(microbatch_meta(slot, ring, cp_rank, seqs, seq_lens, padded, static_shapes))
    mb["sequence_ids"] = rows[:, len(FIELDS)].contiguous()
    return mb


def attach_groups(microbatches: list[dict], rings: list[tuple[int, ...]], groups: ProcessGroups,
                  use_megatron: Optional[bool]) -> None:
    """Make the rings runnable (``cp_groups="lazy"``: create the groups of new rings, collective over the world;
    ``"prebuilt"``: check them against the set; ``"pool"``: nothing) and attach each microbatch's packed params,
    its :class:`~dynacp.integration.config.CPRing` (``"cp_ring"``), its
    :class:`~dynacp.integration.shapes.MicrobatchShape` (``"shape"``) and its TransformerEngine CP parameters
    (``"te"``, :class:`~dynacp.integration.packed.TEContextParallel`)."""
    g = groups
    g.cp_pool.ensure(rings)
    for mb in microbatches:
        ring = mb["ring"]
        if mb["cp_rank"] is None:
            mb["cp_rank"] = list(ring).index(g.pool_index)
        group = g.cp_pool.get(ring)
        mb["cp_ring"] = g.cp_pool.ring(ring, g.dp_cp, g.pool_index)
        mb["shape"] = shape_of(mb)
        mb["packed_seq_params"] = make_packed_seq_params(
            mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"], len(ring), group, use_megatron=use_megatron)
        mb["te"] = make_te_context_parallel(group, [g.pool_ranks[i] for i in ring], mb["cp_rank"],
                                            mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"])
