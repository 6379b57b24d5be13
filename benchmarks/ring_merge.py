#!/usr/bin/env python3
"""Bytes the ring loop's LSE merge moves per ring step, before and after issue 36 (docs/benchmarks.md, "GPU").

    python3 benchmarks/ring_merge.py                        # the markdown table (bytes, then CPU times)
    python3 benchmarks/ring_merge.py --tokens 16384 --heads 32 --dim 128 --time-tokens 4096

Before: the merge of dynacp.torch.ring_loop until issue 36 (kept here as :func:`merge_before`): every block,
the first included, merged into zero / -inf accumulators with ``o - sigmoid(lb - la) (o - ob)`` and a
``torch.where`` for -inf blocks. After: :func:`dynacp.torch.ring_loop.merge_block`: a copy at the first block that
reaches the rows, then the weight and the new LSE on ``[n, H]`` and, on ``[n, H, D]``, one ``lerp_`` per row slice
or, for rows scattered over more than 16 ranges, ``index_reduce_(prod, 1 - w)`` and ``index_add_(w ob)`` in place
(no gather, no scatter, no fp32 copy of a bf16 block output).

Bytes are counted, not timed: every aten op the merge issues is intercepted (a ``TorchDispatchMode``) on meta
tensors of the full size, and charged the bytes it reads and writes: each tensor input and output once (broadcast
dimensions once), indexed ops only the selected rows (``index_select``: the rows it reads and writes;
``index_copy_``: its source and the rows it writes; ``index_add_``/``index_reduce_``: also the rows they read back),
views nothing. A step is one block's merge, the accumulator set-up it needs included. That
is the memory traffic of unfused kernels (no cache reuse between ops), which is how eager torch runs the merge on a
GPU. The step kinds are those of a zigzag ring: step 0 (the diagonal block, every row: ``q_all``), a later step
whose block covers every q row (the kv of a lower rank) and one covering the back half (a higher rank's kv: row
slices for a few documents, indexed in place for many). ``ob`` is bfloat16 as FlashAttention returns it (the CPU TorchBlock's float32 also shown).
Times (``--time-tokens``): the same merges on CPU tensors, median of 5, measured on the machine that runs it.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynacp.torch.ring_loop import merge_block, row_runs

_INDEX_READS = {"index_select", "index_copy", "index_copy_", "index_add_", "index_add", "index_reduce_",
                "index_reduce"}


def merge_before(out: torch.Tensor, lse: torch.Tensor, idx: torch.Tensor, ob: torch.Tensor, lb: torch.Tensor,
                 everything: bool = False) -> None:
    """The merge of dynacp.torch.ring_loop before issue 36 (every block, the first included)."""
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


def touched_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``t`` (a broadcast, stride-0 dimension counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class ByteCounter(TorchDispatchMode):
    """Charges every aten op the bytes it reads and writes (see the module docstring); ``ops`` lists them."""

    def __init__(self):
        super().__init__()
        self.read = self.written = 0
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func.is_view:
            return result
        name = func.__name__.split(".")[0]
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        outs = [r for r in (result if isinstance(result, (tuple, list)) else [result]) if isinstance(r, torch.Tensor)]
        if name in _INDEX_READS:  # only the selected rows move
            index, source = tensors[1], tensors[-1]
            if name == "index_select":
                read, written = touched_bytes(outs[0]) + touched_bytes(index), touched_bytes(outs[0])
            else:  # the rows of self it writes; index_add_ / index_reduce_ also read them
                rows = index.numel() * math.prod(tensors[0].shape[1:]) * tensors[0].element_size()
                updates = rows if name.startswith(("index_add", "index_reduce")) else 0
                read, written = touched_bytes(source) + touched_bytes(index) + updates, rows
        elif name == "copy_":
            read, written = touched_bytes(tensors[1]), touched_bytes(tensors[0])
        elif name in ("empty", "empty_like", "empty_strided"):
            read, written = 0, 0
        else:
            read = sum(touched_bytes(t) for t in tensors)
            written = sum(touched_bytes(t) for t in outs)
        self.read += read
        self.written += written
        self.ops.append((name, read, written))
        return result


def count(fn: Callable[[], None]) -> ByteCounter:
    counter = ByteCounter()
    with counter:
        fn()
    return counter


def _back_halves(tokens: int, docs: int) -> np.ndarray:
    """Rows ``[c, 2c)`` of every ``2c``-row sequence of ``tokens`` rows split into ``docs`` (at most tokens / 2)."""
    chunk = max(1, tokens // (2 * docs))
    return np.arange(tokens, dtype=np.int64).reshape(-1, 2 * chunk)[:, chunk:].reshape(-1)


def _step_inputs(tokens: int, heads: int, dim: int, ob_dtype: torch.dtype, device: str, docs: int):
    """A block's (ob, lb) and the q rows it covers: every row (``docs`` = 0), or the back half of each of ``docs``
    equal sequences, as for the kv of a higher rank."""
    g = torch.Generator().manual_seed(0)
    n = tokens // 2 if docs else tokens
    idx = torch.from_numpy(_back_halves(tokens, docs)) if docs else torch.arange(tokens)
    if device == "meta":
        ob = torch.empty(n, heads, dim, dtype=ob_dtype, device="meta")
        lb = torch.empty(n, heads, dtype=torch.float32, device="meta")
        return ob, lb, idx.to("meta")
    ob = torch.randn(n, heads, dim, generator=g).to(ob_dtype)
    lb = torch.randn(n, heads, generator=g)
    return ob, lb, idx


def _accumulators(tokens, heads, dim, device, init: bool):
    if init:  # zeros / -inf: the state before any block
        return (torch.zeros(tokens, heads, dim, device=device),
                torch.full((tokens, heads), float("-inf"), device=device))
    g = torch.Generator().manual_seed(1)
    if device == "meta":
        return torch.empty(tokens, heads, dim, device="meta"), torch.empty(tokens, heads, device="meta")
    return torch.randn(tokens, heads, dim, generator=g), torch.randn(tokens, heads, generator=g)


STEPS = (("step 0: diagonal block, every row (copy)", 0, True),
         ("later step: kv of a lower rank, every q row", 0, False),
         ("later step: kv of a higher rank, back half of q, 4 documents (4 row ranges: slices)", 4, False),
         ("later step: kv of a higher rank, back half of q, 1024 documents (1024 row ranges: indexed)", 1024, False))
"""(label, documents whose back halves the block covers (0: every row), first): the step kinds of a zigzag
ring."""


def step_functions(label_half_first: tuple, tokens: int, heads: int, dim: int, ob_dtype: torch.dtype,
                   device: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(before, after): one ring step's merge, each including the accumulator set-up that step needs (step 0: the
    zero / -inf initialisation before; nothing after, as the first blocks write every row)."""
    _, docs, first = label_half_first
    half = docs > 0
    ob, lb, idx = _step_inputs(tokens, heads, dim, ob_dtype, device, docs)
    runs = row_runs(_back_halves(tokens, docs)) if half else None

    def before() -> None:
        out, lse = (_accumulators(tokens, heads, dim, device, True) if first else state["before"])
        merge_before(out, lse, idx, ob, lb, everything=not half)

    def after() -> None:
        if first:
            out = torch.empty(tokens, heads, dim, device=device)
            lse = torch.empty(tokens, heads, device=device)
        else:
            out, lse = state["after"]
        merge_block(out, lse, idx, ob, lb, everything=not half, first=first, runs=runs)

    state = {} if first else {"before": _accumulators(tokens, heads, dim, device, False),
                              "after": _accumulators(tokens, heads, dim, device, False)}
    return before, after


def byte_rows(tokens: int, heads: int, dim: int) -> list[dict]:
    """Counted bytes per step kind, for bf16 (FlashBlock) and fp32 (TorchBlock) block outputs."""
    rows = []
    for ob_dtype in (torch.bfloat16, torch.float32):
        for kind in STEPS:
            before, after = step_functions(kind, tokens, heads, dim, ob_dtype, "meta")
            b, a = count(before), count(after)
            rows.append({"step": kind[0], "ob": str(ob_dtype)[6:], "before": b.read + b.written,
                         "after": a.read + a.written, "before_ops": len(b.ops), "after_ops": len(a.ops)})
    return rows


def time_rows(tokens: int, heads: int, dim: int, repeats: int = 5) -> list[dict]:
    """CPU time per step kind (fp32 block outputs), median of ``repeats``."""
    rows = []
    for kind in STEPS:
        times = {}
        for name in ("before", "after"):
            samples = []
            for _ in range(repeats):
                fn = dict(zip(("before", "after"), step_functions(kind, tokens, heads, dim, torch.float32,
                                                                  "cpu")))[name]
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
            times[name] = statistics.median(samples)
        rows.append({"step": kind[0], "before_ms": 1e3 * times["before"], "after_ms": 1e3 * times["after"]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=131072, help="local rows T of the counted merge (tokens)")
    ap.add_argument("--heads", type=int, default=32, help="query heads H")
    ap.add_argument("--dim", type=int, default=128, help="head dim D")
    ap.add_argument("--time-tokens", type=int, default=8192, help="local rows of the timed CPU merge (0: skip)")
    args = ap.parse_args(argv)
    print(f"Bytes moved by the merge of one ring step, T = {args.tokens} local rows, H = {args.heads}, "
          f"D = {args.dim}, fp32 accumulators (counted from the aten ops issued):\n")
    print("| step | block out | before (GB) | after (GB) | before / after |\n|---|---|---:|---:|---:|")
    for r in byte_rows(args.tokens, args.heads, args.dim):
        print(f"| {r['step']} | {r['ob']} | {r['before'] / 1e9:.2f} | {r['after'] / 1e9:.2f} | "
              f"{r['before'] / r['after']:.2f}x |")
    if args.time_tokens:
        print(f"\nCPU time of the same merges, T = {args.time_tokens}, fp32 block outputs, median of 5:\n")
        print("| step | before (ms) | after (ms) |\n|---|---:|---:|")
        for r in time_rows(args.time_tokens, args.heads, args.dim):
            print(f"| {r['step']} | {r['before_ms']:.1f} | {r['after_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
