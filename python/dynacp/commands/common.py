"""What the CLI subcommands share once their options are parsed: the cluster and cost model, the global batches,
progress bars, run metadata (the options themselves are defined in :mod:`dynacp.commands.options`).

Sequence ids are 0-based everywhere: sequence i of a batch is entry i of its lengths array, and a plan records which
entry of the lengths file each one came from.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional

import numpy as np

from dynacp import _core, distributions
from dynacp.commands import options

logger = logging.getLogger(__name__)

# the option definitions live in dynacp.commands.options; these two names stay importable from here
ALIASES, flags = options.ALIASES, options.flags


def solver_kwargs(args: argparse.Namespace) -> dict:
    """The dynacp solver options of the command line, as keyword arguments of :func:`dynacp.plan`."""
    return {"threads": args.threads, "time_limit": args.time_limit}


def cluster_and_cost(args: argparse.Namespace) -> tuple:
    """The ``Cluster`` (with ``tokens_per_rank``, or ``activation_budget`` bytes) and ``CostModel`` the flags
    describe."""
    if args.tokens_per_rank <= 0:
        raise ValueError(f"--tokens-per-rank must be >= 1, got {args.tokens_per_rank}")
    from dynacp.calibrate.fileformat import apply_links, resolve_cost

    cost, links = resolve_cost(args.cost)
    budget = getattr(args, "activation_budget", None)
    if budget is None:
        cluster = _core.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                                tokens_per_rank=args.tokens_per_rank)
    elif args.tokens_per_rank != options.PRESET_FLAGS["--tokens-per-rank"][1]:
        raise ValueError(f"give the activation budget once: --tokens-per-rank {args.tokens_per_rank} (tokens) or "
                         f"--activation-budget {budget:g} (bytes)")
    elif not budget > 0:
        raise ValueError(f"--activation-budget must be > 0 bytes, got {budget:g}")
    else:
        cluster = _core.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node, activation_budget=budget,
                                tokens_per_rank=0)
    apply_links(cluster, links)
    cluster.validate()
    return cluster, cost


@dataclass
class Pricing:
    """How a command's plans are priced: the scheduler's ``cluster`` and ``cost``, where they come from, and (with
    ``--model/--layout/--cluster``) the layout that turns a scheduler step time into the layout's."""

    cluster: _core.Cluster
    """The DP x CP pool the scheduler plans."""
    cost: _core.CostModel
    """The cost model of every predicted time."""
    kind: str
    """'preset' (a built-in preset), 'file' (a calibrated preset file) or 'derived' (from a model and a layout)."""
    label: str
    """The line the outputs print, e.g. 'cost: preset bytescale-fig6a (quick look, not your hardware)'."""
    layout: Optional[Any] = None
    """The :class:`dynacp.planner.layout_cost.LayoutCost` when ``kind`` is 'derived'."""

    def step(self, scheduler_seconds: float) -> float:
        """The step seconds to report for a scheduler step (or bound): the layout's when derived, else itself."""
        return self.layout.step(scheduler_seconds) if self.layout is not None else scheduler_seconds

    def describe(self) -> Dict[str, Any]:
        """JSON-able: kind and label, with the layout's stretch, DP seconds and pool fields when derived."""
        base = self.layout.describe() if self.layout is not None else {}
        return {**base, "kind": self.kind, "label": self.label}


def pricing(args: argparse.Namespace, batches: Batches) -> Pricing:
    """The :class:`Pricing` of the flags: derived from ``--model --layout --cluster`` (all three, and none of the
    preset's own flags) for ``batches``, else the ``--cost`` preset or file with the pool flags."""
    given = {f: getattr(args, f.lstrip("-"), None) for f in ("--model", "--layout", "--cluster")}
    if not any(given.values()):
        if hasattr(args, "recompute") and options.training_options(args) != options.training_defaults():
            raise ValueError("the training options (--optimizer, --recompute, --fp8, ...) price a layout: give them "
                             "with --model, --layout and --cluster")
        cluster, cost = cluster_and_cost(args)
        if args.cost in _core.preset_names():
            return Pricing(cluster, cost, "preset", f"cost: preset {args.cost} (quick look, not your hardware; "
                           "--model/--layout/--cluster price your own)")
        return Pricing(cluster, cost, "file", f"cost: calibrated file {args.cost} ({cost.source})")
    missing = [f for f, v in given.items() if not v]
    if missing:
        raise ValueError(f"--model, --layout and --cluster go together (the cost model is derived from all three); "
                         f"missing {', '.join(missing)}")
    clash = [f for f, (dest, default) in options.PRESET_FLAGS.items() if getattr(args, dest, default) != default]
    if clash:
        raise ValueError(f"{', '.join(clash)} cannot be given with --model/--layout/--cluster, which derive the cost "
                         "model, the pool, its activation budget and the pipeline; drop them (or drop --model/--layout/"
                         "--cluster to use them)")
    from dynacp.planner import layout_cost as lcm

    spec = args.lengths or args.dist
    seq = lcm.resolve_seq_length(lcm.longest_length(spec), args.seq_length, "--seq-length",
                                 f"--lengths {spec}" if args.lengths else f"--dist {spec}")
    lc = lcm.layout_cost(args.model, args.layout, args.cluster, [b.lengths for b in batches.batches],
                         seq_length=seq, micro_batch=args.mbs or 1, options=options.training_options(args))
    return Pricing(lc.cluster, lc.cost, "derived", f"cost: {lc.label} (step = scheduler step x {lc.stretch:.3f} "
                   f"pipeline stretch + {lc.dp_seconds * 1e3:.1f} ms DP; {lc.cluster.num_ranks} pool ranks)", lc)


#: What every output says is predicted and what is measured.
PREDICTED = "every step time, lower bound, speed-up, gap, balance and token count: predicted by the cost model"
MEASURED = "solve times only: wall-clock on this machine"


def check_pool(cluster: _core.Cluster, sequences: int) -> None:
    """Warn (``dynacp`` logger) when the pool has more ranks than a batch has sequences."""
    if cluster.num_ranks > sequences:
        logger.warning("the pool has %d ranks but a batch holds %d sequences: %d more ranks than sequences, so most "
                       "ranks work only inside another's CP group or idle; check --ranks / --gbs",
                       cluster.num_ranks, sequences, cluster.num_ranks - sequences)


#: A pool where the fastest plan of a batch leaves more than this share of the ranks without work is warned about
#: (:func:`warn_idle`): even the best schedule has no use for them.
IDLE_SHARE = 0.5


def idle_ranks(busy: Any) -> int:
    """Ranks of a plan with no work (busy time 0)."""
    return int(np.sum(np.asarray(busy) <= 0.0))


def warn_idle(plans: Dict[str, List[tuple]], ranks: int) -> bool:
    """Warn once (``dynacp`` logger) when on some batch the fastest plan (``plans``: strategy -> per batch
    ``(predicted step seconds, idle ranks)``; ties by name) leaves more than :data:`IDLE_SHARE` of the ``ranks``
    without work; True if it did."""
    for b in range(max((len(v) for v in plans.values()), default=0)):
        at = {n: v[b] for n, v in plans.items() if b < len(v)}
        name = min(at, key=lambda n: (at[n][0], n))
        idle = at[name][1]
        if idle > IDLE_SHARE * ranks:
            logger.warning("most of the pool is idle: on batch %d the fastest plan (%s) leaves %d of %d ranks (%.0f %%, "
                           "more than %.0f %%) without work; the pool is larger than the batch needs: use fewer "
                           "--ranks or a larger --gbs", b, name, idle, ranks, 100.0 * idle / ranks, 100 * IDLE_SHARE)
            return True
    return False


@dataclass
class Batch:
    """One global batch: ``lengths[i]`` is sequence i; with a file, ``entries[i]`` is its 0-based file entry."""

    lengths: np.ndarray
    entries: Optional[np.ndarray] = None


@dataclass
class Batches:
    """The global batches of one command and where they came from (``source``: JSON-able, see :func:`load`)."""

    batches: List[Batch]
    source: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        s = self.source
        if s["kind"] == "file":
            how = f"shuffled with seed {s['seed']}, " if s["shuffle"] else ""
            return f"{s['path']} ({how}from entry {s['offset']}{', wrapped' if s['wrap'] else ''})"
        return f"{s['name']} (seed {s['seed']})"


def load(args: argparse.Namespace, count: int, gbs: int) -> Batches:
    """``count`` global batches of ``gbs`` sequences from ``--lengths`` (consecutive entries from ``--offset``, or
    a ``--seed``-ed permutation with ``--shuffle``) or from ``--dist``.

    Raises ValueError when the file holds fewer entries than the request needs and ``--wrap`` is not given."""
    if gbs <= 0:
        raise ValueError(f"--gbs must be >= 1, got {gbs}")
    if count <= 0:
        raise ValueError(f"number of batches must be >= 1, got {count}")
    seed = 0 if args.seed is None else args.seed
    if not args.lengths:
        if args.offset or args.shuffle or args.wrap:
            raise ValueError("--offset, --shuffle and --wrap apply to --lengths FILE only")
        rng = np.random.default_rng(seed)
        dist = distributions.get(args.dist)
        return Batches([Batch(dist.sample(gbs, rng)) for _ in range(count)],
                       {"kind": "distribution", "name": args.dist, "seed": seed})
    if args.seed is not None and not args.shuffle:
        logger.warning("--seed %d has no effect on --lengths without --shuffle: batches are consecutive entries from "
                       "--offset %d", args.seed, args.offset)
    pool = distributions.read_lengths(args.lengths)
    n, need = pool.size, args.offset + count * gbs
    if not 0 <= args.offset < n:
        raise ValueError(f"--offset {args.offset} is outside {args.lengths}, which holds {n} lengths (entries 0.."
                         f"{n - 1})")
    if need > n and not args.wrap:
        raise ValueError(
            f"{args.lengths} holds {n} lengths but {count} batch(es) x {gbs} sequences from entry {args.offset} need "
            f"{need}; pass a smaller --gbs or --batches, or --wrap to reuse entries from the start of the file")
    if need > n:
        logger.info("--wrap: %s holds %d lengths, %d requested; entries are reused from the start", args.lengths, n,
                    need - args.offset)
    order = np.random.default_rng(seed).permutation(n) if args.shuffle else np.arange(n)
    out = []
    for k in range(count):
        entries = order[(args.offset + k * gbs + np.arange(gbs)) % n]
        out.append(Batch(pool[entries], entries.astype(np.int64)))
    source = {"kind": "file", "path": str(args.lengths), "entries_in_file": int(n), "offset": args.offset,
              "shuffle": bool(args.shuffle), "seed": seed if args.shuffle else None, "wrap": bool(args.wrap)}
    return Batches(out, source)


def split_names(text: Optional[str], known: List[str]) -> List[str]:
    if not text:
        return list(known)
    names = [s.strip() for s in text.split(",") if s.strip()]
    for n in names:
        if n not in known:
            raise ValueError(f"unknown strategy {n!r}; known: {', '.join(known)}")
    return names


def progress(items: Iterable, args: argparse.Namespace, desc: str, unit: str, total: Optional[int] = None) -> Iterator:
    """``items`` wrapped in a tqdm bar on stderr when stderr is a terminal and ``--quiet`` is not given."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        return iter(items)
    try:
        from tqdm import tqdm
    except ImportError:  # scripts/setup.sh installs it; without it the command runs, only without a bar
        logger.info("tqdm is not installed: no progress bar")
        return iter(items)

    return iter(tqdm(items, desc=desc, unit=unit, total=total, file=sys.stderr, leave=False))


def run_metadata(args: argparse.Namespace, batches: Batches, price: Pricing) -> Dict[str, Any]:
    """What a JSON or HTML output records about its run: versions, cluster, cost model (``cost``: kind, label and a
    derived layout's stretch and DP time), pipeline, batch source, what is predicted and what measured."""
    import platform

    import dynacp

    cluster, cost = price.cluster, price.cost
    return {
        "command": args.command, "dynacp_version": dynacp.__version__, "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "cluster": {"ranks": cluster.num_ranks, "ranks_per_node": cluster.ranks_per_node,
                    "tokens_per_rank": int(cost.token_capacity(cluster))},
        "cost_preset": args.cost if price.layout is None else price.layout.label, "cost_source": cost.source,
        "cost": price.describe(), "predicted": PREDICTED, "measured": MEASURED,
        "pp": price.layout.pp if price.layout is not None else args.pp,
        "vpp": price.layout.vpp if price.layout is not None else args.vpp,
        "count_policy": args.count_policy, "batches": len(batches.batches),
        "sequences_per_batch": int(batches.batches[0].lengths.size), "lengths_source": batches.source,
        "times_predicted_by": "the cost model (docs/cost_model.md); only solve times are measured",
    }
