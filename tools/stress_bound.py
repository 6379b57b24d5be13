#!/usr/bin/env python3
"""Stress check of the pipelined lower bound where its hard-sequence terms bite: random pools with 2-6 sequences
that each need 15-70 % of the pool's memory, plus up to 40 short ones, random intra- and inter-node bandwidths
(which decide how much work can hide in a ring's exposed communication), pp in {2, 4, 8}. Every strategy plans
every instance; no plan may be faster than the bound. Complements the fuzz target (tests/cpp/fuzz_plans.cpp), whose
lognormal lengths rarely draw several such sequences at once.

    python3 tools/stress_bound.py --instances 5000 --seed 2

Prints one line per violation and a summary (instances, plans, violations, median gap of the best plan); exits 1 on
a violation. Needs the built extension (DYNACP_EXT_DIR, PYTHONPATH as in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import dynacp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=1000, help="random instances to plan")
    ap.add_argument("--seed", type=int, default=1, help="seed of the instance generator")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    names = dynacp.strategy_names()
    violations = plans = 0
    gaps = []
    t0 = time.time()
    for _ in range(args.instances):
        rpn = int(rng.choice([2, 4, 8]))
        P = rpn * int(rng.choice([1, 2, 4]))
        pp = int(rng.choice([2, 4, 8]))
        cost = dynacp.CostModel()
        tokens = int(rng.choice([2048, 4096, 16384]))
        cluster = dynacp.Cluster(num_ranks=P, ranks_per_node=rpn, activation_budget=tokens * cost.mem_per_token,
                                 inter_node_bandwidth=float(rng.choice([12.5e9, 50e9, 200e9])),
                                 intra_node_bandwidth=float(rng.choice([100e9, 350e9, 900e9])))
        hard = [int(rng.integers(int(0.15 * P * tokens), int(0.7 * P * tokens) + 1)) for _ in range(rng.integers(2, 7))]
        short = [int(rng.integers(64, tokens + 1)) for _ in range(rng.integers(0, 41))]
        lengths = np.array(hard + short, dtype=np.int64)
        lb = dynacp.lower_bound(lengths, cluster, cost, pp=pp)
        best = np.inf
        for name in names:
            try:
                p = dynacp.plan(lengths, cluster, cost, name, pp=pp)
            except (ValueError, RuntimeError):  # an anchor that cannot plan this batch (e.g. a 1F1B deadlock)
                continue
            plans += 1
            best = min(best, p.predicted.step_time)
            if p.predicted.step_time < lb * (1 - 1e-9):
                violations += 1
                print(f"below the bound: {name} P={P} rpn={rpn} pp={pp} tokens/rank={tokens} hard={hard} "
                      f"step={p.predicted.step_time} bound={lb}")
        gaps.append(best / lb - 1)
    print(f"stress: {args.instances} instances, {plans} plans, {violations} below the bound, "
          f"{time.time() - t0:.0f} s; median gap of the best plan {100 * np.median(gaps):.1f} %")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
