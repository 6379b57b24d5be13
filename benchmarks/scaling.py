#!/usr/bin/env python3
"""pp = 1 solve-time scaling with the number of sequences (issue 26, part 6).

For each batch size, draws one batch from an embedded long-tailed distribution (numpy, fixed seed) and plans it
with every strategy on one rank pool. Prints a markdown table: per size and strategy, the measured solve time
(``Plan.solve_ms``: the strategy itself, in milliseconds), the measured wall and CPU time of the whole
``dynacp.plan`` call (validation, the solve, the plan's validation and its prediction, in seconds; on a shared
machine the wall time includes waiting for a core, the CPU time does not), the predicted step time and its gap to
the lower bound (the cost model's, in seconds), and the plan's digest (so two builds can be compared plan for plan).
Times are measured on this machine, one core; step times are predicted, not measured.

    python3 benchmarks/scaling.py                                  # 100k and 300k sequences, 1,024 ranks
    python3 benchmarks/scaling.py --sizes 100000 300000 1000000    # the acceptance sizes (1M takes a while)
    python3 benchmarks/scaling.py --sizes 2048 --ranks 64 --repeat 21 --strategies dynacp   # the small case
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Dict, List

import numpy as np

import dynacp
from dynacp import distributions


def measure(lengths: np.ndarray, cluster: dynacp.Cluster, strategy: str, repeat: int) -> Dict[str, object]:
    """Plans ``lengths`` ``repeat`` times with ``strategy``; the median solve, wall and CPU times and the last plan's
    predicted step time (s), lower bound (s) and digest."""
    solve_ms: List[float] = []
    wall_s: List[float] = []
    cpu_s: List[float] = []
    p = None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        p = dynacp.plan(lengths, cluster, dynacp.CostModel(), strategy)
        wall_s.append(time.perf_counter() - t0)
        cpu_s.append(time.process_time() - c0)
        solve_ms.append(p.solve_ms)
    assert p is not None
    return {
        "strategy": strategy,
        "solve_ms": float(np.median(solve_ms)),
        "wall_s": float(np.median(wall_s)),
        "cpu_s": float(np.median(cpu_s)),
        "step_s": p.predicted.step_time,
        "lower_bound_s": p.predicted.lower_bound,
        "digest": f"{p.digest():016x}",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000],
                    help="batch sizes to plan (number of sequences)")
    ap.add_argument("--dist", default="wikipedia", choices=distributions.names(),
                    help="embedded length distribution to draw from")
    ap.add_argument("--ranks", type=int, default=1024, help="ranks in the pool")
    ap.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node")
    ap.add_argument("--tokens-per-rank", type=int, default=16384, help="tokens one rank holds per microbatch")
    ap.add_argument("--strategies", nargs="+", default=None,
                    help="strategies to run (default: all registered ones)")
    ap.add_argument("--repeat", type=int, default=1, help="plans per (size, strategy); the table shows medians")
    ap.add_argument("--seed", type=int, default=0, help="numpy seed of the batches")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args()
    names = args.strategies or dynacp.strategy_names()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                             tokens_per_rank=args.tokens_per_rank)
    print(f"P = {args.ranks} ({args.ranks_per_node}/node), {args.tokens_per_rank} tokens/rank, pp = 1, "
          f"distribution {args.dist}, seed {args.seed}, median of {args.repeat}")
    print()
    print("| sequences | strategy | solve ms | plan() wall s | plan() CPU s | step s (predicted) | gap to bound | digest |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for n in args.sizes:
        lengths = distributions.get(args.dist).sample(n, np.random.default_rng(args.seed))
        for name in names:
            row = {"sequences": n, **measure(lengths, cluster, name, args.repeat)}
            rows.append(row)
            gap = row["step_s"] / row["lower_bound_s"] - 1
            print(f"| {n:,} | {name} | {row['solve_ms']:.2f} | {row['wall_s']:.4g} | {row['cpu_s']:.4g} | "
                  f"{row['step_s']:.4f} | {gap:.2%} | {row['digest']} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
