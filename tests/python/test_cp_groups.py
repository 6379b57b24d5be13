"""CP rings without a process group per ring (issue 25): a 100-step, 4-process gloo training run of the wrapper with
dynacp plans and dynacp's ring attention over the pool group creates no process group after start-up (counted);
with a pre-built ring set (for TransformerEngine) every ring of every plan comes from the set and none is created
after start-up either; restrict_plan keeps plans valid; the TransformerEngine handoff follows TE's padding rule."""

from __future__ import annotations

import datetime

import numpy as np
import pytest
import torch
from gloo_workers import PG_TIMEOUT_S, counting_new_groups, run_workers
from test_integration import CLUSTER, COST, MODEL, make_global_batch

import dynacp
from dynacp.integration import (
    Planner,
    cp_attention,
    distinct_rings,
    finalize_grads,
    get_wrapper,
    make_process_groups,
    make_te_context_parallel,
    masked_token_loss,
    restrict_plan,
    ring_set,
    wrap_data_iterator,
)
from dynacp.integration.tiny_gpt import TinyGPT

PER_RANK = 2  # samples each rank reads per global batch


def _batches(steps: int, world: int) -> list[list[int]]:
    rng = np.random.default_rng(25)
    return [rng.integers(1, 61, PER_RANK * world).tolist() for _ in range(steps)]


def _train(rank: int, world: int, mode: str, steps: int) -> dict:
    torch.set_num_threads(1)  # 4 processes share 2 cores: intra-op threads would oversubscribe them
    rings = ring_set(world, world) if mode == "prebuilt" else None
    kwargs = {} if mode == "default" else {"cp_groups": mode, "ring_set": rings}
    if mode == "prebuilt-default":  # the default set of the pool, and the wrapper plans on it (Planner.ring_set None)
        kwargs = {"cp_groups": "prebuilt"}
    groups = make_process_groups(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S), **kwargs)
    with counting_new_groups() as calls:  # every group creation from here on is counted
        samples = []
        for s, lengths in enumerate(_batches(steps, world)):
            samples += make_global_batch(lengths, seed=s)[rank * PER_RANK:(rank + 1) * PER_RANK]
        stream = iter(samples)
        torch.manual_seed(1234)
        model = TinyGPT(MODEL)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        planner = Planner(strategy="dynacp", cluster=dynacp.Cluster(**CLUSTER), cost=dynacp.CostModel(**COST),
                          timeout=PG_TIMEOUT_S, ring_set=rings)
        seen: set = set()
        loss = 0.0
        for _ in range(steps):
            it, *_ = wrap_data_iterator(stream, planner=planner, groups=groups, num_samples=PER_RANK)
            gb = get_wrapper(stream).last_batch
            seen |= {tuple(r) for r in gb.rings if len(r) > 1}
            opt.zero_grad()
            for mb in it:
                def attn(q, k, v, p=mb["packed_seq_params"], r=mb["cp_ring"]):
                    return cp_attention(q, k, v, p, impl="ring", cp_ring=r)

                loss_sum, count = masked_token_loss(model(mb["tokens"], mb["position_ids"], attn), mb["labels"],
                                                    mb["loss_mask"])
                loss_sum.backward()
                loss = float(loss_sum.detach())
            finalize_grads(model.parameters(), groups, gb.num_valid_tokens)
            opt.step()
        pool_set = groups.cp_pool.ring_set
        return {"new_group_calls": len(calls), "created": groups.cp_pool.created_after_startup,
                "rings": sorted(seen), "set": None if pool_set is None else [tuple(r) for r in pool_set],
                "loss": loss}


def test_hundred_steps_with_dynacp_ring_create_no_process_group():
    results = run_workers(_train, 4, deadline=600, mode="pool", steps=100)
    for r in results:
        assert r["new_group_calls"] == 0 and r["created"] == 0, r["new_group_calls"]
        assert np.isfinite(r["loss"])
    rings = set(results[0]["rings"])
    assert len(rings) >= 4 and {len(x) for x in rings} >= {2, 4}, rings  # real multi-rank rings ran


def test_hundred_steps_with_default_settings_create_no_process_group():
    """Issue 35: the defaults (make_process_groups() and Planner()) never create a group after start-up."""
    results = run_workers(_train, 4, deadline=600, mode="default", steps=100)
    for r in results:
        assert r["new_group_calls"] == 0 and r["created"] == 0, r["new_group_calls"]
    assert len(results[0]["rings"]) >= 2  # multi-rank rings ran


def test_default_prebuilt_set_is_planned_on():
    results = run_workers(_train, 4, deadline=600, mode="prebuilt-default", steps=20)
    for r in results:
        assert r["new_group_calls"] == 0 and r["created"] == 0
        assert r["set"] == [(0, 1), (2, 3), (0, 1, 2, 3)] or set(r["set"]) == {(0, 1), (2, 3), (0, 1, 2, 3)}
        assert set(r["rings"]) <= set(r["set"]), set(r["rings"]) - set(r["set"])


def test_prebuilt_ring_set_serves_every_plan():
    results = run_workers(_train, 4, deadline=600, mode="prebuilt", steps=30)
    for r in results:
        assert r["new_group_calls"] == 0 and r["created"] == 0
        assert set(r["rings"]) <= set(r["set"]), set(r["rings"]) - set(r["set"])
    assert len(results[0]["rings"]) >= 2


def test_restrict_plan_keeps_plans_valid_and_inside_the_set():
    cluster, cost = dynacp.Cluster(num_ranks=16, ranks_per_node=8, tokens_per_rank=8192), dynacp.CostModel()
    allowed = ring_set(16, 8)
    assert all(r[0] // 8 == r[-1] // 8 for r in allowed if len(r) <= 8)  # node-sized rings stay in a node
    assert len(allowed) == len(set(allowed))
    rng = np.random.default_rng(1)
    for _ in range(5):
        lengths = rng.lognormal(8, 1.4, 120).astype(np.int64).clip(1, 60000)
        plan = dynacp.plan(lengths, cluster=cluster, cost=cost)
        out = restrict_plan(plan, lengths, cluster, cost, allowed)
        out.validate(lengths, cluster, cost)
        assert distinct_rings(out) <= set(allowed)
        got = sorted(s for slot in out.microbatches for g in slot for s in g.sequences)
        assert got == list(range(len(lengths)))  # every sequence exactly once
        assert out.predicted.step_time >= plan.predicted.lower_bound * (1 - 1e-9)
    with pytest.raises(ValueError, match="no ring of size"):
        restrict_plan(plan, lengths, cluster, cost, ring_set(16, 8, sizes=[2]))


def test_ring_set_counts_and_rejects_bad_input():
    assert ring_set(4) == [(0, 1), (2, 3), (0, 1, 2), (1, 2, 3), (0, 1, 2, 3)]
    assert len(ring_set(64, 8)) == 289
    with pytest.raises(ValueError, match="must divide"):
        ring_set(10, 4)
    with pytest.raises(ValueError, match="outside"):
        ring_set(4, sizes=[5])


def test_te_handoff_follows_te_padding_rule():
    te = make_te_context_parallel(None, [5, 7, 9], 1, [0, 5, 12], [0, 6, 18], 12)
    assert te.cp_size == 3 and te.cp_comm_type == "p2p"
    kw = te.attention_kwargs()
    assert kw["qkv_format"] == "thd" and kw["cu_seqlens_q_padded"].dtype == torch.int32
    assert kw["cu_seqlens_kv"].tolist() == [0, 5, 12] and kw["max_seqlen_q"] == 12
    with pytest.raises(ValueError, match="multiples of 2 \\* cp_size = 6"):
        make_te_context_parallel(None, [5, 7, 9], 1, [0, 5, 12], [0, 6, 14], 8)
    with pytest.raises(RuntimeError, match="needs a process group per ring"):
        te.apply(object())

    class FakeTE:
        def set_context_parallel_group(self, group, ranks, stream, comm_type):
            self.args = (group, ranks, stream, comm_type)

    m = FakeTE()
    make_te_context_parallel("G", [5, 7], 0, [0, 3], [0, 4], 4, cp_comm_type="a2a").apply(m, cp_stream="S")
    assert m.args == ("G", [5, 7], "S", "a2a")
