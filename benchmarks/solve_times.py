#!/usr/bin/env python3
"""dynacp's solve time on bench.py's batches (issue 26's speed targets), measured on this machine.

Plans bench.py's batches (every embedded distribution and FCP's extreme batch; 64 ranks, 8 per node, 16,384 tokens
per rank, GBS 512 unless changed) with dynacp at pp = 1, pp = 4 and pp = 4 with vpp = 2, and prints per row the
median ``Plan.solve_ms`` (wall milliseconds of the solve, measured) and the median process CPU milliseconds of the
whole ``dynacp.plan`` call (validation and the pipelined lower bound included). Step times are not printed: see
bench.py for the cost model's predictions. ``--ring-set`` plans on a ring set (``PlanOptions.ring_set``): ``pow2``
the power-of-two set (``rings.power_of_two_set``), ``selected`` per workload the set ``rings.select_ring_set``
chooses (pp = 1) from ``--select-batches`` other batches of it (drawn with seed 1; not timed).

    python3 benchmarks/solve_times.py                    # threads = every hardware thread
    python3 benchmarks/solve_times.py --threads 1
    python3 benchmarks/solve_times.py --ranks 1024 --gbs 8192 --batches 1 --pp 4
    python3 benchmarks/solve_times.py --pp 4 --threads 2 --ring-set selected
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from bench import workloads

import dynacp
from dynacp.integration.rings import power_of_two_set, select_ring_set


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2, help="batches per workload")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--tokens-per-rank", type=int, default=16384)
    ap.add_argument("--gbs", type=int, default=512, help="sequences per global batch")
    ap.add_argument("--pp", type=int, nargs="+", default=[1, 4], help="pipeline depths (pp > 1 rows also run vpp 2)")
    ap.add_argument("--threads", type=int, default=0, help="solver threads (0 = every hardware thread)")
    ap.add_argument("--ring-set", choices=["none", "pow2", "selected"], default="none",
                    help="plan on no ring set, the power-of-two set, or each workload's selected set")
    ap.add_argument("--select-batches", type=int, default=8, help="sample batches select_ring_set chooses from")
    args = ap.parse_args()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                             tokens_per_rank=args.tokens_per_rank)
    rows = [(pp, vpp) for pp in args.pp for vpp in ((1,) if pp == 1 else (1, 2))]
    print(f"P = {args.ranks} ({args.ranks_per_node}/node), GBS {args.gbs}, {args.batches} batches per workload, "
          f"threads = {args.threads or 'all'}, ring set {args.ring_set} (measured on this machine)\n")
    sets: dict[str, list] = {}
    for name, gen in workloads(args.gbs, 1).items():
        if args.ring_set == "pow2":
            sets[name] = power_of_two_set(cluster)
        elif args.ring_set == "selected":
            sets[name] = select_ring_set([next(gen) for _ in range(args.select_batches)], cluster,
                                         threads=args.threads)
    if sets:
        print(f"ring set sizes (rings): {', '.join(f'{k} {len(v)}' for k, v in sets.items())}\n")
    print("| pp | vpp | median solve ms (wall) | median plan() CPU ms |\n|---|---|---|---|")
    for pp, vpp in rows:
        wall, cpu = [], []
        for name, gen in workloads(args.gbs, 0).items():
            for _ in range(args.batches):
                lengths = next(gen)
                c0 = time.process_time()
                try:
                    p = dynacp.plan(lengths, cluster, pp=pp, vpp=vpp, threads=args.threads,
                                    ring_set=sets.get(name))
                except ValueError:  # a batch the pool cannot hold
                    continue
                cpu.append((time.process_time() - c0) * 1e3)
                wall.append(p.solve_ms)
        print(f"| {pp} | {vpp} | {np.median(wall):.1f} | {np.median(cpu):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
