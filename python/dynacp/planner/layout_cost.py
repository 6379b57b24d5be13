"""The per-batch scheduler priced from a model, a layout and a cluster: the one place that turns the planner's
per-layer model into the scheduler's ``dynacp.Cluster`` and ``dynacp.CostModel``.

``dynacp configs --lengths`` (every layout it predicts) and ``dynacp compare|plan|report --model M --layout L
--cluster C`` (one layout) both call :func:`price` and :func:`derive`, so the two commands price a layout alike:

* the layout's DP x CP ranks are the scheduler's pool, each pool rank one TP x PP slice of the layout; the cost
  coefficients come from :func:`dynacp.planner.dynamic.scheduler_inputs` (attention, GEMMs, TP / EP / PP traffic,
  at the layout's achieved compute speed), the activation budget is the usable GPU memory left after the model
  states and buffers;
* the scheduler plans one stage's work with ``pp = 1`` (the pipeline is throughput-parallel), and a **layout step
  time** is ``scheduler step time x stretch + dp_seconds``: ``stretch = 1 + (p - 1) / (v m)`` the pipeline bubble of
  the layout's m micro-batches, ``dp_seconds`` the once-per-step exposed DP traffic (:class:`LayoutCost`);
* the **speed-up** both commands report is :func:`speedup`: the mean over the batches of the static strategy's
  (``packing``) layout step time over the dynamic one's, batch by batch.

Sequence length: a pack holds the longest sequence (:func:`resolve_seq_length`); nothing is clipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from dynacp.planner import dynamic
from dynacp.planner.memory import GB, MemoryBreakdown, memory_breakdown
from dynacp.planner.model import BatchConfig, ClusterConfig, Layout, ModelConfig, PlannerOptions
from dynacp.planner.timing import TimeBreakdown, step_time

#: A sequence length taken from the lengths is rounded up to a multiple of this many tokens, so that a pack splits
#: into 2 x CP equal chunks for every CP degree up to 512 (the planner's ``seq % 2CP`` rule).
SEQ_LENGTH_MULTIPLE = 1024

#: Fields of :func:`dynamic.scheduler_inputs` that belong to ``dynacp.Cluster`` (the rest are ``CostModel``'s).
CLUSTER_FIELDS = ("num_ranks", "ranks_per_node", "activation_budget", "intra_node_bandwidth", "inter_node_bandwidth")


def longest_length(spec: dynamic.LengthSpec) -> int:
    """The longest length ``spec`` can give: an array's or a lengths file's longest entry, an embedded
    distribution's context window (its samples are capped there, :class:`dynacp.distributions.Distribution`)."""
    if isinstance(spec, (np.ndarray, list, tuple)):
        return int(dynamic.check_lengths(spec).max())
    if Path(spec).exists():
        return int(dynamic.read_lengths(spec).max())
    from dynacp import distributions

    if str(spec) in distributions.names():
        return int(distributions.get(str(spec)).context)
    dynamic.length_sampler(spec)  # raises the error naming a spec that is neither
    raise AssertionError("unreachable")  # pragma: no cover


def resolve_seq_length(longest: int, given: Optional[int], flag: str = "--seq-length",
                       where: str = "the lengths") -> int:
    """The pack size s: ``given`` when it holds the ``longest`` length, else a ValueError naming both and ``flag``;
    without ``given``, ``longest`` rounded up to a multiple of :data:`SEQ_LENGTH_MULTIPLE` tokens."""
    derived = -(-int(longest) // SEQ_LENGTH_MULTIPLE) * SEQ_LENGTH_MULTIPLE
    if given is None:
        return derived
    if given < longest:
        raise ValueError(f"{where}: sequences up to {longest} tokens, longer than {flag} {given}: give {flag} "
                         f"{longest} or more, or leave {flag} out to use {derived} (the longest length rounded up to "
                         f"a multiple of {SEQ_LENGTH_MULTIPLE}); no length is clipped")
    return int(given)


def parse_layout(text: str, model: ModelConfig, cluster: ClusterConfig) -> Layout:
    """A :class:`Layout` from ``'TP4/PP4/CP2'`` (parts in any order, '/'-separated, case-insensitive: ``TP``,
    ``PP`` (``PP4x2`` = VPP 2), ``VPP``, ``CP``, ``EP``, ``ETP``, ``DP``; absent ones are 1, DP is the rest of the
    cluster's GPUs and, when given, must equal it)."""
    dims: Dict[str, int] = {}
    for part in str(text).replace(",", "/").split("/"):
        part = part.strip().upper()
        if not part:
            continue
        if part.startswith("PP") and "X" in part:
            part, vpp = part.split("X", 1)
            dims["VPP"] = _degree(vpp, "VPP", text)
        key = next((k for k in ("ETP", "VPP", "TP", "PP", "CP", "EP", "DP") if part.startswith(k)), None)
        if key is None or key in dims:
            raise ValueError(f"--layout {text!r}: cannot read {part!r}; write e.g. TP4/PP4/CP2 (parts TP, PP or "
                             "PPpxv, VPP, CP, EP, ETP, DP, each once)")
        dims[key] = _degree(part[len(key):], key, text)
    t, p, c = dims.get("TP", 1), dims.get("PP", 1), dims.get("CP", 1)
    w = cluster.world
    if w % (t * p * c):
        raise ValueError(f"--layout {text!r}: TP x PP x CP = {t * p * c} does not divide the {w} GPUs of "
                         f"{cluster.name}")
    d = w // (t * p * c)
    if dims.get("DP", d) != d:
        raise ValueError(f"--layout {text!r}: DP {dims['DP']} is not {w} GPUs / (TP x PP x CP) = {d}")
    e, te = dims.get("EP", 1), dims.get("ETP", 1)
    if (e > 1 or te > 1) and not model.is_moe:
        raise ValueError(f"--layout {text!r}: EP / ETP apply to MoE models; {model.name} is dense")
    return Layout(t, p, c, d, e, te, dims.get("VPP", 1), max(1, w // (te * e * p)))


def _degree(digits: str, key: str, text: str) -> int:
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"--layout {text!r}: {key} needs a degree >= 1, got {digits!r}")
    return int(digits)


def price(model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
          sum_sq: Optional[float] = None) -> Tuple[MemoryBreakdown, TimeBreakdown, str]:
    """Per-GPU memory, analytic step time and the memory rejection ('' when the layout fits) of one layout that
    passes the hard constraints (``sum_sq``: mean sum of s^2 of the sampled batches, None for full packs)."""
    m = batch.global_batch // (batch.micro_batch * layout.dp)
    mem = memory_breakdown(model, batch, layout, opts, m)
    tm = step_time(model, cluster, batch, layout, opts, sum_sq)
    usable = cluster.gpu_memory * opts.memory_headroom
    reason = ""
    if mem.total > usable:
        reason = (f"memory: needs {mem.total / GB:.1f} GB > {usable / GB:.1f} GB usable ({opts.memory_headroom:.0%} "
                  f"of {cluster.gpu_memory / GB:.0f} GB) on the {mem.stage} stage (states {mem.model_states / GB:.1f},"
                  f" activations {mem.activations / GB:.1f}, logits {mem.logits / GB:.1f})")
    return mem, tm, reason


@dataclass
class LayoutCost:
    """The scheduler's view of one layout: plan with ``cluster``, ``cost``, ``pp`` and ``vpp``, then turn a
    scheduler step time into the layout's with :meth:`step`."""

    cluster: Any
    """``dynacp.Cluster``: the layout's DP x CP pool (one rank = one TP x PP slice), its activation budget in bytes."""
    cost: Any
    """``dynacp.CostModel`` derived from the planner's per-layer model (name ``planner``)."""
    stretch: float
    """1 + (p - 1) / (v m): the pipeline bubble of the layout's m micro-batches (1 without a pipeline)."""
    dp_seconds: float
    """Exposed DP (gradient reduce-scatter / parameter all-gather) seconds per step."""
    label: str
    """E.g. 'derived from llama3-70b on TP4/PP4/CP2/DP16, h100-512'."""
    fields: Dict[str, float]
    """The :func:`dynamic.scheduler_inputs` fields ``cluster`` and ``cost`` were built from."""
    pp: int = 1
    """Pipeline stages the scheduler plans (1: the pipeline enters as ``stretch``)."""
    vpp: int = 1
    """Virtual stages the scheduler plans (1)."""
    layout: Optional[Layout] = None
    """The layout."""
    batch: Optional[BatchConfig] = None
    """The planner batch it was priced for (packs of ``seq_length`` tokens)."""
    memory: Optional[MemoryBreakdown] = None
    """Per-GPU memory of the layout."""
    time: Optional[TimeBreakdown] = None
    """Analytic step time of the layout."""

    def step(self, scheduler_seconds: float) -> float:
        """The layout's step seconds for a scheduler step (or lower bound) of ``scheduler_seconds``."""
        return scheduler_seconds * self.stretch + self.dp_seconds

    def describe(self) -> Dict[str, Any]:
        """JSON-able: the label, the stretch, the DP seconds and the pool."""
        return {"kind": "derived", "label": self.label, "pipeline_stretch": self.stretch,
                "dp_seconds": self.dp_seconds, "scheduler_pp": self.pp, "scheduler_vpp": self.vpp,
                "layout": self.layout.name if self.layout else None,
                "seq_length_tokens": self.batch.seq_length if self.batch else None,
                "global_batch_packs": self.batch.global_batch if self.batch else None,
                "fields": dict(self.fields)}


def scheduler_cost(fields: Dict[str, float]) -> Tuple[Any, Any]:
    """``(dynacp.Cluster, dynacp.CostModel)`` of :func:`dynamic.scheduler_inputs` fields."""
    import dynacp

    cluster = dynacp.Cluster(**{k: fields[k] for k in CLUSTER_FIELDS})
    cost = dynacp.CostModel(name="planner", source="dynacp.planner layout model",
                            **{k: v for k, v in fields.items() if k not in CLUSTER_FIELDS})
    return cluster, cost


def derive(model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
           mem: MemoryBreakdown, tm: TimeBreakdown) -> LayoutCost:
    """The :class:`LayoutCost` of a priced layout (``mem``, ``tm`` from :func:`price`)."""
    full = 4 / 3 if opts.recompute == "full" else 1.0
    speed = tm.model_flops / cluster.world * full / tm.compute if tm.compute > 0 else None
    fields = dynamic.scheduler_inputs(model, cluster, batch, layout, opts, mem.model_states + mem.buffers,
                                      tm.microbatches, speed)
    pool, cost = scheduler_cost(fields)
    label = f"derived from {model.name} on {layout.label(model.is_moe)}, {cluster.name}"
    return LayoutCost(pool, cost, 1 + tm.bubble_vs_ideal, tm.dp_comm, label, fields, layout=layout, batch=batch,
                      memory=mem, time=tm)


def scheduled_times(lc: LayoutCost, batches: Sequence[np.ndarray], strategies: Sequence[str]) -> Dict[str, Any]:
    """Per strategy, the layout step seconds of every batch (a list), or ``{'error': why}`` when the scheduler
    refuses one."""
    import dynacp

    out: Dict[str, Any] = {}
    try:
        for strat in strategies:
            out[strat] = [lc.step(dynacp.plan(b, lc.cluster, lc.cost, strategy=strat, pp=lc.pp, vpp=lc.vpp
                                              ).predicted.step_time) for b in batches]
    except ValueError as e:
        return {"error": str(e)}
    return out


def speedup(static: Sequence[float], dynamic_: Sequence[float]) -> Optional[float]:
    """The speed-up both ``configs`` and ``compare`` report: mean over the batches of static step time / dynamic
    step time (layout step times, batch by batch); None when a time is not finite."""
    r = float(np.mean(np.asarray(static, dtype=np.float64) / np.asarray(dynamic_, dtype=np.float64)))
    return r if math.isfinite(r) else None


def batch_for(lengths: Sequence[np.ndarray], seq_length: int, micro_batch: int, dp: int) -> BatchConfig:
    """The planner batch of given global batches: packs of ``seq_length`` tokens, the mean tokens per batch
    rounded up to whole packs and to a multiple of ``micro_batch`` x DP (so that every DP rank runs m micro-batches;
    for batches ``configs`` sampled this gives back its ``global_batch``)."""
    tokens = float(np.mean([np.sum(b, dtype=np.int64) for b in lengths]))
    packs = max(1, math.ceil(tokens / seq_length))
    step = micro_batch * dp
    return BatchConfig(-(-packs // step) * step, int(seq_length), int(micro_batch))


def sum_of_squares(batches: Sequence[np.ndarray]) -> float:
    """Mean over the batches of sum s^2 (tokens^2): what the analytic attention time of sampled batches uses."""
    return float(np.mean([np.sum(np.asarray(x, dtype=np.float64) ** 2) for x in batches]))


def layout_cost(
    model: Union[str, Path, Dict[str, Any], ModelConfig],
    layout: Union[str, Layout],
    cluster: Union[str, Path, Dict[str, Any], ClusterConfig],
    batches: Sequence[Any],
    *,
    seq_length: Optional[int] = None,
    micro_batch: int = 1,
    options: Union[PlannerOptions, Dict[str, Any], None] = None,
) -> LayoutCost:
    """The scheduler's Cluster and CostModel for ``layout`` of ``model`` on ``cluster`` (presets, files, dicts or
    configs, as :func:`dynacp.configs` takes them), priced for ``batches`` (global batches: arrays of lengths).

    ``seq_length`` (tokens per pack) defaults to the longest length rounded up (:func:`resolve_seq_length`); the
    planner batch is :func:`batch_for`. Plan with ``lc.cluster``, ``lc.cost``, ``pp=lc.pp``, ``vpp=lc.vpp`` and turn
    a predicted step time into the layout's with ``lc.step(seconds)``.

    Raises:
        ValueError: an unreadable layout, one that breaks a hard constraint or does not fit in memory (the reason
            names the rule and the numbers), or a ``seq_length`` shorter than the longest length.
    """
    from dynacp.planner.enumerate import check
    from dynacp.planner.presets import resolve_cluster, resolve_model

    m_cfg, c_cfg = resolve_model(model), resolve_cluster(cluster)
    opts = options if isinstance(options, PlannerOptions) else PlannerOptions.from_dict(options or {})
    opts.validate()
    lay = layout if isinstance(layout, Layout) else parse_layout(layout, m_cfg, c_cfg)
    arrays: List[np.ndarray] = [dynamic.check_lengths(b, "batch") for b in batches]
    if not arrays:
        raise ValueError("layout_cost needs at least one global batch")
    longest = max(int(b.max()) for b in arrays)
    s = resolve_seq_length(longest, seq_length, "seq_length", "the batches")
    b_cfg = batch_for(arrays, s, micro_batch, lay.dp)
    b_cfg.validate()
    cand = check(m_cfg, c_cfg, b_cfg, lay, opts)
    mem, tm, reason = price(m_cfg, c_cfg, b_cfg, lay, opts, sum_of_squares(arrays)) if cand.feasible else (
        None, None, "")
    why = "; ".join(cand.violations) or reason
    if why:
        raise ValueError(f"layout {lay.label(m_cfg.is_moe)} of {m_cfg.name} on {c_cfg.name} (global batch "
                         f"{b_cfg.global_batch} packs of {s} tokens, micro batch {micro_batch}): {why}")
    assert mem is not None and tm is not None
    return derive(m_cfg, c_cfg, b_cfg, lay, opts, mem, tm)
