#!/usr/bin/env python3
"""What restricting dynacp's plans to a pre-built ring set costs (for TransformerEngine, which needs one process group
per ring; dynacp's own ring attention needs none).

For each embedded distribution, plans ``--batches`` global batches with dynacp at ``--ranks`` ranks and maps each plan
onto ``ring_set(ranks, per_node)`` (every CP size: node-local tilings + tails up to the node size, pool tilings
+ tail above it) with ``dynacp.integration.rings.restrict_plan``.
Prints a markdown table: distinct rings the unrestricted plans use over the batches (the groups a lazy pool would
create), the size of the pre-built set, the mean predicted step time (seconds, dynacp's cost model, default preset)
unrestricted and restricted, and the mean and worst per-batch cost of the restriction. Times are predictions, not
measurements; solve times are not part of it.

    python3 benchmarks/ring_set.py --batches 20 --ranks 64 --gbs 512
"""

from __future__ import annotations

import argparse

import numpy as np

import dynacp
from dynacp import distributions
from dynacp.integration.rings import distinct_rings, restrict_plan, ring_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20, help="global batches per distribution")
    ap.add_argument("--ranks", type=int, default=64, help="DP x CP pool size (ranks)")
    ap.add_argument("--per-node", type=int, default=8, help="ranks per node")
    ap.add_argument("--gbs", type=int, default=512, help="sequences per global batch")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.per_node)
    cost = dynacp.CostModel()
    allowed = ring_set(args.ranks, args.per_node)
    print(f"ranks {args.ranks} ({args.per_node} per node), gbs {args.gbs}, {args.batches} batches per workload, "
          f"pre-built set: {len(allowed)} rings\n")
    print("| workload | distinct rings (unrestricted) | rings of the set used | step time unrestricted (s) | "
          "restricted (s) | mean cost | worst batch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in distributions.names():
        rng = np.random.default_rng(args.seed)
        dist = distributions.get(name)
        seen, used, base, restricted, worst = set(), set(), [], [], 0.0
        for _ in range(args.batches):
            lengths = dist.sample(args.gbs, rng)
            plan = dynacp.plan(lengths, cluster=cluster, cost=cost, tight_bound=False)
            snapped = restrict_plan(plan, lengths, cluster, cost, allowed)
            seen |= distinct_rings(plan)
            got = distinct_rings(snapped)
            assert got <= set(allowed), "a restricted plan left the ring set"
            used |= got
            base.append(plan.predicted.step_time)
            restricted.append(snapped.predicted.step_time)
            worst = max(worst, snapped.predicted.step_time / plan.predicted.step_time - 1)
        cost_pct = 100 * (np.mean(restricted) / np.mean(base) - 1)
        print(f"| {name} | {len(seen)} | {len(used)} | {np.mean(base):.3f} | {np.mean(restricted):.3f} | "
              f"{cost_pct:+.1f} % | {100 * worst:+.1f} % |", flush=True)


if __name__ == "__main__":
    main()
