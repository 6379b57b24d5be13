"""The Python ring loop of dynacp.torch (ring_loop.py) on CPU over gloo: schedule equal to the C++ one, fp32 results
within 1e-5 + 1e-5·|ref| of an fp64 dense reference for CP 1-6 (causal, full, mixed; GQA; odd and empty lengths;
default and caller padding; forward and backward), concurrent rings addressed by pool rank on one group, the
overlap order (the receive of hop t+1 is posted before block t is computed), and the FlashAttention block's errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from gloo_workers import run_workers  # noqa: E402

from dynacp import _core  # noqa: E402
from dynacp.torch import ring_attention, ring_loop, zigzag_shard  # noqa: E402

TOL = 1e-5
LENGTHS = [1, 13, 24, 7, 2, 31, 0, 5, 19]


def reference(q, k, v, cu, causal, scale):
    """Dense softmax attention per sequence (fp64, torch autograd); padded/empty sequences contribute no rows."""
    outs, g = [], q.shape[1] // k.shape[1]
    for b in range(len(cu) - 1):
        s, e = int(cu[b]), int(cu[b + 1])
        if e == s:
            continue
        ks, vs = k[s:e].repeat_interleave(g, 1), v[s:e].repeat_interleave(g, 1)
        scores = torch.einsum("ihd,jhd->hij", q[s:e], ks) * scale
        if causal[b]:
            scores = scores.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs))
    return torch.cat(outs)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = (got.double() - want).abs() - (TOL + TOL * want.abs())
    assert float(err.max()) <= 0, f"{what}: exceeds 1e-5 + 1e-5|ref| by {float(err.max()):.3g}"


def _gather_rows(local: torch.Tensor, cu, cp: int, index: int, cu_padded, total: int) -> torch.Tensor:
    """Scatter this ring member's rows into a zero global tensor (summed over the ring by the caller)."""
    rows = torch.from_numpy(_core.zigzag_rows(cu, cp, index, cu_padded))
    out = local.new_zeros((total,) + tuple(local.shape[1:]))
    keep = rows >= 0
    out[rows[keep]] = local[keep]
    return out


def _check(ring: list, causal, seed: int, pad_extra: int = 0, kv_heads: int = 2) -> None:
    """Run ring_attention on the ring (pool ranks of WORLD) and compare out, lse, dq, dk, dv on every member."""
    me, cp = dist.get_rank(), len(ring)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    flags = [causal] * len(LENGTHS) if isinstance(causal, bool) else causal
    cu_padded = None
    if pad_extra:  # the caller's own padding: each sequence padded past the default by pad_extra * 2cp rows
        lens = [(-(-n // (2 * cp)) + pad_extra) * 2 * cp for n in LENGTHS]
        cu_padded = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    g = torch.Generator().manual_seed(seed)
    t = int(cu[-1])
    q, dout = (torch.randn(t, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(t, kv_heads, 8, generator=g, dtype=torch.float64) for _ in range(2))
    idx = ring.index(me)
    qg, kg, vg = (x.float().requires_grad_() for x in (q, k, v))
    ql, kl, vl = (zigzag_shard(x, cu, cp, idx, cu_padded) for x in (qg, kg, vg))
    out, lse = ring_attention(ql, kl, vl, cu, None, causal, ranks=ring, cu_seqlens_padded=cu_padded, timeout=30.0,
                              return_lse=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    pad = torch.from_numpy(_core.zigzag_rows(cu, cp, idx, cu_padded)) < 0
    assert bool(torch.all(out[pad] == 0)) and bool(torch.all(lse[pad] == float("-inf")))
    (out * zigzag_shard(dout.float(), cu, cp, idx, cu_padded)).sum().backward()
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, cu, flags, 8 ** -0.5)
    ref.backward(dout)
    # each member checks its own rows of out; gradients: every member holds the gradient of its own q/k/v rows
    _close(out.detach()[~pad], zigzag_shard(ref.detach(), cu, cp, idx, cu_padded)[~pad], f"out ring {ring}")
    for name, got, want in zip("qkv", (qg.grad, kg.grad, vg.grad), (qr.grad, kr.grad, vr.grad)):
        mine = _gather_rows(zigzag_shard(want, cu, cp, idx, cu_padded), cu, cp, idx, cu_padded, t)
        _close(got, mine, f"d{name} ring {ring} causal {causal}")


def _worker_rings(rank: int, world: int, rings: list) -> str:
    """Every step: a set of disjoint rings covering the world, run concurrently on the WORLD group."""
    torch.set_num_threads(1)  # several processes share the cores
    for step, (layout, causal, pad, kvh) in enumerate(rings):
        ring = next(r for r in layout if rank in r)
        _check(list(ring), causal, seed=100 + step, pad_extra=pad, kv_heads=kvh)
    dist.barrier()
    return "ok"


MIXED = [i % 2 == 0 for i in range(len(LENGTHS))]


def test_ring_loop_three_processes_cp1_and_cp3():
    rings = [([(0, 1, 2)], True, 0, 2), ([(2, 0, 1)], False, 1, 1), ([(1, 2, 0)], MIXED, 0, 4),
             ([(0,), (1,), (2,)], True, 1, 2), ([(0,), (2, 1)], MIXED, 0, 2)]
    assert run_workers(_worker_rings, 3, rings=rings) == ["ok"] * 3


def test_ring_loop_four_processes_cp2_and_cp4_concurrent_rings():
    rings = [([(0, 1, 2, 3)], True, 0, 2), ([(3, 1, 0, 2)], False, 0, 1), ([(0, 2), (3, 1)], MIXED, 1, 2),
             ([(1, 2, 3), (0,)], True, 0, 4)]
    assert run_workers(_worker_rings, 4, rings=rings) == ["ok"] * 4


def test_ring_loop_six_processes_cp5_and_cp6():
    rings = [([(4, 0, 2, 1, 3), (5,)], True, 0, 2), ([(5, 4, 3, 2, 1, 0)], MIXED, 1, 2),
             ([(0, 1, 2, 3, 4, 5)], False, 0, 1)]
    assert run_workers(_worker_rings, 6, rings=rings) == ["ok"] * 6


def test_the_loop_runs_the_cpp_schedule_by_hand():
    """Two sequences (5 tokens causal, padded to 8; 1 token full, padded to 4) on a ring of 2: chunks of 2 and 1 rows.
    Step 0 is each rank's own diagonal block; at step 1 rank 0 holds rank 1's kv (src > rank: q back half, kv whole)
    and rank 1 holds rank 0's (src < rank: q whole, kv front half); the full-mask sequence takes whole blocks."""
    cu, cu_p = np.array([0, 5, 6]), np.array([0, 8, 12])
    want = {
        (0, 0): [[0, 2, 0, 4, 0, 4, 5, 0, 0, 1], [4, 1, 0, 2, 0, 2, 1, 0, 0, 0]],
        (0, 1): [[0, 2, 2, 4, 0, 4, 5, 0, 1, 0], [4, 1, 0, 2, 0, 2, 1, 0, 1, 0]],
        (1, 0): [[0, 2, 0, 4, 0, 4, 5, 1, 1, 1], [4, 1, 0, 2, 0, 2, 1, 1, 1, 0]],
        (1, 1): [[0, 2, 0, 4, 0, 2, 5, 1, 0, 0], [4, 1, 0, 2, 0, 2, 1, 1, 0, 0]],
    }
    for (rank, step), rows in want.items():
        assert ring_loop.step_blocks(cu, cu_p, 2, rank, step, [True, False]).tolist() == rows, (rank, step)


def test_every_rank_computes_one_diagonal_and_cp_minus_one_half_blocks():
    cp, chunk = 4, 3
    cu = np.array([0, 2 * cp * chunk], dtype=np.int64)
    for rank in range(cp):
        specs = ring_loop.build_specs(cu, cu, cp, rank, [True], torch.device("cpu"))
        sizes = [(len(s.q_idx), len(s.k_idx), s.causal) for step in specs for s in step]
        assert sizes[0] == (2 * chunk, 2 * chunk, True)
        assert sorted(sizes[1:]) == sorted([(2 * chunk, chunk, False)] * rank + [(chunk, 2 * chunk, False)] *
                                           (cp - 1 - rank))


class _Instrumented:
    """TorchBlock that records each block call into the shared event list."""

    name = "instrumented"

    def __init__(self, events: list):
        self.inner, self.events = ring_loop.TorchBlock(), events

    def forward(self, q, k, v, spec, scale):
        self.events.append(("block", sum(e[0] == "block" for e in self.events)))
        return self.inner.forward(q, k, v, spec, scale)

    def backward(self, dout, q, k, v, out, lse, spec, scale):
        self.events.append(("block_bwd", sum(e[0] == "block_bwd" for e in self.events)))
        return self.inner.backward(dout, q, k, v, out, lse, spec, scale)


def _worker_overlap(rank: int, world: int) -> list:
    cu = np.array([0, 8 * world], dtype=np.int64)  # one full-mask sequence: exactly one block per step
    x = torch.randn(2 * 4, 2, 8, requires_grad=True)
    events: list = []
    out = ring_attention(x, x, x, cu, causal=False, block=_Instrumented(events),
                         recorder=lambda e, i: events.append((e, i)))
    out.sum().backward()
    return events


def test_receive_of_the_next_hop_is_posted_before_the_block_is_computed():
    world = 3
    for events in run_workers(_worker_overlap, world):
        split = events.index(("block_bwd", 0)) - 1  # the backward's first event posts its kv hop 1
        at = {e: i for i, e in enumerate(events[:split])}
        for t in range(world):
            if t + 1 < world:  # forward: kv hop t+1 posted before block t, waited after it
                assert at[("post_kv", t + 1)] < at[("block", t)] < at[("wait_kv", t + 1)], events
        bwd = events[split:]
        assert bwd[0] == ("post_kv", 1), bwd
        pos = {e: i for i, e in enumerate(bwd)}
        for t in range(world):
            if t + 1 < world:
                assert pos[("post_kv", t + 1)] < pos[("block_bwd", t)] < pos[("wait_kv", t + 1)], bwd
            assert pos[("block_bwd", t)] < pos[("post_dkv", t + 1)], bwd  # dk/dv leave after their block
            if t:  # the dk/dv of hop t arrive while block t runs
                assert pos[("post_dkv", t)] < pos[("block_bwd", t)] < pos[("wait_dkv", t)], bwd
        assert ("wait_dkv", world) in pos  # the final hop returns every rank its own dk/dv


def test_flash_block_names_what_is_missing():
    with pytest.raises(RuntimeError, match="FlashAttention block function cannot run.*CUDA tensors"):
        ring_loop.FlashBlock(torch.device("cpu"), torch.bfloat16, 128)
    assert "float32" in ring_loop.flash_missing(torch.device("cuda", 0), torch.float32, 128) or \
        not torch.cuda.is_available()
    if not torch.cuda.is_available():
        assert "is_available() is False" in ring_loop.flash_missing(torch.device("cuda", 0), torch.bfloat16, 128)
    with pytest.raises(ValueError, match="block must be"):
        ring_loop.make_block("fast", torch.device("cpu"), torch.float32, 8)



@pytest.mark.parametrize("lengths", [LENGTHS, [16, 24, 8, 48]])
def test_local_ring_matches_the_process_ring_reference(lengths):
    """The in-process ring (threads; what the single-GPU benchmark and checks run) on CPU, CP 1-4; the second
    pack has no padding at CP 1 and 2, so blocks that cover every row skip the gathers (asserted)."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if lengths != LENGTHS:
        specs = ring_loop.build_specs(cu, cu, 2, 0, [True] * len(lengths), torch.device("cpu"))
        assert specs[0][0].q_all and specs[0][0].k_all and not specs[1][0].q_all
    g = torch.Generator().manual_seed(7)
    t = int(cu[-1])
    q, dout = (torch.randn(t, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(t, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    flags = [i % 2 == 0 for i in range(len(lengths))]
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = reference(qr, kr, vr, cu, flags, 8 ** -0.5)
    ref.backward(dout)
    for cp in range(1, 5):
        shards = [tuple(zigzag_shard(x.float(), cu, cp, r) for x in (q, k, v, dout)) for r in range(cp)]
        res = ring_loop.local_ring_attention(shards, cu, flags, ring_loop.TorchBlock())
        for r, (out, lse, dq, dk, dv) in enumerate(res):
            pad = torch.from_numpy(_core.zigzag_rows(cu, cp, r, None)) < 0
            _close(out[~pad], zigzag_shard(ref.detach(), cu, cp, r)[~pad], f"out cp {cp}")
            assert bool(torch.all(lse[pad] == float("-inf")))
            for name, got, want in zip("qkv", (dq, dk, dv), (qr.grad, kr.grad, vr.grad)):
                _close(got[~pad], zigzag_shard(want, cu, cp, r)[~pad], f"d{name} cp {cp} rank {r}")
