"""Plots (matplotlib, imported lazily): Gantt charts of per-rank timelines and a histogram of sequence lengths.

Both are sized for a screen by default (at most 1400 x 900 pixels at the default 100 dpi), carry a title with the
run's settings and a legend that says what each colour means.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from dynacp import _core

SCREEN_INCHES = (14.0, 9.0)
"""Largest figure size (inches) of the defaults; at the default 100 dpi 1400 x 900 pixels."""


class Bar(NamedTuple):
    """One bar of a Gantt chart: ``rank`` busy from ``start`` to ``end`` (seconds) in CP group ``group``."""

    rank: int
    start: float
    end: float
    group: int
    degree: int
    backward: Optional[bool]
    """None without pipelines (one bar per group: forward and backward together), else which pass."""


def bars(
    plan: _core.Plan, lengths: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel, *, pp: int = 1, vpp: int = 1
) -> List[Bar]:
    """The Gantt bars of ``plan``.

    With ``pp == 1`` a group starts when all its ranks are free (the planner's evaluator). With pipelines the bars
    are stage 0 of each rank from the pipeline simulator (forward and backward ops of every microbatch).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    groups = [g for slot in plan.microbatches for g in slot]
    times = []
    for g in groups:
        crosses = len({r // cluster.ranks_per_node for r in g.ranks}) > 1
        times.append(cost.time(lengths[np.asarray(g.sequences)], g.degree, cluster, crosses_nodes=crosses))
    out: List[Bar] = []
    if pp <= 1:
        free = np.zeros(cluster.num_ranks)
        for gi, (g, t) in enumerate(zip(groups, times)):
            start = max(free[r] for r in g.ranks)
            for r in g.ranks:
                free[r] = start + t
                out.append(Bar(r, start, start + t, gi, g.degree, None))
        return out
    per_rank: List[List[int]] = [[] for _ in range(cluster.num_ranks)]
    for gi, g in enumerate(groups):
        for r in g.ranks:
            per_rank[r].append(gi)
    chunks = pp * vpp
    res = _core.simulate_pipeline(
        per_rank, [list(g.ranks) for g in groups], [t / (3 * chunks) for t in times],
        [2 * t / (3 * chunks) for t in times], pp=pp, vpp=vpp, keep_timeline=True,
    )
    for rank, stage, _chunk, group, backward, start, end in res.ops:
        if stage == 0:
            out.append(Bar(rank, start, end, group, groups[group].degree, bool(backward)))
    return out


def timeline(
    plan: _core.Plan, lengths: np.ndarray, cluster: _core.Cluster, cost: _core.CostModel, *, pp: int = 1, vpp: int = 1
) -> List[Tuple[int, float, float, int, int]]:
    """Bars ``(rank, start, end, group, degree)`` in seconds (:func:`bars` without the pass)."""
    return [(b.rank, b.start, b.end, b.group, b.degree) for b in bars(plan, lengths, cluster, cost, pp=pp, vpp=vpp)]


def settings_title(meta: Mapping[str, Any], batch: Optional[int] = None) -> str:
    """A one-line title from a run's metadata (``commands.common.run_metadata``)."""
    cl, src = meta["cluster"], meta["lengths_source"]
    where = src.get("path") or src.get("name")
    first = f", batch {batch}" if batch is not None else ""
    return (f"{meta['sequences_per_batch']} sequences from {where}{first}; P={cl['ranks']} ({cl['ranks_per_node']}"
            f"/node), {cl['tokens_per_rank']} tokens/rank, cost={meta['cost_preset']}, pp={meta['pp']}, vpp={meta['vpp']}")


def _degree_colors(degrees: List[int]) -> Dict[int, Any]:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("viridis")
    uniq = sorted(set(degrees))
    return {d: cmap(0.1 + 0.8 * i / max(1, len(uniq) - 1)) for i, d in enumerate(uniq)}


def _draw_panel(ax, name: str, plan: _core.Plan, panel: List[Bar], colors: Dict[int, Any], num_ranks: int,
                pp: int) -> None:
    by_key: Dict[Tuple[int, Any, bool], List[Tuple[float, float]]] = {}
    for b in panel:
        by_key.setdefault((b.rank, b.degree, bool(b.backward)), []).append((b.start, b.end - b.start))
    for (rank, degree, backward), spans in by_key.items():
        ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=colors[degree], edgecolor="white", linewidth=0.3,
                       alpha=1.0 if (pp <= 1 or backward) else 0.55, hatch=None if (pp <= 1 or backward) else "///")
    pr = plan.predicted
    ax.axvline(pr.lower_bound, color="crimson", linestyle="--", linewidth=1.2)
    ax.set_title(f"{name}: step {pr.step_time * 1e3:.0f} ms, lower bound {pr.lower_bound * 1e3:.0f} ms, gap "
                 f"{pr.gap:.1%}" + (" (pipeline stage 0)" if pp > 1 else ""), fontsize=10, loc="left")
    ax.set_ylabel("rank")
    ax.set_ylim(num_ranks - 0.4, -0.6)
    ax.tick_params(labelsize=9)


def _legend(fig, colors: Dict[int, Any], pp: int) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=f"CP degree {d}") for d, c in colors.items()]
    if pp > 1:
        handles += [Patch(facecolor="grey", alpha=0.55, hatch="///", label="forward"),
                    Patch(facecolor="grey", label="backward")]
    handles.append(Line2D([0], [0], color="crimson", linestyle="--", label="lower bound"))
    fig.legend(handles=handles, loc="upper right", fontsize=9, ncol=1, frameon=True, title="colour = CP degree",
               title_fontsize=9)


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
    title: Optional[str] = None,
    shared_time: bool = True,
    figsize: Optional[Tuple[float, float]] = None,
    dpi: int = 100,
):
    """One panel per strategy: ranks on the y axis, time (ms) on the x axis, bars coloured by CP degree (legend),
    forward passes hatched and lighter than backward ones with pipelines, the lower bound as a dashed red line.

    Args:
        title: a line of settings above the panels (e.g. :func:`settings_title`).
        shared_time: one time axis for every panel (bars comparable across strategies); False gives each panel
            its own axis, so a fast strategy fills its panel.
        figsize: inches; default :data:`SCREEN_INCHES`-bounded (14 wide, up to 9 high).

    Saves to ``path`` when given (and closes the figure); returns the matplotlib figure.
    """
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    names = list(plans)
    if not names:
        raise ValueError("gantt: no plans to draw (every strategy failed?)")
    panels = {n: bars(plans[n], lengths, cluster, cost, pp=pp, vpp=vpp) for n in names}
    colors = _degree_colors([b.degree for p in panels.values() for b in p])
    fs = figsize or (SCREEN_INCHES[0], min(SCREEN_INCHES[1], 1.6 + 1.9 * len(names)))
    fig, axes = plt.subplots(len(names), 1, figsize=fs, squeeze=False, sharex=shared_time)
    horizon = max(max(plans[n].predicted.step_time, plans[n].predicted.lower_bound) for n in names)
    ms = FuncFormatter(lambda x, _pos: f"{x * 1e3:g}")
    for ax, name in zip(axes[:, 0], names):
        _draw_panel(ax, name, plans[name], panels[name], colors, cluster.num_ranks, pp)
        own = max(plans[name].predicted.step_time, plans[name].predicted.lower_bound)
        ax.set_xlim(0, (horizon if shared_time else own) * 1.02)
        ax.xaxis.set_major_formatter(ms)
        if not shared_time:
            ax.set_xlabel("time (ms)", fontsize=9)
    axes[-1, 0].set_xlabel("time (ms, predicted by the cost model)" + ("" if shared_time else "; own axis per panel"))
    _legend(fig, colors, pp)
    fig.suptitle(title or "Gantt chart per strategy", fontsize=11, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    if path:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig


LENGTH_BANDS = [(1, 1024, "< 1K"), (1024, 8192, "1K-8K"), (8192, 32768, "8K-32K"), (32768, 2**62, ">= 32K")]
"""Length bands (tokens, [lo, hi)) the histogram colours by."""


def histogram(
    lengths: np.ndarray,
    path: Optional[str] = None,
    *,
    title: Optional[str] = None,
    figsize: Tuple[float, float] = (10.0, 5.0),
    dpi: int = 100,
):
    """Histogram of sequence lengths on log-spaced bins: sequence counts as bars coloured by length band (legend,
    :data:`LENGTH_BANDS`), and on a second axis each band's share of the tokens and of the attention work (sum s^2),
    the quantities that make long tails expensive. Saves to ``path`` when given; returns the figure."""
    import matplotlib

    if path:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    x = np.asarray(lengths, dtype=np.int64)
    if x.size == 0:
        raise ValueError("histogram: no lengths")
    edges = np.unique(np.geomspace(max(1, x.min()), x.max() + 1, 41).astype(np.int64))
    if edges.size < 2:
        edges = np.array([x.min(), x.min() + 1])
    counts, edges = np.histogram(x, bins=edges)
    band_colors = matplotlib.colormaps["plasma"](np.linspace(0.1, 0.85, len(LENGTH_BANDS)))
    mids = np.sqrt(edges[:-1] * edges[1:])
    colors = [band_colors[next(i for i, (lo, hi, _) in enumerate(LENGTH_BANDS) if lo <= m < hi)] for m in mids]
    fig, ax = plt.subplots(figsize=figsize)
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color=colors, edgecolor="white", linewidth=0.4)
    ax.set_xscale("log")
    ax.set_xlabel("sequence length (tokens, log scale)")
    ax.set_ylabel("sequences (count)")
    shares = []
    for (lo, hi, label), c in zip(LENGTH_BANDS, band_colors):
        sel = (x >= lo) & (x < hi)
        tok = x[sel].sum() / x.sum()
        work = (x[sel].astype(np.float64) ** 2).sum() / (x.astype(np.float64) ** 2).sum()
        shares.append(Patch(facecolor=c, label=f"{label}: {sel.sum()} seqs, {tok:.0%} of tokens, {work:.0%} of s^2"))
    ax.legend(handles=shares, fontsize=9, title="length band (colour)", title_fontsize=9, loc="upper right")
    stats = f"n={x.size}, median {int(np.median(x))}, mean {x.mean():.0f}, max {x.max()} tokens"
    ax.set_title((title + "\n" if title else "") + stats, fontsize=10, loc="left")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig
