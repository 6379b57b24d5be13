"""Layouts under dynacp's per-batch scheduler: sample global batches from a length distribution and plan them.

A layout's DP x CP ranks form the scheduler's pool (``dynacp.Cluster(num_ranks = DP * CP)``); each pool rank is one
TP x PP slice of the layout. Its cost model is derived from the planner's own formulas, per token and per rank:

* ``attn_coef`` a = 12 h_q L_attn x recompute / (t p x speed)  (full mask; the scheduler applies eta = 0.5),
* ``linear_coef`` b = 6 N_active x recompute / (t p x speed) + the TP, EP and PP traffic of one token,
* ``kv_bytes_per_token`` = 3 (fwd KV, bwd KV + dKV) x 2 g_t d_h x 2 B x L_attn / p,
* ``mem_per_token`` = the layout's activation + logits bytes per token (in-flight micro-batches included), and
  ``activation_budget`` = usable GPU memory - model states - buffers.

The scheduler's step time is then stretched by the pipeline bubble (1 + (p-1)/(v m)) and the once-per-step DP
traffic is added. "Static" is the scheduler's ``packing`` baseline (one CP degree, the smallest that holds the
longest sequence, for the whole batch); "dynamic" is ``dynacp`` when built, else ``fcp``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from dynacp.planner.memory import activation_bytes, stage_layers
from dynacp.planner.model import BatchConfig, ClusterConfig, Layout, ModelConfig, PlannerOptions
from dynacp.planner.timing import linear_flops_per_token, link_bandwidth, recompute_factors, ring_factor

Sampler = Callable[[int, np.random.Generator], np.ndarray]
LengthSpec = Union[str, Path, np.ndarray, List[int]]


def read_lengths(path: Union[str, Path]) -> np.ndarray:
    """Lengths from a ``.npy`` file or a text file with one integer per line (int64, all >= 1)."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"lengths file not found: {p}")
    if p.suffix == ".npy":
        arr = np.load(p)
    else:
        try:
            arr = np.array([int(x) for x in p.read_text().split()], dtype=np.int64)
        except ValueError as e:
            raise ValueError(f"{p}: expected one integer per line ({e})") from e
    return check_lengths(arr, str(p))


def check_lengths(arr: Any, where: str = "lengths") -> np.ndarray:
    a = np.asarray(arr)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{where}: expected a non-empty 1-D array of lengths, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        if not (np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a))):
            raise ValueError(f"{where}: lengths must be integers, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.min() < 1:
        raise ValueError(f"{where}: lengths must be >= 1, found {int(a.min())}")
    return a


def length_sampler(spec: LengthSpec) -> Tuple[Sampler, str]:
    """A sampler ``(n, rng) -> lengths`` and a description, from an array (drawn with replacement), a lengths file,
    or the name of an embedded distribution of :mod:`dynacp.distributions` (when that module is available)."""
    if isinstance(spec, (np.ndarray, list, tuple)):
        pool = check_lengths(spec)
        return (lambda n, rng: rng.choice(pool, size=n)), f"{pool.size} given lengths (mean {pool.mean():.0f})"
    if Path(spec).exists():
        pool = read_lengths(spec)
        desc = f"{Path(spec).name}: {pool.size} lengths (mean {pool.mean():.0f})"
        return (lambda n, rng: rng.choice(pool, size=n)), desc
    try:
        from dynacp import distributions
    except ImportError:  # pragma: no cover - depends on the build
        distributions = None
    if distributions is not None and str(spec) in distributions.names():
        return (lambda n, rng: np.asarray(distributions.sample(str(spec), n, rng), dtype=np.int64)), str(spec)
    known = ", ".join(distributions.names()) if distributions is not None else "none available"
    raise ValueError(f"--lengths {spec!r} is neither a file nor an embedded distribution ({known})")


def sample_global_batches(
    sampler: Sampler, batch: BatchConfig, count: int, rng: np.random.Generator
) -> Tuple[List[np.ndarray], int]:
    """``count`` global batches of about global_batch x seq_length tokens; lengths above seq_length are clipped.
    Returns the batches and how many lengths were clipped."""
    budget = batch.global_batch * batch.seq_length
    out, clipped = [], 0
    for _ in range(count):
        parts, total = [], 0
        while total < budget:
            draw = np.asarray(sampler(256, rng), dtype=np.int64)
            clipped += int(np.sum(draw > batch.seq_length))
            parts.append(np.clip(draw, 1, batch.seq_length))
            total += int(parts[-1].sum())
        lengths = np.concatenate(parts)
        keep = max(1, int(np.searchsorted(np.cumsum(lengths), budget, side="right")))
        out.append(lengths[:keep])
    return out, clipped


def scheduler_inputs(
    model: ModelConfig,
    cluster: ClusterConfig,
    batch: BatchConfig,
    layout: Layout,
    opts: PlannerOptions,
    static_bytes: float,
    m: int,
    speed: Optional[float] = None,
) -> Dict[str, float]:
    """Fields of ``dynacp.Cluster`` and ``dynacp.CostModel`` for the layout's DP x CP pool (see module doc).
    ``speed``: achieved FLOP/s of the layout's compute (default: ``opts.mfu`` x peak, or 45% of peak)."""
    t, p, e, v = layout.tp, layout.pp, layout.ep, layout.vpp
    h = model.hidden_size
    if speed is None:
        speed = cluster.peak_flops * (opts.mfu if opts.mfu is not None else 0.45)
    lin_r, attn_r = recompute_factors(opts)
    f_dense, f_exp = linear_flops_per_token(model)
    frac = stage_layers(model, p) / model.num_layers
    full = opts.recompute == "full"
    comm = 0.0
    if t > 1:
        comm += (6 if full else 4) * model.num_layers * frac * h * 2 * ring_factor(t) / link_bandwidth(cluster, t)
    if model.is_moe and e > 1:
        passes = 6 if full or opts.recompute_moe else 4
        a2a = passes * model.moe_layers * frac * model.top_k * h * 2 * (e - 1) / e * opts.moe_imbalance
        comm += a2a / t / link_bandwidth(cluster, layout.etp * e)
    if p > 1:
        comm += 2 * v * h * 2 / t / link_bandwidth(cluster, cluster.world)
    one = Layout(t, p, 1, layout.dp, e, layout.etp, v, layout.edp)
    first, last, logits = activation_bytes(model, BatchConfig(batch.global_batch, batch.seq_length, 1), one, opts, m)
    acts = max(first + (logits if p == 1 else 0.0), last + logits)
    ranks = layout.dp * layout.cp
    per_node = max(1, cluster.gpus_per_node // t)
    while ranks % per_node:
        per_node -= 1
    return {
        "num_ranks": ranks,
        "ranks_per_node": per_node,
        "activation_budget": float(int((cluster.gpu_memory * opts.memory_headroom - static_bytes) / 1e8) * 1e8),
        "intra_node_bandwidth": cluster.intra_node_bandwidth,
        "inter_node_bandwidth": cluster.inter_node_bandwidth,
        "attn_coef": 12.0 * model.q_size * model.attention_layers * frac * attn_r / (t * speed),
        "linear_coef": (f_dense + f_exp * opts.moe_imbalance) * frac * lin_r / (t * speed) + comm,
        "group_overhead": opts.group_overhead,
        "kv_bytes_per_token": 3 * model.attention_layers * frac * 2 * max(1.0, model.kv_heads / t) * model.dh * 2,
        "mem_per_token": acts / batch.seq_length,
    }


def dynamic_strategy(choice: str = "auto") -> str:
    """The dynamic strategy: ``choice`` itself, or for 'auto' 'dynacp' when the scheduler has it, else 'fcp'."""
    import dynacp

    names = dynacp.strategy_names()
    if choice == "auto":
        return "dynacp" if "dynacp" in names else "fcp"
    if choice not in names:
        raise ValueError(f"dynamic_strategy {choice!r} is not a scheduler strategy; known: {', '.join(names)}")
    return choice


def progress(iterable: Any, total: Optional[int], desc: str, enabled: bool) -> Any:
    """tqdm progress bar when tqdm is installed and ``enabled``; the iterable itself otherwise."""
    if not enabled:
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False)
