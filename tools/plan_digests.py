#!/usr/bin/env python3
"""Plan digests of dynacp on a fixed set of batches: the refactor check of the solver.

Plans the benchmark workloads (bench.py's batches: every embedded distribution and FCP's extreme batch, 64 ranks,
GBS 512) at pp = 1, pp = 4 and pp = 4 with vpp = 2, plus a seeded sample of small random instances (2-16 ranks,
pp 1, 2 and 4, mixed masks, tight memory), and prints one line per case: its name, the plan's digest and its
predicted step time (seconds). Two builds that print the same lines make identical plans on these inputs.

    python3 tools/plan_digests.py > before.txt      # with the old build
    python3 tools/plan_digests.py > after.txt       # with the new one
    diff before.txt after.txt

`--timing` adds each case's measured solve time (ms, on this machine) to stderr, which the digests ignore.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench import workloads  # noqa: E402

import dynacp  # noqa: E402


def bench_cases(batches: int):
    """(name, lengths, masks, cluster, pp, vpp) of the benchmark workloads."""
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8, tokens_per_rank=16384)
    for wname in workloads(512, 0):
        gen = workloads(512, 0)[wname]
        for b in range(batches):
            lengths = next(gen)
            for pp, vpp in ((1, 1), (4, 1), (4, 2)):
                yield f"{wname}/{b}/pp{pp}/vpp{vpp}", lengths, None, cluster, pp, vpp


def fuzz_cases(count: int, seed: int):
    """Small random instances: pools of 2-16 ranks, tight token budgets, mixed masks."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        rpn = int(rng.choice([1, 2, 4]))
        nodes = int(rng.integers(1, 5))
        P = rpn * nodes
        cap = int(rng.choice([512, 1024, 2048, 4096]))
        n = int(rng.integers(3, 40))
        lengths = np.minimum(rng.lognormal(6.5, 1.2, n).astype(np.int64) + 1, cap * P // 2)
        masks = rng.integers(0, 2, n).astype(np.int64)
        pp = int(rng.choice([1, 2, 4]))
        vpp = 2 if pp > 1 and rng.random() < 0.25 else 1
        intra, inter = (5e9, 10e9) if rng.random() < 0.2 else (1e11, 2.5e10)
        cluster = dynacp.Cluster(num_ranks=P, ranks_per_node=rpn, tokens_per_rank=cap,
                                 intra_node_bandwidth=intra, inter_node_bandwidth=inter)
        yield f"fuzz/{i}/P{P}/pp{pp}/vpp{vpp}", lengths, masks, cluster, pp, vpp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2, help="benchmark batches per workload")
    ap.add_argument("--fuzz", type=int, default=150, help="random small instances")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--timing", action="store_true", help="also print solve times (ms) to stderr")
    args = ap.parse_args()
    cost = dynacp.CostModel()
    cases = list(bench_cases(args.batches)) + list(fuzz_cases(args.fuzz, args.seed))
    for name, lengths, masks, cluster, pp, vpp in cases:
        try:
            p = dynacp.plan(lengths, cluster, cost, "dynacp", masks=masks, pp=pp, vpp=vpp, tight_bound=False)
        except ValueError as e:
            print(f"{name} error {str(e)[:60]}")
            continue
        print(f"{name} {p.digest():016x} {p.predicted.step_time:.9g}")
        if args.timing:
            print(f"{name} {p.solve_ms:.2f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
