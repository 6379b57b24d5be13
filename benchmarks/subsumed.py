#!/usr/bin/env python3
"""Which dynacp families the local search subsumes (issue 26, part 7), measured on this machine.

dynacp's last stage, the local search, runs on small instances only (at most `LocalSearchTuning.max_sequences`
sequences on at most `max_ranks` ranks). Where it runs, a family it subsumes can be skipped without changing any
plan's step time. This script plans small random instances (tools/plan_digests.py's generator: 2-16 ranks, pp 1,
2 and 4, mixed masks, tight memory; those within the local search's limits) with the whole portfolio and with each
family skipped in turn (`DynacpTuning(skip_families=[name])`), and prints per family on how many instances it
applies, on how many skipping it makes the plan slower, and by how much (predicted step times of the cost model).

    python3 benchmarks/subsumed.py                  # 150 instances, seed 2026
    python3 benchmarks/subsumed.py --count 400 --seed 7

A family that never makes a plan slower here is subsumed on small instances only: at scale (where the local search
does not run) it still has to earn its place (benchmarks/families.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from plan_digests import fuzz_cases  # noqa: E402

import dynacp  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=150, help="random small instances drawn (some fall outside)")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    limits = dynacp.LocalSearchTuning()
    cost = dynacp.CostModel()
    families = dynacp.dynacp_families()
    won = dict.fromkeys(families, 0)
    slower = dict.fromkeys(families, 0)
    worst = dict.fromkeys(families, 0.0)
    used = 0
    for _name, lengths, masks, cluster, pp, vpp in fuzz_cases(args.count, args.seed):
        if len(lengths) > limits.max_sequences or cluster.num_ranks > limits.max_ranks:
            continue
        kw = dict(masks=masks, pp=pp, vpp=vpp, tight_bound=False)
        try:
            plan = dynacp.plan(lengths, cluster, cost, "dynacp", **kw)
        except ValueError:
            continue
        used += 1
        full = plan.predicted.step_time
        won[plan.family] = won.get(plan.family, 0) + 1
        for fam in families:
            tuning = dynacp.DynacpTuning(skip_families=[fam])
            t = dynacp.plan(lengths, cluster, cost, "dynacp", tuning=tuning, **kw).predicted.step_time
            if t > full * (1 + 1e-12):
                slower[fam] += 1
                worst[fam] = max(worst[fam], t / full - 1)
    print(f"{used} instances within the local search's limits (<= {limits.max_sequences} sequences, "
          f"<= {limits.max_ranks} ranks); step times predicted by the cost model")
    print()
    print("| family | plans it produced | plans slower without it | largest loss |")
    print("|---|---|---|---|")
    for fam in families:
        print(f"| {fam} | {won[fam]} | {slower[fam]} | {100 * worst[fam]:.2f} % |")
    for fam in sorted(set(won) - set(families)):  # the fallback (pool-slots) is no family and cannot be skipped
        print(f"| {fam} (fallback) | {won[fam]} | - | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
