#!/usr/bin/env python3
"""dynacp's ring attention on FlashAttention kernels, on one GPU: correctness against an fp64 reference and
TFLOP/s next to a single FlashAttention call (run by tests/gpu/run.sh; needs torch with CUDA, sm80+).

    python3 benchmarks/gpu_ring.py --check                  # bf16/fp16 vs fp64, CP 1-4; exit 1 on a failure
    python3 benchmarks/gpu_ring.py --bench [--scale 0.25]   # the TFLOP/s table (markdown on stdout)
    python3 benchmarks/gpu_ring.py --check --bench --write-docs docs/benchmarks.md

Benchmark: packs of ``128K * scale`` tokens made of 8K, 32K or 128K documents or a long-tailed mix; bf16, causal,
32 query heads, 8 kv heads, head dim 128. Rows: (a) one ``aten._flash_attention_forward/backward`` varlen call over
the whole pack; (b) dynacp's ring loop (``dynacp.torch.ring_loop``, FlashBlock) at CP 1; (c) every rank of a CP
2/3/4/8 zigzag split, all ranks run on the one GPU (threads of :func:`~dynacp.torch.ring_loop.local_ring_attention`;
kv hops are device copies), so their summed time is the time of the whole pack's attention. FLOPs are the useful
ones, the same for every row (causal pairs: 4·H·D per pair forward, 3.5x that forward+backward, FlashAttention's
convention); efficiency = TFLOP/s of the row / TFLOP/s of (a), i.e. the per-rank efficiency of a CP split.
Times: CUDA events, median of ``--iters`` after ``--warmup`` runs.

Correctness (--check): FlashAttention's own test rule: the error of dynacp's result against an fp64 dense reference
is at most twice the error of the same dense reference computed in the input dtype, plus 1e-3 (out, lse, dq, dk,
dv), for CP 1-4, causal / full / mixed masks, GQA, odd lengths and padding rows (out 0, lse -inf).
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from typing import Callable

import numpy as np
import torch

from dynacp import _core
from dynacp.torch import ring_loop, zigzag_shard

HEADS, KV_HEADS, DIM = 32, 8, 128


# -- correctness ------------------------------------------------------------------------------------------------------

def dense(q, k, v, dout, cu, causal, scale):
    """Per-sequence dense attention with autograd in the inputs' dtype: out, lse, dq, dk, dv (global rows)."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e == s:
            continue
        sc = torch.einsum("ihd,jhd->hij", q[s:e], k[s:e].repeat_interleave(g, 1)) * scale
        if causal[b]:
            sc = sc.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lses.append(torch.logsumexp(sc.float(), -1).transpose(0, 1))
        outs.append(torch.einsum("hij,jhd->ihd", sc.softmax(-1), v[s:e].repeat_interleave(g, 1)))
    out = torch.cat(outs)
    out.backward(dout)
    return [out.detach(), torch.cat(lses).detach(), q.grad, k.grad, v.grad]


def check_case(cp, lengths, causal, dtype, heads, kv_heads, dim, seed, device: str = "cuda",
               block=None) -> tuple[bool, str]:
    """One correctness case (FlashBlock on CUDA unless ``block``/``device`` say otherwise): (ok, what failed)."""
    dev = torch.device(device)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = int(cu[-1])
    q, dout = (torch.randn(t, heads, dim, generator=g).to(dev, dtype) for _ in range(2))
    k, v = (torch.randn(t, kv_heads, dim, generator=g).to(dev, dtype) for _ in range(2))
    scale = dim ** -0.5
    ref = dense(*(x.double() for x in (q, k, v, dout)), cu, causal, scale)
    low = dense(q, k, v, dout, cu, causal, scale)
    shards = [tuple(zigzag_shard(x, cu, cp, r) for x in (q, k, v, dout)) for r in range(cp)]
    res = ring_loop.local_ring_attention(shards, cu, causal, block or ring_loop.FlashBlock(dev, dtype, dim))
    worst = ""
    ok = True
    for r, got in enumerate(res):
        rows = torch.from_numpy(_core.zigzag_rows(cu, cp, r, None)).to(dev)
        real = rows >= 0
        ok &= bool(torch.all(got[0][~real] == 0)) and bool(torch.all(got[1][~real] == float("-inf")))
        for name, x, want, base in zip(("out", "lse", "dq", "dk", "dv"), got, ref, low):
            x = x[real].double()
            w, b = want[rows[real]].double(), base[rows[real]].double()
            err, allowed = float((x - w).abs().max()), 2 * float((b - w).abs().max()) + 1e-3
            if err > allowed:
                ok = False
                worst += f" {name}@{r}: {err:.3g} > {allowed:.3g}"
    return ok, worst


def run_checks() -> bool:
    lengths = [1, 700, 2049, 64, 3000, 3, 511, 0, 1537]
    mixed = [i % 2 == 0 for i in range(len(lengths))]
    cases = [(cp, mask, dtype, h, hk, d) for cp in (1, 2, 3, 4) for mask in ("causal", "full", "mixed")
             for dtype, h, hk, d in ((torch.bfloat16, 8, 2, 128), (torch.float16, 4, 4, 64))]
    all_ok = True
    for i, (cp, mask, dtype, h, hk, d) in enumerate(cases):
        causal = {"causal": [True] * len(lengths), "full": [False] * len(lengths), "mixed": mixed}[mask]
        ok, why = check_case(cp, lengths, causal, dtype, h, hk, d, seed=i)
        all_ok &= ok
        print(f"{'PASS' if ok else 'FAIL'} cp {cp} {mask} {str(dtype)[6:]} heads {h}/{hk} dim {d}{why}", flush=True)
    for dtype, dim in ((torch.float32, 128), (torch.bfloat16, 96 + 4)):
        try:
            ring_loop.FlashBlock(torch.device("cuda"), dtype, dim)
            print(f"FAIL: FlashBlock accepted {dtype} / head dim {dim}")
            all_ok = False
        except RuntimeError as e:
            print(f"PASS clear error: {e}")
    return all_ok


# -- benchmark --------------------------------------------------------------------------------------------------------

def packs(scale: float) -> dict[str, list[int]]:
    total = int(131072 * scale)
    rng = np.random.default_rng(0)
    tail, left = [], total
    while left > 0:  # long-tailed: lognormal lengths (median ~2K), capped at the pack
        n = int(min(left, max(16, rng.lognormal(7.6, 1.4))))
        tail.append(n)
        left -= n
    return {f"{n // 1024}K docs": [min(n, total)] * max(1, total // n) for n in (8192, 32768, 131072)} | {
        "long-tailed": tail}


def timed(fn: Callable[[], object], warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return float(np.median(times))


def flash_whole(q, k, v, dout, cu, max_len, backward: bool):
    cu_t = torch.from_numpy(cu).to(q.device, torch.int32)
    out, lse, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(q, k, v, cu_t, cu_t, max_len, max_len,
                                                                            0.0, True, False, scale=DIM ** -0.5)
    if backward:
        torch.ops.aten._flash_attention_backward(dout, q, k, v, out, lse, cu_t, cu_t, max_len, max_len, 0.0, True,
                                                 rng_state, unused, scale=DIM ** -0.5)


def bench_pack(name: str, lengths: list[int], args) -> list[tuple]:
    dev = torch.device("cuda")
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    t = int(cu[-1])
    q, dout = (torch.randn(t, HEADS, DIM, device=dev, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(t, KV_HEADS, DIM, device=dev, dtype=torch.bfloat16) for _ in range(2))
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    fwd_flops = 4.0 * HEADS * DIM * pairs
    block = ring_loop.FlashBlock(dev, torch.bfloat16, DIM)
    rows = []
    for backward in (False, True):
        flops = fwd_flops * (3.5 if backward else 1.0)
        base = timed(lambda b=backward: flash_whole(q, k, v, dout, cu, max(lengths), b), args.warmup, args.iters)
        rows.append((name, "fwd+bwd" if backward else "fwd", "(a) one flash call", base, flops / base / 1e12, 1.0))
        for cp in (1, 2, 3, 4, 8):
            shards = [tuple(zigzag_shard(x, cu, cp, r) for x in (q, k, v, dout)) for r in range(cp)]
            causal = [True] * len(lengths)

            def run(shards=shards, causal=causal, b=backward):
                ring_loop.local_ring_attention(shards, cu, causal, block, backward=b)

            sec = timed(run, args.warmup, args.iters)
            label = "(b) ring, CP 1" if cp == 1 else f"(c) CP {cp}, all ranks on 1 GPU"
            rows.append((name, "fwd+bwd" if backward else "fwd", label, sec, flops / sec / 1e12, base / sec))
            del shards
        torch.cuda.empty_cache()
    return rows


def bench_table(args) -> str:
    lines = [f"Measured on {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, with "
             f"`python3 benchmarks/gpu_ring.py --bench --scale {args.scale:g}` (bf16, causal, {HEADS}/{KV_HEADS} "
             f"heads, head dim {DIM}, packs of {int(131072 * args.scale)} tokens; median of {args.iters}).", "",
             "| pack | pass | what | time (ms) | TFLOP/s | efficiency vs (a) |", "|---|---|---|---:|---:|---:|"]
    for name, lengths in packs(args.scale).items():
        for pack, kind, what, sec, tflops, eff in bench_pack(name, lengths, args):
            lines.append(f"| {pack} | {kind} | {what} | {1e3 * sec:.2f} | {tflops:.0f} | {100 * eff:.0f} % |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def write_docs(path: str, text: str) -> None:
    """Replace the text between the gpu-ring markers of docs/benchmarks.md."""
    doc = open(path).read()
    begin, end = "<!-- gpu-ring:begin -->", "<!-- gpu-ring:end -->"
    if begin not in doc or end not in doc:
        raise ValueError(f"{path} has no {begin} ... {end} section to replace")
    doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{text}\n{end}", doc, flags=re.S)
    open(path, "w").write(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="correctness against the fp64 reference")
    ap.add_argument("--bench", action="store_true", help="TFLOP/s table")
    ap.add_argument("--scale", type=float, default=1.0, help="pack size as a fraction of 128K tokens")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--write-docs", metavar="FILE", help="write the results into FILE's gpu-ring section")
    args = ap.parse_args()
    missing = ring_loop.flash_missing(torch.device("cuda", 0), torch.bfloat16, DIM)
    if missing:
        print(f"gpu_ring SKIPPED: {missing}")
        return 2
    ok, parts = True, []
    if args.check:
        ok = run_checks()
        parts.append(f"Correctness (`--check`, fp64 reference, FlashAttention's 2x rule): "
                     f"{'all cases pass' if ok else 'FAILURES (see the run log)'}.")
    if args.bench:
        parts.append(bench_table(args))
    if args.write_docs and parts:
        write_docs(args.write_docs, "\n\n".join(parts))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
