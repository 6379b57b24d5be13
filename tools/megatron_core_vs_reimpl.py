#!/usr/bin/env python3
"""Megatron-Core 0.16.1's released BalancedCPScheduler against dynacp's `megatron` re-implementation.

Per workload, over --batches batches of --gbs sequences on --ranks ranks: how many batches get the same partition of
sequences into groups (released) / microbatches (re-implementation), how many sequences get the same CP size, how
many are widened above their least power-of-two degree, how many re-implementation groups pack several sequences,
and both predicted step times (dynacp's cost model; the released schedule with its barriers). docs/strategies.md
records the output and explains each difference.

    python3 tools/megatron_core_vs_reimpl.py --batches 20        # 5 workloads x 20 = 100 batches
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from megatron_core_common import add_workload_options, pool  # this folder, first on sys.path for a script

from dynacp import distributions
from dynacp.integration.megatron_core import compare_with_reimplementation


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_options(ap, batches=20, seed=1)
    args = ap.parse_args()
    cluster, cost = pool(args)
    print(f"P = {args.ranks}, {args.tokens_per_rank} tokens/rank, GBS {args.gbs}, {args.batches} batches per row\n")
    print("| workload | same partition | groups (released / re-impl) | same CP size | widened (released / re-impl) "
          "| re-impl packed groups | step s (released / re-impl) |")
    print("|---|---|---|---|---|---|---|")
    for name in distributions.names():
        rng = np.random.default_rng(args.seed)
        rows = [compare_with_reimplementation(distributions.get(name).sample(args.gbs, rng), cluster, cost)
                for _ in range(args.batches)]
        n = args.batches * args.gbs
        same = sum(r["same_partition"] for r in rows)
        groups = [sum(r["groups"][i] for r in rows) / args.batches for i in range(2)]
        widened = [sum(r["widened"][i] for r in rows) / n for i in range(2)]
        packed = sum(r["packed_groups"][0] for r in rows) / max(1, sum(r["packed_groups"][1] for r in rows))
        steps = [np.mean([r["step_time"][i] for r in rows]) for i in range(2)]
        print(f"| {name} | {same}/{args.batches} | {groups[0]:.2f} / {groups[1]:.2f} | "
              f"{sum(r['same_degree'] for r in rows) / n:.1%} | {widened[0]:.1%} / {widened[1]:.1%} | {packed:.1%} | "
              f"{steps[0]:.3f} / {steps[1]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
