"""The Python zigzag ring loop: one loop for every device, with a pluggable block function (see docs/runtime.md).

The loop runs the schedule of the C++ ``runtime::ring_blocks`` (``_core.ring_blocks``, through :func:`step_blocks`), the double-buffered K/V exchange, the LSE merge (fp32; fp64 for fp64 inputs)
and the backward order (dK/dV travel the ring with the K/V they belong to and reach their owner one hop after the last
step). A *block function* computes one ring step's attention over variable-length blocks with the FlashAttention
contract -- the forward returns ``(out, lse)``, the backward takes ``(dout, q, k, v, out, lse)`` with the *global*
out and LSE -- so the same loop runs:

* :class:`TorchBlock` on any device with plain torch ops (fp32/fp64; the CPU path that CI tests line by line), and
* :class:`FlashBlock` on CUDA with the aten FlashAttention-2 varlen kernels that back
  ``torch.nn.attention.varlen.varlen_attn`` (bf16/fp16, head dim <= 256 and a multiple of 8).

Communication: P2P between ring neighbours over one process group (the DP x CP pool), addressed by the group ranks
listed in ``ranks``, so no process group per ring is needed. Every hop is posted with ``dist.batch_isend_irecv``
*before* the block of the current step is computed (the receive for hop t+1 is in flight while block t runs) and is
waited for only when its buffer is needed; on NCCL ``Work.wait()`` makes the current stream wait (no host sync), on
gloo it waits with the ring's timeout.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional, Protocol, Sequence

import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger("dynacp")

Recorder = Callable[[str, int], None]
"""``recorder(event, index)``: called with ("post_kv", hop), ("post_dkv", hop), ("wait_kv", hop), ("wait_dkv", hop)."""


# -- schedule ---------------------------------------------------------------------------------------------------------

def step_blocks(cu_seqlens: np.ndarray, cu_padded: np.ndarray, cp: int, rank: int, step: int,
                causal: Sequence[bool]) -> np.ndarray:
    """The blocks of one ring step as int64 ``[n, 10]`` rows ``(row0, chunk, q_lo, q_hi, k_lo, k_hi, len, q_holder,
    k_holder, causal)``: the C++ schedule itself (``runtime::ring_blocks``, exposed as ``_core.ring_blocks``), so the
    CPU executor, the CUDA executor and this loop run one schedule."""
    from dynacp import _core

    flags = np.asarray([bool(c) for c in causal], dtype=np.int64)
    return _core.ring_blocks(np.asarray(cu_seqlens, dtype=np.int64), cp, rank, step, flags,
                             np.asarray(cu_padded, dtype=np.int64))


def _valid_rows(row0: int, chunk: int, lo: int, hi: int, length: int, holder: int, cp: int) -> np.ndarray:
    """Local rows ``row0 + j`` (``lo <= j < hi``) of a holder whose zigzag position is a real (non-padding) token."""
    j = np.arange(lo, hi, dtype=np.int64)
    pos = np.where(j < chunk, holder * chunk + j, (2 * cp - 1 - holder) * chunk + (j - chunk))
    return row0 + j[pos < length]


@dataclass
class BlockSpec:
    """One block-function call: varlen q rows x kv rows of several sequences, one mask.

    ``q_idx``/``k_idx`` are local rows (of the local q and of the held kv buffer), sequence after sequence;
    ``cu_q``/``cu_k`` (int32, on the device) and ``cu_q_host``/``cu_k_host`` their offsets; ``causal`` applies the
    causal mask (only on the diagonal block, where q and kv rows are the same positions, so top-left = by position).
    """

    q_idx: torch.Tensor
    k_idx: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    cu_q_host: list[int]
    cu_k_host: list[int]
    max_q: int
    max_k: int
    causal: bool
    q_all: bool = False
    """``q_idx`` is every local row in order (the block reads q and writes out without a gather)."""
    k_all: bool = False
    """``k_idx`` is every row of the kv buffer in order."""


def build_specs(cu_seqlens: np.ndarray, cu_padded: np.ndarray, cp: int, rank: int, causal: Sequence[bool],
                device: torch.device) -> list[list[BlockSpec]]:
    """Every step's block specs, built on the host and uploaded once per layout: every layer of a microbatch has the
    same cu_seqlens, so later calls reuse the first one's specs (read-only; no host sync per hop)."""
    key = (np.asarray(cu_seqlens, dtype=np.int64).tobytes(), np.asarray(cu_padded, dtype=np.int64).tobytes(), cp,
           rank, tuple(bool(c) for c in causal), str(device))
    return _cached_specs(key)


@functools.lru_cache(maxsize=64)
def _cached_specs(key: tuple) -> list[list[BlockSpec]]:
    cu_b, cu_p_b, cp, rank, causal, device = key
    return _build_specs(np.frombuffer(cu_b, dtype=np.int64), np.frombuffer(cu_p_b, dtype=np.int64), cp, rank, causal,
                        torch.device(device))


def _build_specs(cu_seqlens: np.ndarray, cu_padded: np.ndarray, cp: int, rank: int, causal: Sequence[bool],
                 device: torch.device) -> list[list[BlockSpec]]:
    rows = int(cu_padded[-1]) // cp
    steps = []
    for t in range(cp):
        groups: dict[bool, tuple[list, list]] = {}
        for row0, chunk, q_lo, q_hi, k_lo, k_hi, length, qh, kh, diag in step_blocks(cu_seqlens, cu_padded, cp,
                                                                                     rank, t, causal):
            qi = _valid_rows(row0, chunk, q_lo, q_hi, length, qh, cp)
            ki = _valid_rows(row0, chunk, k_lo, k_hi, length, kh, cp)
            if qi.size == 0 or ki.size == 0:
                continue
            if diag and not (qh == kh and len(qi) == len(ki)):
                raise RuntimeError(f"ring schedule: diagonal block of step {t} on rank {rank} is not square")
            qs, ks = groups.setdefault(bool(diag), ([], []))
            qs.append(qi)
            ks.append(ki)
        steps.append([_spec(qs, ks, diag, device, rows) for diag, (qs, ks) in sorted(groups.items())])
    return steps


def _spec(qs: list, ks: list, diag: bool, device: torch.device, rows: int) -> BlockSpec:
    cu_q = np.concatenate([[0], np.cumsum([len(x) for x in qs])]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum([len(x) for x in ks])]).astype(np.int64)
    q_idx, k_idx = np.concatenate(qs), np.concatenate(ks)

    def up(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype, non_blocking=True)

    def everything(idx: np.ndarray) -> bool:
        return len(idx) == rows and bool(np.all(idx == np.arange(rows)))

    return BlockSpec(up(q_idx, torch.long), up(k_idx, torch.long), up(cu_q, torch.int32), up(cu_k, torch.int32),
                     cu_q.tolist(), cu_k.tolist(), int(np.diff(cu_q).max()), int(np.diff(cu_k).max()), diag,
                     everything(q_idx), everything(k_idx))


def _rows(x: torch.Tensor, idx: torch.Tensor, everything: bool) -> torch.Tensor:
    return x if everything else x.index_select(0, idx)


# -- block functions --------------------------------------------------------------------------------------------------

class BlockFunction(Protocol):
    """One ring step's attention over a :class:`BlockSpec` (the FlashAttention varlen contract).

    ``forward(q, k, v, spec, scale) -> (out [nq, H, D], lse [nq, H])``: natural-log LSE, float32 or wider.
    ``backward(dout, q, k, v, out, lse, spec, scale) -> (dq, dk, dv)``: ``out``/``lse`` are the rows of the final
    (merged) output and LSE; ``dk``/``dv`` have the kv heads (GQA groups summed)."""

    name: str

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: BlockSpec,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, spec: BlockSpec, scale: float) -> tuple[torch.Tensor, torch.Tensor,
                                                                           torch.Tensor]: ...


class TorchBlock:
    """Block function in plain torch ops, one sequence at a time, computed in ``dtype`` (float32 or float64).

    Runs on any device; it is the CPU path (and the oracle of the loop in CI). Quadratic memory per sequence."""

    name = "torch"

    def __init__(self, dtype: torch.dtype = torch.float32):
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"TorchBlock computes in float32 or float64, got {dtype}")
        self.dtype = dtype

    def _seq(self, spec: BlockSpec, i: int, q, k, v):
        a, b = spec.cu_q_host[i], spec.cu_q_host[i + 1]
        c, d = spec.cu_k_host[i], spec.cu_k_host[i + 1]
        g = q.shape[1] // k.shape[1]
        qs = q[a:b].to(self.dtype)
        ks, vs = (x[c:d].to(self.dtype).repeat_interleave(g, 1) for x in (k, v))
        return (a, b, c, d), qs, ks, vs

    @staticmethod
    def _mask(scores: torch.Tensor, causal: bool) -> torch.Tensor:
        if not causal:
            return scores
        n = scores.shape[-1]
        return scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=scores.device).triu(1), float("-inf"))

    def forward(self, q, k, v, spec, scale):
        out = torch.empty(q.shape, dtype=self.dtype, device=q.device)
        lse = torch.empty(q.shape[:2], dtype=self.dtype, device=q.device)
        for i in range(len(spec.cu_q_host) - 1):
            (a, b, _, _), qs, ks, vs = self._seq(spec, i, q, k, v)
            s = self._mask(torch.einsum("ihd,jhd->hij", qs, ks) * scale, spec.causal)
            ls = torch.logsumexp(s, -1)
            out[a:b] = torch.einsum("hij,jhd->ihd", torch.exp(s - ls[..., None]), vs)
            lse[a:b] = ls.transpose(0, 1)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        g = q.shape[1] // k.shape[1]
        dq = torch.zeros(q.shape, dtype=self.dtype, device=q.device)
        dk = torch.zeros(k.shape, dtype=self.dtype, device=q.device)
        dv = torch.zeros(k.shape, dtype=self.dtype, device=q.device)
        for i in range(len(spec.cu_q_host) - 1):
            (a, b, c, d), qs, ks, vs = self._seq(spec, i, q, k, v)
            do, o = dout[a:b].to(self.dtype), out[a:b].to(self.dtype)
            s = self._mask(torch.einsum("ihd,jhd->hij", qs, ks) * scale, spec.causal)
            p = torch.exp(s - lse[a:b].to(self.dtype).transpose(0, 1)[..., None])
            dp = torch.einsum("ihd,jhd->hij", do, vs)
            ds = p * (dp - (do * o).sum(-1).transpose(0, 1)[..., None])
            dq[a:b] = torch.einsum("hij,jhd->ihd", ds, ks) * scale
            dks = torch.einsum("hij,ihd->jhd", ds, qs) * scale
            dvs = torch.einsum("hij,ihd->jhd", p, do)
            dk[c:d] = dks.reshape(d - c, k.shape[1], g, -1).sum(2)
            dv[c:d] = dvs.reshape(d - c, k.shape[1], g, -1).sum(2)
        return dq, dk, dv


FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


class FlashBlock:
    """Block function on the aten FlashAttention-2 varlen kernels (``aten._flash_attention_forward/backward``, the
    kernels behind ``torch.nn.attention.varlen.varlen_attn``): CUDA, float16/bfloat16, head dim a multiple of 8 and
    at most 256, sm80 or newer. GQA is native (kv heads divide q heads). The LSE comes back float32 ``[H, nq]``.

    Construction checks everything it can and raises RuntimeError naming what is missing; it never falls back."""

    name = "flash"

    def __init__(self, device: torch.device, dtype: torch.dtype, head_dim: int):
        missing = flash_missing(device, dtype, head_dim)
        if missing:
            raise RuntimeError(f"dynacp ring attention: the FlashAttention block function cannot run: {missing}")
        self._unused = torch.empty(0, device=device)
        self._rng = torch.zeros(2, dtype=torch.uint64, device=device)

    def forward(self, q, k, v, spec, scale):
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, spec.cu_q, spec.cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, False, scale=scale)
        return out, lse.transpose(0, 1)

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.transpose(0, 1).contiguous().float(), spec.cu_q,
            spec.cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, self._rng, self._unused, scale=scale)
        return dq, dk, dv


def flash_missing(device: torch.device, dtype: torch.dtype, head_dim: int) -> Optional[str]:
    """What the FlashAttention block function lacks for these inputs (None when it can run)."""
    if device.type != "cuda":
        return f"the tensors are on {device}; FlashAttention kernels need CUDA tensors (use block='torch' on CPU)"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or no CUDA driver)"
    if not torch.backends.cuda.is_flash_attention_available():
        return f"this torch build ({torch.__version__}) has no FlashAttention kernels"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"FlashAttention needs compute capability >= 8.0, {torch.cuda.get_device_name(device)} is {major}.{minor}"
    if dtype not in FLASH_DTYPES:
        return f"dtype {dtype} is not supported by FlashAttention (float16 or bfloat16); cast q, k, v"
    if head_dim % 8 or head_dim > FLASH_MAX_HEAD_DIM:
        return f"head dim {head_dim} is not supported by FlashAttention (a multiple of 8, at most {FLASH_MAX_HEAD_DIM})"
    return None


def make_block(block, device: torch.device, dtype: torch.dtype, head_dim: int) -> BlockFunction:
    """``None``: :class:`TorchBlock` on the CPU, :class:`FlashBlock` on CUDA; "torch"/"flash" by name; or an object
    with the :class:`BlockFunction` methods. A torch block on CUDA is allowed but logs a warning (it is slow)."""
    if block is None:
        block = "flash" if device.type == "cuda" else "torch"
    if block == "flash":
        return FlashBlock(device, dtype, head_dim)
    if block == "torch":
        if device.type == "cuda":
            log.warning("dynacp ring attention: block='torch' on CUDA computes attention with plain torch ops "
                        "(no FlashAttention kernels): correct but slow")
        return TorchBlock(torch.float64 if dtype == torch.float64 else torch.float32)
    if isinstance(block, str):
        raise ValueError(f"block must be None, 'torch', 'flash' or a block function object, got {block!r}")
    return block


# -- communication ----------------------------------------------------------------------------------------------------

class _Hop:
    """One posted hop (a send to the next and a receive from the previous ring member), waited against one deadline
    on gloo (``timeout`` seconds from the wait); ``timeout=None`` (NCCL) waits stream-ordered, without a host sync."""

    def __init__(self, works, what: str, timeout: Optional[float], rank: int, peers: tuple[int, int]):
        self.works, self.what, self.timeout, self.rank, self.peers = works, what, timeout, rank, peers

    def wait(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for work in self.works:
            try:
                if deadline is None:
                    ok = work.wait()
                else:
                    ok = work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))
            except RuntimeError as e:
                raise TimeoutError(self._message() + f": {e}") from e
            if ok is False:
                raise TimeoutError(self._message())

    def _message(self) -> str:
        return (f"ring member {self.rank}: {self.what} (send to peer {self.peers[0]}, receive from peer "
                f"{self.peers[1]}; global ranks) did not complete within {self.timeout:g} s (a neighbour did not "
                "answer; every ring member must run the same ring with the same cu_seqlens)")


class PoolP2P:
    """Ring-neighbour P2P over one process group (the pool): ``ranks`` are the group ranks of the ring, in ring
    order. No group per ring: peers are translated to global ranks and messages carry per-kind tags."""

    def __init__(self, group, ranks: Sequence[int], timeout: float, recorder: Optional[Recorder] = None):
        self.group = group
        me = dist.get_rank(group)
        if me not in ranks:
            raise ValueError(f"group rank {me} is not a member of the ring {list(ranks)}")
        self.index, self.size = list(ranks).index(me), len(ranks)
        self.next = dist.get_global_rank(group, ranks[(self.index + 1) % self.size])
        self.prev = dist.get_global_rank(group, ranks[(self.index - 1) % self.size])
        gloo = str(dist.get_backend(group)) == "gloo"
        self.timeout = timeout if gloo else None  # NCCL: stream-ordered wait, the group's watchdog catches hangs
        self.recorder = recorder

    def post(self, send: torch.Tensor, recv: torch.Tensor, kind: str, hop: int) -> _Hop:
        tag = 2 * hop + (0 if kind == "kv" else 1)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        works = dist.batch_isend_irecv(ops)
        if self.recorder:
            self.recorder(f"post_{kind}", hop)
        return _Hop(works, f"{kind} hop {hop}", self.timeout, self.index, (self.next, self.prev))

    def wait(self, hop: _Hop, kind: str, index: int) -> None:
        hop.wait()
        if self.recorder:
            self.recorder(f"wait_{kind}", index)


class LocalHub:
    """Mailboxes of an in-process ring whose members are threads of one process (one device): a hop is a device
    copy. Used to run every member of a CP ring on one GPU (benchmarks/gpu_ring.py, tests/gpu) and in CPU tests."""

    def __init__(self, size: int, timeout: float = 60.0):
        self.size, self.timeout = size, timeout
        self._boxes: dict = {}
        self._cv = threading.Condition()

    def deliver(self, dst: int, key: tuple, tensor: torch.Tensor) -> None:
        with self._cv:  # FIFO per (destination, kind, hop): a forward's and a backward's hop 1 may both wait
            self._boxes.setdefault((dst, key), collections.deque()).append(tensor)
            self._cv.notify_all()

    def take(self, dst: int, key: tuple) -> torch.Tensor:
        with self._cv:
            if not self._cv.wait_for(lambda: bool(self._boxes.get((dst, key))), timeout=self.timeout):
                raise TimeoutError(f"local ring member {dst}: {key[0]} hop {key[1]} did not arrive within "
                                   f"{self.timeout:g} s")
            return self._boxes[(dst, key)].popleft()


class _LocalHop:
    def __init__(self, hub: LocalHub, index: int, key: tuple, recv: torch.Tensor):
        self.hub, self.index, self.key, self.recv = hub, index, key, recv

    def wait(self) -> None:
        self.recv.copy_(self.hub.take(self.index, self.key))


class LocalComm:
    """The :class:`PoolP2P` interface for member ``index`` of an in-process ring (see :class:`LocalHub`)."""

    def __init__(self, hub: LocalHub, index: int, recorder: Optional[Recorder] = None):
        self.hub, self.index, self.size, self.recorder = hub, index, hub.size, recorder

    def post(self, send: torch.Tensor, recv: torch.Tensor, kind: str, hop: int) -> _LocalHop:
        self.hub.deliver((self.index + 1) % self.size, (kind, hop), send.clone())
        if self.recorder:
            self.recorder(f"post_{kind}", hop)
        return _LocalHop(self.hub, self.index, (kind, hop), recv)

    def wait(self, hop: _LocalHop, kind: str, index: int) -> None:
        hop.wait()
        if self.recorder:
            self.recorder(f"wait_{kind}", index)


def run_local_ring(size: int, fn: Callable[[LocalComm], object], timeout: float = 60.0) -> list:
    """Run ``fn(comm)`` for every member of an in-process ring of ``size`` threads; returns the results by member
    and re-raises the first member's exception."""
    hub = LocalHub(size, timeout)
    results: list = [None] * size
    errors: list = []

    def member(i: int) -> None:
        try:
            results[i] = fn(LocalComm(hub, i))
        except BaseException as e:  # handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# -- the loop ---------------------------------------------------------------------------------------------------------

def _merge(out: torch.Tensor, lse: torch.Tensor, idx: torch.Tensor, ob: torch.Tensor, lb: torch.Tensor,
           everything: bool = False) -> None:
    """Merge a block's (out, lse) into the accumulators at rows ``idx`` (all rows when ``everything``),
    overflow-free; -inf blocks are skipped."""
    if everything:
        o, la = out, lse
    else:
        o, la = out.index_select(0, idx), lse.index_select(0, idx)
    ob, lb = ob.to(out.dtype), lb.to(lse.dtype)
    skip = lb == float("-inf")
    new_l = torch.maximum(la, lb) + torch.log1p(torch.exp(-(la - lb).abs()))
    new_o = o - torch.sigmoid(lb - la).unsqueeze(-1) * (o - ob)
    new_o, new_l = torch.where(skip.unsqueeze(-1), o, new_o), torch.where(skip, la, new_l)
    if everything:
        out.copy_(new_o)
        lse.copy_(new_l)
    else:
        out.index_copy_(0, idx, new_o)
        lse.index_copy_(0, idx, new_l)


class RingLoop:
    """One ring call's state: schedule, neighbours, block function, accumulation type."""

    def __init__(self, comm: PoolP2P | LocalComm, specs: list[list[BlockSpec]], block: BlockFunction,
                 scale: float, acc: torch.dtype):
        self.comm, self.specs, self.block, self.scale, self.acc = comm, specs, block, scale, acc
        self.cp = comm.size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out [T, H, D] (accumulation type; 0 on rows that see no key) and lse [T, H] (-inf there)."""
        out = torch.zeros(q.shape, dtype=self.acc, device=q.device)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=self.acc, device=q.device)
        bufs = [torch.stack([k, v]), None]
        for t in range(self.cp):
            cur = bufs[t % 2]
            hop = None
            if t + 1 < self.cp:  # post hop t+1 before computing block t
                bufs[(t + 1) % 2] = torch.empty_like(cur) if bufs[(t + 1) % 2] is None else bufs[(t + 1) % 2]
                hop = self.comm.post(cur, bufs[(t + 1) % 2], "kv", t + 1)
            for spec in self.specs[t]:
                ki = spec.k_idx
                ob, lb = self.block.forward(_rows(q, spec.q_idx, spec.q_all), _rows(cur[0], ki, spec.k_all),
                                            _rows(cur[1], ki, spec.k_all), spec, self.scale)
                _merge(out, lse, spec.q_idx, ob, lb, spec.q_all)
            if hop is not None:
                self.comm.wait(hop, "kv", t + 1)
        return out, lse

    def backward(self, q, k, v, out, lse, dout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """dq [T, H, D] and dk, dv [T, Hkv, D] in the accumulation type; dk/dv travel with their kv."""
        dq = torch.zeros(q.shape, dtype=self.acc, device=q.device)
        bufs = [torch.stack([k, v]), None]
        dkv_recv: list[Optional[torch.Tensor]] = [None, None]
        dkv_hop, dkv_sent = None, None  # dkv_sent keeps the tensor of the send in flight alive
        for t in range(self.cp):
            cur = bufs[t % 2]
            kv_hop = None
            if t + 1 < self.cp:
                bufs[(t + 1) % 2] = torch.empty_like(cur) if bufs[(t + 1) % 2] is None else bufs[(t + 1) % 2]
                kv_hop = self.comm.post(cur, bufs[(t + 1) % 2], "kv", t + 1)
            dkv = torch.zeros(cur.shape, dtype=self.acc, device=q.device)
            for spec in self.specs[t]:
                qi, ki, qa, ka = spec.q_idx, spec.k_idx, spec.q_all, spec.k_all
                g = self.block.backward(_rows(dout, qi, qa), _rows(q, qi, qa), _rows(cur[0], ki, ka),
                                        _rows(cur[1], ki, ka), _rows(out, qi, qa), _rows(lse, qi, qa), spec,
                                        self.scale)
                for acc, idx, every, grad in ((dq, qi, qa, g[0]), (dkv[0], ki, ka, g[1]), (dkv[1], ki, ka, g[2])):
                    if every:
                        acc.add_(grad.to(self.acc))
                    else:
                        acc.index_add_(0, idx, grad.to(self.acc))
            if dkv_hop is not None:  # the dk/dv accumulated so far for the kv held at step t
                self.comm.wait(dkv_hop, "dkv", t)
                dkv += dkv_recv[(t - 1) % 2]
            if self.cp > 1:
                dkv_recv[t % 2] = torch.empty_like(dkv) if dkv_recv[t % 2] is None else dkv_recv[t % 2]
                dkv_hop, dkv_sent = self.comm.post(dkv, dkv_recv[t % 2], "dkv", t + 1), dkv
            if kv_hop is not None:
                self.comm.wait(kv_hop, "kv", t + 1)
        if dkv_hop is not None:  # the last hop brings every rank its own dk/dv
            self.comm.wait(dkv_hop, "dkv", self.cp)
            dkv = dkv_recv[(self.cp - 1) % 2]
        del dkv_sent
        return dq, dkv[0], dkv[1]


def default_scale(dim: int, scale: Optional[float]) -> float:
    return float(scale) if scale else 1.0 / math.sqrt(dim)


def local_ring_attention(shards: Sequence[tuple], cu_seqlens: np.ndarray, causal: Sequence[bool],
                         block: BlockFunction, *, cu_padded: Optional[np.ndarray] = None,
                         scale: Optional[float] = None, backward: bool = True, timeout: float = 600.0) -> list:
    """Every member of a ``len(shards)``-member ring in this process (threads, :func:`run_local_ring`): member i
    gets ``shards[i] = (q, k, v[, dout])`` (its zigzag rows, see ``dynacp.torch.zigzag_shard``) and returns
    ``(out, lse)`` or, with ``backward`` and a dout, ``(out, lse, dq, dk, dv)`` in the accumulation type. No
    autograd; the benchmark and the single-GPU checks use it to run every rank's blocks of a CP split on one GPU."""
    from dynacp import _core

    cp = len(shards)
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    cu_p = _core.zigzag_layout(cu, cp, None if cu_padded is None else np.asarray(cu_padded, dtype=np.int64))
    q0 = shards[0][0]
    acc = torch.float64 if q0.dtype == torch.float64 else torch.float32
    sc = default_scale(q0.shape[2], scale)
    specs = [build_specs(cu, cu_p, cp, i, causal, q0.device) for i in range(cp)]

    def member(comm: LocalComm):
        q, k, v = shards[comm.index][:3]
        loop = RingLoop(comm, specs[comm.index], block, sc, acc)
        out, lse = loop.forward(q, k, v)
        if not backward or len(shards[comm.index]) < 4:
            return out, lse
        out_in = out.to(q.dtype)  # the backward sees the rounded output, as FlashAttention's does
        return (out, lse, *loop.backward(q, k, v, out_in, lse, shards[comm.index][3]))

    return run_local_ring(cp, member, timeout)
