"""Bounded sets of CP rings, for attention implementations that need one process group per ring
(TransformerEngine): the groups are created once at start-up (``make_process_groups(cp_groups="prebuilt",
ring_set=...)``) and every plan uses only them.

The constraint lives in the solver: ``dynacp.plan(..., ring_set=rings)`` (and :attr:`Planner.ring_set
<dynacp.integration.config.Planner.ring_set>`) makes dynacp pick its degrees and rings from the set and score every
candidate as placed on it, so the plan it returns is the best *constrained* plan it found; the other strategies'
plans are projected onto the set after their solve (the fallback, in C++: ``RingSet::project``).
:func:`select_ring_set` chooses a small set (at most 2 x the pool size rings by default) from sample batches of the
workload. :func:`restrict_plan` is the older after-the-solve pass (groups keep their sizes; used by
benchmarks/ring_set.py as the "restricted after the solve" column).

Memory: each pre-built ring is one NCCL communicator on each of its ranks. An estimate (not measured here): NCCL
allocates per channel a Simple-protocol buffer of ``NCCL_BUFFSIZE`` (default 4 MiB) plus LL128 (about 4.6 MiB) and
LL (about 0.25 MiB) buffers per ring neighbour (NCCL user guide, "Environment Variables": NCCL_BUFFSIZE,
NCCL_NCHANNELS, NCCL_PROTO), so a ring communicator with C channels holds roughly C x 2 x 9 MiB per GPU;
:func:`communicator_memory` reports the communicators per rank and that estimate.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from dynacp import _core

Ring = tuple[int, ...]


def ring_set(pool_size: int, ranks_per_node: Optional[int] = None, sizes: Optional[Sequence[int]] = None
             ) -> list[Ring]:
    """The pre-built rings, in a fixed order (every rank creates the same groups in the same order). For each CP
    size ``d`` (default every size 2..pool_size): if ``d`` fits a node (``ranks_per_node``, default the whole pool),
    the contiguous tiling ``[k*d, (k+1)*d)`` of each node plus, when ``d`` does not divide the node, the node's tail
    (so no such ring crosses a node); otherwise the tiling of the pool plus its tail. About ``n ln n`` rings for
    ``n`` ranks (241 at 64 ranks, 8 per node); fewer with ``sizes``."""
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    per_node = pool_size if ranks_per_node is None else int(ranks_per_node)
    if per_node < 1 or pool_size % per_node:
        raise ValueError(f"ranks_per_node {ranks_per_node} must divide the pool size {pool_size}")
    sizes = range(2, pool_size + 1) if sizes is None else sorted({int(d) for d in sizes})
    out: list[Ring] = []
    for d in sizes:
        if not 2 <= d <= pool_size:
            raise ValueError(f"ring size {d} is outside [2, pool size {pool_size}]")
        span = per_node if d <= per_node else pool_size
        for base in range(0, pool_size, span):
            starts = list(range(0, span - d + 1, d)) + ([span - d] if span % d else [])
            out.extend(tuple(range(base + a, base + a + d)) for a in starts)
    return out


def _crosses(ring: Ring, per_node: int) -> bool:
    return ring[0] // per_node != ring[-1] // per_node


def restrict_plan(plan: _core.Plan, lengths: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel,
                  allowed: Sequence[Sequence[int]], options: Optional[_core.PlanOptions] = None) -> _core.Plan:
    """``plan`` with every CP group moved onto a ring of ``allowed`` (pool ranks, ring order) of the same size;
    validated and re-predicted by the cost model.

    Groups keep their sequences and size. Four placements are tried and the one the cost model predicts faster is
    returned: (a) the ranks are relabelled (a permutation of the whole plan keeps every rank's load) so that the
    groups of the slot with the most multi-rank groups land on disjoint rings of the set (all of them moved, or
    those already on the set pinned), then (b) is applied;
    (b) groups whose ring is in the set stay, the others are placed longest-first; (c) every group is placed
    longest-first. "Placed" means: into the slot and free ring of its size that keep the busiest of its ranks
    least busy (the cost model's group time on that ring), a new slot opening when that is best. Raises ValueError
    when ``allowed`` has no ring of a size the plan uses, or for a pipeline plan (pp > 1: slot order is schedule)."""
    if options is not None and options.pp > 1:
        raise ValueError("restrict_plan supports pp = 1 plans (a pipeline plan's slot order is its schedule)")
    lengths = np.asarray(lengths, dtype=np.int64)
    by_size: dict[int, list[Ring]] = {1: [(r,) for r in range(plan.num_ranks)]}
    for r in allowed:
        if len(r) > 1:
            by_size.setdefault(len(r), []).append(tuple(int(x) for x in r))
    d = plan.to_dict()
    needed = sorted({len(g["ranks"]) for slot in d["microbatches"] for g in slot} - set(by_size))
    if needed:
        raise ValueError(f"the ring set has no ring of size {needed}; pre-build rings of every CP size the planner "
                         f"may use (ring_set(pool_size) covers all sizes)")
    best = None
    starts = [_relabel(d["microbatches"], by_size, plan.num_ranks, pin) for pin in (False, True)]
    for start, keep in ((starts[0], True), (starts[1], True), (d["microbatches"], True), (d["microbatches"], False)):
        slots = _placement(start, by_size, lengths, cluster, cost, keep)
        cand = dict(d, microbatches=slots)
        cand.pop("predicted", None)
        out = _core.Plan.from_dict(cand)
        out.validate(lengths, cluster, cost)
        pred = _core.predict(out, lengths, cluster, cost, options or _core.PlanOptions())
        if best is None or pred.step_time < best[0].step_time:
            best = (pred, cand)
    best[1]["predicted"] = dict(best[0].to_dict())
    return _core.Plan.from_dict(best[1])


def _relabel(microbatches: list, by_size: dict[int, list[Ring]], n: int, pin: bool) -> list[list[dict]]:
    """The plan under a rank permutation that puts the anchor slot's multi-rank groups (largest first, first fit)
    on disjoint rings of the set; with ``pin``, groups already on a ring of the set keep their ranks. Other ranks
    keep their order. Groups are listed with ascending ranks."""
    def multi(slot: list) -> list:
        return [g for g in slot if len(g["ranks"]) > 1]

    anchor = max(range(len(microbatches)), key=lambda s: (sum(len(g["ranks"]) for g in multi(microbatches[s])), -s))
    used: set[int] = set()
    pi: dict[int, int] = {}
    allowed = {r for rings in by_size.values() for r in rings}
    for g in multi(microbatches[anchor]) if pin else []:
        if tuple(g["ranks"]) in allowed:
            used.update(g["ranks"])
            pi.update(zip(g["ranks"], g["ranks"]))
    for g in sorted(multi(microbatches[anchor]), key=lambda g: (-len(g["ranks"]), g["ranks"])):
        if g["ranks"][0] in pi:
            continue
        ring = next((r for r in by_size[len(g["ranks"])] if not used.intersection(r)), None)
        if ring is not None:
            used.update(ring)
            pi.update(zip(g["ranks"], ring))
    pi.update(zip([r for r in range(n) if r not in pi], [r for r in range(n) if r not in used]))
    return [[{"ranks": sorted(pi[r] for r in g["ranks"]), "sequences": list(g["sequences"])} for g in slot]
            for slot in microbatches]


def _placement(microbatches: list, by_size: dict[int, list[Ring]], lengths: np.ndarray, cluster: _core.Cluster,
               cost: _core.CostModel, keep: bool) -> list[list[dict]]:
    """One placement of the plan's groups onto the ring set (see :func:`restrict_plan`)."""
    per_node = int(cluster.ranks_per_node)
    allowed = {r for rings in by_size.values() for r in rings}
    load = np.zeros(max(r for rings in by_size.values() for ring in rings for r in ring) + 1)
    slots: list[tuple[set, list]] = [(set(), []) for _ in microbatches]
    todo = []
    for s, slot in enumerate(microbatches):
        for g in slot:
            ring = tuple(g["ranks"])
            ls = lengths[np.asarray(g["sequences"], dtype=np.int64)]
            times = {c: cost.time(ls, len(ring), cluster, crosses_nodes=c) for c in (False, True)}
            if keep and ring in allowed:
                slots[s][0].update(ring)
                slots[s][1].append({"ranks": list(ring), "sequences": list(g["sequences"])})
                load[list(ring)] += times[_crosses(ring, per_node)]
            else:
                todo.append((g, times))
    for g, times in sorted(todo, key=lambda x: (-x[1][False], x[0]["ranks"], x[0]["sequences"])):
        choice = None
        for s, (used, _) in enumerate(slots + [(set(), [])]):
            for ring in by_size[len(g["ranks"])]:
                if used.intersection(ring):
                    continue
                t = times[_crosses(ring, per_node)]
                key = (float(max(load[list(ring)])) + t, s, ring)
                if choice is None or key < choice[0]:
                    choice = (key, s, ring, t)
        _, s, ring, t = choice
        if s == len(slots):
            slots.append((set(), []))
        slots[s][0].update(ring)
        slots[s][1].append({"ranks": list(ring), "sequences": list(g["sequences"])})
        load[list(ring)] += t
    return [sorted(gs, key=lambda g: g["ranks"]) for _, gs in slots if gs]


def distinct_rings(plan: _core.Plan) -> set[Ring]:
    """The rings (two or more ranks) a plan uses."""
    return {tuple(g.ranks) for slot in plan.microbatches for g in slot if len(g.ranks) > 1}


#: Estimated bytes one NCCL ring communicator holds per GPU and per channel: two ring neighbours x (Simple
#: NCCL_BUFFSIZE 4 MiB + LL128 about 4.6 MiB + LL about 0.25 MiB). An estimate from the NCCL documentation, not a
#: measurement (see the module docstring).
NCCL_BYTES_PER_CHANNEL = 2 * (4 * 2**20 + 4.6 * 2**20 + 0.25 * 2**20)


def communicator_memory(rings: Sequence[Sequence[int]], pool_size: int, channels: int = 2) -> tuple[int, float]:
    """``(communicators on the busiest rank, their estimated NCCL buffer bytes on it)`` for a pre-built ring set
    (``channels`` per communicator, default 2; NCCL chooses 2-32 by topology). An estimate: see
    :data:`NCCL_BYTES_PER_CHANNEL`."""
    per_rank = np.zeros(pool_size, dtype=np.int64)
    for r in rings:
        per_rank[list(r)] += 1
    most = int(per_rank.max()) if pool_size else 0
    return most, most * channels * NCCL_BYTES_PER_CHANNEL


def node_aligned(cluster: _core.Cluster) -> bool:
    """Whether rings that fit a node should stay inside one: the link across nodes is slower (bandwidth or latency)
    than inside a node."""
    return (cluster.inter_node_bandwidth < cluster.intra_node_bandwidth
            or cluster.inter_node_latency > cluster.intra_node_latency)


def power_of_two_set(cluster: _core.Cluster) -> list[Ring]:
    """The rings of every power-of-two CP size up to the pool (Megatron-Core's pre-built sizes), tiled per node where
    :func:`node_aligned` says so: 63 rings at 64 ranks, 8 per node. The default set of ``cp_groups="prebuilt"``."""
    n = int(cluster.num_ranks)
    sizes = [1 << k for k in range(1, n.bit_length()) if 1 << k <= n]
    if n not in sizes and n > 1:
        sizes.append(n)
    return ring_set(n, int(cluster.ranks_per_node) if node_aligned(cluster) else n, sizes)


def _samples(length_samples: Union[str, Sequence[np.ndarray]], batches: int, gbs: int, seed: int) -> list[np.ndarray]:
    if isinstance(length_samples, str):
        from dynacp import distributions

        dist = distributions.get(length_samples)
        rng = np.random.default_rng(seed)
        return [dist.sample(gbs, rng) for _ in range(batches)]
    out = [np.asarray(x, dtype=np.int64) for x in length_samples]
    if not out:
        raise ValueError("select_ring_set: length_samples is empty; pass sample batches or a distribution name")
    return out


def select_ring_set(length_samples: Union[str, Sequence[np.ndarray]], cluster: Optional[_core.Cluster] = None,
                    cost: Optional[_core.CostModel] = None, max_rings: Optional[int] = None, *, batches: int = 8,
                    gbs: int = 512, seed: int = 0, pp: int = 1, threads: int = 0) -> list[Ring]:
    """A bounded ring set for this workload: at most ``max_rings`` rings (default 2 x the pool size), node-aligned
    where the link says so (:func:`node_aligned`), deterministic (the same samples give the same set).

    ``length_samples``: sample global batches of the workload (int64 lengths, one array per batch), or the name of
    an embedded distribution (``dynacp.distributions.names()``), of which ``batches`` batches of ``gbs`` sequences
    are drawn with ``seed``. Start from :func:`power_of_two_set` and the tilings of the widths of 3, 5, 6 and 7
    whole nodes; plan each sample with dynacp unconstrained and try
    adding, most used first (:func:`_candidates`), the tilings of the other degrees up to a node and the node-offset
    windows of the whole-node widths, each kept only where it lowers the mean predicted step time of the samples
    planned on the set and fits the budget. dynacp also searches on the power-of-two tilings of any set alone (and keeps
    the better plan), so a size that fragments the pool rarely makes a batch worse than on the power-of-two set."""
    cluster = cluster or _core.Cluster()
    cost = cost or _core.CostModel()
    n = int(cluster.num_ranks)
    budget = 2 * n if max_rings is None else int(max_rings)
    base = power_of_two_set(cluster)
    if budget < len(base):
        raise ValueError(f"max_rings = {budget} is below the {len(base)} rings of the power-of-two set")
    samples = _samples(length_samples, batches, gbs, seed)
    per_node = int(cluster.ranks_per_node) if node_aligned(cluster) else n
    usage = _usage(samples, cluster, cost, pp, threads, per_node)
    chosen = list(base)
    # the widths of 3-7 whole nodes, tiled: a rare giant that needs 21 ranks runs on 24, not 32 (at most two rings
    # per rank and width; the samples seldom hold such giants, so these are not left to the test below). Wider ones
    # only where the samples use them (below): every width at 1,024 ranks would slow the solver several-fold.
    wide = ring_set(n, per_node, [k * per_node for k in range(3, min(8, n // per_node)) if k & (k - 1)]) \
        if per_node < n else []
    if len(chosen) + len(wide) <= budget:
        chosen += wide
    best = _mean_step(samples, cluster, cost, pp, threads, chosen)
    for extra in _candidates(usage, n, per_node, {len(r) for r in base}):
        extra = [r for r in extra if r not in set(chosen)]
        if not extra or len(chosen) + len(extra) > budget:
            continue
        t = _mean_step(samples, cluster, cost, pp, threads, chosen + extra)
        if t < best * (1 - 1e-9):
            chosen, best = chosen + extra, t
    return sorted(chosen, key=lambda r: (len(r), r))


def _usage(samples: list[np.ndarray], cluster: _core.Cluster, cost: _core.CostModel, pp: int, threads: int,
           per_node: int) -> dict[int, float]:
    """Ring area (seconds x ranks) per degree in the free plans of the samples; degrees wider than a node count at
    their whole-node width."""
    usage: dict[int, float] = {}
    for lengths in samples:
        for slot in _plan(lengths, cluster, cost, pp, threads, None).microbatches:
            for g in slot:
                d = len(g.ranks)
                if d > 1:
                    t = cost.time(lengths[np.asarray(g.sequences, dtype=np.int64)], d, cluster,
                                  crosses_nodes=d > per_node)
                    key = d if d <= per_node else min(-(-d // per_node) * per_node, int(cluster.num_ranks))
                    usage[key] = usage.get(key, 0.0) + t * d
    return usage


def _candidates(usage: dict[int, float], n: int, per_node: int, have: set[int]) -> list[list[Ring]]:
    """What select_ring_set tries to add, most used first: the node tilings of the other degrees up to a node, and
    for widths of whole nodes (used ones and the set's powers of two) the windows at every node offset (a wide ring
    can start on any node, as the free picker places it)."""
    wide = {d for d in have if per_node < d < n}
    out = []
    for d in sorted(set(usage) | wide, key=lambda x: (-usage.get(x, 0.0), x)):
        if d <= per_node:
            if d not in have:
                out.append(ring_set(n, per_node, [d]))
        elif d < n:
            out.append([tuple(range(a, a + d)) for a in range(0, n - d + 1, per_node)])
    return out


def _plan(lengths: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel, pp: int, threads: int,
          rings: Optional[list[Ring]]) -> _core.Plan:
    options = _core.PlanOptions(strategy="dynacp", pp=pp, tight_bound=False, threads=threads,
                                ring_set=[list(r) for r in rings or []])
    return _core.plan(lengths, cluster, cost, options, None)


def _mean_step(samples: list[np.ndarray], cluster: _core.Cluster, cost: _core.CostModel, pp: int, threads: int,
               rings: list[Ring]) -> float:
    return float(np.mean([_plan(x, cluster, cost, pp, threads, rings).predicted.step_time for x in samples]))


__all__ = ["NCCL_BYTES_PER_CHANNEL", "communicator_memory", "distinct_rings", "node_aligned", "power_of_two_set",
           "restrict_plan", "ring_set", "select_ring_set"]
