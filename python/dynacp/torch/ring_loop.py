"""The Python zigzag ring loop: one loop for every device, with a pluggable block function (see docs/runtime.md).

The loop runs the schedule of the C++ ``runtime::ring_blocks`` (``_core.ring_blocks``, through :func:`step_blocks`),
the double-buffered K/V exchange, the LSE merge (fp32; fp64 for fp64 inputs) and the backward order (dK/dV travel
the ring with the K/V they belong to and reach their owner one hop after the last step). A *block function*
computes one ring step's attention over variable-length blocks with the FlashAttention contract -- the forward
returns ``(out, lse)`` (optionally a third item, state the backward gets back), the backward takes
``(dout, q, k, v, out, lse)`` with the *global* out and LSE -- so the same loop runs:

* :class:`TorchBlock` on any device with plain torch ops (fp32/fp64; the CPU path that CI tests line by line), and
* :class:`FlashBlock` on CUDA with the aten FlashAttention-2 varlen kernels that back
  ``torch.nn.attention.varlen.varlen_attn`` (bf16/fp16, head dim <= 256 and a multiple of 8).

Merge: the first step that reaches a row copies the block's (out, lse) into the accumulators; every later step
merges with two passes, ``w = sigmoid(lse_b - lse)`` and the new LSE on ``[n, H]``, then the ``[n, H, D]`` rows:
a ``lerp_`` per row slice, or in place at scattered rows (see :func:`merge_block`; benchmarks/ring_merge.py counts
the bytes).

Communication (:mod:`dynacp.torch.ring_comm`): P2P between ring neighbours over one process group (the DP x CP
pool), addressed by the group ranks listed in ``ranks``, so no process group per ring is needed. Every hop is
posted with ``dist.batch_isend_irecv`` *before* the block of the current step is computed (the receive for hop t+1
is in flight while block t runs) and is waited for only when its buffer is needed.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import torch

from dynacp.torch.ring_comm import (  # noqa: F401  (re-exported: the loop's communicators)
    LocalComm,
    LocalHub,
    PoolP2P,
    Recorder,
    needs_host_staging,
    run_local_ring,
    warm_up_group,
)

log = logging.getLogger("dynacp")


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
    first: bool = False
    """No earlier block of the ring reaches these q rows: the forward copies this block's (out, lse) instead of
    merging it."""
    q_runs: Optional[tuple[tuple[int, int], ...]] = None
    """``q_idx`` as local row ranges ``[lo, hi)``, in block order, when it has at most ``TUNING.max_runs`` of them
    (else None): reads become views and the merge works on row slices instead of a gather and a scatter."""
    k_runs: Optional[tuple[tuple[int, int], ...]] = None
    """The same for ``k_idx`` (rows of the kv buffer)."""


@dataclass(frozen=True)
class LoopTuning:
    """Tuning constants of the Python ring loop."""

    max_runs: int = 16
    """Most contiguous row ranges a block's q (or kv) rows may form to be handled as slices (a view per range, a
    merge kernel per range) rather than one gather and one scatter: a pack of few long documents has one or a few
    ranges per block; many short documents are cheaper as one indexed kernel."""


TUNING = LoopTuning()


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
    reached = np.zeros(rows, dtype=bool)  # q rows some earlier block already wrote
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
        specs = []
        for diag, (qs, ks) in sorted(groups.items()):
            q_rows = np.concatenate(qs)
            specs.append(_spec(qs, ks, diag, device, rows, first=not reached[q_rows].any()))
            reached[q_rows] = True
        steps.append(specs)
    return steps


def _spec(qs: list, ks: list, diag: bool, device: torch.device, rows: int, first: bool) -> BlockSpec:
    cu_q = np.concatenate([[0], np.cumsum([len(x) for x in qs])]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum([len(x) for x in ks])]).astype(np.int64)
    q_idx, k_idx = np.concatenate(qs), np.concatenate(ks)

    def up(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype, non_blocking=True)

    def everything(idx: np.ndarray) -> bool:
        return len(idx) == rows and bool(np.all(idx == np.arange(rows)))

    return BlockSpec(up(q_idx, torch.long), up(k_idx, torch.long), up(cu_q, torch.int32), up(cu_k, torch.int32),
                     cu_q.tolist(), cu_k.tolist(), int(np.diff(cu_q).max()), int(np.diff(cu_k).max()), diag,
                     everything(q_idx), everything(k_idx), first, row_runs(q_idx), row_runs(k_idx))


def pack_spec(cu_seqlens: np.ndarray, causal: bool, device: torch.device) -> BlockSpec:
    """One block holding every (non-empty) sequence of an unpadded pack of ``cu_seqlens[-1]`` rows against itself:
    the single-call baseline of benchmarks/gpu_ring.py."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    seqs = [np.arange(a, b, dtype=np.int64) for a, b in zip(cu[:-1], cu[1:]) if b > a]
    return _spec(seqs, seqs, causal, device, int(cu[-1]), first=True)


def row_runs(idx: np.ndarray, max_runs: Optional[int] = None) -> Optional[tuple[tuple[int, int], ...]]:
    """``idx`` (increasing within each run) as ranges ``[lo, hi)`` of consecutive rows, or None when there are more
    than ``max_runs`` (default ``TUNING.max_runs``) or none."""
    limit = TUNING.max_runs if max_runs is None else max_runs
    if idx.size == 0:
        return None
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    if len(breaks) + 1 > limit:
        return None
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [idx.size]])
    return tuple((int(idx[a]), int(idx[b - 1]) + 1) for a, b in zip(starts, ends))


def _rows(x: torch.Tensor, idx: torch.Tensor, everything: bool,
          runs: Optional[tuple[tuple[int, int], ...]] = None) -> torch.Tensor:
    """Rows ``idx`` of ``x``: ``x`` itself, a view (one run), or a gather."""
    if everything:
        return x
    if runs is not None and len(runs) == 1:
        return x[runs[0][0]:runs[0][1]]
    return x.index_select(0, idx)


def _add_rows(acc: torch.Tensor, idx: torch.Tensor, everything: bool, runs, grad: torch.Tensor) -> None:
    """``acc[idx] += grad`` (in place; a slice when ``idx`` is one run)."""
    if everything:
        acc.add_(grad)
    elif runs is not None and len(runs) == 1:
        acc[runs[0][0]:runs[0][1]].add_(grad)
    else:
        acc.index_add_(0, idx, grad)


# -- block functions --------------------------------------------------------------------------------------------------

class BlockFunction(Protocol):
    """One ring step's attention over a :class:`BlockSpec` (the FlashAttention varlen contract).

    ``forward(q, k, v, spec, scale) -> (out [nq, H, D], lse [nq, H])``: natural-log LSE, float32 or wider. A
    forward may return a third item, state of that call (e.g. FlashAttention's ``rng_state``/``unused``); the loop
    keeps it and hands it back to the same block's backward as ``state=``.
    ``backward(dout, q, k, v, out, lse, spec, scale[, state=...]) -> (dq, dk, dv)``: ``out``/``lse`` are the rows of
    the final (merged) output and LSE; ``dk``/``dv`` have the kv heads (GQA groups summed)."""

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


FLASH_FORWARD_ARGS = ("Tensor", "Tensor", "Tensor", "Optional[Tensor]", "Optional[Tensor]", "int", "int", "float",
                      "bool", "bool")
"""Types (as ``str(argument.type)`` prints them: ``Tensor?`` is ``Optional[Tensor]``, ``SymInt`` is ``int``) of the
positional arguments FlashBlock passes to ``aten::_flash_attention_forward`` (query, key, value, cum_seq_q,
cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask), then ``scale=`` by keyword."""
FLASH_BACKWARD_ARGS = ("Tensor",) * 8 + ("int", "int", "float", "bool", "Tensor", "Tensor")
"""Types of the positional arguments of ``aten::_flash_attention_backward`` (grad_out, query, key, value, out,
logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, rng_state, unused), then ``scale=``."""
FLASH_FORWARD_RETURNS = 5
"""``(output, softmax_logsumexp, rng_state, unused, debug_attn_mask)``."""


def flash_schema_problem(forward_schema: Any, backward_schema: Any) -> Optional[str]:
    """What in these ``torch._C.FunctionSchema`` objects (``torch.ops.aten._flash_attention_forward.default._schema``
    and the backward's) differs from the calls FlashBlock makes (None when they match): the positional argument
    types, a keyword-only ``scale`` and the forward's five results (torch 2.11 and 2.13 both match)."""
    for schema, want, returns in ((forward_schema, FLASH_FORWARD_ARGS, FLASH_FORWARD_RETURNS),
                                  (backward_schema, FLASH_BACKWARD_ARGS, 3)):
        positional = tuple(str(a.type) for a in schema.arguments if not a.kwarg_only)
        keywords = [a.name for a in schema.arguments if a.kwarg_only]
        if positional != want:
            return f"{schema.name} takes positional arguments {positional}, dynacp passes {want}"
        if "scale" not in keywords:
            return f"{schema.name} has no keyword argument scale (keywords: {keywords})"
        if len(schema.returns) != returns:
            return f"{schema.name} returns {len(schema.returns)} values, dynacp expects {returns}"
    return None


def installed_flash_schemas() -> tuple[Any, Any]:
    """The installed torch's schemas of ``aten::_flash_attention_forward`` and ``aten::_flash_attention_backward``."""
    return (torch.ops.aten._flash_attention_forward.default._schema,
            torch.ops.aten._flash_attention_backward.default._schema)


class FlashBlock:
    """Block function on the aten FlashAttention-2 varlen kernels (``aten._flash_attention_forward/backward``, the
    kernels behind ``torch.nn.attention.varlen.varlen_attn``): CUDA, float16/bfloat16, head dim a multiple of 8 and
    at most 256, sm80 or newer. GQA is native (kv heads divide q heads). The LSE comes back float32 ``[H, nq]``.
    The forward's own ``rng_state`` and ``unused`` results go back to its backward (the loop keeps them per block).

    Construction checks everything it can and raises RuntimeError naming what is missing; it never falls back."""

    name = "flash"

    def __init__(self, device: torch.device, dtype: torch.dtype, head_dim: int):
        missing = flash_missing(device, dtype, head_dim)
        if missing:
            raise RuntimeError(f"dynacp ring attention: the FlashAttention block function cannot run: {missing}")

    def forward(self, q, k, v, spec, scale):
        out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, spec.cu_q, spec.cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, False, scale=scale)
        return out, lse.transpose(0, 1), (rng_state, unused)

    def backward(self, dout, q, k, v, out, lse, spec, scale, state=None):
        if state is None:
            raise RuntimeError("FlashBlock.backward needs the (rng_state, unused) its forward returned for this "
                               "block (state=); run the forward first")
        rng_state, unused = state
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out.contiguous(), lse.transpose(0, 1).contiguous().float(), spec.cu_q,
            spec.cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, rng_state, unused, scale=scale)
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
    problem = flash_schema_problem(*installed_flash_schemas())
    if problem:
        return f"torch {torch.__version__}'s FlashAttention op differs from what dynacp calls: {problem}"
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


# -- the loop ---------------------------------------------------------------------------------------------------------

def merge_block(out: torch.Tensor, lse: torch.Tensor, idx: torch.Tensor, ob: torch.Tensor, lb: torch.Tensor,
                everything: bool = False, first: bool = False,
                runs: Optional[tuple[tuple[int, int], ...]] = None) -> None:
    """Merge a block's (out ``ob`` [n, H, D], lse ``lb`` [n, H]) into the accumulators at rows ``idx`` (all rows,
    in order, when ``everything``; the row ranges ``runs`` when given, see :func:`row_runs`), in place.

    ``first`` (no earlier block reached these rows): a copy. Otherwise two passes: on ``[n, H]`` the weight
    ``w = sigmoid(lb - la)`` and the overflow-free ``max(la, lb) + log1p(exp(-|la - lb|))``, then the ``[n, H, D]``
    rows: with ``everything`` or ``runs``, one ``lerp_(ob, w)`` per row slice (``o - w (o - ob)``); otherwise (rows
    scattered, e.g. the back halves of many documents) in place at ``idx`` without gathering or scattering them:
    ``index_reduce_(.., 1 - w, "prod")`` then ``index_add_(.., w ob)``, which is ``(1 - w) o + w ob`` (``1 - w``
    computed as ``sigmoid(la - lb)``); under ``torch.use_deterministic_algorithms(True)`` (CUDA's ``index_reduce_``
    is flagged nondeterministic) a gather, a ``lerp_`` and a scatter. Rows whose block LSE is -inf keep their values
    (w = 0); rows not reached yet (la = -inf) take the block's (w = 1)."""
    slices = None
    if everything:
        slices = [(0, out.shape[0], 0)]
    elif runs is not None:
        starts = np.cumsum([0] + [hi - lo for lo, hi in runs])
        slices = [(lo, hi, int(s0)) for (lo, hi), s0 in zip(runs, starts)]
    if first:
        if slices is not None:
            for lo, hi, s0 in slices:
                out[lo:hi].copy_(ob[s0:s0 + hi - lo])
                lse[lo:hi].copy_(lb[s0:s0 + hi - lo])
        else:
            out.index_copy_(0, idx, ob.to(out.dtype))
            lse.index_copy_(0, idx, lb.to(lse.dtype))
        return
    la = lse if everything else lse.index_select(0, idx)
    lb = lb.to(la.dtype)
    skip = lb == float("-inf")
    w = torch.sigmoid(lb - la).masked_fill_(skip, 0.0).unsqueeze(-1)
    new_l = torch.where(skip, la, torch.maximum(la, lb) + torch.log1p(torch.exp(-(la - lb).abs())))
    if slices is not None:
        ob = ob.to(out.dtype)
        for lo, hi, s0 in slices:
            out[lo:hi].lerp_(ob[s0:s0 + hi - lo], w[s0:s0 + hi - lo])
            lse[lo:hi].copy_(new_l[s0:s0 + hi - lo])
        return
    if torch.are_deterministic_algorithms_enabled():  # CUDA's index_reduce_ is flagged nondeterministic
        o = out.index_select(0, idx)
        o.lerp_(ob.to(out.dtype), w)
        out.index_copy_(0, idx, o)
        lse.index_copy_(0, idx, new_l)
        return
    keep = torch.sigmoid(la - lb).masked_fill_(skip, 1.0).unsqueeze(-1)  # 1 - w without rounding 1 - w
    out.index_reduce_(0, idx, keep.expand(ob.shape), "prod")  # o (1 - w) in place: no gather, no scatter
    out.index_add_(0, idx, (w * ob).to(out.dtype))  # + w ob (reads ob in its own dtype: no fp32 copy of it)
    lse.index_copy_(0, idx, new_l)


def _spend_index_reduce_warning() -> None:
    """torch warns once per process that ``index_reduce_`` is in beta; spend that warning here, silenced, when the
    module is imported (one thread), instead of from a ring member's thread in the first merge."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.ones(1).index_reduce_(0, torch.zeros(1, dtype=torch.long), torch.ones(1), "prod")


_spend_index_reduce_warning()


class RingLoop:
    """One ring call's state: schedule, neighbours, block function, accumulation type."""

    def __init__(self, comm: PoolP2P | LocalComm, specs: list[list[BlockSpec]], block: BlockFunction,
                 scale: float, acc: torch.dtype):
        self.comm, self.specs, self.block, self.scale, self.acc = comm, specs, block, scale, acc
        self.cp = comm.size
        self.saved: list[list[Any]] = [[None] * len(step) for step in specs]
        """Per step and block: the state the block's forward returned for its backward (None when none)."""

    def _accumulators(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out/lse for the forward: uninitialised when the first-reaching blocks write every row, else 0 / -inf
        (rows no block reaches: padding)."""
        first_rows = sum(s.q_idx.numel() for step in self.specs for s in step if s.first)
        if first_rows == q.shape[0]:  # first-reaching blocks cover disjoint rows
            return (torch.empty(q.shape, dtype=self.acc, device=q.device),
                    torch.empty(q.shape[:2], dtype=self.acc, device=q.device))
        return (torch.zeros(q.shape, dtype=self.acc, device=q.device),
                torch.full(q.shape[:2], float("-inf"), dtype=self.acc, device=q.device))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out [T, H, D] (accumulation type; 0 on rows that see no key) and lse [T, H] (-inf there)."""
        out, lse = self._accumulators(q)
        bufs = [torch.stack([k, v]), None]
        for t in range(self.cp):
            cur = bufs[t % 2]
            hop = None
            if t + 1 < self.cp:  # post hop t+1 before computing block t
                bufs[(t + 1) % 2] = torch.empty_like(cur) if bufs[(t + 1) % 2] is None else bufs[(t + 1) % 2]
                hop = self.comm.post(cur, bufs[(t + 1) % 2], "kv", t + 1)
            for j, spec in enumerate(self.specs[t]):
                ki = spec.k_idx
                res = self.block.forward(_rows(q, spec.q_idx, spec.q_all, spec.q_runs),
                                         _rows(cur[0], ki, spec.k_all, spec.k_runs),
                                         _rows(cur[1], ki, spec.k_all, spec.k_runs), spec, self.scale)
                self.saved[t][j] = res[2] if len(res) > 2 else None
                merge_block(out, lse, spec.q_idx, res[0], res[1], spec.q_all, spec.first, spec.q_runs)
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
            for j, spec in enumerate(self.specs[t]):
                qi, ki, qa, ka, qr, kr = spec.q_idx, spec.k_idx, spec.q_all, spec.k_all, spec.q_runs, spec.k_runs
                state = {} if self.saved[t][j] is None else {"state": self.saved[t][j]}
                g = self.block.backward(_rows(dout, qi, qa, qr), _rows(q, qi, qa, qr), _rows(cur[0], ki, ka, kr),
                                        _rows(cur[1], ki, ka, kr), _rows(out, qi, qa, qr), _rows(lse, qi, qa, qr),
                                        spec, self.scale, **state)
                for acc, idx, every, runs, grad in ((dq, qi, qa, qr, g[0]), (dkv[0], ki, ka, kr, g[1]),
                                                    (dkv[1], ki, ka, kr, g[2])):
                    _add_rows(acc, idx, every, runs, grad.to(self.acc))
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
