"""A bounded set of CP rings and plans restricted to it, for attention implementations that need one process group
per ring (TransformerEngine): the groups are created once at start-up (``make_process_groups(cp_groups=
"prebuilt")``) and :attr:`Planner.ring_set <dynacp.integration.config.Planner.ring_set>` maps every plan onto them.

Why a Planner-level pass and not a solver constraint: every strategy (dynacp, fcp, bytescale, ...) places its groups
with its own code in C++; restricting the placement in each of them would change five solvers, while the
restriction only needs the *ranks* of each group to change. :func:`restrict_plan` keeps every group's size and
sequences (so each slot's per-rank memory is unchanged and the plan stays valid) and re-places the groups of each
slot onto disjoint rings of the set, balancing the estimated per-rank work; a group that finds no free ring in its
slot opens a new slot. The cost model then re-predicts the plan, so its quality cost is measured, not assumed
(benchmarks/ring_set.py; docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Optional, Sequence

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


__all__ = ["distinct_rings", "restrict_plan", "ring_set"]
