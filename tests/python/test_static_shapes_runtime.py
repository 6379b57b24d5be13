"""CUDA-graph mode of the wrapper (issue 35, item 4, runtime half): with ``Planner(static_shapes=...)`` every emitted
microbatch has one of the declared shapes (rows per rank a bucket, ``cu_seqlens`` of ``max_sequences + 1`` entries,
CP size in the set, at most ``max_microbatches`` per rank per step), padding leaves loss and gradients equal to the
single-process reference, no process group is created after start-up, and the shapes reach pipeline stages
without data.

Run: DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest tests/python/test_static_shapes_runtime.py
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gloo_workers import PG_TIMEOUT_S, counting_new_groups, run_raw, run_workers
from test_integration import (
    BATCHES,
    CLUSTER,
    COST,
    RTOL,
    _build_model,
    _rel_err,
    check_conservation,
    make_global_batch,
    rank_share,
    reference_training,
)

import dynacp
from dynacp.integration import (
    DynamicCPDataIterator,
    MicrobatchShape,
    Planner,
    declared_shapes,
    finalize_grads,
    make_process_groups,
    reduce_num_tokens,
)
from dynacp.integration.layout import padded_length
from dynacp.integration.shapes import check_plan, fixed_length, group_padded
from dynacp.integration.slicing import WIDTH, slice_rows
from dynacp.integration.tiny_gpt import microbatch_loss

SOLVER_SHAPES = hasattr(dynacp, "StaticShapes")  # the solver half (dynacp.plan(..., static_shapes=...))
BUCKETS = [8, 16]          # rows per rank (the 4-rank test pool's budget is 16 tokens per rank)
MAX_MB, MAX_SEQS = 12, 4  # 12 slots x 16 rows x 4 ranks hold the largest random batch (up to ~500 tokens)
RANDOM_STEPS = 18          # steps of random lengths after the two reference batches
PER_RANK = 3               # samples each rank reads per global batch


@dataclass(frozen=True)
class HandShapes:
    """Stand-in for ``dynacp.StaticShapes`` with the same fields, for hand-built plans (fcp's degrees 1-4)."""

    token_buckets: tuple = tuple(BUCKETS)
    cp_sizes: tuple = (1, 2, 3, 4)
    max_microbatches: int = MAX_MB
    max_sequences: int = MAX_SEQS

    def bucket_of(self, rows: int) -> int:
        fits = [b for b in self.token_buckets if b >= rows]
        if not fits:
            raise ValueError(f"{rows} rows exceed the largest bucket {max(self.token_buckets)}")
        return fits[0]


def make_shapes(pool: int = 4):
    if SOLVER_SHAPES:  # CP sizes must divide the pool
        return dynacp.StaticShapes(token_buckets=BUCKETS, cp_sizes=[c for c in (1, 2, 4) if pool % c == 0],
                                   max_microbatches=MAX_MB,
                                   max_sequences=MAX_SEQS)
    return HandShapes()  # fcp takes up to 9 slots on these batches


def make_planner(pool: int = 4) -> Planner:
    cluster = dynacp.Cluster(num_ranks=pool, ranks_per_node=pool, activation_budget=CLUSTER["activation_budget"])
    cost = dynacp.CostModel(**COST)
    if SOLVER_SHAPES:  # the solver plans under the shapes
        return Planner(strategy="dynacp", cluster=cluster, cost=cost, timeout=PG_TIMEOUT_S,
                       static_shapes=make_shapes(pool))

    def fcp_equal(lengths: np.ndarray) -> dynacp.Plan:  # satisfies the stand-in shapes (the wrapper checks)
        return dynacp.plan(lengths, cluster=cluster, cost=cost, strategy="fcp", count_policy="equal")

    return Planner(plan_fn=fcp_equal, cluster=cluster, cost=cost, timeout=PG_TIMEOUT_S, static_shapes=make_shapes())


# ---------------------------------------------------------------------------------------------------------------------
# single-process unit tests


def test_group_padding_reaches_the_bucket_by_hand():
    """Lengths 5 and 3 on 2 ranks pad to 8 and 4 tokens (6 rows per rank); bucket 8 adds 2 rows per rank (4 tokens)
    as a padding-only sequence, or, with no room left in cu_seqlens (max_sequences = 2), to the last sequence; free
    shapes keep the zigzag padding only."""
    shapes = HandShapes()
    assert group_padded([5, 3], 2, 2, None) == [8, 4]
    assert group_padded([5, 3], 2, 2, shapes) == [8, 4, 4]
    assert group_padded([5, 3], 2, 2, HandShapes(max_sequences=2)) == [8, 8]
    assert group_padded([30], 2, 2, shapes) == [32]  # 16 rows: already a bucket
    assert group_padded([1], 1, 2, shapes) == [2, 6]
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        group_padded([40], 2, 2, shapes)
    with pytest.raises(ValueError, match="seq_pad_multiple"):
        group_padded([3], 1, 2, HandShapes(token_buckets=(5, 16)))


def test_fixed_length_cu_seqlens_and_declared_bank():
    shapes = HandShapes()
    assert fixed_length([0, 5, 8], shapes) == [0, 5, 8, 8, 8]
    assert fixed_length([0, 5, 8], None) == [0, 5, 8]
    with pytest.raises(ValueError, match="max_sequences"):
        fixed_length(list(range(7)), shapes)
    bank = declared_shapes(shapes)
    assert len(bank) == 4 * 2 and bank[0] == MicrobatchShape(1, 8, MAX_SEQS + 1)
    assert {s.rows for s in bank} == set(BUCKETS) and {s.cp_size for s in bank} == {1, 2, 3, 4}
    assert Planner(static_shapes=shapes).declared_shapes() == bank and Planner().declared_shapes() == []


def test_check_plan_names_what_breaks_the_shapes():
    def plan(groups):  # the plan fields check_plan reads (pool indices per group, sequence ids)
        return SimpleNamespace(microbatches=[[SimpleNamespace(**g) for g in slot] for slot in groups])

    shapes = HandShapes(cp_sizes=(1, 2), max_microbatches=2, max_sequences=2)
    check_plan(plan([[{"ranks": [0, 1], "sequences": [0, 1]}], [{"ranks": [0], "sequences": [2]}]]), shapes, 2)
    with pytest.raises(ValueError, match="CP size 3"):
        check_plan(plan([[{"ranks": [0, 1, 2], "sequences": [0]}]]), shapes, 3)
    with pytest.raises(ValueError, match="3 sequences > StaticShapes.max_sequences"):
        check_plan(plan([[{"ranks": [0], "sequences": [0, 1, 2]}]]), shapes, 1)
    with pytest.raises(ValueError, match="pool rank 0 3 microbatches"):
        check_plan(plan([[{"ranks": [0], "sequences": [s]}] for s in range(3)]), shapes, 1)


def test_bucket_padding_rows_carry_no_loss():
    """slice_rows with a padded length past the zigzag rule: the extra rows are padding (id -1, loss_mask 0) and
    every real token is held exactly once across the ring."""
    n, cp = 5, 2
    sample = make_global_batch([n], seed=3)[0]
    seen = []
    for rank in range(cp):
        out = torch.empty(16 // cp, WIDTH, dtype=torch.int64)
        slice_rows(sample, 7, cp, rank, out, 2, 16)
        ids, pos = out[:, WIDTH - 1], out[:, 3]
        mask = out[:, 2].view(torch.float64)
        assert bool((mask[ids < 0] == 0).all()) and int((ids == 7).sum()) + int((ids < 0).sum()) == 16 // cp
        seen += pos[ids == 7].tolist()
    assert sorted(seen) == list(range(n)) and padded_length(n, cp) == 8


# ---------------------------------------------------------------------------------------------------------------------
# multi-process: 4 ranks, 20 steps, dynacp's ring attention on the pool group (no group per ring)


def _random_batches() -> list[list[int]]:
    rng = np.random.default_rng(35)
    return [rng.integers(1, 61, PER_RANK * 4).tolist() for _ in range(RANDOM_STEPS)]


def _shapes_worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    groups = make_process_groups(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))  # default: cp_groups="pool"
    with counting_new_groups() as calls:  # every group creation from here on is counted
        lengths = list(BATCHES) + _random_batches()
        samples = [s for k, ls in enumerate(lengths) for s in rank_share(make_global_batch(ls, seed=k), rank, world)]
        model = _build_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        w = DynamicCPDataIterator(iter(samples), planner=make_planner(), groups=groups, num_samples=PER_RANK)
        steps = []
        for gb in w:
            opt.zero_grad()
            count, mbs = 0.0, []
            for mb in gb.microbatches:
                loss_sum, c = microbatch_loss(model, mb, impl="ring", cp_ring=mb["cp_ring"])
                loss_sum.backward()
                count += float(c)
                mbs.append({k: mb[k] for k in ("slot", "ring", "cp_rank", "tokens", "labels", "loss_mask",
                                               "position_ids", "sequence_ids", "cu_seqlens", "cu_seqlens_padded",
                                               "max_seqlen", "shape")})
            reduce_num_tokens(count, groups)
            finalize_grads(model.parameters(), groups, gb.num_valid_tokens)
            steps.append({"microbatches": mbs, "grads": {n: q.grad.clone() for n, q in model.named_parameters()},
                          "digest": gb.digest})
            opt.step()
        return {"steps": steps, "bank": w.declared_shapes(), "new_group_calls": len(calls),
                "created": groups.cp_pool.created_after_startup}


@pytest.fixture(scope="module")
def shapes_run():
    return run_workers(_shapes_worker, world=4, deadline=300)


def test_every_microbatch_has_a_declared_shape(shapes_run):
    bank = set(shapes_run[0]["bank"])
    assert len(bank) == len(make_shapes().cp_sizes) * len(BUCKETS)
    assert len(shapes_run[0]["steps"]) == len(BATCHES) + RANDOM_STEPS
    emitted, pad_only = set(), 0
    for r, res in enumerate(shapes_run):
        assert res["new_group_calls"] == 0 and res["created"] == 0, "no process group after start-up"
        for k, step in enumerate(res["steps"]):
            assert len(step["microbatches"]) <= make_shapes().max_microbatches
            for mb in step["microbatches"]:
                shape = mb["shape"]
                assert shape in bank, f"rank {r} step {k}: {shape} not declared"
                assert mb["tokens"].numel() == shape.rows and shape.cp_size == len(mb["ring"])
                assert len(mb["cu_seqlens"]) == len(mb["cu_seqlens_padded"]) == MAX_SEQS + 1
                assert mb["cu_seqlens_padded"][-1] == shape.rows * shape.cp_size == mb["max_seqlen"]
                emitted.add(shape)
                cu, cup = mb["cu_seqlens"], mb["cu_seqlens_padded"]
                pad_only += any(b == a and d > c for a, b, c, d in zip(cu, cu[1:], cup, cup[1:]))
    assert len({s.rows for s in emitted}) == len(BUCKETS), f"both buckets used: {sorted(emitted)}"
    assert pad_only > 0, "some microbatch is padded by a padding-only tail sequence"


def test_padding_to_buckets_keeps_loss_and_gradients(shapes_run):
    """The two reference batches: every token trained once, gradients equal the single-process reference."""
    ref_grads, _ = reference_training(steps=len(BATCHES))
    for step, lengths in enumerate(BATCHES):
        check_conservation(shapes_run, step, lengths)
        padded = sum(int((mb["sequence_ids"] < 0).sum()) for r in shapes_run
                     for mb in r["steps"][step]["microbatches"])
        assert padded > 0
        for name, ref in ref_grads[step].items():
            for r, res in enumerate(shapes_run):
                err = _rel_err(res["steps"][step]["grads"][name], ref)
                assert err < RTOL, f"step {step} rank {r} grad {name}: rel err {err:.2e}"


# ---------------------------------------------------------------------------------------------------------------------
# pipeline stages: the shape reaches a stage without data


def _pp_worker(rank: int, world: int) -> dict:
    groups = make_process_groups(pp_size=2, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    pool = groups.pool_size
    has_data = groups.pp_rank == 0
    samples = rank_share(make_global_batch([20, 9, 14, 3, 7, 12], seed=7), groups.pool_index, pool)
    w = DynamicCPDataIterator(iter(samples) if has_data else None, planner=make_planner(pool), groups=groups,
                              num_samples=len(samples))
    batch = w.next_global_batch()
    return {"pp_rank": groups.pp_rank, "pool_index": groups.pool_index, "bank": w.declared_shapes(),
            "mbs": [(mb["shape"], mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"])
                    for mb in batch.microbatches]}


def test_shapes_reach_pipeline_stages_without_data():
    results = run_workers(_pp_worker, world=4, deadline=120)
    lead = {r["pool_index"]: r for r in results if r["pp_rank"] == 0}
    for r in results:
        assert r["mbs"] == lead[r["pool_index"]]["mbs"] and r["mbs"]
        assert all(shape in set(r["bank"]) for shape, *_ in r["mbs"])


@pytest.mark.skipif(not SOLVER_SHAPES, reason="needs the solver half (dynacp.StaticShapes)")
def test_example_runs_as_written(capsys):
    """examples/cuda_graph_shapes.py runs as written; every group it plans has a declared shape (it asserts)."""
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "cuda_graph_shapes.py"), run_name="__main__")
    assert "graph bank: 28 shapes" in capsys.readouterr().out


def _off_shape_worker(rank: int, world: int) -> str:
    """A plan_fn whose plan uses a 3-rank ring under shapes that allow CP sizes 1, 2 and 4 only."""
    groups = make_process_groups(timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    planner = dataclasses.replace(make_planner(), static_shapes=HandShapes(cp_sizes=(1, 2, 4)))
    if SOLVER_SHAPES:  # make_planner's solver path plans inside the shapes: take the fcp plan instead
        cluster, cost = planner.resolved_cluster(world), planner.cost
        planner.plan_fn = lambda lengths: dynacp.plan(lengths, cluster=cluster, cost=cost, strategy="fcp",
                                                      count_policy="equal")
    stream = iter(rank_share(make_global_batch(BATCHES[0], seed=0), rank, world))
    DynamicCPDataIterator(stream, planner=planner, groups=groups, num_samples=3).next_global_batch()
    return "no error"


def test_a_plan_outside_the_shapes_fails_every_rank():
    """fcp's plan of the first reference batch has a 3-rank ring: every rank raises the same RankFailedError,
    naming the ring and StaticShapes.cp_sizes, and none hangs."""
    for r, res in enumerate(run_raw(_off_shape_worker, world=4, deadline=120)):
        assert not res["ok"], f"rank {r} ran a plan outside the shapes"
        assert res["type"] == "RankFailedError" and "CP size 3 is not in StaticShapes.cp_sizes" in res["error"]
