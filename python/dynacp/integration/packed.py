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
