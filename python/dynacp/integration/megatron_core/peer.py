"""Megatron-Core's released hybrid-CP scheduler as a measured peer (the ``megatron-core`` strategy).

Megatron-Core 0.16.1 ships ``BalancedCPScheduler`` (``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``),
which ``HybridCPDataLoaderWrapper`` (``megatron/core/datasets/data_schedule.py``) calls once per global batch as
``get_groups_and_subsamples(global_id_seqlens, config)``. It returns *groups* (Megatron runs a barrier over the DP x CP
pool after each) and, per group and per DP x CP rank, the ids of the sub-samples that rank runs, in order; a
sub-sample listed on k ranks runs as one context-parallel ring over those k ranks, one sub-sample per forward.

:func:`released_plan` -- the peer of ``dynacp compare`` and ``benchmarks/bench.py`` -- runs the released scheduler
itself, measures its solve time, and turns its groups into a :class:`dynacp.Plan` priced by dynacp's evaluator
(:func:`plan_from_sample_id_groups`). megatron-core is imported only where needed (its import takes seconds and warns
about missing Transformer Engine). See docs/integration.md and docs/strategies.md.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dynacp import _core
from dynacp.api import predict

RELEASED_VERSION = "0.16.1"
"""The megatron-core release whose scheduler the peer runs (``scripts/setup.sh`` installs it)."""

PEER_NAME = "megatron-core"

# sample_id_groups[j][r] = ids of the sub-samples DP x CP rank r runs in group j, in run order.
SampleIdGroups = List[List[List[int]]]


def released_scheduler_class() -> type:
    """``megatron.core.pipeline_parallel.hybrid_cp_schedule.BalancedCPScheduler``.

    Raises:
        RuntimeError: megatron-core is not importable (the message says how to install it).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler
    except Exception as exc:  # ImportError, or megatron-core failing on import
        raise RuntimeError(
            f"the {PEER_NAME} peer needs megatron-core's released scheduler, which is not importable "
            f"({type(exc).__name__}: {exc}); install it with `pip install --no-deps megatron-core=={RELEASED_VERSION}` "
            "(scripts/setup.sh does)") from exc
    return BalancedCPScheduler


@dataclass(frozen=True)
class PoolSize:
    """Stand-in for the DP x CP process group where only its size is read (``BalancedCPScheduler.__init__`` calls
    ``dp_cp_group.size()`` and nothing else)."""

    ranks: int
    """number of DP x CP ranks."""

    def size(self) -> int:
        return self.ranks


def released_groups(lengths: Sequence[int], num_ranks: int, max_seq_len_per_rank: int) -> Tuple[SampleIdGroups, float]:
    """Run the released ``BalancedCPScheduler`` on one global batch.

    Args:
        lengths: sub-sample lengths in tokens; sample ids are positions in this sequence.
        num_ranks: DP x CP ranks.
        max_seq_len_per_rank: tokens one rank holds (Megatron's ``max_seqlen_per_dp_cp_rank``).

    Returns:
        ``(sample_id_groups, solve_ms)``: the scheduler's second output and its wall time in milliseconds (the
        ``get_groups_and_subsamples`` call alone, measured with ``time.perf_counter``).

    Raises:
        ValueError: a sequence whose power-of-two CP size exceeds ``num_ranks`` (the released scheduler would assert).
        RuntimeError: megatron-core is missing, or its scheduler failed (its assertion is quoted).
    """
    lens = [int(s) for s in lengths]
    if num_ranks < 1 or max_seq_len_per_rank < 1:
        raise ValueError(f"num_ranks and max_seq_len_per_rank must be >= 1, got {num_ranks} and {max_seq_len_per_rank}")
    for i, s in enumerate(lens):
        need = 1 << max(0, math.ceil(math.log2(s / max_seq_len_per_rank))) if s >= 1 else 0
        if s < 1 or need > num_ranks:
            raise ValueError(f"sequence {i} has {s} tokens; the released scheduler needs s >= 1 and its CP size, the "
                             f"next power of two of s / {max_seq_len_per_rank} tokens per rank ({need}), at most "
                             f"the {num_ranks} ranks")
    scheduler = released_scheduler_class()(max_seq_len_per_rank=max_seq_len_per_rank, dp_cp_group=PoolSize(num_ranks))
    t0 = time.perf_counter()
    try:
        _, sample_id_groups = scheduler.get_groups_and_subsamples([(i, s) for i, s in enumerate(lens)], None)
    except AssertionError as exc:
        raise RuntimeError(f"megatron-core {RELEASED_VERSION}'s BalancedCPScheduler failed on this batch "
                           f"({num_ranks} ranks, {max_seq_len_per_rank} tokens/rank): {exc}") from exc
    solve_ms = (time.perf_counter() - t0) * 1e3
    return [[[int(x) for x in ids] for ids in group] for group in sample_id_groups], solve_ms


def rank_lists_to_slots(rank_lists: Sequence[Sequence[int]]) -> List[List[Tuple[List[int], int]]]:
    """Slots of one Megatron group: each slot is ``[(ranks, sample_id), ...]``.

    A sub-sample listed on several ranks is one ring over them; it can start only when it heads every one of their
    lists. Slots are built as early as each rank allows (every sub-sample heading all its ranks' lists goes into the
    next slot), so each rank's slot order is its list order.

    Raises:
        RuntimeError: two sub-samples that share ranks are listed in opposite orders on two of them (the ranks would
            wait for each other forever), or a rank lists a sub-sample twice.
    """
    owners: Dict[int, List[int]] = {}
    for r, ids in enumerate(rank_lists):
        if len(set(ids)) != len(ids):
            raise RuntimeError(f"rank {r} lists a sub-sample twice in one group: {list(ids)}")
        for x in ids:
            owners.setdefault(int(x), []).append(r)
    heads = [0] * len(rank_lists)
    left = sum(len(ids) for ids in rank_lists)
    slots: List[List[Tuple[List[int], int]]] = []
    while left:
        ready = []
        for x, ranks in owners.items():
            if all(heads[r] < len(rank_lists[r]) and int(rank_lists[r][heads[r]]) == x for r in ranks):
                ready.append((sorted(ranks), x))
        if not ready:
            stuck = {r: int(rank_lists[r][heads[r]]) for r in range(len(rank_lists)) if heads[r] < len(rank_lists[r])}
            raise RuntimeError(f"sub-samples are listed in inconsistent orders on ranks that share them (rank -> next "
                               f"sub-sample: {stuck}); the ring would deadlock")
        ready.sort(key=lambda t: t[0][0])
        for ranks, x in ready:
            for r in ranks:
                heads[r] += 1
            left -= len(ranks)
            del owners[x]
        slots.append(ready)
    return slots


def _plan_dict(slots: List[List[Tuple[List[int], int]]], num_ranks: int, strategy: str, solve_ms: float,
               remap: Optional[Dict[int, int]] = None) -> dict:
    mb = [[{"ranks": ranks, "sequences": [remap[x] if remap else x]} for ranks, x in slot] for slot in slots]
    return {"version": 1, "strategy": strategy, "num_ranks": num_ranks, "solve_ms": float(solve_ms), "microbatches": mb}


def plan_from_sample_id_groups(
    sample_id_groups: SampleIdGroups,
    lengths: Sequence[int],
    cluster: _core.Cluster,
    cost: _core.CostModel,
    *,
    strategy: str = PEER_NAME,
    solve_ms: float = 0.0,
    masks: Optional[Sequence[int]] = None,
) -> _core.Plan:
    """Turn a Megatron hybrid-CP schedule into a validated :class:`dynacp.Plan` priced by dynacp's evaluator.

    Each sub-sample is a group of its own (Megatron runs one sub-sample per forward); the slots of each Megatron group
    come from :func:`rank_lists_to_slots`, groups follow each other. ``predicted.step_time`` honours Megatron's
    barrier after each group: it is the sum over groups of the evaluator's step time of that group alone (the
    evaluator itself lets a rank start its next group's work as soon as its own ranks are free, which would credit
    Megatron with overlap it does not have). ``per_rank_time``, ``peak_tokens_per_rank`` and ``lower_bound`` are the
    evaluator's for the whole plan; ``bubble_fraction`` is recomputed against the barrier step time. pp = 1 only:
    Megatron-Core 0.16.1 runs hybrid CP only in its no-pipelining schedule.

    Raises:
        ValueError: an id is out of range, missing, or in two groups (naming it), or the plan breaks a dynacp
            invariant (``Plan.validate``).
        RuntimeError: inconsistent orders inside a group (see :func:`rank_lists_to_slots`).
    """
    lens = np.asarray(lengths, dtype=np.int64)
    n, num_ranks = lens.size, cluster.num_ranks
    seen: Dict[int, int] = {}
    all_slots = []
    step = 0.0
    for j, group in enumerate(sample_id_groups):
        if len(group) != num_ranks:
            raise ValueError(f"group {j} lists {len(group)} ranks, expected one list per DP x CP rank ({num_ranks})")
        slots = rank_lists_to_slots(group)
        ids = sorted({x for slot in slots for _, x in slot})
        for x in ids:
            if not 0 <= x < n:
                raise ValueError(f"group {j} names sample id {x}, outside the batch's {n} sequences")
            if x in seen:
                raise ValueError(f"sample id {x} is in groups {seen[x]} and {j}; each sub-sample runs exactly once")
            seen[x] = j
        remap = {x: k for k, x in enumerate(ids)}
        sub = _core.Plan.from_dict(_plan_dict(slots, num_ranks, strategy, 0.0, remap))
        sub_masks = None if masks is None else np.asarray(masks)[ids]
        step += predict(sub, lens[ids], cluster, cost, masks=sub_masks).step_time
        all_slots.extend(slots)
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise ValueError(f"the schedule leaves out {len(missing)} sample id(s), e.g. {missing[:5]}")
    d = _plan_dict(all_slots, num_ranks, strategy, solve_ms)
    whole = predict(_core.Plan.from_dict(d), lens, cluster, cost, masks=masks)
    busy = float(np.sum(whole.per_rank_time))
    d["predicted"] = {
        "step_time": step, "lower_bound": whole.lower_bound, "per_rank_time": list(whole.per_rank_time),
        "peak_tokens_per_rank": whole.peak_tokens_per_rank,
        "bubble_fraction": 1.0 - busy / (step * num_ranks) if step > 0 else 0.0,
    }
    plan = _core.Plan.from_dict(d)
    plan.validate(lens, cluster, cost)
    return plan


def released_plan(
    lengths: Sequence[int],
    cluster: Optional[_core.Cluster] = None,
    cost: Optional[_core.CostModel] = None,
    strategy: str = PEER_NAME,
    *,
    pp: int = 1,
    vpp: int = 1,
    masks: Optional[Sequence[int]] = None,
    **_: Any,
) -> _core.Plan:
    """The ``megatron-core`` peer: Megatron-Core's released ``BalancedCPScheduler`` on one batch, as a dynacp Plan.

    Same call shape as :func:`dynacp.plan` (``count_policy`` and other keywords are accepted and ignored: Megatron
    runs what its scheduler lists). ``max_seq_len_per_rank`` is ``cost.token_capacity(cluster)``; ``solve_ms`` is the
    released scheduler's own wall time on this machine; times are predicted by ``cost`` (see
    :func:`plan_from_sample_id_groups`).

    Raises:
        ValueError: ``pp > 1`` (Megatron-Core 0.16.1 schedules hybrid CP only without pipelining), or a bad batch.
        RuntimeError: megatron-core is not installed, or its scheduler failed on the batch.
    """
    if pp != 1 or vpp != 1:
        raise ValueError(f"{PEER_NAME}: Megatron-Core {RELEASED_VERSION} runs hybrid context parallelism only in its "
                         f"no-pipelining schedule (pp = 1, vpp = 1), got pp = {pp}, vpp = {vpp}")
    cluster = cluster or _core.Cluster()
    cost = cost or _core.CostModel()
    groups, solve_ms = released_groups(lengths, cluster.num_ranks, cost.token_capacity(cluster))
    return plan_from_sample_id_groups(groups, lengths, cluster, cost, strategy=strategy, solve_ms=solve_ms,
                                      masks=masks)


PEER_STRATEGIES: Dict[str, Callable[..., _core.Plan]] = {PEER_NAME: released_plan}
"""Python-side strategies that ``dynacp compare --strategies`` accepts beside the C++ registry."""
