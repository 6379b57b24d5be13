"""What the two Megatron-Core comparison scripts share: their batch and pool options, and the pool they describe.

``tools/megatron_core_adapter.py`` (DynacpCPScheduler against the released scheduler) and
``tools/megatron_core_vs_reimpl.py`` (the released scheduler against dynacp's re-implementation) price the same
kind of workload: ``--batches`` batches of ``--gbs`` sequences on a pool of ``--ranks`` ranks (8 per node) that hold
``--tokens-per-rank`` tokens each, under dynacp's default cost model.
"""

from __future__ import annotations

import argparse

import dynacp

RANKS_PER_NODE = 8
"""Ranks (GPUs) per node of the pool both scripts price."""


def add_workload_options(ap: argparse.ArgumentParser, *, batches: int, seed: int) -> None:
    """``--batches`` (default ``batches``), ``--gbs``, ``--ranks``, ``--tokens-per-rank`` and ``--seed`` (default
    ``seed``)."""
    for flag, default, text in (("--batches", batches, f"batches per workload (default {batches})"),
                                ("--gbs", 512, "sequences per batch (default 512)"),
                                ("--ranks", 64, "DP x CP ranks (default 64)"),
                                ("--tokens-per-rank", 16384, "tokens one rank holds (default 16384)")):
        ap.add_argument(flag, type=int, default=default, help=text)
    ap.add_argument("--seed", type=int, default=seed)


def pool(args: argparse.Namespace) -> tuple[dynacp.Cluster, dynacp.CostModel]:
    """The cluster (``--ranks``, 8 per node, ``--tokens-per-rank``) and the default cost model."""
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=RANKS_PER_NODE, tokens_per_rank=args.tokens_per_rank)
    return cluster, dynacp.CostModel()
