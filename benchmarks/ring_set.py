#!/usr/bin/env python3
"""What planning on a pre-built ring set costs (for TransformerEngine, which needs one process group per ring;
dynacp's own ring attention needs none).

For each embedded distribution, plans ``--batches`` global batches with dynacp at ``--ranks`` ranks three ways:
unconstrained; restricted after the solve (``rings.restrict_plan`` onto ``ring_set(ranks, per_node)``, every CP size
at every node tiling: the earlier approach); and constrained in the solver (``dynacp.plan(..., ring_set=...)``) with
the set ``rings.select_ring_set`` chooses from ``--select-batches`` other sample batches of the same distribution
(seed ``--seed + 1``). Prints a markdown table: distinct rings the unconstrained plans use (the groups a lazy pool
would create), the sizes of both sets, the most communicators (rings of the selected set) on one rank, the mean predicted step time (seconds, dynacp's cost model, default preset)
and the mean and worst per-batch cost of each restriction against the unconstrained plan. Times are predictions,
not measurements.

    python3 benchmarks/ring_set.py --batches 20 --ranks 64 --gbs 512
"""

from __future__ import annotations

import argparse

import numpy as np

import dynacp
from dynacp import distributions
from dynacp.integration.rings import communicator_memory, distinct_rings, restrict_plan, ring_set, select_ring_set


def _costs(times: list, base: list) -> str:
    """Mean and worst per-batch cost of ``times`` against ``base``, as two table cells."""
    x, b = np.asarray(times), np.asarray(base)
    return f"{100 * (x.mean() / b.mean() - 1):+.1f} % | {100 * (x / b - 1).max():+.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=20, help="global batches per distribution")
    ap.add_argument("--select-batches", type=int, default=8, help="sample batches select_ring_set chooses from")
    ap.add_argument("--ranks", type=int, default=64, help="DP x CP pool size (ranks)")
    ap.add_argument("--per-node", type=int, default=8, help="ranks per node")
    ap.add_argument("--gbs", type=int, default=512, help="sequences per global batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workloads", nargs="*", default=None, help="distribution names (default: all)")
    args = ap.parse_args()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.per_node)
    cost = dynacp.CostModel()
    full = ring_set(args.ranks, args.per_node)
    print(f"ranks {args.ranks} ({args.per_node} per node), gbs {args.gbs}, {args.batches} batches per workload; "
          f"after-solve set: {len(full)} rings (every size)\n")
    print("| workload | distinct rings (unconstrained) | step time unconstrained (s) | after the solve: mean | "
          "worst batch | selected set (rings) | communicators per rank (most) | in the solver: mean | worst batch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.workloads or distributions.names():
        dist = distributions.get(name)
        sel_rng = np.random.default_rng(args.seed + 1)
        selected = select_ring_set([dist.sample(args.gbs, sel_rng) for _ in range(args.select_batches)], cluster,
                                   cost)
        rng = np.random.default_rng(args.seed)
        seen, base, after, inside = set(), [], [], []
        for _ in range(args.batches):
            lengths = dist.sample(args.gbs, rng)
            plan = dynacp.plan(lengths, cluster=cluster, cost=cost, tight_bound=False)
            snapped = restrict_plan(plan, lengths, cluster, cost, full)
            constrained = dynacp.plan(lengths, cluster=cluster, cost=cost, tight_bound=False, ring_set=selected)
            assert distinct_rings(snapped) <= set(full) and distinct_rings(constrained) <= set(selected)
            seen |= distinct_rings(plan)
            base.append(plan.predicted.step_time)
            after.append(snapped.predicted.step_time)
            inside.append(constrained.predicted.step_time)
        most, _ = communicator_memory(selected, args.ranks)
        print(f"| {name} | {len(seen)} | {np.mean(base):.3f} | {_costs(after, base)} | {len(selected)} | {most} | "
              f"{_costs(inside, base)} |", flush=True)


if __name__ == "__main__":
    main()
