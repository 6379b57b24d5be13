"""Megatron-compatible packed-sequence parameters (``megatron.core.packed_seq_params.PackedSeqParams`` when
megatron-core is importable, a field-compatible dataclass otherwise)."""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

MegatronPackedSeqParams: Any = None
MEGATRON_IMPORT_ERROR: Optional[str] = None
_megatron_tried = False


def megatron_packed_seq_params_class() -> Any:
    """``megatron.core.packed_seq_params.PackedSeqParams``, imported on first use (megatron-core's import is slow and
    warns about missing Transformer Engine/Apex); ``None`` when it is not importable (see MEGATRON_IMPORT_ERROR)."""
    global MegatronPackedSeqParams, MEGATRON_IMPORT_ERROR, _megatron_tried
    if not _megatron_tried:
        _megatron_tried = True
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from megatron.core.packed_seq_params import PackedSeqParams as cls
            MegatronPackedSeqParams = cls
        except Exception as exc:  # ImportError, or megatron-core failing on import
            MEGATRON_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
    return MegatronPackedSeqParams


@dataclass
class PackedSeqParams:
    """Field-compatible stand-in for Megatron's ``PackedSeqParams`` (used when megatron-core is not importable)."""

    qkv_format: str = "thd"
    cu_seqlens_q: Optional[torch.Tensor] = None
    cu_seqlens_kv: Optional[torch.Tensor] = None
    cu_seqlens_q_padded: Optional[torch.Tensor] = None
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None
    max_seqlen_q: Optional[int] = None
    max_seqlen_kv: Optional[int] = None
    local_cp_size: Optional[int] = None
    cp_group: Any = None


def make_packed_seq_params(cu_seqlens: Sequence[int], cu_seqlens_padded: Sequence[int], max_seqlen: int,
                           local_cp_size: int, cp_group: Any, use_megatron: Optional[bool] = None) -> Any:
    """Build THD packed-sequence params. ``cu_seqlens`` are global offsets of the real tokens of the (unsliced)
    sequences, ``cu_seqlens_padded`` their offsets in the padded layout (each a multiple of ``2 * local_cp_size``);
    ``max_seqlen`` is the longest padded sequence. ``use_megatron``: ``True`` requires megatron-core, ``False`` uses the
    local dataclass, ``None`` uses Megatron's class when ``megatron.core`` is already imported (a Megatron training
    loop) so plain-PyTorch loops do not pay megatron-core's import."""
    cu = torch.tensor(list(cu_seqlens), dtype=torch.int32)
    cup = torch.tensor(list(cu_seqlens_padded), dtype=torch.int32)
    kwargs = dict(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cup,
                  cu_seqlens_kv_padded=cup, max_seqlen_q=int(max_seqlen), max_seqlen_kv=int(max_seqlen),
                  local_cp_size=int(local_cp_size), cp_group=cp_group)
    if use_megatron is None:
        use_megatron = "megatron.core" in sys.modules and megatron_packed_seq_params_class() is not None
    if use_megatron:
        cls = megatron_packed_seq_params_class()
        if cls is None:
            raise ImportError(f"megatron-core is not importable: {MEGATRON_IMPORT_ERROR}")
        return cls(**kwargs)
    return PackedSeqParams(**kwargs)


TE_COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")


@dataclass
class TEContextParallel:
    """What TransformerEngine's context-parallel attention needs for one microbatch on a CP group of any size.

    TE's ``DotProductAttention`` runs CP on the group set by ``set_context_parallel_group(cp_group, cp_global_ranks,
    cp_stream, cp_comm_type)`` and, for the THD format, takes ``cu_seqlens_q/kv`` (real tokens) and
    ``cu_seqlens_q/kv_padded`` in the forward. TE's padding rule: every sequence's padded length is a multiple of
    ``2 * cp_size`` (dynacp's zigzag layout pads to ``k * cp_size`` with ``k`` even, 2 by default, so the plan's
    padded offsets are used as they are; checked here). TE needs a real process group per ring, so use
    ``make_process_groups(cp_groups="prebuilt", ring_set=...)`` with ``Planner(ring_set=...)`` (bounded, created at
    start-up) or ``"lazy"``; with ``"pool"`` ``cp_group`` is ``None`` and :meth:`apply` raises.
    """

    cp_group: Any
    """The ring's own process group (``None`` for one rank, or in ``"pool"`` mode)."""
    cp_global_ranks: list[int]
    """Global ranks of the ring in ring order (TE's ``cp_global_ranks``)."""
    cp_size: int
    """Ring size (CP degree)."""
    cp_rank: int
    """This rank's ring position = zigzag chunk index = its rank in ``cp_group``."""
    cu_seqlens: torch.Tensor
    """int32 offsets of the real tokens (TE ``cu_seqlens_q`` and ``cu_seqlens_kv``)."""
    cu_seqlens_padded: torch.Tensor
    """int32 padded offsets, each sequence a multiple of ``2 * cp_size`` (TE ``cu_seqlens_q/kv_padded``)."""
    max_seqlen: int
    """Longest padded sequence, tokens (TE ``max_seqlen_q/kv``)."""
    cp_comm_type: str = "p2p"
    """TE's ``cp_comm_type``: "p2p" (ring; the zigzag layout dynacp builds), "a2a", "all_gather", "a2a+p2p"."""

    def __post_init__(self) -> None:
        if self.cp_comm_type not in TE_COMM_TYPES:
            raise ValueError(f"cp_comm_type must be one of {TE_COMM_TYPES}, got {self.cp_comm_type!r}")
        lens = (self.cu_seqlens_padded[1:] - self.cu_seqlens_padded[:-1]).tolist()
        bad = [i for i, n in enumerate(lens) if n % (2 * self.cp_size)]
        if bad:
            raise ValueError(f"sequences {bad[:4]} have padded lengths {[lens[i] for i in bad[:4]]} that are not "
                             f"multiples of 2 * cp_size = {2 * self.cp_size} (TransformerEngine's THD CP rule)")

    def attention_kwargs(self) -> dict:
        """Keyword arguments of TE ``DotProductAttention.forward`` for this THD microbatch."""
        return dict(qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
                    cu_seqlens_q_padded=self.cu_seqlens_padded, cu_seqlens_kv_padded=self.cu_seqlens_padded,
                    max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)

    def apply(self, attention: Any, cp_stream: Any = None) -> None:
        """Point a TE ``DotProductAttention`` (anything with ``set_context_parallel_group``) at this ring."""
        if self.cp_size > 1 and self.cp_group is None:
            raise RuntimeError("TransformerEngine context parallelism needs a process group per ring, but this "
                               "microbatch has none (cp_groups='pool'); build the groups with make_process_groups("
                               "cp_groups='prebuilt', ring_set=...) and Planner(ring_set=...)")
        attention.set_context_parallel_group(self.cp_group if self.cp_size > 1 else None, self.cp_global_ranks,
                                             cp_stream, self.cp_comm_type)


def make_te_context_parallel(cp_group: Any, global_ranks: Sequence[int], cp_rank: int, cu_seqlens: Sequence[int],
                             cu_seqlens_padded: Sequence[int], max_seqlen: int,
                             cp_comm_type: str = "p2p") -> TEContextParallel:
    """:class:`TEContextParallel` of one microbatch (offsets as int32 tensors)."""
    return TEContextParallel(cp_group, [int(r) for r in global_ranks], len(global_ranks), int(cp_rank),
                             torch.tensor(list(cu_seqlens), dtype=torch.int32),
                             torch.tensor(list(cu_seqlens_padded), dtype=torch.int32), int(max_seqlen), cp_comm_type)
