"""CUDA-graph mode (issue 35): dynacp plans under StaticShapes (token buckets, CP sizes, slot and sequence caps),
prices the bucket padding, reports padding_fraction, and leaves every plan as it was when the shapes are off."""

from __future__ import annotations

import numpy as np
import pytest

import dynacp
from dynacp import distributions

CLUSTER = dict(num_ranks=16, ranks_per_node=8, tokens_per_rank=8192)


def _lengths(seed: int, n: int = 96) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(7.5, 1.3, n).astype(np.int64).clip(1, 40000)


def _shapes(**kw) -> dynacp.StaticShapes:
    base = dict(token_buckets=[1024, 2048, 4096, 8192], cp_sizes=[1, 2, 4, 8], max_microbatches=8)
    base.update(kw)
    return dynacp.StaticShapes(**base)


def _check_shapes(plan: dynacp.Plan, lengths: np.ndarray, cluster: dynacp.Cluster,
                  shapes: dynacp.StaticShapes) -> None:
    """Every group has a declared shape (checked here independently of the core's check)."""
    plan.validate(lengths, cluster, dynacp.CostModel(), static_shapes=shapes)
    k = cluster.seq_pad_multiple
    slots = np.zeros(cluster.num_ranks, dtype=int)
    for slot in plan.microbatches:
        for g in slot:
            d = len(g.ranks)
            assert d in shapes.cp_sizes
            rows = sum(-(-int(lengths[s]) // (k * d)) * k for s in g.sequences)
            assert rows <= shapes.token_buckets[-1]
            if shapes.max_sequences:
                assert len(g.sequences) <= shapes.max_sequences
            slots[list(g.ranks)] += 1
    if shapes.max_microbatches:
        assert slots.max() <= shapes.max_microbatches


def test_static_shapes_fields_and_repr():
    s = _shapes(max_sequences=16)
    assert s.enabled() and not dynacp.StaticShapes().enabled()
    assert s.token_buckets == [1024, 2048, 4096, 8192] and s.cp_sizes == [1, 2, 4, 8]
    assert repr(s) == ("StaticShapes(token_buckets=[1024, 2048, 4096, 8192], cp_sizes=[1, 2, 4, 8], "
                       "max_microbatches=8, max_sequences=16)")
    assert s.bucket_of(1) == 1024 and s.bucket_of(1024) == 1024 and s.bucket_of(1026) == 2048
    with pytest.raises(ValueError, match="9000 rows per rank exceed the largest"):
        s.bucket_of(9000)
    with pytest.raises(ValueError, match="has no field 'buckets'"):
        dynacp.StaticShapes(buckets=[2])


@pytest.mark.parametrize("kw,match", [
    (dict(token_buckets=[2048, 1024]), "strictly ascending"),
    (dict(token_buckets=[1023]), "multiples of Cluster.seq_pad_multiple"),
    (dict(token_buckets=[16384]), "exceeds the token capacity of 8192"),
    (dict(cp_sizes=[2, 4]), "must include 1"),
    (dict(cp_sizes=[1, 3]), "must divide the pool of 16"),
    (dict(max_microbatches=-1), "max_microbatches is -1"),
])
def test_bad_shapes_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dynacp.plan(_lengths(0), dynacp.Cluster(**CLUSTER), static_shapes=_shapes(**kw))


def test_infeasible_shapes_raise_with_the_numbers():
    cluster = dynacp.Cluster(**CLUSTER)
    with pytest.raises(ValueError, match="sequence 0 has 40000 tokens"):
        dynacp.plan([40000, 10], cluster, static_shapes=_shapes(cp_sizes=[1, 2, 4]))
    with pytest.raises(ValueError, match="16 ranks x 1 max_microbatches x 8192"):
        dynacp.plan([8000] * 17, cluster, static_shapes=_shapes(max_microbatches=1))


@pytest.mark.parametrize("strategy", ["packing", "fcp", "megatron", "bytescale"])
def test_other_strategies_name_the_fallback(strategy):
    with pytest.raises(ValueError, match=f"strategy {strategy} cannot plan under static_shapes; use strategy 'dynacp'"):
        dynacp.plan(_lengths(0), dynacp.Cluster(**CLUSTER), strategy=strategy, static_shapes=_shapes())


@pytest.mark.parametrize("pp", [1, 2])
def test_every_group_has_a_declared_shape(pp):
    cluster = dynacp.Cluster(**CLUSTER)
    for seed in range(4):
        for shapes in (_shapes(), _shapes(max_sequences=4), _shapes(token_buckets=[8192], cp_sizes=[1, 2, 4, 8, 16])):
            lengths = _lengths(seed)
            p = dynacp.plan(lengths, cluster, pp=pp, threads=1, static_shapes=shapes)
            _check_shapes(p, lengths, cluster, shapes)
            assert 0.0 <= p.predicted.padding_fraction < 1.0


def test_bench_workloads_plans_have_declared_shapes():
    cluster = dynacp.Cluster(num_ranks=32, ranks_per_node=8, tokens_per_rank=16384)
    shapes = dynacp.default_static_shapes(cluster, dynacp.CostModel(), cp_sizes=(1, 2, 4, 8, 16, 32))
    for name in distributions.names():
        lengths = distributions.sample(name, 128, np.random.default_rng(1))
        p = dynacp.plan(lengths, cluster, threads=1, static_shapes=shapes)
        _check_shapes(p, lengths, cluster, shapes)


def test_deterministic_across_thread_counts():
    cluster = dynacp.Cluster(**CLUSTER)
    shapes = _shapes(max_sequences=6)
    for pp in (1, 2):
        lengths = _lengths(3)
        a = dynacp.plan(lengths, cluster, pp=pp, threads=1, static_shapes=shapes)
        b = dynacp.plan(lengths, cluster, pp=pp, threads=2, static_shapes=shapes)
        assert a.digest() == b.digest()


def test_padding_fraction_and_cost_hand_checked():
    # Two ranks, one sequence of 1000 tokens on one rank: 1000 rows padded to the 2048 bucket.
    cluster = dynacp.Cluster(num_ranks=2, ranks_per_node=2, tokens_per_rank=4096)
    cost = dynacp.CostModel()
    shapes = dynacp.StaticShapes(token_buckets=[2048, 4096], cp_sizes=[1, 2])
    p = dynacp.plan([1000], cluster, threads=1, static_shapes=shapes)
    (g,) = [g for slot in p.microbatches for g in slot]
    assert len(g.ranks) == 1
    assert p.predicted.padding_fraction == pytest.approx((2048 - 1000) / 2048)
    # Padding is linear work only: (eta a 1000^2 + b 2048) / 1 + c.
    want = cost.causal_factor * cost.attn_coef * 1000 ** 2 + cost.linear_coef * 2048 + cost.group_overhead
    assert p.predicted.step_time == pytest.approx(want, rel=1e-12)
    free = dynacp.predict(p, [1000], cluster, cost)
    assert free.padding_fraction == 0.0
    assert free.step_time == pytest.approx(want - cost.linear_coef * 1048, rel=1e-12)
    assert p.predicted.peak_tokens_per_rank == 2048


def test_off_leaves_plans_identical():
    cluster = dynacp.Cluster(**CLUSTER)
    for pp in (1, 2):
        lengths = _lengths(5)
        a = dynacp.plan(lengths, cluster, pp=pp, threads=1)
        b = dynacp.plan(lengths, cluster, pp=pp, threads=1, static_shapes=dynacp.StaticShapes())
        assert a.digest() == b.digest() and a.predicted.to_dict() == b.predicted.to_dict()
        assert b.predicted.padding_fraction == 0.0 and "padding_fraction" not in b.to_dict()["predicted"]


def test_default_static_shapes():
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8, tokens_per_rank=16384)
    s = dynacp.default_static_shapes(cluster)
    assert s.token_buckets == [2048, 4096, 8192, 16384]
    assert s.cp_sizes == [1, 2, 4, 8] and s.max_microbatches == 8 and s.max_sequences == 0
    assert dynacp.default_static_shapes(cluster, buckets=1).token_buckets == [16384]
