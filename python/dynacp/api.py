"""Planning API: numpy arrays in, :class:`dynacp.Plan` out."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from dynacp import _core

ArrayLike = Union[np.ndarray, list, tuple]


def _as_lengths(lengths: ArrayLike) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _as_masks(masks: Optional[ArrayLike], n: int) -> Optional[np.ndarray]:
    if masks is None:
        return None
    arr = np.asarray(masks)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if arr.shape != (n,):
        raise ValueError(f"masks must have one entry per sequence ({n}), got shape {arr.shape}")
    return arr.astype(np.int64)


def _batch(lengths: ArrayLike, cluster: Optional[_core.Cluster], cost: Optional[_core.CostModel],
           masks: Optional[ArrayLike]) -> tuple:
    """``(lengths, cluster, cost, masks)`` as the core takes them: checked int64 lengths, the default ``Cluster()`` and
    ``CostModel()`` where none is given, the masks checked against the lengths."""
    arr = _as_lengths(lengths)
    return arr, cluster or _core.Cluster(), cost or _core.CostModel(), _as_masks(masks, arr.size)


def plan(
    lengths: ArrayLike,
    cluster: Optional[_core.Cluster] = None,
    cost: Optional[_core.CostModel] = None,
    strategy: str = "dynacp",
    *,
    masks: Optional[ArrayLike] = None,
    pp: int = 1,
    vpp: int = 1,
    count_policy: Union[str, _core.CountPolicy] = "variable",
    tight_bound: bool = True,
    threads: int = 0,
    time_limit: Optional[float] = None,
    tuning: Optional[_core.DynacpTuning] = None,
    ring_set: Optional[Sequence[Sequence[int]]] = None,
    static_shapes: Optional[_core.StaticShapes] = None,
) -> _core.Plan:
    """Plan one global batch.

    Args:
        lengths: sequence lengths in tokens (int64, any order); sequence ids are 0-based positions in this array.
        cluster: the DP x CP rank pool; defaults to ``Cluster()`` (64 ranks, 8 per node, 16,384 tokens per rank).
            Set the memory budget with ``Cluster(tokens_per_rank=...)`` (tokens one rank holds per microbatch), or in
            bytes with ``activation_budget=`` (then ``tokens_per_rank`` is derived from ``cost.mem_per_token``).
        cost: cost model; defaults to ``CostModel()`` (the ``bytescale-fig6a`` preset).
        strategy: a name from :func:`dynacp.strategy_names` (default ``"dynacp"``; the others are the baselines
            it is compared with).
        masks: optional per-sequence mask, 0 = causal, 1 = full (bidirectional); default all causal.
        pp, vpp: pipeline stages per rank and virtual stages per stage.
        count_policy: ``"equal"`` or ``"variable"`` microbatch counts per rank (pipeline strategies).
        tight_bound: whether ``predicted.lower_bound`` includes the cover term (pp > 1, vpp = 1), the tightest and
            slowest part of the bound (up to about a second at 64 ranks, pp = 4). ``False`` reports the looser bound
            of the other terms; the plan itself is the same either way.
        threads: ``dynacp`` only: threads that build and score candidate plans; 0 (default) uses every hardware
            thread. The plan is identical for any thread count.
        time_limit: ``dynacp`` only: seconds after which no new candidate is built; the best plan found so far is
            returned with ``plan.partial`` set. ``None`` (default): no limit. Ctrl-C raises ``KeyboardInterrupt``
            within about 0.1 s either way.
        tuning: ``dynacp`` only: a :class:`dynacp.DynacpTuning` overriding search constants (experiments; e.g.
            ``DynacpTuning(skip_families=["shelves"])``). ``plan.family`` names the family that produced the plan.
        ring_set: rings (pool ranks, ring order, 2 or more ranks each) that every multi-rank group must use, e.g. the
            process groups TransformerEngine needs, pre-built at start-up
            (:func:`dynacp.integration.rings.select_ring_set`). ``dynacp`` chooses its degrees and rings from the set
            while it searches; the other strategies' plans are projected onto it after their solve (the fallback).
            ``None`` (default): any ring.
        static_shapes: CUDA-graph mode, a :class:`dynacp.StaticShapes` (token buckets in rows per rank, CP sizes in
            ranks, microbatch slots per rank, sequences per group; e.g. :func:`dynacp.default_static_shapes`):
            ``dynacp`` plans under the shapes and scores its candidates with their padding
            (``plan.predicted.padding_fraction``); the other strategies raise ValueError. ``None`` (default): off.

    Returns:
        A validated :class:`dynacp.Plan` with ``predicted`` filled.

    Raises:
        ValueError: bad input, naming the offender (e.g. a sequence longer than the pool holds), or an anchor's
            pipelined plan whose microbatch counts break the ``vpp > 1`` rule (every rank a multiple of ``pp``;
            ``dynacp`` itself raises this only when no plan can meet it, e.g. fewer than ``pp`` sequences).
        RuntimeError: an anchor's pipelined plan that would deadlock under 1F1B, or ``megatron`` unable to split
            its microbatches to a multiple of ``pp`` under ``vpp > 1`` (Megatron-Core asserts there).
    """
    arr, cluster, cost, masks_ = _batch(lengths, cluster, cost, masks)
    policy = _count_policy(count_policy)
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds (or None for no limit), got {time_limit}")
    options = _core.PlanOptions(strategy=strategy, pp=pp, vpp=vpp, count_policy=policy, tight_bound=tight_bound,
                                threads=threads, time_limit_s=time_limit or 0.0, tuning=tuning,
                                ring_set=[[int(r) for r in ring] for ring in ring_set or []],
                                static_shapes=static_shapes)
    return _core.plan(arr, cluster, cost, options, masks_)


def predict(
    plan_: _core.Plan,
    lengths: ArrayLike,
    cluster: Optional[_core.Cluster] = None,
    cost: Optional[_core.CostModel] = None,
    *,
    masks: Optional[ArrayLike] = None,
    pp: int = 1,
    vpp: int = 1,
    tight_bound: bool = True,
    static_shapes: Optional[_core.StaticShapes] = None,
) -> _core.Predicted:
    """Re-predict an existing plan (e.g. one read from JSON) under a cost model (``tight_bound`` as in :func:`plan`;
    ``static_shapes`` prices each group's bucket padding)."""
    arr, cluster, cost, masks_ = _batch(lengths, cluster, cost, masks)
    options = _core.PlanOptions(strategy=plan_.strategy, pp=pp, vpp=vpp, tight_bound=tight_bound,
                                static_shapes=static_shapes)
    return _core.predict(plan_, arr, cluster, cost, options, masks_)


def lower_bound(
    lengths: ArrayLike,
    cluster: Optional[_core.Cluster] = None,
    cost: Optional[_core.CostModel] = None,
    *,
    masks: Optional[ArrayLike] = None,
    pp: int = 1,
    vpp: int = 1,
    tight_bound: bool = True,
) -> float:
    """Seconds no plan of this batch can beat on pipelines of ``pp`` stages (``vpp`` virtual chunks each).

    pp = 1: max(total work / P + c, best time of the longest sequence, ...). pp > 1 adds the pipeline fill and
    drain; for 1F1B (vpp = 1) also the best split of the mean work into microbatches, the longest sequence's
    microbatch with the other work its ranks run, and the hardest few sequences either meeting on a rank or running on
    disjoint rings (docs/cost_model.md). It equals ``plan(...).predicted.lower_bound`` (with the same
    ``tight_bound``: ``False`` leaves out the cover term, the slowest part).
    """
    return _core.lower_bound(*_batch(lengths, cluster, cost, masks), int(pp), int(vpp), bool(tight_bound))


def _count_policy(value: Union[str, _core.CountPolicy]) -> _core.CountPolicy:
    if isinstance(value, _core.CountPolicy):
        return value
    names = {"equal": _core.CountPolicy.EQUAL, "variable": _core.CountPolicy.VARIABLE}
    if value not in names:
        raise ValueError(f"count_policy must be one of {sorted(names)}, got {value!r}")
    return names[value]
