"""Single-GPU check of the C++ ring executor, dynacp.torch.ring_attention(loop="cpp"), on CUDA tensors (run by tests/gpu/run.sh; needs torch with CUDA
and dynacp built with its CUDA module dynacp._cuda, e.g. DYNACP_EXT_DIR=<build>/python PYTHONPATH=python).

1. One process, an NCCL process group of size 1 (cp = 1): the CUDA path (C++ ring loop + CUDA kernels) against the
   CPU path (the same loop with the Eigen kernels, fp64) on the same rounded inputs, fp32 / bf16 / fp16, causal and
   full masks, GQA, head dims 64 and 128; then forward/backward time and TFLOP/s of one bf16 call.
2. Three processes sharing the one GPU over a gloo group (cp = 3; CUDA buffers staged through host memory, since
   one GPU cannot host several NCCL ranks): the multi-rank ring with the CUDA kernels against the CPU path, fp32 and
   bf16.

Tolerance: |got - ref| <= atol + rtol |ref| with atol = rtol = 1e-4 (fp32), 1e-2 (fp16), 2e-2 (bf16); the reference
sees the rounded inputs, so this measures accumulation, the rounded output (used by the backward, as in
FlashAttention) and the final rounding. Exit status 0 when every check passes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from dynacp.torch import ring_attention, zigzag_shard

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
LENGTHS = [1, 100, 257, 64, 300, 3, 31]


def inputs(seed: int, heads: int, kv_heads: int, dim: int, lengths=LENGTHS):
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q, dout = (torch.randn(t, heads, dim, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(t, kv_heads, dim, generator=g, dtype=torch.float64) for _ in range(2))
    return cu, q, k, v, dout


def run(cu, xs, dout, cp, rank, group, causal, device, dtype):
    """ring_attention on this rank's shard; returns out, lse, dq, dk, dv as fp64 CPU tensors."""
    leaves = [zigzag_shard(x.to(dtype), cu, cp, rank).to(device).requires_grad_() for x in xs]
    out, lse = ring_attention(*leaves, cu, group, causal=causal, timeout=60.0, return_lse=True, loop="cpp")
    out.backward(zigzag_shard(dout.to(dtype), cu, cp, rank).to(device))
    return [t.detach().double().cpu() for t in (out, lse, *(x.grad for x in leaves))]


def compare(label, cu, cp, rank, cuda_group, cpu_group, dtype, causal, seed, heads=8, kv_heads=2, dim=64) -> bool:
    _, q, k, v, dout = inputs(seed, heads, kv_heads, dim)
    rounded = [x.to(dtype).double() for x in (q, k, v, dout)]  # the values the GPU sees
    got = run(cu, rounded[:3], rounded[3], cp, rank, cuda_group, causal, "cuda", dtype)
    want = run(cu, rounded[:3], rounded[3], cp, rank, cpu_group, causal, "cpu", torch.float64)
    tol, worst, ok = TOL[dtype], {}, True
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        finite = torch.isfinite(w)
        ok &= bool(torch.equal(torch.isfinite(g), finite)) and bool(torch.all(g[~finite] == w[~finite]))
        err = ((g[finite] - w[finite]).abs() / (tol + tol * w[finite].abs())).max().item() if finite.any() else 0.0
        worst[name] = err
        ok &= err <= 1.0
    detail = " ".join(f"{n}={e:.3f}" for n, e in worst.items())
    print(f"  [{' ok ' if ok else 'FAIL'}] {label}: max |err| / (atol + rtol |ref|) {detail} (atol = rtol = {tol:g})",
          flush=True)
    return ok


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench(scale: float) -> None:
    lengths = [max(64, int(n * scale)) for n in (4096, 2048, 1024, 1024)]
    cu, q, k, v, dout = inputs(0, 32, 8, 128, lengths)
    xs = [x.to("cuda", torch.bfloat16).requires_grad_() for x in (q, k, v)]
    d = dout.to("cuda", torch.bfloat16)
    flops = 4.0 * 32 * 128 * sum(n * (n + 1) / 2 for n in lengths)
    times = []
    for _ in range(3):  # the first call warms up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = ring_attention(*xs, cu, None, causal=True, loop="cpp")
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        out.backward(d)
        torch.cuda.synchronize()
        times.append((t1 - t0, time.perf_counter() - t1))
    f, b = times[-1]
    print(f"  ring_attention bf16, causal, H=32, Hkv=8, D=128, {sum(lengths)} tokens, NCCL size 1: "
          f"fwd {f * 1e3:.2f} ms {flops / f / 1e12:.2f} TFLOP/s | bwd {b * 1e3:.2f} ms {2.5 * flops / b / 1e12:.2f} TFLOP/s",
          flush=True)


def single_process() -> bool:
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    cpu_group = dist.new_group([0], backend="gloo")
    cu = inputs(0, 1, 1, 1)[0]
    mixed = [i % 3 != 1 for i in range(len(LENGTHS))]
    print("dynacp.torch.ring_attention, CUDA tensors, NCCL group of size 1 vs the CPU path (fp64)", flush=True)
    ok = True
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ok &= compare(f"cp=1 {str(dtype)[6:]} mixed masks GQA D=64", cu, 1, 0, None, cpu_group, dtype, mixed, seed=1)
    ok &= compare("cp=1 bfloat16 full mask D=128", cu, 1, 0, None, cpu_group, torch.bfloat16, False, seed=2, heads=4,
                  kv_heads=4, dim=128)
    bench(float(os.environ.get("BENCH_SCALE", "1.0")))
    dist.destroy_process_group()
    return ok


def ring_rank(rank: int, world: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    torch.cuda.set_device(0)
    cu = inputs(0, 1, 1, 1)[0]
    mixed = [i % 2 == 0 for i in range(len(LENGTHS))]
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        ok &= compare(f"cp={world} rank {rank} {str(dtype)[6:]} mixed masks GQA", cu, world, rank, None, None, dtype,
                      mixed, seed=3)
    sys.stdout.flush()
    os._exit(0 if ok else 1)


def multi_process(world: int = 3, limit: float = 80.0) -> bool:
    print(f"dynacp.torch.ring_attention, CUDA tensors, {world} processes on one GPU over gloo (host-staged) vs the "
          "CPU path (fp64)", flush=True)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "rank", str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    deadline, ok = time.monotonic() + limit, True
    try:
        for r, p in enumerate(procs):
            try:
                out = p.communicate(timeout=max(deadline - time.monotonic(), 1))[0]
            except subprocess.TimeoutExpired:
                out, ok = f"  [FAIL] rank {r} did not finish within {limit:g} s\n", False
            print(out, end="", flush=True)
            ok &= p.returncode == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return ok


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "rank":
        ring_rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    if not torch.cuda.is_available():
        print("torch ring check: torch sees no CUDA device", flush=True)
        return 2
    from dynacp import _cuda  # noqa: F401  (fails loudly when the build has no CUDA module)

    t0 = time.monotonic()
    ok = single_process()
    ok &= multi_process()
    print(f"torch ring check: {'all passed' if ok else 'FAILED'} in {time.monotonic() - t0:.1f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
