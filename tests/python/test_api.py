"""Planning API: plans validate, round-trip through JSON, are deterministic, and bad input is named."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import random_lengths, small_cluster

import dynacp


@pytest.mark.parametrize("strategy", dynacp.strategy_names())
def test_every_strategy_gives_valid_plans_on_random_batches(strategy: str) -> None:
    rng = np.random.default_rng(1)
    for trial in range(40):
        ranks = int(rng.choice([4, 8, 12, 16, 24]))
        cluster, cost = small_cluster(ranks, 4, int(rng.integers(512, 4096)))
        cap = cost.token_capacity(cluster) // 2 * 2 * ranks  # the longest sequence that fits the pool once padded
        lengths = random_lengths(rng, int(rng.integers(1, 120)), cap)
        masks = (rng.random(lengths.size) < 0.2).astype(np.int64)
        p = dynacp.plan(lengths, cluster, cost, strategy, masks=masks)
        p.validate(lengths, cluster, cost, masks=masks)
        ids = sorted(s for slot in p.microbatches for g in slot for s in g.sequences)
        assert ids == list(range(lengths.size)), f"trial {trial}"
        assert p.predicted.step_time >= p.predicted.lower_bound * (1 - 1e-12)
        assert len(p.predicted.per_rank_time) == ranks


def test_plan_json_round_trip_and_format() -> None:
    cluster, cost = small_cluster()
    lengths = np.array([9000, 3000, 200, 50, 7000, 1])
    p = dynacp.plan(lengths, cluster, cost, "fcp")
    d = json.loads(json.dumps(p.to_dict()))
    assert set(d) == {"version", "strategy", "num_ranks", "solve_ms", "family", "partial", "microbatches", "predicted"}
    assert d["version"] == 1 and d["strategy"] == "fcp" and d["num_ranks"] == 16
    assert set(d["predicted"]) >= {"step_time", "lower_bound", "per_rank_time", "peak_tokens_per_rank"}
    for slot in d["microbatches"]:
        for g in slot:
            assert set(g) == {"ranks", "sequences"}
    q = dynacp.Plan.from_dict(d)
    q.validate(lengths, cluster, cost)
    assert q.digest() == p.digest()
    assert q.to_dict() == d


def test_from_dict_then_validate_rejects_broken_plans() -> None:
    cluster, cost = small_cluster()
    lengths = np.array([100, 200, 300])
    d = dynacp.plan(lengths, cluster, cost, "fcp").to_dict()
    d["microbatches"][0][0]["sequences"].append(0)  # duplicate id
    with pytest.raises(ValueError, match="more than once"):
        dynacp.Plan.from_dict(d).validate(lengths, cluster, cost)
    bad = dict(d, version=2)
    with pytest.raises(ValueError, match="version"):
        dynacp.Plan.from_dict(bad)
    missing = {k: v for k, v in d.items() if k != "microbatches"}
    with pytest.raises(ValueError, match="microbatches"):
        dynacp.Plan.from_dict(missing)


def test_same_input_same_plan() -> None:
    cluster, cost = small_cluster(32, 8)
    lengths = random_lengths(np.random.default_rng(5), 400, 100_000)
    for s in dynacp.strategy_names():
        a, b = dynacp.plan(lengths, cluster, cost, s), dynacp.plan(lengths.copy(), cluster, cost, s)
        assert a.digest() == b.digest() and a.to_dict()["microbatches"] == b.to_dict()["microbatches"]


def test_fcp_beats_packing_on_a_skewed_batch() -> None:
    cluster, cost = small_cluster(16, 8, 8192)
    lengths = np.array([40_000] + [1500] * 30)
    fcp = dynacp.plan(lengths, cluster, cost, "fcp").predicted.step_time
    packing = dynacp.plan(lengths, cluster, cost, "packing").predicted.step_time
    assert fcp < packing


@pytest.mark.parametrize(
    "lengths, match",
    [
        ([], "empty batch"),
        ([10, 0, 5], "sequence 1"),
        ([10, -3], "sequence 1"),
        ([10, 10_000_000], "sequence 1 has 10000000 tokens"),
        ([[1, 2], [3, 4]], "1-D"),
        ([1.5, 2.0], "integers"),
    ],
)
def test_bad_lengths_raise_value_error_naming_the_offender(lengths, match) -> None:
    cluster, cost = small_cluster()
    with pytest.raises(ValueError, match=match):
        dynacp.plan(np.array(lengths), cluster, cost)


def test_bad_cluster_and_cost_and_strategy() -> None:
    cluster, cost = small_cluster()
    with pytest.raises(ValueError, match="does not divide"):
        dynacp.plan([10], dynacp.Cluster(num_ranks=12, ranks_per_node=8), cost)
    with pytest.raises(ValueError, match="num_ranks"):
        dynacp.plan([10], dynacp.Cluster(num_ranks=0), cost)
    with pytest.raises(ValueError, match="attn_coef"):
        dynacp.plan([10], cluster, dynacp.CostModel(attn_coef=-1.0))
    with pytest.raises(ValueError, match="linear_coef"):
        dynacp.plan([10], cluster, dynacp.CostModel(linear_coef=float("nan")))
    with pytest.raises(ValueError, match="unknown strategy"):
        dynacp.plan([10], cluster, cost, "nope")
    with pytest.raises(ValueError, match="has no field"):
        dynacp.Cluster(ranks=4)
    with pytest.raises(ValueError, match="masks"):
        dynacp.plan([10, 20], cluster, cost, masks=[0])


def test_configs_are_dataclass_like() -> None:
    c = dynacp.Cluster(num_ranks=24, ranks_per_node=8)
    assert c.to_dict()["num_ranks"] == 24 and "Cluster(num_ranks=24" in repr(c)
    m = dynacp.CostModel(attn_coef=1e-9)
    assert m.to_dict()["attn_coef"] == 1e-9
    import pickle

    assert pickle.loads(pickle.dumps(m)).attn_coef == 1e-9
    assert pickle.loads(pickle.dumps(dynacp.plan([5, 6], c))).num_ranks == 24


def test_degree_allocation_matches_exhaustive_search_from_python() -> None:
    import itertools

    rng = np.random.default_rng(0)
    for _ in range(200):
        k, ranks = int(rng.integers(1, 4)), int(rng.integers(3, 8))
        dmin = [1] * k
        times = rng.integers(1, 20, size=(k, ranks + 1)).astype(float).tolist()
        best = min(
            max(times[i][d[i]] for i in range(k))
            for d in itertools.product(range(1, ranks + 1), repeat=k)
            if sum(d) <= ranks
        )
        for method in ("dp", "threshold"):
            degrees, makespan = dynacp._core.allocate_degrees(times, dmin, ranks, method)
            assert makespan == best and sum(degrees) <= ranks


def test_lower_bound_matches_the_plans_bound_with_pipelines() -> None:
    cluster, cost = small_cluster()
    lengths = np.array([9000, 3000, 200, 50, 7000, 1, 4000, 4000])
    for pp, vpp in [(1, 1), (2, 1), (4, 1)]:
        p = dynacp.plan(lengths, cluster, cost, "dynacp", pp=pp, vpp=vpp)
        assert dynacp.lower_bound(lengths, cluster, cost, pp=pp, vpp=vpp) == pytest.approx(p.predicted.lower_bound, rel=1e-12)
        assert p.predicted.step_time >= p.predicted.lower_bound * (1 - 1e-12)
    # a pipeline adds fill and drain on top of the per-stage share: pp = 4 bound > pp = 1 bound / 4
    assert dynacp.lower_bound(lengths, cluster, cost, pp=4) > dynacp.lower_bound(lengths, cluster, cost) / 4
    # interleaving shortens the fill and drain, and the 1F1B-only terms do not apply to it
    assert dynacp.lower_bound(lengths, cluster, cost, pp=4, vpp=2) <= dynacp.lower_bound(lengths, cluster, cost, pp=4)
    with pytest.raises(ValueError, match="pp and vpp"):
        dynacp.lower_bound(lengths, cluster, cost, pp=0)


def test_tight_bound_off_keeps_the_plan_and_reports_a_looser_bound() -> None:
    # github batch 3's four giants with 30K and 3K sequences (tests/cpp/test_solve.cpp,
    # AGroupOfSeveralGiantsTakesCapacity): the cover term lifts the bound past 2.12 s, the other terms stay below
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8, activation_budget=16384 * dynacp.CostModel().mem_per_token)
    cost = dynacp.CostModel()
    lengths = np.array([228652, 197795, 172480, 160334] + [30000] * 40 + [3000] * 229)
    tight = dynacp.plan(lengths, cluster, cost, "dynacp", pp=4)
    loose = dynacp.plan(lengths, cluster, cost, "dynacp", pp=4, tight_bound=False)
    assert loose.digest() == tight.digest()
    assert loose.predicted.step_time == tight.predicted.step_time
    assert loose.predicted.lower_bound < 2.12 < tight.predicted.lower_bound <= tight.predicted.step_time
    assert dynacp.lower_bound(lengths, cluster, cost, pp=4, tight_bound=False) == loose.predicted.lower_bound
    again = dynacp.predict(tight, lengths, cluster, cost, pp=4, tight_bound=False)
    assert again.lower_bound == loose.predicted.lower_bound
    assert "tight_bound=False" in repr(dynacp.PlanOptions(pp=4, tight_bound=False))
    # the training-loop planner leaves it off: it never reads the bound
    pytest.importorskip("torch")
    from dynacp.integration.config import Planner

    assert Planner().tight_bound is False
