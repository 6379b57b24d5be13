#!/usr/bin/env python3
"""DynacpCPScheduler (the Megatron-Core drop-in) against the released BalancedCPScheduler and dynacp's own plans.

Same batches as benchmarks/bench.py (each embedded distribution and FCP's extreme batch). Per workload: the mean
predicted step time (dynacp's cost model; Megatron schedules priced with their barriers) of the released scheduler,
of DynacpCPScheduler, and of `dynacp` (THD-packing plans that Megatron's hybrid-CP loop cannot run), and the median
wall time of one DynacpCPScheduler call on this machine (all its candidates, the released scheduler's included).

    python3 tools/megatron_core_adapter.py --batches 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from megatron_core_common import add_workload_options, pool  # this folder, first on sys.path for a script

import dynacp
from dynacp.integration import megatron_core as mc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench import workloads  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_options(ap, batches=4, seed=0)
    args = ap.parse_args()
    cluster, cost = pool(args)
    print(f"P = {args.ranks} (8/node), {args.tokens_per_rank} tokens/rank, GBS {args.gbs}, {args.batches} batches "
          "per row; step times predicted (s), solve times measured (ms)\n")
    print("| workload | released step s | DynacpCPScheduler step s | dynacp step s | DynacpCPScheduler solve ms |")
    print("|---|---|---|---|---|")
    for name, gen in workloads(args.gbs, args.seed).items():
        rel, ada, own, ms = [], [], [], []
        for _ in range(args.batches):
            lens = next(gen)
            rel.append(mc.released_plan(lens, cluster, cost).predicted.step_time)
            sched = mc.DynacpCPScheduler(args.tokens_per_rank, mc.PoolSize(args.ranks), cost=cost, ranks_per_node=8)
            t0 = time.perf_counter()
            sched.get_groups_and_subsamples(list(enumerate(lens.tolist())), None)
            ms.append((time.perf_counter() - t0) * 1e3)
            ada.append(sched.last_plan.predicted.step_time)
            own.append(dynacp.plan(lens, cluster, cost, "dynacp").predicted.step_time)
        print(f"| {name} | {np.mean(rel):.3f} | {np.mean(ada):.3f} | {np.mean(own):.3f} | {np.median(ms):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
