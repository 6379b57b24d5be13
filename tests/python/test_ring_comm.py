"""The Python ring loop's communication set-up over gloo, 4 processes (dynacp.torch.ring_comm): the group warm-up
before the first P2P on a sub-ring (explicit, counted by every rank; automatic for a ring over the whole group;
the error naming the fix where an NCCL group would be left to lazy initialisation) and the host staging of device
tensors over gloo (the device check faked on CPU tensors), each with results against the fp64 reference."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from gloo_workers import run_workers  # noqa: E402
from test_ring_loop import LENGTHS, _close, _gather_rows, reference  # noqa: E402

from dynacp.torch import ring_attention, ring_comm, zigzag_shard  # noqa: E402


def _ring_check(group, ring: list, seed: int, events: list) -> None:
    """ring_attention on the ring (group ranks of ``group``) vs the fp64 reference: out and the own rows' grads."""
    me, cp = dist.get_rank(group), len(ring)
    idx = ring.index(me)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q, dout = (torch.randn(t, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(t, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    qg, kg, vg = (x.float().requires_grad_() for x in (q, k, v))
    out = ring_attention(*(zigzag_shard(x, cu, cp, idx) for x in (qg, kg, vg)), cu, group, True, ranks=ring,
                         timeout=30.0, recorder=lambda e, i: events.append((e, i)))
    (out * zigzag_shard(dout.float(), cu, cp, idx)).sum().backward()
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, cu, [True] * len(LENGTHS), 8 ** -0.5)
    ref.backward(dout)
    from dynacp import _core

    pad = torch.from_numpy(_core.zigzag_rows(cu, cp, idx, None)) < 0
    _close(out.detach()[~pad], zigzag_shard(ref.detach(), cu, cp, idx)[~pad], f"out ring {ring}")
    for name, got, want in zip("qkv", (qg.grad, kg.grad, vg.grad), (qr.grad, kr.grad, vr.grad)):
        _close(got, _gather_rows(zigzag_shard(want, cu, cp, idx), cu, cp, idx, None, t), f"d{name} ring {ring}")


def _kinds(events: list) -> set:
    return {e for e, _ in events}


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    res: dict = {}
    sub = [0, 1] if rank < 2 else [2, 3]  # two rings, each on half of the group
    # 1. A fresh group, first P2P on a sub-ring: as NCCL without eager init it is refused, naming the fix.
    g = dist.new_group(list(range(world)))
    real = ring_comm.backend_name
    ring_comm.backend_name = lambda group: "nccl" if group is g else real(group)
    try:
        ring_attention(torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), np.array([0, 16]), g,
                       ranks=sub)
        res["refused"] = ""
    except RuntimeError as e:
        res["refused"] = str(e)
    finally:
        ring_comm.backend_name = real
    # 2. Every rank warms the group up once (the count is the group size); then the first P2P runs on sub-rings.
    res["warm"] = [ring_comm.warm_up_group(g, timeout=30.0), ring_comm.warm_up_group(g, timeout=30.0)]
    events: list = []
    _ring_check(g, sub, seed=1, events=events)
    res["sub_events"] = sorted(_kinds(events))
    # 3. A ring over a whole fresh group warms it up by itself, once.
    g2 = dist.new_group(list(range(world)))
    first, second = [], []
    _ring_check(g2, [3, 1, 0, 2], seed=2, events=first)
    _ring_check(g2, sub, seed=3, events=second)
    res["auto"] = [i for e, i in first if e == "warm_up"] + [i for e, i in second if e == "warm_up"]
    # 4. Device tensors over gloo go through host copies: the device check faked, on CPU tensors.
    staged_fn = ring_comm.needs_host_staging
    ring_comm.needs_host_staging = lambda device, group: True
    try:
        staged: list = []
        _ring_check(g2, sub, seed=4, events=staged)
    finally:
        ring_comm.needs_host_staging = staged_fn
    res["staged"] = sum(e.startswith("stage_") for e, _ in staged)
    res["posted"] = sum(e.startswith("post_") for e, _ in staged)
    dist.barrier()
    return res


def test_pool_warm_up_before_the_first_p2p_on_a_sub_ring_and_host_staging():
    for res in run_workers(_worker, 4):
        assert "warm_up_group(group)" in res["refused"] and "device_id" in res["refused"], res["refused"]
        assert res["warm"] == [4, 0], res
        assert "warm_up" not in res["sub_events"] and "post_kv" in res["sub_events"], res
        assert res["auto"] == [4], res
        assert res["staged"] == res["posted"] > 0, res  # every hop of the ring, forward and backward


def test_device_check_of_the_staging_rule():
    """CUDA (any non-CPU device) over gloo is staged; CPU tensors and non-gloo groups are not."""
    class _Group:
        pass

    real = ring_comm.backend_name
    try:
        ring_comm.backend_name = lambda group: group.backend
        gloo, nccl = _Group(), _Group()
        gloo.backend, nccl.backend = "gloo", "nccl"
        assert ring_comm.needs_host_staging(torch.device("cuda", 0), gloo)
        assert not ring_comm.needs_host_staging(torch.device("cpu"), gloo)
        assert not ring_comm.needs_host_staging(torch.device("cuda", 0), nccl)
    finally:
        ring_comm.backend_name = real
