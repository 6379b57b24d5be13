"""Ring attention and packing-metadata broadcast over torch.distributed (see docs/runtime.md)."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from dynacp import _core

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[int]]


def _as_int64(x: Optional[ArrayLike]) -> Optional[np.ndarray]:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.int64))


def _group_rank(group) -> tuple:
    group = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"global rank {dist.get_rank()} is not a member of the process group it runs ring attention on")
    return group, rank, dist.get_world_size(group)


class _GroupExchange:
    """Grouped P2P for the C++ ring: posts every op with batch_isend_irecv, waits with a deadline."""

    def __init__(self, group, rank: int):
        self.group = group
        self.rank = rank

    def __call__(self, ops, what: str, timeout_s: float) -> None:
        p2p, peers, tags = [], [], {}
        for kind, peer, view in ops:
            if view.size == 0:
                continue
            key = (kind, peer)
            tag = tags.get(key, 0)  # the i-th message between a pair matches the i-th receive
            tags[key] = tag + 1
            fn = dist.isend if kind == "send" else dist.irecv
            global_peer = dist.get_global_rank(self.group, peer)  # P2P peers are global ranks
            p2p.append(dist.P2POp(fn, torch.from_numpy(view), global_peer, self.group, tag))
            peers.append((kind, peer))
        if not p2p:
            return
        deadline = time.monotonic() + timeout_s
        works = dist.batch_isend_irecv(p2p)
        for work, (kind, peer) in zip(works, peers):
            left = max(deadline - time.monotonic(), 1e-3)
            try:
                ok = work.wait(timeout=timedelta(seconds=left))
            except RuntimeError as e:  # gloo raises on timeout
                raise TimeoutError(
                    f"group rank {self.rank}: {what}: {kind} with peer {peer} did not complete within {timeout_s:g} s "
                    f"(the peer never answered; check that every rank of the group runs the same schedule): {e}"
                ) from e
            if ok is False:
                raise TimeoutError(f"group rank {self.rank}: {what}: {kind} with peer {peer} timed out after {timeout_s:g} s")


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cpu":
            raise ValueError(
                f"{name} is on {t.device}: dynacp.torch.ring_attention runs the C++ CPU kernels on CPU tensors over "
                "gloo; the CUDA path lives in the C++ runtime (dynacp_cuda)"
            )
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{name} has dtype {t.dtype}; CPU ring attention supports float32 and float64")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [tokens, heads, dim], got shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, comm, cu, cu_padded, causal, scale):  # type: ignore[override]
        out, lse = _core.ring_attention_forward(comm, _np(q), _np(k), _np(v), cu, cu_padded, causal, scale)
        out_t, lse_t = torch.from_numpy(out), torch.from_numpy(lse)
        ctx.save_for_backward(q, k, v, out_t, lse_t)
        ctx.args = (comm, cu, cu_padded, causal, scale)
        ctx.mark_non_differentiable(lse_t)
        return out_t, lse_t

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        comm, cu, cu_padded, causal, scale = ctx.args
        dq, dk, dv = _core.ring_attention_backward(
            comm, _np(q), _np(k), _np(v), _np(out), _np(lse), _np(dout.to(q.dtype)), cu, cu_padded, causal, scale
        )
        return torch.from_numpy(dq), torch.from_numpy(dk), torch.from_numpy(dv), None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: ArrayLike,
    group: Any = None,
    causal: Union[bool, Sequence[bool]] = True,
    *,
    cu_seqlens_padded: Optional[ArrayLike] = None,
    softmax_scale: Optional[float] = None,
    timeout: float = 60.0,
    return_lse: bool = False,
):
    """Zigzag ring attention over the ranks of `group` (default: WORLD).

    Args:
        q, k, v: this rank's zigzag shard, [local_tokens, heads, dim] and [local_tokens, kv_heads, dim]
            (see :func:`zigzag_shard`); float32 or float64 CPU tensors. kv_heads must divide heads (GQA).
        cu_seqlens: global offsets of the real tokens of the packed batch (the same on every rank).
        group: the CP process group; its size is the CP degree (any integer >= 1).
        causal: one flag for all sequences, or one per sequence.
        cu_seqlens_padded: padded offsets; default pads each sequence to a multiple of 2 * cp.
        softmax_scale: default 1 / sqrt(dim).
        timeout: seconds each ring exchange may take before TimeoutError.
        return_lse: also return the fp32/fp64 log-sum-exp [local_tokens, heads] (-inf on padding rows).

    Returns:
        out [local_tokens, heads, dim] (zero on padding rows), and lse when return_lse.
    """
    _check_inputs(q, k, v)
    group, rank, size = _group_rank(group)
    cu = _as_int64(cu_seqlens)
    cu_padded = _as_int64(cu_seqlens_padded)
    causal_arg = bool(causal) if isinstance(causal, (bool, np.bool_)) else np.asarray(causal, dtype=np.int64)
    comm = _core.make_callback_comm(rank, size, float(timeout), _GroupExchange(group, rank))
    out, lse = _RingAttention.apply(q, k, v, comm, cu, cu_padded, causal_arg, float(softmax_scale or 0.0))
    return (out, lse) if return_lse else out


def zigzag_shard(
    x: torch.Tensor, cu_seqlens: ArrayLike, cp: int, rank: int, cu_seqlens_padded: Optional[ArrayLike] = None
) -> torch.Tensor:
    """Rows of the packed tensor `x` ([tokens, ...]) that `rank` holds in the zigzag layout; padding rows are zero.
    Differentiable (an index_select), so gradients flow back to the global tensor."""
    rows = torch.from_numpy(_core.zigzag_rows(_as_int64(cu_seqlens), cp, rank, _as_int64(cu_seqlens_padded)))
    ext = torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))])
    return ext.index_select(0, torch.where(rows >= 0, rows, torch.full_like(rows, x.shape[0])))


def zigzag_gather(
    local: torch.Tensor, cu_seqlens: ArrayLike, group: Any = None, cu_seqlens_padded: Optional[ArrayLike] = None
) -> torch.Tensor:
    """Inverse of :func:`zigzag_shard` over the group: every rank gets the global [tokens, ...] tensor."""
    group, _, size = _group_rank(group)
    cu = _as_int64(cu_seqlens)
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    out = local.new_zeros((int(cu[-1]),) + tuple(local.shape[1:]))
    for r, part in enumerate(parts):
        rows = torch.from_numpy(_core.zigzag_rows(cu, size, r, _as_int64(cu_seqlens_padded)))
        keep = rows >= 0
        out[rows[keep]] = part[keep]
    return out


def encode_packing(microbatches: Sequence[dict]) -> np.ndarray:
    """int64 buffer: header [version, count, payload length, checksum] + payload (see docs/runtime.md)."""
    return _core.encode_packing(list(microbatches))


def decode_packing(buffer: ArrayLike) -> list:
    """Inverse of :func:`encode_packing`; RuntimeError on version, length or checksum mismatch."""
    return _core.decode_packing(_as_int64(buffer))


def _wait(work, timeout: float, what: str) -> None:
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as e:
        raise TimeoutError(f"{what} did not complete within {timeout:g} s: {e}") from e
    if ok is False:
        raise TimeoutError(f"{what} did not complete within {timeout:g} s")


def broadcast_packing(
    microbatches: Optional[Sequence[dict]], src: int, group: Any = None, timeout: float = 60.0
) -> list:
    """Broadcasts packing metadata from global rank `src` (e.g. the first pipeline stage) to every rank of `group`
    as int64 tensors (exact beyond 2^24): first the fixed header, then the payload. Each broadcast waits at most
    `timeout` seconds (TimeoutError). Receivers validate version and checksum (RuntimeError on mismatch).
    CPU tensors: use a gloo group (for an NCCL group, broadcast on the device and decode on the host)."""
    header_size = int(_core.PACKING_HEADER_SIZE)
    if dist.get_rank() == src:
        if microbatches is None:
            raise ValueError("the source rank must pass the microbatches to broadcast")
        buf = torch.from_numpy(encode_packing(microbatches))
    else:
        buf = torch.zeros(header_size, dtype=torch.int64)
    header = buf[:header_size].clone()
    _wait(dist.broadcast(header, src=src, group=group, async_op=True), timeout, f"packing header broadcast from {src}")
    length = int(header[2])
    if length < 0 or length > (1 << 40):
        raise RuntimeError(f"packing metadata: implausible payload length {length} in the broadcast header")
    payload = buf[header_size:].clone() if dist.get_rank() == src else torch.zeros(length, dtype=torch.int64)
    if length:
        _wait(dist.broadcast(payload, src=src, group=group, async_op=True), timeout, f"packing payload broadcast from {src}")
    return decode_packing(torch.cat([header, payload]))
