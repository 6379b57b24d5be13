"""Attention over packed THD microbatches: a single-process reference, a simple all-gather CP oracle, and the
dispatch to the runtime's ring attention.

* :func:`reference_attention` - one process, whole (unsliced) sequences; the ground truth of the gradient test.
* :func:`allgather_kv_attention` - CP over a torch.distributed group by all-gathering K and V (autograd: the
  backward all-reduces dK/dV and keeps the local rows). O(total tokens) memory per rank: a correctness oracle and a
  fallback, not the production path.
* :func:`cp_attention` - uses ``dynacp.torch.ring_attention`` (the runtime's zigzag ring attention) when it is
  importable and ``impl`` allows it, otherwise the oracle.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from dynacp.integration.layout import zigzag_global_rows


def _ring_attention():
    """``dynacp.torch.ring_attention`` when importable and the loaded extension has its kernels, else ``None``."""
    try:
        from dynacp import _core
        from dynacp.torch import ring_attention  # type: ignore[import-not-found]
    except Exception:
        return None
    return ring_attention if hasattr(_core, "ring_forward") else None


def ring_attention_available() -> bool:
    """Whether the runtime's ``dynacp.torch.ring_attention`` is importable."""
    return _ring_attention() is not None


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """q (Tq,H,D), k/v (Tk,H,D), allowed (Tq,Tk) bool -> (Tq,H,D). Rows with no allowed key give 0."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Sequence[int],
                        causal: bool = True) -> torch.Tensor:
    """Packed THD attention in one process: ``q/k/v`` are (T, H, D) with the sequences at ``cu_seqlens``."""
    out = []
    cu = [int(x) for x in cu_seqlens]
    for a, b in zip(cu[:-1], cu[1:]):
        n = b - a
        allowed = torch.ones(n, n, dtype=torch.bool)
        if causal:
            allowed = torch.tril(allowed)
        out.append(_masked_attention(q[a:b], k[a:b], v[a:b], allowed))
    return torch.cat(out) if out else q.new_zeros(q.shape)


class _AllGather(torch.autograd.Function):
    """All-gather equal-shaped tensors along a new leading dim; backward sums every member's gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None


def _row_info(cu_seqlens: Sequence[int], cu_seqlens_padded: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """Per row of the padded packed layout: sequence index, position in its sequence, real (not padding)."""
    seq, pos, real = [], [], []
    for b in range(len(cu_seqlens_padded) - 1):
        n_pad = int(cu_seqlens_padded[b + 1]) - int(cu_seqlens_padded[b])
        n = int(cu_seqlens[b + 1]) - int(cu_seqlens[b])
        seq.append(torch.full((n_pad,), b))
        p = torch.arange(n_pad)
        pos.append(p)
        real.append(p < n)
    if not seq:
        z = torch.zeros(0, dtype=torch.long)
        return z, z, z.bool()
    return torch.cat(seq), torch.cat(pos), torch.cat(real)


def allgather_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Sequence[int],
                           cu_seqlens_padded: Sequence[int], group: Optional[dist.ProcessGroup],
                           causal: bool = True) -> torch.Tensor:
    """Zigzag-CP attention by all-gathering K/V over ``group`` (``None``: CP size 1).

    ``q/k/v`` hold this rank's zigzag rows (``cu_seqlens_padded[-1] / cp`` rows); ``cu_seqlens`` and
    ``cu_seqlens_padded`` describe the whole (unsliced) sequences. Padding keys are never attended to.
    """
    cp = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    seq, pos, real = _row_info(cu_seqlens, cu_seqlens_padded)
    if cp == 1:
        k_all, v_all = k, v
        k_rows = zigzag_global_rows(cu_seqlens_padded, 1, 0)
    else:
        k_all = _AllGather.apply(k, group).reshape(-1, *k.shape[1:])
        v_all = _AllGather.apply(v, group).reshape(-1, *v.shape[1:])
        k_rows = torch.cat([zigzag_global_rows(cu_seqlens_padded, cp, j) for j in range(cp)])
    q_rows = zigzag_global_rows(cu_seqlens_padded, cp, rank)
    allowed = (seq[q_rows][:, None] == seq[k_rows][None, :]) & real[k_rows][None, :]
    if causal:
        allowed &= pos[k_rows][None, :] <= pos[q_rows][:, None]
    return _masked_attention(q, k_all, v_all, allowed)


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed_seq_params: Any, causal: bool = True,
                 impl: str = "auto", cp_ring: Any = None, **ring_kwargs: Any) -> torch.Tensor:
    """Attention of one zigzag CP-sliced THD microbatch described by Megatron-style ``packed_seq_params``.

    ``impl``: ``"ring"`` (runtime ring attention, error if missing), ``"allgather"`` (the oracle; needs the ring's
    own group), ``"auto"`` (ring when importable). ``cp_ring``: the microbatch's
    :class:`~dynacp.integration.config.CPRing` (``mb["cp_ring"]``): the ring then runs on its group by its ranks --
    with ``cp_groups="pool"`` the pool group, no group per ring. Without it the ring runs on
    ``packed_seq_params.cp_group``. ``ring_kwargs`` go to ``dynacp.torch.ring_attention`` (e.g. ``block=``).
    """
    p = packed_seq_params
    cp = p.local_cp_size or 1
    group = p.cp_group if cp > 1 else None
    ring = _ring_attention() if impl in ("auto", "ring") else None
    if impl == "ring" and ring is None:
        raise ImportError("dynacp.torch.ring_attention is not available")
    if cp > 1 and ring is not None and cp_ring is not None:
        return ring(q, k, v, p.cu_seqlens_q, cp_ring.group, causal=causal, ranks=list(cp_ring.ranks),
                    cu_seqlens_padded=p.cu_seqlens_q_padded, **ring_kwargs)
    if cp > 1 and group is None:
        raise ValueError(f"this microbatch runs on a {cp}-rank ring without a group of its own (cp_groups='pool'): "
                         "pass cp_ring=mb['cp_ring'] and use the ring attention (impl='ring' or 'auto'); the "
                         "all-gather oracle needs cp_groups='lazy' or 'prebuilt'")
    if ring is not None and group is not None:
        return ring(q, k, v, p.cu_seqlens_q, group, causal=causal, cu_seqlens_padded=p.cu_seqlens_q_padded,
                    **ring_kwargs)
    return allgather_kv_attention(q, k, v, p.cu_seqlens_q.tolist(), p.cu_seqlens_q_padded.tolist(), group, causal)
