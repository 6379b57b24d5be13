"""``dynacp.configs``: enumerate layouts, price memory and time, rank, explain rejections, optionally predict each
layout under the per-batch scheduler."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np

from dynacp.planner import dynamic, layout_cost
from dynacp.planner.enumerate import enumerate_layouts
from dynacp.planner.memory import GB, MemoryBreakdown, param_counts
from dynacp.planner.model import BatchConfig, ClusterConfig, Layout, ModelConfig, PlannerOptions, recompute_modules_of
from dynacp.planner.presets import resolve_cluster, resolve_model
from dynacp.planner.timing import TimeBreakdown


@dataclass
class Row:
    """One layout with its memory and time breakdown; ``reason`` is empty for feasible layouts."""

    layout: Layout
    """The layout."""
    memory: Optional[MemoryBreakdown]
    """Per-GPU memory (None when a hard constraint already rejects the layout)."""
    time: Optional[TimeBreakdown]
    """Predicted step time (None when a hard constraint already rejects the layout)."""
    usable: float
    """Usable bytes per GPU: gpu_memory x memory_headroom."""
    reason: str = ""
    """Why the layout is rejected: every violated constraint, '; '-joined on one line."""
    flags: List[str] = field(default_factory=list)
    """Notes on an accepted layout (uneven pipeline)."""
    scheduled: Dict[str, Any] = field(default_factory=dict)
    """With a length distribution: ``static`` and ``dynamic``, the mean layout step seconds under the scheduler's
    static and dynamic strategies (scheduler step x pipeline stretch + DP seconds, :mod:`dynacp.planner.layout_cost`),
    and ``speedup``, the mean over the batches of static / dynamic step time (x; :func:`layout_cost.speedup`)."""

    @property
    def feasible(self) -> bool:
        return not self.reason

    @property
    def headroom(self) -> float:
        """Usable bytes left on the most-loaded GPU."""
        return self.usable - self.memory.total if self.memory else float("-inf")

    @property
    def step(self) -> float:
        """Ranking time: the dynamic-scheduler prediction when there is one, else the analytic step time."""
        if "error" in self.scheduled:
            return float("inf")
        dyn = self.scheduled.get("dynamic")
        if dyn is not None:
            return dyn
        return self.time.step if self.time else float("inf")

    def to_dict(self) -> Dict[str, Any]:
        return {
            "layout": self.layout.label(self.layout.ep > 1 or self.layout.etp > 1), **dataclasses.asdict(self.layout),
            "feasible": self.feasible, "reason": self.reason, "flags": list(self.flags),
            "headroom_bytes": self.headroom if self.memory else None,
            "memory": self.memory.to_dict() if self.memory else None,
            "time": self.time.to_dict() if self.time else None,
            "scheduled": dict(self.scheduled),
        }


@dataclass
class ConfigTable:
    """Feasible layouts ranked best first, every rejected layout with its reason, and the inputs."""

    rows: List[Row]
    """Feasible layouts, best first."""
    rejected: List[Row]
    """Rejected layouts, each with a one-line reason."""
    model: ModelConfig
    cluster: ClusterConfig
    batch: BatchConfig
    options: PlannerOptions
    warnings: List[str] = field(default_factory=list)
    """Inconsistencies found in the inputs (they do not stop the search)."""
    lengths: str = ""
    """Description of the length distribution ('' for fixed-length sequences)."""
    strategies: Dict[str, str] = field(default_factory=dict)
    """Scheduler strategy used for 'static' and 'dynamic'."""
    sampled: List[np.ndarray] = field(default_factory=list)
    """The global batches sampled from the length distribution (sequence lengths in tokens; not in the JSON)."""

    @property
    def best(self) -> Optional[Row]:
        return self.rows[0] if self.rows else None

    def find(self, **dims: int) -> List[Row]:
        """Rows (feasible and rejected) whose layout matches every given dimension, e.g. ``find(tp=1, ep=8)``."""
        return [r for r in self.rows + self.rejected if all(getattr(r.layout, k) == v for k, v in dims.items())]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "model": dataclasses.asdict(self.model), "cluster": dataclasses.asdict(self.cluster),
            "batch": dataclasses.asdict(self.batch), "options": dataclasses.asdict(self.options),
            "lengths": self.lengths, "strategies": self.strategies, "warnings": self.warnings,
            "bubble_definitions": {"bubble_of_total": "(p-1)/(v m + p - 1)", "bubble_vs_ideal": "(p-1)/(v m)"},
            "units": "bytes and seconds",
            "feasible": [r.to_dict() for r in self.rows], "rejected": [r.to_dict() for r in self.rejected],
        }

    def to_json(self, indent: int = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format(self, top: int = 10, show_rejected: bool = False) -> str:
        """A text table (GB = 1e9 bytes) of the ``top`` layouts and a summary (or the full list) of rejections."""
        c, b, o = self.cluster, self.batch, self.options
        lines = [
            f"{self.model.name} on {c.name}: {c.num_nodes} x {c.gpus_per_node} GPUs, {c.gpu_memory / GB:.0f} GB each "
            f"(usable {o.memory_headroom:.0%} = {c.gpu_memory * o.memory_headroom / GB:.1f} GB); global batch "
            f"{b.global_batch} x {b.seq_length} tokens, micro batch {b.micro_batch}; recompute {o.recompute}"
            f"{''.join(' + ' + n for n in recompute_modules_of(o))}, "
            f"{o.optimizer} optimizer, {o.grad_dtype} grads, CE {'chunked' if o.chunked_ce else 'full'}",
        ]
        if self.lengths:
            lines.append(f"lengths: {self.lengths}; scheduler static = {self.strategies.get('static')}, "
                         f"dynamic = {self.strategies.get('dynamic')}; 'static s' / 'dynamic s' = scheduler step x "
                         "pipeline stretch + DP time (predicted), 'speedup' = mean per-batch static / dynamic")
        lines += [f"warning: {w}" for w in self.warnings]
        lines.append("bubble: 'bub%tot' = (p-1)/(v m + p - 1) of the step, 'bub%ideal' = (p-1)/(v m) over ideal")
        head = (f"{'#':>3} {'layout':<28} {'m':>3} {'params/GPU':>10} {'weights':>8} {'grads':>7} {'optim':>7} "
                f"{'acts':>7} {'logits':>7} {'bufs':>5} {'total':>7} {'free':>6} {'bub%tot':>7} {'bub%ideal':>9} "
                f"{'step s':>8} {'MFU':>5}")
        if self.lengths:
            head += f" {'static s':>9} {'dynamic s':>9} {'speedup':>8}"
        lines.append(head)
        for i, r in enumerate(self.rows[:top], 1):
            mem, tm = r.memory, r.time
            assert mem is not None and tm is not None
            line = (
                f"{i:>3} {r.layout.label(self.model.is_moe):<28} {tm.microbatches:>3} "
                f"{(mem.params_dense + mem.params_expert) / 1e9:>9.2f}B "
                f"{(mem.weights + mem.fp8_weights) / GB:>8.1f} "
                f"{mem.grads / GB:>7.1f} {mem.optimizer / GB:>7.2f} {mem.activations / GB:>7.1f} "
                f"{mem.logits / GB:>7.1f} {mem.buffers / GB:>5.1f} {mem.total / GB:>7.1f} {r.headroom / GB:>6.1f} "
                f"{tm.bubble_of_total:>7.1%} {tm.bubble_vs_ideal:>9.1%} {tm.step:>8.2f} {tm.mfu:>5.1%}"
            )
            if self.lengths:
                s = r.scheduled
                sp = s.get("speedup")
                line += (f" {s.get('static', float('nan')):>9.2f} {s.get('dynamic', float('nan')):>9.2f} "
                         f"{'n/a' if sp is None else f'{sp:.3f}x':>8}" if "error" not in s
                         else f"  scheduler: {s['error']}")
            if r.flags:
                line += "  [" + "; ".join(r.flags) + "]"
            lines.append(line)
        if not self.rows:
            lines.append("  (no feasible layout)")
        lines.append(f"{len(self.rows)} feasible, {len(self.rejected)} rejected (memory in GB = 1e9 bytes; 'weights' "
                     "includes the FP8 copy)")
        if show_rejected:
            lines += [f"  rejected {r.layout.label(self.model.is_moe)}: {r.reason}" for r in self.rejected]
        elif self.rejected:
            counts: Dict[str, int] = {}
            for r in self.rejected:
                for part in r.reason.split("; "):
                    key = part.split(":")[0]
                    counts[key] = counts.get(key, 0) + 1
            top_reasons = sorted(counts.items(), key=lambda kv: -kv[1])
            lines.append("  rejections by rule: " + ", ".join(f"{k} {n}" for k, n in top_reasons)
                         + " (list each with --rejected)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def model_warnings(model: ModelConfig) -> List[str]:
    """Inconsistencies between parameter counts given directly and the shapes."""
    out = []
    if model.expert_params is not None and model.num_experts and model.expert_ffn_hidden_size:
        mult = 3 if model.gated_mlp else 2
        shaped = model.moe_layers * model.num_experts * mult * model.hidden_size * model.expert_ffn_hidden_size
        if abs(shaped - model.expert_params) > 0.02 * model.expert_params:
            out.append(
                f"expert_params {model.expert_params / 1e9:.2f}B disagrees with the shapes: {model.moe_layers} MoE "
                f"layers x {model.num_experts} experts x {mult} x {model.hidden_size} x "
                f"{model.expert_ffn_hidden_size} = "
                f"{shaped / 1e9:.2f}B (check num_layers)")
    return out


def _model_parallel(row: Row) -> int:
    return row.layout.tp * row.layout.pp * row.layout.cp


def _rank(rows: List[Row], tol: float) -> List[Row]:
    """Sort by step time; rows within ``tol`` of the fastest row of their run are ties, ordered by the least model
    parallelism TP x PP x CP (the simpler layout, as practitioners choose), then by the most memory headroom."""
    rows = sorted(rows, key=lambda r: (r.step, -r.headroom))
    out: List[Row] = []
    i = 0
    while i < len(rows):
        j = i
        while j < len(rows) and rows[j].step <= rows[i].step * (1 + tol):
            j += 1
        out += sorted(rows[i:j], key=lambda r: (_model_parallel(r), -r.headroom, r.step))
        i = j
    return out


def _batch_config(batch: Union[BatchConfig, Dict[str, Any], None], lengths: Optional[dynamic.LengthSpec]
                  ) -> BatchConfig:
    """The batch, its ``seq_length`` taken from ``lengths`` when the batch (a dict, or None) does not give one, and
    checked against the longest length when it does (:func:`layout_cost.resolve_seq_length`)."""
    if isinstance(batch, BatchConfig):
        given: Dict[str, Any] = dataclasses.asdict(batch)
    else:
        given = dict(batch or {"global_batch": 256})
    if lengths is not None:
        longest = layout_cost.longest_length(lengths)
        where = f"--lengths {lengths}" if isinstance(lengths, (str, Path)) else "the lengths"
        given["seq_length"] = layout_cost.resolve_seq_length(longest, given.get("seq_length"), "--seq-length", where)
    given.setdefault("seq_length", 4096)
    b_cfg = BatchConfig.from_dict(given)
    b_cfg.validate()
    return b_cfg


def _scheduled(times: Dict[str, Any], strategies: Dict[str, str]) -> Dict[str, Any]:
    """A row's ``scheduled``: mean layout step seconds per role (static, dynamic) and the speed-up
    (:func:`layout_cost.speedup`), or the scheduler's error."""
    if "error" in times:
        return {"error": times["error"]}
    out: Dict[str, Any] = {name: float(np.mean(times[strat])) for name, strat in strategies.items()}
    out["speedup"] = layout_cost.speedup(times[strategies["static"]], times[strategies["dynamic"]])
    return out


def configs(
    model: Union[str, Path, Dict[str, Any], ModelConfig],
    cluster: Union[str, Path, Dict[str, Any], ClusterConfig],
    batch: Union[BatchConfig, Dict[str, Any], None] = None,
    options: Union[PlannerOptions, Dict[str, Any], None] = None,
    *,
    lengths: Optional[dynamic.LengthSpec] = None,
    progress: bool = False,
    **option_overrides: Any,
) -> ConfigTable:
    """Enumerate, check, price and rank every parallel layout of ``model`` on ``cluster``.

    Args:
        model: a ModelConfig, a dict of its fields, a JSON file or a preset name
            (see :func:`dynacp.planner.presets.preset_names`).
        cluster: the same for ClusterConfig.
        batch: BatchConfig or dict (default: global batch 256 x 4096 tokens, micro batch 1).
        options: PlannerOptions or dict; keyword overrides (e.g. ``recompute="full"``) are applied on top.
        lengths: a length distribution (array, lengths file, or embedded distribution name). Then attention FLOPs use
            the sampled sequences' sum s^2, and each feasible layout is also planned by the scheduler on
            ``options.sample_batches`` sampled global batches (static "packing" vs dynamic) -- the best
            ``options.predict_top`` layouts by analytic time, which are then re-ranked by the dynamic prediction.
        progress: show a tqdm progress bar for the scheduler predictions.

    Returns:
        A :class:`ConfigTable`: ``rows`` (feasible, best first) and ``rejected`` (each with its reason).

    Raises:
        ValueError: bad input, naming the field or file.
    """
    m_cfg, c_cfg = resolve_model(model), resolve_cluster(cluster)
    if isinstance(options, PlannerOptions):
        opts = dataclasses.replace(options, **option_overrides)
    else:
        opts = PlannerOptions.from_dict({**(options or {}), **option_overrides})
    opts.validate()
    b_cfg = _batch_config(batch, lengths)
    usable = c_cfg.gpu_memory * opts.memory_headroom
    warnings = model_warnings(m_cfg)

    sum_sq = None
    batches: List[np.ndarray] = []
    desc = ""
    if lengths is not None:
        sampler, desc = dynamic.length_sampler(lengths)
        rng = np.random.default_rng(opts.seed)
        batches, clipped = dynamic.sample_global_batches(sampler, b_cfg, opts.sample_batches, rng)
        if clipped:  # _batch_config made seq_length hold the longest length: nothing can be clipped
            raise AssertionError(f"{clipped} sampled lengths exceed seq_length {b_cfg.seq_length}")
        sum_sq = layout_cost.sum_of_squares(batches)

    feasible, rejected = [], []
    for cand in enumerate_layouts(m_cfg, c_cfg, b_cfg, opts):
        lay = cand.layout
        if not cand.feasible:
            rejected.append(Row(lay, None, None, usable, "; ".join(cand.violations)))
            continue
        mem, tm, reason = layout_cost.price(m_cfg, c_cfg, b_cfg, lay, opts, sum_sq)
        row = Row(lay, mem, tm, usable, reason, flags=cand.flags)
        (rejected if reason else feasible).append(row)

    strategies: Dict[str, str] = {}
    ranked = _rank(feasible, opts.tie_tolerance)
    if batches and feasible:
        strategies = {"static": "packing", "dynamic": dynamic.dynamic_strategy(opts.dynamic_strategy)}
        chosen = ranked[: opts.predict_top] if opts.predict_top else ranked
        cache: Dict[Any, Dict[str, Any]] = {}
        for row in dynamic.progress(chosen, len(chosen), "scheduler", progress):
            assert row.memory is not None and row.time is not None
            lc = layout_cost.derive(m_cfg, c_cfg, b_cfg, row.layout, opts, row.memory, row.time)
            key = (tuple(sorted(lc.fields.items())), lc.stretch, lc.dp_seconds)
            if key not in cache:
                cache[key] = layout_cost.scheduled_times(lc, batches, list(strategies.values()))
            row.scheduled = _scheduled(cache[key], strategies)
        ranked = _rank(chosen, opts.tie_tolerance) + ranked[len(chosen):]
    return ConfigTable(ranked, rejected, m_cfg, c_cfg, b_cfg, opts, warnings, desc, strategies, batches)


def total_params(model: ModelConfig) -> float:
    """Total parameters (non-expert + routed experts)."""
    return param_counts(model).total
