#!/usr/bin/env python3
"""Which of dynacp's candidate families win, and by how much (issue: "dynacp as a declared portfolio").

For every case - the benchmark workloads (bench.py's batches: every embedded distribution and FCP's extreme batch,
64 ranks, 8 per node, 16,384 tokens per rank, GBS 512) at pp = 1, pp = 4 and pp = 4 with vpp = 2, plus a seeded
sample of small random instances (tools/plan_digests.py's fuzz cases) - it plans once with every family and once
with the winning family left out (``DynacpTuning(skip_families=[winner])``). The winner's margin is how much slower
the second plan is: what the family buys on that case. Times are predicted by the cost model (the default preset);
solve times are measured on this machine.

    python3 benchmarks/families.py --batches 2 --fuzz 60

Prints a markdown table per setting (family, wins, share, mean and max margin, median solve ms of the full search)
that docs/strategies.md records. A family that never wins, or wins by less than 0.1 %, is a candidate for removal.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from plan_digests import bench_cases, fuzz_cases  # noqa: E402

import dynacp  # noqa: E402


def margin_of(case, threads: int) -> Tuple[str, float, float]:
    """(winning family, its margin as a fraction, solve ms) of one case."""
    name, lengths, masks, cluster, pp, vpp = case
    cost = dynacp.CostModel()
    kw = dict(masks=masks, pp=pp, vpp=vpp, tight_bound=False, threads=threads)
    full = dynacp.plan(lengths, cluster, cost, "dynacp", **kw)
    if full.family in ("", "pool-slots"):
        return full.family or "none", 0.0, full.solve_ms
    tuning = dynacp.DynacpTuning(skip_families=[full.family])
    try:
        without = dynacp.plan(lengths, cluster, cost, "dynacp", tuning=tuning, **kw)
        margin = without.predicted.step_time / full.predicted.step_time - 1
    except ValueError:  # nothing else meets the count policy
        margin = float("inf")
    return full.family, margin, full.solve_ms


def table(title: str, rows: List[Tuple[str, float, float]]) -> List[str]:
    wins: Dict[str, List[float]] = defaultdict(list)
    for fam, m, _ in rows:
        wins[fam].append(m)
    solve = np.median([s for _, _, s in rows]) if rows else float("nan")
    out = [f"**{title}** ({len(rows)} cases, median dynacp solve {solve:.1f} ms)", "",
           "| family | wins | share | mean margin | max margin |", "|---|---|---|---|---|"]
    for fam in dynacp.dynacp_families() + ["pool-slots"]:
        ms = wins.get(fam, [])
        if not ms:
            out.append(f"| {fam} | 0 | 0 % | - | - |")
            continue
        finite = [m for m in ms if np.isfinite(m)]
        mean = f"{np.mean(finite):.2%}" if finite else "-"
        mx = "inf" if len(finite) < len(ms) else f"{max(finite):.2%}"
        out.append(f"| {fam} | {len(ms)} | {len(ms) / len(rows):.0%} | {mean} | {mx} |")
    return out + [""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=2, help="benchmark batches per workload")
    ap.add_argument("--fuzz", type=int, default=60, help="small random instances")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--threads", type=int, default=0, help="solver threads (0 = all)")
    args = ap.parse_args()
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        def tqdm(x, **_):
            return x
    groups: Dict[str, List[Tuple[str, float, float]]] = defaultdict(list)
    cases = list(bench_cases(args.batches)) + list(fuzz_cases(args.fuzz, args.seed))
    for case in tqdm(cases, desc="families", unit="case", file=sys.stderr):
        name, pp, vpp = case[0], case[4], case[5]
        kind = "fuzz" if name.startswith("fuzz") else "bench"
        try:
            groups[f"{kind}, pp {pp}" + (f", vpp {vpp}" if vpp > 1 else "")].append(margin_of(case, args.threads))
        except ValueError:
            continue  # an instance no strategy can plan (fuzz)
    lines = [f"dynacp {dynacp.__version__}: winning family per case and its margin (predicted step time without "
             "it / with it - 1)", ""]
    for key in sorted(groups):
        lines += table(key, groups[key])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
