"""Plots: Gantt charts of per-rank timelines (matplotlib, imported lazily)."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from dynacp import _core


def timeline(
    plan: _core.Plan,
    lengths: np.ndarray,
    cluster: _core.Cluster,
    cost: _core.CostModel,
    *,
    pp: int = 1,
    vpp: int = 1,
) -> List[Tuple[int, float, float, int, int]]:
    """Bars ``(rank, start, end, group, degree)`` in seconds.

    With ``pp == 1`` a group starts when all its ranks are free (the planner's evaluator). With pipelines the bars
    are stage 0 of each rank from the pipeline simulator (forward and backward ops of every microbatch).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    groups = [g for slot in plan.microbatches for g in slot]
    times = []
    for g in groups:
        crosses = len({r // cluster.ranks_per_node for r in g.ranks}) > 1
        times.append(cost.time(lengths[np.asarray(g.sequences)], g.degree, cluster, crosses_nodes=crosses))
    bars: List[Tuple[int, float, float, int, int]] = []
    if pp <= 1:
        free = np.zeros(cluster.num_ranks)
        for gi, (g, t) in enumerate(zip(groups, times)):
            start = max(free[r] for r in g.ranks)
            for r in g.ranks:
                free[r] = start + t
                bars.append((r, start, start + t, gi, g.degree))
        return bars
    per_rank: List[List[int]] = [[] for _ in range(cluster.num_ranks)]
    for gi, g in enumerate(groups):
        for r in g.ranks:
            per_rank[r].append(gi)
    chunks = pp * vpp
    res = _core.simulate_pipeline(
        per_rank, [list(g.ranks) for g in groups], [t / (3 * chunks) for t in times],
        [2 * t / (3 * chunks) for t in times], pp=pp, vpp=vpp, keep_timeline=True,
    )
    for rank, stage, _chunk, group, _backward, start, end in res.ops:
        if stage == 0:
            bars.append((rank, start, end, group, groups[group].degree))
    return bars


def gantt(
    plans: Mapping[str, _core.Plan],
    lengths: np.ndarray,
    cluster: _core.Cluster,
    cost: _core.CostModel,
    path: Optional[str] = None,
    *,
    pp: int = 1,
    vpp: int = 1,
    count_policy: str = "variable",
):
    """One panel per strategy: ranks on the y axis, time on the x axis, one colour per CP group (its degree
    printed on bars wide enough). Saves to ``path`` when given; returns the matplotlib figure."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(plans)
    fig, axes = plt.subplots(len(names), 1, figsize=(12, 1.2 + 0.12 * cluster.num_ranks * len(names)), squeeze=False)
    cmap = plt.get_cmap("tab20")
    horizon = 0.0
    for ax, name in zip(axes[:, 0], names):
        plan = plans[name]
        bars = timeline(plan, lengths, cluster, cost, pp=pp, vpp=vpp)
        by_rank: Dict[int, List[Tuple[float, float]]] = {}
        colors: Dict[int, List] = {}
        for rank, start, end, group, degree in bars:
            by_rank.setdefault(rank, []).append((start, end - start))
            colors.setdefault(rank, []).append(cmap(group % 20))
            if degree > 1 and end - start > 0.04 * plan.predicted.step_time:
                ax.text(start + (end - start) / 2, rank, str(degree), ha="center", va="center", fontsize=6)
        for rank, spans in by_rank.items():
            ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=colors[rank], edgecolor="white", linewidth=0.3)
        ax.axvline(plan.predicted.lower_bound, color="k", linestyle="--", linewidth=0.8)
        ax.set_title(
            f"{name}: step {plan.predicted.step_time * 1e3:.0f} ms, lower bound {plan.predicted.lower_bound * 1e3:.0f} ms"
            + (f" (pp={pp}, stage 0)" if pp > 1 else ""),
            fontsize=9, loc="left",
        )
        ax.set_ylabel("rank")
        ax.set_ylim(-0.6, cluster.num_ranks - 0.4)
        ax.invert_yaxis()
        horizon = max(horizon, plan.predicted.step_time)
    for ax in axes[:, 0]:
        ax.set_xlim(0, horizon * 1.02)
    axes[-1, 0].set_xlabel("seconds (bars: CP groups, number = CP degree; dashed: lower bound)")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
