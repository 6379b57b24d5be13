"""The Python ring loop across processes over gloo (run by tests/gpu/run.sh, stage p2p_check):
``dynacp.torch.ring_attention`` (loop="python") in 3 processes sharing one device, on CUDA tensors with FlashBlock
(bf16; gloo moves them through host copies: ring_comm's host staging) or, with ``--device cpu`` (the dry run), on CPU
tensors with TorchBlock (fp32).

Each rank runs, on the WORLD group: a ring over the whole group first (which runs the group's warm-up collective:
every rank counts 3), then rings over parts of it -- (0, 2) and (1) -- whose P2P involves only some ranks of the
group. Out, LSE-padding rows and dq/dk/dv of its own rows are checked with FlashAttention's rule against an fp64
dense reference (at most twice the error of the same reference in the input dtype, plus 1e-3).

    python3 tests/gpu/ring_p2p_check.py [--device cpu] [--json FILE]     # exit 0 when every rank passes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dynacp import _core
from dynacp.torch import ring_attention, zigzag_shard

ROOT = Path(__file__).resolve().parents[2]
WORLD = 3
RINGS = ([0, 1, 2], [2, 0, 1])  # over the whole group (the first one warms it up), then parts of it
SUB_RINGS = ([0, 2], [1])
SIZES = {"cuda": ((1, 300, 257, 64, 513, 3, 31), torch.bfloat16, 8, 2, 64),
         "cpu": ((1, 37, 24, 7, 2, 31, 0, 5), torch.float32, 4, 2, 16)}


def _gpu_ring():
    spec = importlib.util.spec_from_file_location("gpu_ring", ROOT / "benchmarks" / "gpu_ring.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_ring(ring: list, device: str, seed: int, events: list) -> list[str]:
    """One ring_attention call on this rank's shard: the failures (empty when it passes)."""
    lengths, dtype, heads, kv_heads, dim = SIZES[device]
    dev = torch.device(device)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    me, cp = dist.get_rank(), len(ring)
    idx = ring.index(me)
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q, dout = (torch.randn(t, heads, dim, generator=g).to(dev, dtype) for _ in range(2))
    k, v = (torch.randn(t, kv_heads, dim, generator=g).to(dev, dtype) for _ in range(2))
    causal = [i % 2 == 0 for i in range(len(lengths))]
    dense = _gpu_ring().dense
    ref = dense(*(x.double() for x in (q, k, v, dout)), cu, causal, dim ** -0.5)
    low = dense(q, k, v, dout, cu, causal, dim ** -0.5)
    leaves = [zigzag_shard(x, cu, cp, idx).detach().requires_grad_() for x in (q, k, v)]
    out, lse = ring_attention(*leaves, cu, None, causal, ranks=ring, timeout=60.0, return_lse=True,
                              recorder=lambda e, i: events.append((e, i)))
    out.backward(zigzag_shard(dout, cu, cp, idx))
    rows = torch.from_numpy(_core.zigzag_rows(cu, cp, idx, None)).to(dev)
    real = rows >= 0
    bad = []
    if not (bool(torch.all(out[~real] == 0)) and bool(torch.all(lse[~real] == float("-inf")))):
        bad.append("padding rows are not out 0 / lse -inf")
    got = [out, lse] + [x.grad for x in leaves]  # dk/dv: the gradient of this rank's own kv rows, from the ring
    for name, x, want, base in zip(("out", "lse", "dq", "dk", "dv"), got, ref, low):
        x, w, b = x[real].double(), want[rows[real]].double(), base[rows[real]].double()
        err, allowed = float((x - w).abs().max()), 2 * float((b - w).abs().max()) + 1e-3
        if err > allowed:
            bad.append(f"{name}: {err:.3g} > {allowed:.3g}")
    return bad


def rank_main(rank: int, port: int, device: str) -> int:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    if device == "cuda":
        torch.cuda.set_device(0)
    ok, report = True, {"rank": rank, "cases": []}
    for step, ring in enumerate(list(RINGS) + [next(r for r in SUB_RINGS if rank in r)]):
        events: list = []
        bad = check_ring(ring, device, seed=step, events=events)
        warm = [i for e, i in events if e == "warm_up"]
        staged = sum(e.startswith("stage_") for e, _ in events)
        posted = sum(e.startswith("post_") for e, _ in events)
        if step == 0 and warm != [WORLD]:
            bad.append(f"the first ring over the group ran warm-up {warm}, expected one counting {WORLD}")
        if step > 0 and warm:
            bad.append(f"ring {step} ran the warm-up again: {warm}")
        if device == "cuda" and staged != posted:
            bad.append(f"{posted} hops posted but {staged} staged through host memory (CUDA tensors over gloo)")
        ok &= not bad
        report["cases"].append({"ring": ring, "ok": not bad, "problems": bad, "hops": posted, "staged": staged})
        print(f"  [{'PASS' if not bad else 'FAIL'}] rank {rank} ring {ring}: {posted} hops ({staged} host-staged)"
              + ("" if not bad else ": " + "; ".join(bad)), flush=True)
    dist.barrier()
    print("RESULT " + json.dumps(report), flush=True)
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "rank":
        return rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", metavar="FILE", help="write every rank's results (JSON) to FILE")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds before the ranks are killed")
    args = ap.parse_args()
    if args.device == "cuda":
        from dynacp.torch import ring_loop

        missing = ring_loop.flash_missing(torch.device("cuda", 0), torch.bfloat16, SIZES["cuda"][4])
        if missing:
            print(f"ring_p2p_check SKIPPED: {missing}")
            return 2
    print(f"dynacp.torch.ring_attention (Python loop), {WORLD} processes over gloo, {args.device} tensors "
          f"({'FlashBlock, bf16, host-staged' if args.device == 'cuda' else 'TorchBlock, fp32'})", flush=True)
    port, t0 = free_port(), time.monotonic()
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(port), args.device],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(WORLD)]
    ok, ranks = True, []
    try:
        for r, p in enumerate(procs):
            try:
                out = p.communicate(timeout=max(t0 + args.limit - time.monotonic(), 1))[0]
            except subprocess.TimeoutExpired:
                out, ok = f"  [FAIL] rank {r} did not finish within {args.limit:g} s\n", False
            print("".join(line + "\n" for line in out.splitlines() if not line.startswith("RESULT ")), end="")
            ranks += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
            ok &= p.returncode == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "ok": ok, "ranks": ranks, "seconds": time.monotonic() - t0}, f, indent=1)
    print(f"ring p2p check: {'all passed' if ok else 'FAILED'} in {time.monotonic() - t0:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
