"""A dynacp-backed drop-in for Megatron-Core 0.16.1's ``BalancedCPScheduler`` (:class:`DynacpCPScheduler`), the
one-line switch (:func:`use_dynacp_scheduler`), and the released scheduler against dynacp's ``megatron``
re-implementation (:func:`compare_with_reimplementation`). See docs/integration.md and docs/strategies.md."""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from dynacp import _core
from dynacp.integration.megatron_core.peer import (
    SampleIdGroups,
    plan_from_sample_id_groups,
    rank_lists_to_slots,
    released_groups,
)

log = logging.getLogger("dynacp")


def megatron_degrees(num_ranks: int) -> List[int]:
    """CP sizes a Megatron hybrid-CP sub-sample can take: 1, the powers of two below the pool (one process group per
    aligned block, ``parallel_state.create_hybrid_dp_cp_groups``) and the whole DP x CP pool."""
    out, d = [1], 2
    while d < num_ranks:
        out.append(d)
        d *= 2
    if num_ranks > 1:
        out.append(num_ranks)
    return out


def megatron_blocks(num_ranks: int, d: int) -> List[int]:
    """First ranks of the aligned blocks of ``d`` ranks that own a Megatron process group (only whole blocks)."""
    return [0] if d == num_ranks else list(range(0, num_ranks - d + 1, d))


def check_megatron_schedule(sample_id_groups: SampleIdGroups, num_ranks: int) -> Optional[str]:
    """Why Megatron-Core 0.16.1 could not run this schedule, or ``None`` when it can.

    It can when every sub-sample of a group sits on one aligned block of an allowed size (:func:`megatron_degrees`;
    the size decides which process group it runs on), the ranks that share sub-samples list them in one order (see
    :func:`rank_lists_to_slots`), and every rank has a sub-sample in the last group
    (``hybrid_context_parallel_forward_backward`` runs the last group's last sub-sample outside its loop).
    """
    allowed = set(megatron_degrees(num_ranks))
    for j, group in enumerate(sample_id_groups):
        if len(group) != num_ranks:
            return f"group {j} lists {len(group)} ranks, not {num_ranks}"
        try:
            slots = rank_lists_to_slots(group)
        except RuntimeError as exc:
            return f"group {j}: {exc}"
        for slot in slots:
            for ranks, x in slot:
                d = len(ranks)
                if d not in allowed or ranks != list(range(ranks[0], ranks[0] + d)) or ranks[0] not in megatron_blocks(
                        num_ranks, d):
                    return f"group {j}: sub-sample {x} runs on ranks {ranks}, not an aligned Megatron CP group"
    if sample_id_groups and any(not ids for ids in sample_id_groups[-1]):
        empty = [r for r, ids in enumerate(sample_id_groups[-1]) if not ids]
        return f"ranks {empty[:8]} have no sub-sample in the last group"
    return None


class _TimeTable:
    """T(s, d) of single sequences from the cost model, cached per (length, degree, crosses nodes)."""

    def __init__(self, cluster: _core.Cluster, cost: _core.CostModel) -> None:
        self.cluster, self.cost, self._memo = cluster, cost, {}

    def __call__(self, s: int, d: int, crosses: bool) -> float:
        key = (s, d, crosses)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = self.cost.time([s], d, self.cluster, crosses_nodes=crosses)
        return t


def _list_schedule(lens: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel, times: _TimeTable,
                   slack: Optional[float]) -> Optional[List[List[int]]]:
    """One Megatron group from dynacp's cost model: sequences, slowest first at their least degree, each go to the
    aligned block (of any allowed size) where they finish earliest. ``slack`` bounds the widening: a degree is used
    only while its rank-time ``d T(s, d)`` stays within ``(1 + slack)`` x that at the least degree (``None``: no
    bound). Empty ranks then take the sub-samples whose buddy block is empty (doubling, as Megatron fills them).
    Returns per-rank lists of positions, or ``None`` when some rank stays empty."""
    P, rpn = cluster.num_ranks, cluster.ranks_per_node
    cap = cost.token_capacity(cluster)
    degrees = megatron_degrees(P)
    least = [next(d for d in degrees if d * cap >= s) for s in lens]
    crosses = {d: np.array([b // rpn != (b + d - 1) // rpn for b in megatron_blocks(P, d)]) for d in degrees}
    order = sorted(range(lens.size), key=lambda i: (-times(int(lens[i]), least[i], least[i] > rpn), i))
    free = np.zeros(P)
    place: List[Tuple[int, int]] = [(0, 0)] * lens.size  # (first rank, degree) per position
    lists: List[List[int]] = [[] for _ in range(P)]
    for i in order:
        s = int(lens[i])
        area0 = least[i] * times(s, least[i], least[i] > rpn)
        best = (np.inf, 0, 0)
        for d in degrees[degrees.index(least[i]):]:
            t = np.where(crosses[d], times(s, d, True), times(s, d, False))
            if slack is not None and d > least[i] and d * t.min() > (1 + slack) * area0:
                break
            starts = free[: len(t) * d].reshape(len(t), d).max(axis=1) if d < P else np.array([free.max()])
            fin = starts + t
            b = int(np.argmin(fin))
            if fin[b] < best[0] * (1 - 1e-12):
                best = (float(fin[b]), d, megatron_blocks(P, d)[b])
        fin, d, first = best
        free[first: first + d] = fin
        place[i] = (first, d)
        for r in range(first, first + d):
            lists[r].append(i)
    return lists if _fill_by_doubling(lists, place, order, P) else None


def _fill_by_doubling(lists: List[List[int]], place: List[Tuple[int, int]], order: List[int], P: int) -> bool:
    """Give empty ranks work as Megatron does: a sub-sample whose aligned buddy block (the other half of the block of
    twice its size) is all empty doubles onto it, the latest placed first, until no rank is empty or none can.
    Returns whether every rank has work."""
    changed = True
    while changed and not all(lists):
        changed = False
        for i in reversed(order):
            first, d = place[i]
            if d == P:
                continue
            two = 2 * d if 2 * d < P else P
            lo = (first // two) * two if two < P else 0
            if two not in megatron_degrees(P) or lo not in megatron_blocks(P, two):
                continue
            others = [r for r in range(lo, lo + two) if not first <= r < first + d]
            if all(not lists[r] for r in others):
                for r in others:
                    lists[r].append(i)
                place[i] = (lo, two)
                changed = True
                break
    return all(lists)


def _megatron_strategy_lists(lens: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel) -> List[List[int]]:
    """dynacp's ``megatron`` strategy (a packing-aware re-implementation) as one Megatron group: each packed CP group
    runs its sequences one sub-sample at a time, longest first, on the same ranks."""
    from dynacp.api import plan as make_plan

    lists: List[List[int]] = [[] for _ in range(cluster.num_ranks)]
    for slot in make_plan(lens, cluster, cost, "megatron").microbatches:
        for g in slot:
            for x in sorted(g.sequences, key=lambda k: (-int(lens[k]), k)):
                for r in g.ranks:
                    lists[r].append(int(x))
    return lists


class DynacpCPScheduler:
    """Megatron-Core's ``BalancedCPScheduler`` interface, backed by dynacp's cost model.

    ``HybridCPDataLoaderWrapper`` builds its scheduler as ``BalancedCPScheduler(max_seq_len_per_rank=...,
    dp_cp_group=...)`` and calls ``get_groups_and_subsamples(global_id_seqlens, config)`` once per global batch; this
    class takes the same arguments and returns the same structure, so swapping it in is one line
    (:func:`use_dynacp_scheduler`). Its schedules obey what Megatron-Core 0.16.1 can run
    (:func:`check_megatron_schedule`): one sub-sample per forward on an aligned power-of-two block (or the whole
    pool), one order on shared ranks, every rank busy in the last group.

    Every global batch it builds candidates -- list schedules from dynacp's cost model (each sequence, slowest first,
    on the aligned block where it finishes earliest while its rank-time stays within 0, 2 or 5 % of that at its
    least degree), dynacp's ``megatron`` strategy (both one Megatron group: no barrier inside the step), and, when
    megatron-core is importable and ``include_released`` is set, the released scheduler's own schedule -- prices
    each with dynacp's evaluator (Megatron's barrier after each group included, :func:`plan_from_sample_id_groups`)
    and returns the fastest. So under the cost model it is never slower than the released scheduler on the same batch.

    Args:
        max_seq_len_per_rank: tokens one rank holds (Megatron's ``max_seqlen_per_dp_cp_rank``).
        dp_cp_group: the DP x CP process group (only ``size()`` is read) or anything with ``size()``.
        cost: dynacp cost model pricing the candidates (default ``CostModel()``, the ``bytescale-fig6a`` preset;
            calibrate it for your model, docs/cost_model.md).
        ranks_per_node: GPUs per node (rings inside a node use the intra-node link of the cost model).
        include_released: also consider the released scheduler's schedule (needs megatron-core).
    """

    SLACKS: Tuple[Optional[float], ...] = (0.0, 0.02, 0.05)
    """Widening bounds of the list-schedule candidates (fraction of extra rank-time over the least degree;
    ``None`` would be unbounded: measured 2-3x slower plans on the bench workloads, so not used)."""

    def __init__(self, max_seq_len_per_rank: int, dp_cp_group: Any, *, cost: Optional[_core.CostModel] = None,
                 ranks_per_node: int = 8, include_released: bool = True) -> None:
        if int(max_seq_len_per_rank) < 1:
            raise ValueError(f"max_seq_len_per_rank must be >= 1 token, got {max_seq_len_per_rank}")
        self.max_seq_len_per_rank = int(max_seq_len_per_rank)
        self.total_hdp_gpus = int(dp_cp_group.size())
        self.cost = cost or _core.CostModel()
        self.cluster = _core.Cluster(num_ranks=self.total_hdp_gpus,
                                     ranks_per_node=max(1, min(int(ranks_per_node), self.total_hdp_gpus)),
                                     tokens_per_rank=self.max_seq_len_per_rank)
        self.cluster.validate()
        self.include_released = include_released
        self.last_plan: Optional[_core.Plan] = None
        """The chosen schedule of the last batch as a dynacp Plan (ids are positions in that batch's list)."""
        self.last_candidates: Dict[str, float] = {}
        """Predicted step time in seconds of every candidate of the last batch (``inf``: not runnable by Megatron)."""
        self._times = _TimeTable(self.cluster, self.cost)

    def gpus_needed(self, seq_len: int) -> int:
        """Least CP size of a sub-sample: the next power of two of ``s / capacity`` as in the released scheduler, or
        the whole pool when that exceeds it (the pool need not be a power of two here)."""
        return next(d for d in megatron_degrees(self.total_hdp_gpus) if d * self.max_seq_len_per_rank >= seq_len)

    def get_total_workload(self, seq_length: int, cp_size: Optional[int] = None) -> float:
        """The released scheduler's workload proxy ``s^2 / cp`` (kept for interface parity; dynacp uses its cost
        model)."""
        return seq_length * seq_length / (cp_size or self.gpus_needed(seq_length))

    def get_groups_and_subsamples(self, sample_id_seqlens: Sequence[Tuple[int, int]],
                                  config: Any = None) -> Tuple[List[List[List[int]]], SampleIdGroups]:
        """Schedule one global batch: ``(groups, sample_id_groups)`` as the released scheduler returns them.

        Args:
            sample_id_seqlens: ``(sample_id, sequence_length)`` pairs (the wrapper's global ids and lengths).
            config: Megatron's config (unused, accepted for interface parity).

        Returns:
            ``groups[j][r]``: lengths of the sub-samples rank r runs in group j, in order; ``sample_id_groups[j][r]``:
            their ids.

        Raises:
            ValueError: a sequence longer than the pool holds, a non-positive length, or a repeated id.
        """
        ids = [int(x) for x, _ in sample_id_seqlens]
        lens = np.array([int(s) for _, s in sample_id_seqlens], dtype=np.int64)
        if len(set(ids)) != len(ids):
            raise ValueError("sample ids must be unique; got a repeated id in sample_id_seqlens")
        if not ids:
            return [], []
        cap, P = self.max_seq_len_per_rank, self.total_hdp_gpus
        bad = np.flatnonzero((lens < 1) | (lens > cap * P))
        if bad.size:
            raise ValueError(f"sample {ids[bad[0]]} has {lens[bad[0]]} tokens; each must be in [1, {cap * P}] "
                             f"(max_seq_len_per_rank {cap} x {P} DP x CP ranks)")
        best = self._choose(lens)
        sample_id_groups = [[[ids[k] for k in ranks] for ranks in group] for group in best]
        groups = [[[int(lens[k]) for k in ranks] for ranks in group] for group in best]
        return groups, sample_id_groups

    def _candidates(self, lens: np.ndarray) -> Dict[str, Tuple[SampleIdGroups, float]]:
        out: Dict[str, Tuple[SampleIdGroups, float]] = {}
        for slack in self.SLACKS:
            t0 = time.perf_counter()
            lists = _list_schedule(lens, self.cluster, self.cost, self._times, slack)
            if lists is not None:
                out[f"list(slack={slack})"] = ([lists], (time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        out["megatron"] = ([_megatron_strategy_lists(lens, self.cluster, self.cost)], (time.perf_counter() - t0) * 1e3)
        if self.include_released:
            try:
                out["released"] = released_groups(lens, self.total_hdp_gpus, self.max_seq_len_per_rank)
            except (RuntimeError, ValueError) as exc:  # not installed, or it cannot schedule this batch
                log.debug("DynacpCPScheduler: released scheduler not used: %s", exc)
        return out

    def _choose(self, lens: np.ndarray) -> SampleIdGroups:
        t0 = time.perf_counter()
        best: Optional[Tuple[float, str, SampleIdGroups]] = None
        self.last_candidates = {}
        for name, (groups, _) in self._candidates(lens).items():
            why = check_megatron_schedule(groups, self.total_hdp_gpus)
            if why is not None:
                log.debug("DynacpCPScheduler: candidate %s dropped: %s", name, why)
                self.last_candidates[name] = float("inf")
                continue
            plan = plan_from_sample_id_groups(groups, lens, self.cluster, self.cost, strategy="dynacp-megatron-core")
            self.last_candidates[name] = plan.predicted.step_time
            if best is None or plan.predicted.step_time < best[0]:
                best = (plan.predicted.step_time, name, groups)
        if best is None:
            raise RuntimeError("DynacpCPScheduler: no candidate schedule is runnable by Megatron-Core "
                               f"({self.last_candidates}); see the debug log of the 'dynacp' logger")
        solve_ms = (time.perf_counter() - t0) * 1e3
        self.last_plan = plan_from_sample_id_groups(best[2], lens, self.cluster, self.cost,
                                                    strategy="dynacp-megatron-core", solve_ms=solve_ms)
        log.debug("DynacpCPScheduler: chose %s (%.4f s predicted) in %.1f ms", best[1], best[0], solve_ms)
        return best[2]


def use_dynacp_scheduler(wrapper: Any, **kwargs: Any) -> DynacpCPScheduler:
    """Swap dynacp in for the released scheduler of a ``HybridCPDataLoaderWrapper`` (one line)::

        use_dynacp_scheduler(HybridCPDataLoaderWrapper(data_iterator, config, pg_collection))

    Keyword arguments go to :class:`DynacpCPScheduler`. Returns the new scheduler (also set on the wrapper as
    ``cp_balancing_scheduler``, the attribute the wrapper's ``__next__`` calls)."""
    sched = DynacpCPScheduler(wrapper.config.max_seqlen_per_dp_cp_rank, wrapper.dp_cp_group, **kwargs)
    wrapper.cp_balancing_scheduler = sched
    return sched


def compare_with_reimplementation(lengths: Sequence[int], cluster: _core.Cluster,
                                  cost: _core.CostModel) -> Dict[str, Any]:
    """The released scheduler against dynacp's ``megatron`` re-implementation on one batch (docs/strategies.md).

    Returns a dict: ``groups`` (released Megatron groups, re-implementation microbatches), ``same_partition`` (the
    same sets of sequences per group / microbatch), ``same_degree`` (sequences on the same CP size in both),
    ``widened`` (sequences above their least power-of-two degree, released and re-implementation),
    ``packed_groups`` (re-implementation CP groups holding several sequences, of all its groups), ``step_time``
    (predicted seconds, released with its barriers, and re-implementation).
    """
    lens = np.asarray(lengths, dtype=np.int64)
    P, cap = cluster.num_ranks, cost.token_capacity(cluster)
    released, _ = released_groups(lens, P, cap)
    from dynacp.api import plan as make_plan

    reimpl = make_plan(lens, cluster, cost, "megatron")
    r_deg, r_grp, m_deg, m_grp = {}, {}, {}, {}
    for j, group in enumerate(released):
        for ids in group:
            for x in ids:
                r_deg[x] = r_deg.get(x, 0) + 1
                r_grp[x] = j
    packed = total = 0
    for j, slot in enumerate(reimpl.microbatches):
        for g in slot:
            total += 1
            packed += len(g.sequences) > 1
            for x in g.sequences:
                m_deg[int(x)], m_grp[int(x)] = len(g.ranks), j
    least = [next(d for d in megatron_degrees(P) if d * cap >= s) for s in lens]

    def partition(owner: Dict[int, int]) -> List[Tuple[int, ...]]:
        return sorted(tuple(sorted(x for x in owner if owner[x] == j)) for j in set(owner.values()))

    return {
        "groups": (len(released), len(reimpl.microbatches)),
        "same_partition": partition(r_grp) == partition(m_grp),
        "same_degree": sum(r_deg[x] == m_deg[x] for x in range(lens.size)),
        "widened": (sum(r_deg[x] > least[x] for x in range(lens.size)),
                    sum(m_deg[x] > least[x] for x in range(lens.size))),
        "packed_groups": (packed, total),
        "step_time": (plan_from_sample_id_groups(released, lens, cluster, cost).predicted.step_time,
                      reimpl.predicted.step_time),
    }
