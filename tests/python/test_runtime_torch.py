"""dynacp.torch over torch.distributed/gloo with real processes, plus the packing codec.

Each distributed scenario runs this file as `python test_runtime_torch.py <scenario> <rank> <world> <port>` in
separate processes (inheriting DYNACP_EXT_DIR / PYTHONPATH); the pytest side only checks exit codes and output, with
a hard timeout so a hang fails instead of blocking CI. fp32 ring vs fp64 reference: atol = rtol = 1e-5; fp64 ring:
1e-10. Most checks run the default Python ring loop (tests/python/test_ring_loop.py covers it in depth); some run
the C++ ring executor (``loop="cpp"``), including its host-staged exchange of CUDA buffers over gloo on CPU tensors.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from dynacp import _core  # noqa: E402
from dynacp.torch import (  # noqa: E402
    broadcast_packing,
    decode_packing,
    encode_packing,
    ring_attention,
    zigzag_gather,
    zigzag_shard,
)
from dynacp.torch import ring as ring_module  # noqa: E402

ATOL = RTOL = 1e-5
LENGTHS = [1, 13, 24, 7, 2, 31, 0, 5]


def reference(q, k, v, cu, causal, scale):
    """Dense softmax attention per sequence, fp64, plain torch autograd."""
    outs = []
    group = q.shape[1] // k.shape[1]
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e == s:
            continue
        qs, ks, vs = q[s:e], k[s:e].repeat_interleave(group, 1), v[s:e].repeat_interleave(group, 1)
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        if causal[b]:
            scores = scores.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs))
    return torch.cat(outs)


def _inputs(seed, heads=4, kv_heads=2, dim=8):
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q = torch.randn(t, heads, dim, generator=g, dtype=torch.float64)
    k = torch.randn(t, kv_heads, dim, generator=g, dtype=torch.float64)
    v = torch.randn(t, kv_heads, dim, generator=g, dtype=torch.float64)
    dout = torch.randn(t, heads, dim, generator=g, dtype=torch.float64)
    return cu, q, k, v, dout


def _check_ring(group, members, causal, seed, dtype=torch.float32, tol=ATOL, loop="python"):
    """Runs the ring on `group` and checks out, lse, dq, dk, dv against the fp64 reference on every member."""
    cu, q, k, v, dout = _inputs(seed)
    cp, rank = len(members), dist.get_rank(group)
    qg, kg, vg = (x.to(dtype, copy=True).requires_grad_() for x in (q, k, v))
    ql, kl, vl = (zigzag_shard(x, cu, cp, rank) for x in (qg, kg, vg))
    out, lse = ring_attention(ql, kl, vl, cu, group, causal=causal, timeout=30.0, return_lse=True, loop=loop)
    assert out.dtype == dtype and lse.dtype == dtype and lse.shape == ql.shape[:2], (out.dtype, lse.dtype)
    padding = torch.from_numpy(_core.zigzag_rows(cu, cp, rank, None)) < 0
    assert bool(torch.all(lse[padding] == float("-inf"))) and bool(torch.all(out[padding] == 0))
    (out * zigzag_shard(dout.to(dtype), cu, cp, rank)).sum().backward()
    grads = [x.grad.clone() for x in (qg, kg, vg)]
    for gr in grads:  # each rank holds the gradient of its own rows only
        dist.all_reduce(gr, group=group)
    flags = [causal] * len(LENGTHS) if isinstance(causal, bool) else causal
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, cu, flags, q.shape[-1] ** -0.5)
    ref.backward(dout)
    torch.testing.assert_close(zigzag_gather(out.detach(), cu, group).double(), ref.detach(), atol=tol, rtol=tol)
    for name, got, want in zip("qkv", grads, (qr.grad, kr.grad, vr.grad)):
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol, msg=lambda m, n=name: f"d{n}: {m}")


def _always_stage(device, group):
    """The exchange of CUDA buffers over gloo (through host copies), applied to CPU buffers."""
    _always_stage.calls += 1
    return True


_always_stage.calls = 0


_default_stage = ring_module._stage_through_host


def _worker(scenario: str, rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    if scenario == "ring":
        _check_ring(None, list(range(world)), True, seed=1)
        _check_ring(None, list(range(world)), True, seed=1, loop="cpp")  # the C++ ring executor
        _check_ring(None, list(range(world)), [i % 2 == 0 for i in range(len(LENGTHS))], seed=2)
        _check_ring(None, list(range(world)), True, seed=6, dtype=torch.float64, tol=1e-10)
        _check_ring(None, list(range(world)), False, seed=6, dtype=torch.float64, tol=1e-10, loop="cpp")
        ring_module._stage_through_host = _always_stage  # the CUDA-over-gloo exchange, on CPU tensors
        _check_ring(None, list(range(world)), [i % 3 == 0 for i in range(len(LENGTHS))], seed=7, loop="cpp")
        assert _always_stage.calls == 2, _always_stage.calls  # one forward, one backward
        ring_module._stage_through_host = _default_stage
        # Groups of size 3 and 1: every rank must create every group, in the same order.
        g3, g1 = dist.new_group([0, 1, 2]), dist.new_group([3])
        if rank < 3:
            _check_ring(g3, [0, 1, 2], True, seed=3)
            _check_ring(g3, [0, 1, 2], False, seed=4)
        else:
            _check_ring(g1, [3], True, seed=5)
        dist.barrier()
        print("RING OK", flush=True)
        # Packing metadata from the last rank (e.g. the first pipeline stage) to everyone, exact beyond 2^24.
        big = (1 << 24) + 1
        mbs = [
            dict(cu_seqlens=[0, big, 2 * big + 3], cu_seqlens_padded=[0, big + 5, 2 * big + 11], max_seqlen=big + 1,
                 cp_size=3, group_ranks=[0, 1, 2]),
            dict(cu_seqlens=[0, 1 << 40], cu_seqlens_padded=[0, (1 << 40) + 4], max_seqlen=1 << 40, cp_size=1,
                 group_ranks=[3]),
        ]
        got = broadcast_packing(mbs if rank == world - 1 else None, src=world - 1, timeout=30.0)
        assert len(got) == 2 and got[0]["cu_seqlens"].tolist() == [0, big, 2 * big + 3], got
        assert got[1]["max_seqlen"] == 1 << 40 and got[1]["group_ranks"].tolist() == [3], got
        dist.barrier()
        print("PACKING OK", flush=True)
    elif scenario == "timeout":
        # Rank 1 never joins the ring (nor the broadcast): rank 0 must raise TimeoutError within its timeout.
        if rank == 0:
            cu = np.array([0, 16], dtype=np.int64)
            x = torch.randn(8, 2, 4)
            t0 = time.monotonic()
            try:
                ring_attention(x, x, x, cu, None, timeout=1.0)
                raise AssertionError("ring attention should have timed out")
            except TimeoutError as e:
                assert "peer 1" in str(e), e
                print(f"RING TIMEOUT after {time.monotonic() - t0:.2f}s: {e}".splitlines()[0], flush=True)
            t0 = time.monotonic()
            try:
                broadcast_packing(None, src=1, timeout=1.0)
                raise AssertionError("broadcast should have timed out")
            except TimeoutError:
                print(f"BROADCAST TIMEOUT after {time.monotonic() - t0:.2f}s", flush=True)
        else:
            time.sleep(6.0)
    sys.stdout.flush()
    os._exit(0)  # skip process-group teardown: a timed-out peer must not make exit hang


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(scenario: str, world: int, limit: float) -> list:
    port = _free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, scenario, str(r), str(world), str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy(),
        )
        for r in range(world)
    ]
    outputs, deadline = [], time.monotonic() + limit
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} of {scenario} failed:\n{out}"
    return outputs


def test_gloo_four_processes_ring_attention_and_packing_broadcast():
    outs = _launch("ring", 4, limit=300)
    assert all("RING OK" in o and "PACKING OK" in o for o in outs), outs


def test_missing_peer_times_out_instead_of_hanging():
    t0 = time.monotonic()
    outs = _launch("timeout", 2, limit=90)
    assert "RING TIMEOUT" in outs[0] and "BROADCAST TIMEOUT" in outs[0], outs[0]
    ring_s = float(outs[0].split("RING TIMEOUT after ")[1].split("s")[0])
    assert 0.9 <= ring_s < 5.0, outs[0]
    assert time.monotonic() - t0 < 90


def test_packing_codec_round_trip_and_corruption():
    big = (1 << 24) + 1
    mbs = [dict(cu_seqlens=[0, big, 2 * big], cu_seqlens_padded=[0, big + 1, 2 * big + 2], max_seqlen=big,
                cp_size=2, group_ranks=[4, 5])]
    buf = encode_packing(mbs)
    assert buf.dtype == np.int64 and buf[0] == _core.PACKING_VERSION and buf[1] == 1
    assert float(np.float32(big)) != big  # the reason for int64: float32 would round this
    got = decode_packing(buf)
    assert got[0]["cu_seqlens"].tolist() == [0, big, 2 * big] and got[0]["max_seqlen"] == big
    bad = buf.copy()
    bad[6] += 1
    with pytest.raises(RuntimeError, match="checksum"):
        decode_packing(bad)
    bad = buf.copy()
    bad[0] = 99
    with pytest.raises(RuntimeError, match="version"):
        decode_packing(bad)
    with pytest.raises(ValueError, match="group_ranks"):
        encode_packing([dict(mbs[0], group_ranks=[1])])


def test_zigzag_shard_rules():
    cu = np.array([0, 7, 10])
    assert _core.zigzag_layout(cu, 2).tolist() == [0, 8, 12]
    x = torch.arange(10.0)[:, None]
    assert zigzag_shard(x, cu, 2, 0)[:, 0].tolist() == [0, 1, 6, 0, 7, 0]  # padding rows are zero
    with pytest.raises(ValueError, match="truncated"):
        _core.zigzag_layout(cu, 2, [0, 6, 10])
    with pytest.raises(ValueError, match="multiple of 2"):
        _core.zigzag_layout(cu, 2, [0, 10, 14])


def test_cuda_tensors_without_the_cuda_extension_raise_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "dynacp._cuda", None)  # as in a build without nvcc: the module does not exist
    with pytest.raises(RuntimeError, match=r"no CUDA support: the extension module dynacp\._cuda is missing.*nvcc"):
        ring_module._ring_device(torch.device("cuda", 0), torch.bfloat16)


def test_cuda_ring_device_without_a_gpu_raises_the_cuda_error():
    cuda_ext = pytest.importorskip("dynacp._cuda", reason="built without CUDA (nvcc not found)")
    try:
        visible = cuda_ext.device_count()
    except RuntimeError:
        visible = 0
    if visible:
        pytest.skip("a GPU is visible; tests/gpu/run.sh covers the CUDA path")
    with pytest.raises(RuntimeError, match="CUDA error in cudaGetDeviceCount"):
        cuda_ext.CudaRingDevice("bfloat16", 0, 0)
    with pytest.raises(ValueError, match="float32, bfloat16 and float16"):
        cuda_ext.CudaRingDevice("float64", 0, 0)
    assert cuda_ext.MAX_HEAD_DIM == 128
    assert issubclass(cuda_ext.CudaRingDevice, _core.RingDevice)  # one ring loop in _core takes either device


def test_ring_attention_input_checks():
    cu = np.array([0, 8])
    x = torch.zeros(8, 2, 4)
    with pytest.raises(ValueError, match="float32 and float64"):
        ring_attention(x.bfloat16(), x.bfloat16(), x.bfloat16(), cu)
    with pytest.raises(ValueError, match="CPU and CUDA"):
        ring_attention(x.to("meta"), x.to("meta"), x.to("meta"), cu)
    with pytest.raises(ValueError, match="shapes disagree"):
        ring_attention(x, x[:, :1, :2], x[:, :1, :2], cu)
    with pytest.raises(ValueError, match="one device"):
        ring_attention(x, x.to("meta"), x, cu)
    assert _core.cpu_ring_device("float64").acc_bytes == 8
    with pytest.raises(ValueError, match="float32 and float64"):
        _core.cpu_ring_device("float16")


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
