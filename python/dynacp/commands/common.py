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
    """The ``Cluster`` (with ``tokens_per_rank``) and ``CostModel`` the flags describe."""
    if args.tokens_per_rank <= 0:
        raise ValueError(f"--tokens-per-rank must be >= 1, got {args.tokens_per_rank}")
    from dynacp.calibrate.fileformat import apply_links, resolve_cost

    cost, links = resolve_cost(args.cost)
    cluster = _core.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                            tokens_per_rank=args.tokens_per_rank)
    apply_links(cluster, links)
    cluster.validate()
    return cluster, cost


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


def run_metadata(args: argparse.Namespace, batches: Batches, cluster: _core.Cluster, cost: _core.CostModel
                 ) -> Dict[str, Any]:
    """What a JSON or HTML output records about its run: versions, cluster, cost preset, pipeline, batch source."""
    import platform

    import dynacp

    return {
        "command": args.command, "dynacp_version": dynacp.__version__, "python_version": platform.python_version(),
        "numpy_version": np.__version__,
        "cluster": {"ranks": cluster.num_ranks, "ranks_per_node": cluster.ranks_per_node,
                    "tokens_per_rank": int(cost.token_capacity(cluster))},
        "cost_preset": args.cost, "cost_source": cost.source, "pp": args.pp, "vpp": args.vpp,
        "count_policy": args.count_policy, "batches": len(batches.batches),
        "sequences_per_batch": int(batches.batches[0].lengths.size), "lengths_source": batches.source,
        "times_predicted_by": "the cost model (docs/cost_model.md); only solve times are measured",
    }
