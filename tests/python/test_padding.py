"""Memory caps that hold after padding (issue 21, item 1): the runtime pads each sequence of a d-rank ring to a multiple
of k * d rows (k = Cluster.seq_pad_multiple), and every strategy keeps a group's padded rows per rank within the cap."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import small_cluster
from script_loader import load_script

import dynacp


def _padding_check():
    return load_script("tools/padding_check.py")


def test_rows_by_hand() -> None:
    cluster, cost = small_cluster(4, 4, 16)
    # 15 tokens on one rank pad to 16 rows, 1 token to 2: 18 rows, over a 16-token cap the raw tokens (16) meet
    assert cost.rows([15, 1], 1, cluster) == 18
    # on 3 ranks a 45-token sequence pads to 48 (a multiple of 2 x 3): 16 rows per rank
    assert cost.rows([45], 3, cluster) == 16
    assert cost.min_degree(45, cluster) == 3
    cluster.seq_pad_multiple = 4  # tensor-parallel sequence parallelism at tp = 4: multiples of 4 x 3 = 12
    assert cost.rows([45], 3, cluster) == 16
    assert cost.rows([13], 3, cluster) == 8
    assert cost.min_degree(17, cluster) == 2  # 16 rows per rank at most, in multiples of 4: 16 + 16 >= 17


def test_validate_counts_padded_rows() -> None:
    cluster, cost = small_cluster(4, 4, 16)
    lengths = np.array([15, 1], dtype=np.int64)
    plan = dynacp.Plan.from_dict(
        {"version": 1, "strategy": "hand", "num_ranks": 4, "microbatches": [[{"ranks": [0], "sequences": [0, 1]}]]}
    )
    with pytest.raises(ValueError, match="18 rows on each of its 1 ranks once its sequences are padded"):
        plan.validate(lengths, cluster, cost)
    ok = dynacp.Plan.from_dict(
        {"version": 1, "strategy": "hand", "num_ranks": 4, "microbatches": [[{"ranks": [0, 1], "sequences": [0, 1]}]]}
    )
    ok.validate(lengths, cluster, cost)  # on 2 ranks: 2 ceil(15/4) + 2 ceil(1/4) = 8 + 2 = 10 rows


def test_a_sequence_the_padded_pool_cannot_hold_is_named() -> None:
    cluster, cost = small_cluster(4, 4, 15)  # 15 rows per rank, but padded rows come in pairs: 14 usable
    with pytest.raises(ValueError, match="sequence 1 has 57 tokens .* holds at most 56 tokens of one sequence"):
        dynacp.plan([3, 57], cluster, cost, "dynacp")
    assert dynacp.plan([3, 56], cluster, cost, "dynacp").predicted.peak_tokens_per_rank <= 15


@pytest.mark.parametrize("pad", [2, 4])
def test_every_strategy_stays_under_the_cap_once_padded(pad: int) -> None:
    """Odd lengths and many short sequences: exactly the batches where counting raw tokens overflows."""
    rng = np.random.default_rng(21 + pad)
    for _trial in range(6):
        cluster, cost = small_cluster(8, 4, int(rng.integers(300, 2000)))
        cluster.seq_pad_multiple = pad
        cap = cost.token_capacity(cluster)
        lengths = rng.integers(1, 3 * cap, size=int(rng.integers(20, 80))) | 1  # all odd
        for pp in (1, 4):
            for name in dynacp.strategy_names():
                try:
                    plan = dynacp.plan(lengths, cluster, cost, name, pp=pp, tight_bound=False)
                except RuntimeError as e:  # an anchor's 1F1B deadlock under pp > 1, as documented
                    assert pp > 1 and name != "dynacp" and "cycle" in str(e)
                    continue
                for slot in plan.microbatches:
                    for g in slot:
                        d = len(g.ranks)
                        rows = sum(-(-int(lengths[s]) // (pad * d)) * pad for s in g.sequences)
                        assert rows <= cap, f"{name} pp {pp}: a {d}-rank group holds {rows} rows > {cap}"
                assert plan.predicted.peak_tokens_per_rank <= cap


def test_long_tailed_batches_at_64_ranks_fit_once_padded() -> None:
    """The acceptance measurement on a held-out sample (tools/padding_check.py runs the whole table)."""
    res = _padding_check().check(dists=("longcontext", "wlbllm"), pps=(1, 4), batches=1, gbs=256, seed=4242)
    assert sum(res["groups"].values()) > 1000
    assert res["over"] == {name: 0 for name in dynacp.strategy_names()}


def test_predict_names_ids_outside_the_batch() -> None:
    """Found by the sanitizer run (scripts/sanitize.sh): pricing a plan whose ids exceed the batch read past it."""
    cluster, cost = small_cluster(4, 4, 64)
    plan = dynacp.Plan.from_dict(
        {"version": 1, "strategy": "hand", "num_ranks": 4, "microbatches": [[{"ranks": [0, 1], "sequences": [2]}]]}
    )
    with pytest.raises(ValueError, match="names sequence 2 but the batch has 1"):
        dynacp.predict(plan, [40], cluster, cost)
