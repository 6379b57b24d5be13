"""Ring attention and packing-metadata broadcast over torch.distributed (see docs/runtime.md)."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from dynacp import _core
from dynacp.torch import ring_comm, ring_loop

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


_CPU_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_CUDA_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _acc_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """Type of out/lse/dq/dk/dv inside the ring: the input type on the CPU, float32 on CUDA."""
    return dtype if device.type == "cpu" else torch.float32


def _cuda_extension():
    """dynacp._cuda, or a RuntimeError saying what is missing."""
    try:
        from dynacp import _cuda  # type: ignore[attr-defined]
    except ImportError as e:
        raise RuntimeError(
            "dynacp.torch.ring_attention got CUDA tensors, but this dynacp build has no CUDA support: the extension "
            "module dynacp._cuda is missing. It is built only when CMake finds the CUDA compiler (nvcc); install the "
            "CUDA toolkit and rebuild (pip install ., or cmake -DDYNACP_CUDA=ON), or pass CPU tensors over a gloo "
            f"group. Import error: {e}"
        ) from e
    return _cuda


def _ring_device(device: torch.device, dtype: torch.dtype):
    """The kernel provider of the C++ ring loop for tensors on `device`: CPU (Eigen) or CUDA kernels."""
    if device.type == "cpu":
        return _core.cpu_ring_device(_CPU_DTYPES[dtype])
    if device.type == "cuda":
        ext = _cuda_extension()
        index = device.index if device.index is not None else torch.cuda.current_device()
        return ext.CudaRingDevice(_CUDA_DTYPES[dtype], index, torch.cuda.current_stream(index).cuda_stream)
    raise ValueError(f"dynacp.torch.ring_attention runs on CPU and CUDA tensors, got device {device}")


def _stage_through_host(device: torch.device, group) -> bool:
    """Whether ring buffers on `device` go through host copies: CUDA buffers over a gloo group (gloo moves only CPU
    tensors). NCCL (or any backend other than gloo) gets the device buffers themselves (the rule of the Python loop,
    ``ring_comm.needs_host_staging``)."""
    return ring_comm.needs_host_staging(device, group)


class _Workspace:
    """The ring loop's scratch memory: one uint8 tensor on the device; P2P addresses map back to slices of it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffer: Optional[torch.Tensor] = None

    def alloc(self, nbytes: int) -> int:
        self.buffer = torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=self.device)
        return self.buffer.data_ptr()

    def view(self, address: int, nbytes: int) -> torch.Tensor:
        buf = self.buffer
        offset = address - (buf.data_ptr() if buf is not None else 0)
        if buf is None or offset < 0 or offset + nbytes > buf.numel():
            raise RuntimeError(f"ring exchange: buffer {address:#x} (+{nbytes} B) is outside the ring workspace")
        return buf[offset : offset + nbytes]


class _GroupExchange:
    """Grouped P2P for the C++ ring: posts every op with batch_isend_irecv and waits for each with a deadline.

    Buffers are slices of the workspace (CPU or CUDA memory). Work.wait(timeout) raises on gloo and, for NCCL,
    blocks the host until the work completes or the timeout passes (then torch aborts the NCCL communicator and
    raises); both become TimeoutError naming the peer. With `stage`, device buffers travel through host copies."""

    def __init__(self, group, rank: int, workspace: _Workspace, stage: bool = False,
                 ranks: Optional[Sequence[int]] = None):
        self.group = group
        self.rank = rank
        self.workspace = workspace
        self.stage = stage
        self.ranks = ranks  # group rank of each ring member (None: ring member i is group rank i)

    def __call__(self, ops, what: str, timeout_s: float) -> None:
        p2p, peers, tags, landing = [], [], {}, []
        for kind, peer, address, nbytes in ops:
            if nbytes == 0:
                continue
            buf = view = self.workspace.view(address, nbytes)
            if self.stage:  # the send copy waits for the device; received bytes land after the wait
                buf = view.to("cpu", copy=True) if kind == "send" else torch.empty(nbytes, dtype=torch.uint8)
                if kind == "recv":
                    landing.append((view, buf))
            key = (kind, peer)
            tag = tags.get(key, 0)  # the i-th message between a pair matches the i-th receive
            tags[key] = tag + 1
            fn = dist.isend if kind == "send" else dist.irecv
            group_peer = peer if self.ranks is None else self.ranks[peer]
            global_peer = dist.get_global_rank(self.group, group_peer)  # P2P peers are global ranks
            p2p.append(dist.P2POp(fn, buf, global_peer, self.group, tag))
            peers.append((kind, peer))
        if not p2p:
            return
        deadline = time.monotonic() + timeout_s
        works = dist.batch_isend_irecv(p2p)  # NCCL may coalesce the ops into fewer works: name the first op's peer
        for work, (kind, peer) in zip(works, peers):
            left = max(deadline - time.monotonic(), 1e-3)
            try:
                ok = work.wait(timeout=timedelta(seconds=left))
            except RuntimeError as e:  # gloo and NCCL raise on timeout (torch.distributed.DistBackendError)
                raise TimeoutError(
                    f"group rank {self.rank}: {what}: {kind} with peer {peer} did not complete within {timeout_s:g} s "
                    f"(the peer never answered; check that every rank of the group runs the same schedule): {e}"
                ) from e
            if ok is False:
                raise TimeoutError(f"group rank {self.rank}: {what}: {kind} with peer {peer} timed out after {timeout_s:g} s")
        for view, buf in landing:
            view.copy_(buf)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be [tokens, heads, dim], got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"q, k, v must be on one device, got {name} on {t.device} and q on {q.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.device.type == "cpu" and q.dtype not in _CPU_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; ring attention on CPU tensors supports float32 and float64")
    if q.device.type == "cuda" and q.dtype not in _CUDA_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; ring attention on CUDA tensors supports float32, bfloat16, float16")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"dynacp.torch.ring_attention runs on CPU and CUDA tensors, got device {q.device}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"q [T,H,D], k and v [T,Hkv,D] shapes disagree: {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")


class _Ring:
    """One ring_attention call: group, layout arguments and device; runs the C++ ring loop with the device's kernels.

    Every tensor handed to C++ is contiguous, on the device and of the documented shape and type: the loop gets
    addresses, and the kernels run on the current CUDA stream (so torch's stream ordering covers them)."""

    def __init__(self, group, rank, size, cu, cu_padded, causal, scale, timeout, device, dtype, ranks=None):
        self.group, self.rank, self.size, self.ranks = group, rank, size, ranks
        self.cu, self.cu_padded, self.causal, self.scale, self.timeout = cu, cu_padded, causal, scale, timeout
        self.device, self.dtype = device, dtype
        self.acc = _acc_dtype(device, dtype)
        ring_comm.ensure_warm(group, ranks if ranks is not None else range(size), device, timeout, None)

    def _run(self, fn, *tensors: torch.Tensor) -> None:
        q, k = tensors[0], tensors[1]
        shape = (q.shape[0], q.shape[1], k.shape[1], q.shape[2])
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            workspace = _Workspace(self.device)
            stage = _stage_through_host(self.device, self.group)
            exchange = _GroupExchange(self.group, self.rank, workspace, stage, self.ranks)
            comm = _core.make_callback_comm(self.rank, self.size, self.timeout, exchange)
            device = _ring_device(self.device, self.dtype)
            fn(comm, device, shape, *(t.data_ptr() for t in tensors), self.cu, self.cu_padded, self.causal,
               self.scale, workspace.alloc)

    def forward(self, q, k, v):
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        out = torch.empty(q.shape, dtype=self.acc, device=q.device)
        lse = torch.empty(q.shape[:2], dtype=self.acc, device=q.device)
        self._run(_core.ring_forward, q, k, v, out, lse)
        return out.to(self.dtype), lse

    def backward(self, q, k, v, out, lse, dout):
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        out = out.detach().to(self.acc).contiguous()
        dout = dout.detach().to(device=q.device, dtype=self.dtype).contiguous()
        dq = torch.empty(q.shape, dtype=self.acc, device=q.device)
        dk = torch.empty(k.shape, dtype=self.acc, device=q.device)
        dv = torch.empty(k.shape, dtype=self.acc, device=q.device)
        self._run(_core.ring_backward, q, k, v, out, lse.contiguous(), dout, dq, dk, dv)
        return dq.to(self.dtype), dk.to(self.dtype), dv.to(self.dtype)


class _PyRing:
    """One ring_attention call on the Python ring loop (ring_loop.py): block specs, neighbours, block function."""

    def __init__(self, group, ranks, cu, cu_padded, causal, scale, timeout, q, block, recorder):
        cp = len(ranks)
        self.dtype = q.dtype
        self.acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        self.comm = ring_loop.PoolP2P(group, ranks, timeout, recorder, q.device)
        cu_p = _core.zigzag_layout(cu, cp, cu_padded)
        flags = [bool(causal)] * (len(cu) - 1) if isinstance(causal, bool) else [bool(c) for c in causal]
        if len(flags) != len(cu) - 1:
            raise ValueError(f"causal: got {len(flags)} per-sequence flags for {len(cu) - 1} sequences")
        if q.shape[0] != int(cu_p[-1]) // cp:
            raise ValueError(f"q has {q.shape[0]} rows but the zigzag layout gives each of the {cp} ring members "
                             f"{int(cu_p[-1]) // cp} rows (cu_seqlens_padded[-1] / cp)")
        specs = ring_loop.build_specs(cu, cu_p, cp, self.comm.index, flags, q.device)
        fn = ring_loop.make_block(block, q.device, q.dtype, q.shape[2])
        self.loop = ring_loop.RingLoop(self.comm, specs, fn, ring_loop.default_scale(q.shape[2], scale), self.acc)

    def forward(self, q, k, v):
        out, lse = self.loop.forward(*(x.detach().contiguous() for x in (q, k, v)))
        return out.to(self.dtype), lse

    def backward(self, q, k, v, out, lse, dout):
        q, k, v = (x.detach().contiguous() for x in (q, k, v))
        dq, dk, dv = self.loop.backward(q, k, v, out.detach(), lse, dout.detach().to(self.dtype).contiguous())
        return dq.to(self.dtype), dk.to(self.dtype), dv.to(self.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):  # type: ignore[override]
        out, lse = ring.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ring.backward(q, k, v, out, lse, dout)
        return dq, dk, dv, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: ArrayLike,
    group: Any = None,
    causal: Union[bool, Sequence[bool]] = True,
    *,
    ranks: Optional[Sequence[int]] = None,
    cu_seqlens_padded: Optional[ArrayLike] = None,
    softmax_scale: Optional[float] = None,
    timeout: float = 60.0,
    return_lse: bool = False,
    loop: str = "python",
    block: Any = None,
    recorder: Optional[Callable[[str, int], None]] = None,
):
    """Zigzag ring attention over a ring of ranks of `group`, as an autograd function.

    With ``loop="python"`` (default) the Python ring loop (:mod:`dynacp.torch.ring_loop`) runs with a block function
    of the FlashAttention contract and exchanges kv (forward) and kv + dk/dv (backward) with ring neighbours by
    ``batch_isend_irecv`` on `group`, double-buffered (hop t+1 in flight while block t is computed):

    * ``block=None``: CPU tensors (float32/float64) use :class:`~dynacp.torch.ring_loop.TorchBlock` (torch ops);
      CUDA tensors use :class:`~dynacp.torch.ring_loop.FlashBlock` (aten FlashAttention-2 varlen kernels, float16 /
      bfloat16, head dim a multiple of 8 up to 256); anything missing raises RuntimeError naming it.
      ``block="torch"`` on CUDA is allowed with a warning (slow); or pass your own block function object.
    * The LSE merge runs in float32 (float64 for float64 inputs); out is returned in the input dtype.

    ``loop="cpp"`` runs the C++ ring executor instead (``_core.ring_forward``: Eigen kernels on the CPU, the
    reference CUDA kernels of ``dynacp._cuda`` on CUDA; no overlap), kept as a cross-check.

    Args:
        q, k, v: this rank's zigzag shard, [local_tokens, heads, dim] and [local_tokens, kv_heads, dim]
            (see :func:`zigzag_shard`), on one device with one dtype. kv_heads must divide heads (GQA).
        cu_seqlens: global offsets of the real tokens of the packed batch (the same on every ring member).
        group: the process group the ring's P2P runs on (default WORLD), e.g. the DP x CP pool: no group per ring.
        causal: one flag for all sequences, or one per sequence.
        ranks: group ranks of the ring members in ring order (ring position = zigzag chunk index); default every
            rank of `group` in group order. The CP degree is ``len(ranks)`` (any integer >= 1).
        cu_seqlens_padded: padded offsets; default pads each sequence to a multiple of 2 * cp.
        softmax_scale: default 1 / sqrt(dim).
        timeout: seconds each ring hop may take before TimeoutError on gloo (NCCL: the group's own timeout).
        return_lse: also return the natural-log LSE [local_tokens, heads] (-inf on padding rows), float32
            (float64 for float64 inputs).
        loop: "python" (default) or "cpp".
        block: the block function of the Python loop (see above).
        recorder: ``recorder(event, hop)`` called when a hop is posted / waited (tests and tracing).

    Returns:
        out [local_tokens, heads, dim] in the input dtype (zero on padding rows), and lse when return_lse.
    """
    _check_inputs(q, k, v)
    group = group if group is not None else dist.group.WORLD
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"global rank {dist.get_rank()} is not a member of the process group of the ring")
    ring_ranks = list(range(dist.get_world_size(group))) if ranks is None else [int(r) for r in ranks]
    if me not in ring_ranks:
        raise ValueError(f"group rank {me} is not in the ring {ring_ranks}")
    cu = _as_int64(cu_seqlens)
    cu_padded = _as_int64(cu_seqlens_padded)
    if loop == "python":
        ring: Any = _PyRing(group, ring_ranks, cu, cu_padded,
                            bool(causal) if isinstance(causal, (bool, np.bool_)) else list(causal),
                            softmax_scale, float(timeout), q, block, recorder)
    elif loop == "cpp":
        causal_arg = bool(causal) if isinstance(causal, (bool, np.bool_)) else np.asarray(causal, dtype=np.int64)
        ring = _Ring(group, ring_ranks.index(me), len(ring_ranks), cu, cu_padded, causal_arg,
                     float(softmax_scale or 0.0), float(timeout), q.device, q.dtype, ring_ranks)
    else:
        raise ValueError(f"loop must be 'python' or 'cpp', got {loop!r}")
    out, lse = _RingAttention.apply(q, k, v, ring)
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
