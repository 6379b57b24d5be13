"""Options shared by the CLI subcommands: the cluster, the cost model and where batches come from."""

from __future__ import annotations

import argparse
from typing import Iterator, List, Optional

import numpy as np

from dynacp import _core, distributions


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and cost model")
    g.add_argument("--ranks", type=int, default=64, help="ranks P in the DP x CP pool (default 64)")
    g.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node (default 8)")
    g.add_argument(
        "--tokens-per-rank", type=int, default=16384,
        help="activation budget per rank, in tokens of the cost model's mem_per_token (default 16384)",
    )
    g.add_argument("--cost", default="bytescale-fig6a", help=f"cost preset: {', '.join(_core.preset_names())}")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages per rank (default 1)")
    g.add_argument("--vpp", type=int, default=1, help="virtual stages per pipeline stage (default 1)")
    g.add_argument(
        "--count-policy", choices=["equal", "variable"], default="variable",
        help="microbatch counts per rank when pp > 1 (default variable)",
    )


def add_batch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("global batches")
    src = g.add_mutually_exclusive_group()
    src.add_argument(
        "--dist", default=distributions.names()[0],
        help=f"embedded length distribution: {', '.join(distributions.names())} (default %(default)s)",
    )
    src.add_argument(
        "--lengths", metavar="FILE",
        help="lengths file (one integer per line, or .npy); batches are consecutive slices from a seeded offset",
    )
    g.add_argument("--gbs", type=int, default=512, help="sequences per global batch (default 512)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def cluster_and_cost(args: argparse.Namespace) -> tuple:
    if args.tokens_per_rank <= 0:
        raise ValueError(f"--tokens-per-rank must be >= 1, got {args.tokens_per_rank}")
    cost = _core.preset(args.cost)
    cluster = _core.Cluster(
        num_ranks=args.ranks,
        ranks_per_node=args.ranks_per_node,
        activation_budget=cost.mem_static + args.tokens_per_rank * cost.mem_per_token,
    )
    cluster.validate()
    return cluster, cost


def batches(args: argparse.Namespace, count: int) -> Iterator[np.ndarray]:
    """Yields ``count`` global batches of ``args.gbs`` lengths."""
    if args.gbs <= 0:
        raise ValueError(f"--gbs must be >= 1, got {args.gbs}")
    if count <= 0:
        raise ValueError(f"number of batches must be >= 1, got {count}")
    rng = np.random.default_rng(args.seed)
    if args.lengths:
        pool = distributions.read_lengths(args.lengths)
        start = int(rng.integers(pool.size))
        for k in range(count):
            idx = (start + k * args.gbs + np.arange(args.gbs)) % pool.size
            yield pool[idx]
    else:
        dist = distributions.get(args.dist)
        for _ in range(count):
            yield dist.sample(args.gbs, rng)


def split_names(text: Optional[str], known: List[str]) -> List[str]:
    if not text:
        return list(known)
    names = [s.strip() for s in text.split(",") if s.strip()]
    for n in names:
        if n not in known:
            raise ValueError(f"unknown strategy {n!r}; known: {', '.join(known)}")
    return names
