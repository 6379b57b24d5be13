#!/usr/bin/env python3
"""dynacp's ring attention on FlashAttention kernels, on one GPU: correctness against an fp64 reference and
TFLOP/s next to a single FlashAttention call (run by tests/gpu/run.sh; needs torch with CUDA, sm80+).

    python3 benchmarks/gpu_ring.py --check                  # bf16/fp16 vs fp64, CP 1-4; exit 1 on a failure
    python3 benchmarks/gpu_ring.py --bench [--scale 0.25]   # the TFLOP/s table (markdown on stdout)
    python3 benchmarks/gpu_ring.py --check --bench --json out/gpu_ring.json --budget 200
    python3 benchmarks/gpu_ring.py --device cpu --check --bench ...   # the same code on CPU (TorchBlock, fp32)

Benchmark: packs of ``128K * scale`` tokens made of 8K, 32K or 128K documents or a long-tailed mix; bf16, causal,
32 query heads, 8 kv heads, head dim 128. Rows: (a) one FlashAttention varlen call over the whole pack (the block
function on one block holding every sequence); (b) dynacp's ring loop (``dynacp.torch.ring_loop``, FlashBlock) at
CP 1; (c) every rank of a CP 2/3/4/8 zigzag split, all ranks run on the one GPU (threads of
:func:`~dynacp.torch.ring_loop.local_ring_attention`), so their summed time is the time of the whole pack's
attention. The (c) rows measure compute only: the ranks' threads share one CUDA stream, kv hops are device
copies, no NCCL is involved and nothing overlaps. FLOPs are the useful ones, the same for every row (causal pairs:
4·H·D per pair forward, 3.5x that forward+backward, FlashAttention's convention); efficiency = TFLOP/s of the row
/ TFLOP/s of (a), i.e. the per-rank compute efficiency of a CP split. Times: CUDA events (CPU: wall clock), median
of ``--iters`` after ``--warmup`` runs. ``--budget`` seconds: no new (pack, pass) starts past it (those rows are
listed as not run).

Correctness (--check): FlashAttention's own test rule: the error of dynacp's result against an fp64 dense reference
is at most twice the error of the same dense reference computed in the input dtype, plus 1e-3 (out, lse, dq, dk,
dv), for CP 1-4, causal / full / mixed masks, GQA, odd lengths and padding rows (out 0, lse -inf).

``--json FILE`` writes every result as it comes (rewritten after each case and row, so a run cut short keeps what it
measured); benchmarks/gpu_ring_report.py turns results into the text between the gpu-ring markers of
docs/benchmarks.md (``python3 benchmarks/gpu_ring_report.py OUT/results.json --write-docs docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from dynacp import _core
from dynacp.torch import ring_loop, zigzag_shard

HEADS, KV_HEADS, DIM = 32, 8, 128
CP_SIZES = (1, 2, 3, 4, 8)


def _load_report():
    """benchmarks/gpu_ring_report.py (the docs section from results; no torch), loaded by path."""
    spec = importlib.util.spec_from_file_location("gpu_ring_report", Path(__file__).with_name("gpu_ring_report.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_REPORT = _load_report()
render_section, write_docs, targets = _REPORT.render_section, _REPORT.write_docs, _REPORT.targets



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


class Setup(NamedTuple):
    """What one run of the script checks on its device (the GPU cases, or the CPU dry-run sizes). ``device``:
    "cuda" (FlashBlock, bf16/fp16) or "cpu" (TorchBlock, fp32: the dry run of tests/gpu/run.sh);
    ``check_lengths``: sequence lengths (tokens) of every correctness case; ``check_configs``: (dtype, heads, kv
    heads, head dim) of the cases; ``check_cps``: their CP degrees. (A NamedTuple: the script is also loaded by
    path, without a module entry, which dataclasses need.)"""

    device: str
    check_lengths: tuple[int, ...]
    check_configs: tuple[tuple, ...]
    check_cps: tuple[int, ...]


SETUPS = {
    "cuda": Setup("cuda", (1, 700, 2049, 64, 3000, 3, 511, 0, 1537),
                  ((torch.bfloat16, 8, 2, 128), (torch.float16, 4, 4, 64)), (1, 2, 3, 4)),
    "cpu": Setup("cpu", (1, 70, 33, 0, 12, 5), ((torch.float32, 4, 2, 16),), (1, 3)),
}


def make_block(device: str, dtype: torch.dtype, dim: int):
    return ring_loop.FlashBlock(torch.device(device), dtype, dim) if device == "cuda" else ring_loop.TorchBlock()


def run_checks(setup: Setup = SETUPS["cuda"], sink: Optional[Callable[[dict], None]] = None) -> bool:
    """Every correctness case of ``setup``, printed as PASS/FAIL lines; ``sink(result)`` gets each as a dict."""
    lengths = list(setup.check_lengths)
    mixed = [i % 2 == 0 for i in range(len(lengths))]
    cases = [(cp, mask, cfg) for cp in setup.check_cps for mask in ("causal", "full", "mixed")
             for cfg in setup.check_configs]
    all_ok = True
    for i, (cp, mask, (dtype, h, hk, d)) in enumerate(cases):
        causal = {"causal": [True] * len(lengths), "full": [False] * len(lengths), "mixed": mixed}[mask]
        ok, why = check_case(cp, lengths, causal, dtype, h, hk, d, seed=i, device=setup.device,
                             block=make_block(setup.device, dtype, d))
        all_ok &= ok
        line = f"{'PASS' if ok else 'FAIL'} cp {cp} {mask} {str(dtype)[6:]} heads {h}/{hk} dim {d}{why}"
        print(line, flush=True)
        if sink:
            sink({"cp": cp, "mask": mask, "dtype": str(dtype)[6:], "heads": h, "kv_heads": hk, "dim": d, "ok": ok,
                  "detail": why.strip()})
    if setup.device == "cuda":
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


def timed(fn: Callable[[], object], warmup: int, iters: int, device: str = "cuda") -> float:
    """Median seconds of ``iters`` calls after ``warmup`` calls (CUDA events on CUDA, wall clock on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def whole_pack(block, q, k, v, dout, cu, backward: bool) -> None:
    """(a): the block function on one block holding the whole pack (one varlen call; its backward with its state)."""
    spec = ring_loop.pack_spec(cu, True, q.device)
    scale = q.shape[2] ** -0.5
    res = block.forward(q, k, v, spec, scale)
    if backward:
        state = {"state": res[2]} if len(res) > 2 else {}
        block.backward(dout, q, k, v, res[0], res[1], spec, scale, **state)


BENCH_ORDER = (("fwd+bwd", "32K docs"), ("fwd+bwd", "128K docs"), ("fwd+bwd", "8K docs"), ("fwd+bwd", "long-tailed"),
               ("fwd", "32K docs"), ("fwd", "128K docs"), ("fwd", "8K docs"), ("fwd", "long-tailed"))
"""(pass, pack) in the order they are measured: the targets' rows (forward+backward, documents >= 32K) first, so a
run cut short by its budget keeps them."""


def bench_pack(name: str, lengths: list[int], args, emit: Callable[[dict], None], passes=("fwd", "fwd+bwd")) -> None:
    """The rows of one pack for ``passes`` (``emit`` gets each row as it is measured)."""
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    t = int(cu[-1])
    g = torch.Generator(device=dev).manual_seed(0)  # made on the device: a 128K pack is 10^8 values per tensor
    q, dout = (torch.randn(t, args.heads, args.dim, generator=g, device=dev, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(t, args.kv_heads, args.dim, generator=g, device=dev, dtype=dtype) for _ in range(2))
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    fwd_flops = 4.0 * args.heads * args.dim * pairs
    block = make_block(args.device, dtype, args.dim)
    for kind in passes:
        backward = kind == "fwd+bwd"
        if args.budget and time.monotonic() - args.started > args.budget:
            emit({"pack": name, "pass": kind, "skipped": "time budget"})
            continue
        flops = fwd_flops * (3.5 if backward else 1.0)
        base = timed(lambda b=backward: whole_pack(block, q, k, v, dout, cu, b), args.warmup, args.iters, args.device)
        emit({"pack": name, "pass": kind, "what": "(a) one flash call", "cp": 0, "tokens": t, "seconds": base,
              "tflops": flops / base / 1e12, "efficiency": 1.0})
        for cp in CP_SIZES:
            shards = [tuple(zigzag_shard(x, cu, cp, r) for x in (q, k, v, dout)) for r in range(cp)]
            causal = [True] * len(lengths)

            def run(shards=shards, causal=causal, b=backward):
                ring_loop.local_ring_attention(shards, cu, causal, block, backward=b)

            sec = timed(run, args.warmup, args.iters, args.device)
            label = "(b) ring, CP 1" if cp == 1 else f"(c) CP {cp}, all ranks on 1 GPU"
            emit({"pack": name, "pass": kind, "what": label, "cp": cp, "tokens": t, "seconds": sec,
                  "tflops": flops / sec / 1e12, "efficiency": base / sec})
            del shards
        if args.device == "cuda":
            torch.cuda.empty_cache()


# -- driver -----------------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="correctness against the fp64 reference")
    ap.add_argument("--bench", action="store_true", help="TFLOP/s table")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cuda: FlashBlock (the GPU run); cpu: TorchBlock in fp32 (the dry run)")
    ap.add_argument("--scale", type=float, default=1.0, help="pack size as a fraction of 128K tokens")
    ap.add_argument("--heads", type=int, default=HEADS, help="query heads of the benchmark")
    ap.add_argument("--kv-heads", type=int, default=KV_HEADS, help="kv heads of the benchmark")
    ap.add_argument("--dim", type=int, default=DIM, help="head dim of the benchmark")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs before the timed ones")
    ap.add_argument("--iters", type=int, default=3, help="timed runs (the median is reported)")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds from the start after which no new benchmark pass starts (0: no limit)")
    ap.add_argument("--json", metavar="FILE", help="write the results (JSON) to FILE as they come")
    ap.add_argument("--write-docs", metavar="FILE", help="write the results into FILE's gpu-ring section")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    args.started = time.monotonic()
    if args.device == "cuda":
        missing = ring_loop.flash_missing(torch.device("cuda", 0), torch.bfloat16, args.dim)
        if missing:
            print(f"gpu_ring SKIPPED: {missing}")
            return 2
    results = {"device": args.device, "torch": torch.__version__, "command": "python3 benchmarks/gpu_ring.py "
               + " ".join(a for a in (argv if argv is not None else sys.argv[1:])),
               "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU",
               "utc": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
               "shape": f"{'bf16' if args.device == 'cuda' else 'fp32'}, causal, {args.heads}/{args.kv_heads} heads, "
                        f"head dim {args.dim}, packs of {int(131072 * args.scale)} tokens",
               "iters": args.iters, "checks": [], "bench": []}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    def add(key: str) -> Callable[[dict], None]:
        def sink(item: dict) -> None:
            results[key].append(item)
            save()
        return sink

    save()
    ok = True
    if args.check:
        ok = run_checks(SETUPS[args.device], add("checks"))
        results["check_ok"] = ok
        save()
    if args.bench:
        def emit(row: dict) -> None:
            add("bench")(row)
            if "skipped" not in row:
                print(f"| {row['pack']} | {row['pass']} | {row['what']} | {1e3 * row['seconds']:.2f} | "
                      f"{row['tflops']:.2f} | {100 * row['efficiency']:.0f} % |", flush=True)
        pack_lengths = packs(args.scale)
        for kind, name in BENCH_ORDER:
            bench_pack(name, pack_lengths[name], args, emit, (kind,))
    if args.write_docs and (args.check or args.bench):
        write_docs(args.write_docs, render_section(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
