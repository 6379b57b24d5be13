"""Ring sets inside the solver (issue 35): dynacp plans only on rings of PlanOptions.ring_set, chosen while it
searches; the other strategies are projected onto the set after their solve; select_ring_set is bounded,
node-aligned and deterministic; no ring set leaves every plan as it was."""

from __future__ import annotations

import numpy as np
import pytest

import dynacp
from dynacp.integration.rings import (
    communicator_memory,
    distinct_rings,
    node_aligned,
    power_of_two_set,
    ring_set,
    select_ring_set,
)

CLUSTER = dict(num_ranks=16, ranks_per_node=8, tokens_per_rank=8192)


def _lengths(seed: int, n: int = 120) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(8, 1.4, n).astype(np.int64).clip(1, 60000)


def _check_inside(plan: dynacp.Plan, lengths: np.ndarray, cluster: dynacp.Cluster, rings: list) -> None:
    plan.validate(lengths, cluster, dynacp.CostModel())
    allowed = {tuple(r) for r in rings}
    assert distinct_rings(plan) <= allowed, distinct_rings(plan) - allowed
    got = sorted(s for slot in plan.microbatches for g in slot for s in g.sequences)
    assert got == list(range(len(lengths)))


@pytest.mark.parametrize("strategy,pp", [("dynacp", 1), ("dynacp", 2), ("fcp", 1), ("megatron", 1),
                                         ("bytescale", 1), ("packing", 1), ("megatron", 2)])
def test_every_strategy_plans_inside_the_set(strategy, pp):
    cluster = dynacp.Cluster(**CLUSTER)
    rings = power_of_two_set(cluster)
    for seed in range(3):
        lengths = _lengths(seed)
        plan = dynacp.plan(lengths, cluster=cluster, strategy=strategy, pp=pp, ring_set=rings, tight_bound=False)
        _check_inside(plan, lengths, cluster, rings)


def test_power_of_two_set_is_the_aligned_tiling():
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8)
    rings = power_of_two_set(cluster)
    assert len(rings) == 32 + 16 + 8 + 4 + 2 + 1
    assert all(len(r) & (len(r) - 1) == 0 for r in rings)
    assert all(r[0] // 8 == r[-1] // 8 for r in rings if len(r) <= 8)  # node-local sizes stay in a node
    assert all(r[0] % len(r) == 0 and list(r) == list(range(r[0], r[0] + len(r))) for r in rings)
    flat = dynacp.Cluster(num_ranks=8, ranks_per_node=4, inter_node_bandwidth=350e9, intra_node_bandwidth=350e9,
                          inter_node_latency=1e-6, intra_node_latency=1e-6)
    assert node_aligned(cluster) and not node_aligned(flat)


def test_a_set_without_a_size_rounds_groups_up_and_stays_valid():
    cluster = dynacp.Cluster(**CLUSTER)
    rings = ring_set(16, 8, [4, 16])  # no 2, 3, 8: groups take the next allowed size
    for seed in range(3):
        lengths = _lengths(seed)
        for strategy in ("dynacp", "fcp"):
            plan = dynacp.plan(lengths, cluster=cluster, strategy=strategy, ring_set=rings, tight_bound=False)
            _check_inside(plan, lengths, cluster, rings)
            assert {len(r) for r in distinct_rings(plan)} <= {4, 16}


def test_no_ring_set_leaves_the_plan_unchanged():
    cluster = dynacp.Cluster(**CLUSTER)
    lengths = _lengths(5)
    base = dynacp.plan(lengths, cluster=cluster, tight_bound=False)
    for rs in (None, []):
        assert dynacp.plan(lengths, cluster=cluster, tight_bound=False, ring_set=rs).digest() == base.digest()
    # the whole set of every ring allows every dynacp choice, but the pick differs: it is still a valid plan
    every = ring_set(16, 8)
    _check_inside(dynacp.plan(lengths, cluster=cluster, tight_bound=False, ring_set=every), lengths, cluster, every)


def test_bad_ring_sets_name_the_ring():
    cluster = dynacp.Cluster(**CLUSTER)
    lengths = _lengths(1)
    for bad, words in (([[0, 16]], "outside the pool"), ([[3]], "ring_set\\[0\\] has 1 ranks"),
                       ([[0, 1], [1, 0]], "repeats"), ([[2, 2]], "twice")):
        with pytest.raises(ValueError, match=words):
            dynacp.plan(lengths, cluster=cluster, ring_set=bad)
    with pytest.raises(ValueError, match="widest ring"):  # a sequence that needs 4 ranks on a set of pairs
        dynacp.plan(np.array([30000, 10]), cluster=cluster, ring_set=ring_set(16, 8, [2]), strategy="fcp")


def test_constrained_plans_are_deterministic_across_threads():
    cluster = dynacp.Cluster(**CLUSTER)
    rings = power_of_two_set(cluster)
    for seed in range(2):
        lengths = _lengths(seed)
        for pp in (1, 2):
            digests = {dynacp.plan(lengths, cluster=cluster, ring_set=rings + ring_set(16, 8, [3]), threads=t,
                                   pp=pp).digest() for t in (1, 2, 3)}
            assert len(digests) == 1


def test_select_ring_set_is_bounded_aligned_and_deterministic():
    cluster = dynacp.Cluster(**CLUSTER)
    samples = [_lengths(s) for s in range(3)]
    a = select_ring_set(samples, cluster, batches=3)
    assert a == select_ring_set(samples, cluster, batches=3)
    assert len(a) <= 2 * 16 and len(set(a)) == len(a)
    assert set(power_of_two_set(cluster)) <= set(a)
    assert all(r[0] // 8 == r[-1] // 8 for r in a if len(r) <= 8)
    assert len(select_ring_set(samples, cluster, max_rings=len(power_of_two_set(cluster)))) == 15
    with pytest.raises(ValueError, match="max_rings"):
        select_ring_set(samples, cluster, max_rings=3)
    by_name = select_ring_set("sft", cluster, batches=2, gbs=64)
    assert by_name == select_ring_set("sft", cluster, batches=2, gbs=64)
    most, nbytes = communicator_memory(a, 16)
    assert most >= 4 and nbytes == pytest.approx(most * 2 * 2 * (4 + 4.6 + 0.25) * 2**20)
