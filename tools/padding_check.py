"""Counts the groups whose padded rows per rank exceed the memory cap, per strategy (issue 21, acceptance 1).

The runtime pads every sequence of a d-rank ring to a multiple of k * d rows (k = ``Cluster.seq_pad_multiple``, 2 for
zigzag ring attention), so a rank holds sum_i k * ceil(s_i / (k d)) rows of a group. This script plans held-out
long-tailed batches at 64 ranks (8 per node) with caps of 4K, 8K and 16K tokens per rank, pp 1 and 4, with every
strategy, and recomputes each group's padded rows itself rather than trusting ``Plan.validate``, so it measures a
build whose planner ignores padding as well (there the plans validate, and the count shows what the runtime would
overflow).

    python3 tools/padding_check.py                     # the table in docs/benchmarks.md
    python3 tools/padding_check.py --batches 2 --json  # machine-readable
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import dynacp
from dynacp import distributions

DISTS = ("longcontext", "github", "wlbllm", "sft", "wikipedia")
CAPS = (4096, 8192, 16384)


def padded_rows(lengths: np.ndarray, degree: int, k: int) -> int:
    """Rows each rank of a ``degree``-rank ring holds for ``lengths`` once padded to multiples of ``k * degree``."""
    unit = k * degree
    return int(np.sum(-(-lengths // unit) * k))


def check(
    dists=DISTS, caps=CAPS, pps=(1, 4), batches: int = 4, gbs: int = 512, seed: int = 90210, ranks: int = 64
) -> dict:
    """Plans every (distribution, cap, pp, batch, strategy) and returns per-strategy counts of groups over the cap."""
    cost = dynacp.CostModel()
    out: dict = {"groups": {}, "over": {}, "worst_rows_over": {}, "plans": 0, "skipped": []}
    for name in dynacp.strategy_names():
        out["groups"][name] = out["over"][name] = out["worst_rows_over"][name] = 0
    rng = np.random.default_rng(seed)
    for dist in dists:
        for cap in caps:
            cluster = dynacp.Cluster(num_ranks=ranks, ranks_per_node=8, activation_budget=cap * cost.mem_per_token)
            k = getattr(cluster, "seq_pad_multiple", 2)  # builds before issue 21 pad by 2 without saying so
            for b in range(batches):
                lengths = distributions.sample(dist, gbs, rng)
                longest = cap // k * k * ranks
                lengths = np.minimum(lengths, longest)  # a sequence the whole pool cannot hold is split by the loader
                for pp in pps:
                    for name in dynacp.strategy_names():
                        try:
                            plan = dynacp.plan(lengths, cluster, cost, name, pp=pp, tight_bound=False)
                        except (ValueError, RuntimeError) as e:  # an anchor that cannot plan this batch at all
                            out["skipped"].append(f"{dist} cap {cap} pp {pp} batch {b} {name}: {e}")
                            continue
                        out["plans"] += 1
                        for slot in plan.microbatches:
                            for g in slot:
                                rows = padded_rows(lengths[list(g.sequences)], len(g.ranks), k)
                                out["groups"][name] += 1
                                if rows > cap:
                                    out["over"][name] += 1
                                    out["worst_rows_over"][name] = max(out["worst_rows_over"][name], rows - cap)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=4, help="batches per (distribution, cap) (default 4)")
    ap.add_argument("--gbs", type=int, default=512, help="sequences per global batch (default 512)")
    ap.add_argument("--seed", type=int, default=90210, help="sampling seed (held out from bench.py's)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    res = check(batches=args.batches, gbs=args.gbs, seed=args.seed)
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(f"{'strategy':<10} {'groups':>8} {'over cap':>9} {'worst rows over':>16}")
        for name in res["groups"]:
            print(f"{name:<10} {res['groups'][name]:>8} {res['over'][name]:>9} {res['worst_rows_over'][name]:>16}")
        total = sum(res["groups"].values())
        print(f"{res['plans']} plans, {total} groups, {sum(res['over'].values())} over the cap once padded; "
              f"{len(res['skipped'])} plans an anchor could not make")
    return 1 if sum(res["over"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
