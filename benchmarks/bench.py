#!/usr/bin/env python3
"""Benchmark driver: every strategy on every embedded distribution and on FCP's extreme batch, pp in {1, 4}
(and, with --vpp 2, interleaved 1F1B).

Prints a markdown table (what docs/benchmarks.md records): per workload and pp, each strategy's mean predicted step
time, speed-up over `packing`, mean gap to the lower bound, and median solve time; plus whether `dynacp` was at least
as fast as every other strategy on every batch. Predicted times come from dynacp's cost model (the default
`bytescale-fig6a` preset); solve times are measured on this machine.

    python3 benchmarks/bench.py --batches 8 --ranks 64 --gbs 512
    python3 benchmarks/bench.py --batches 4 --pp 4 --vpp 2

An anchor's plan that the simulator rejects shows as `[k deadlock]` (shared CP groups at different 1F1B positions)
or, under vpp > 1, `[k no vpp]` (microbatch counts that are not multiples of pp; megatron splits to one where it
can).

The `megatron-core` column is Megatron-Core 0.16.1's released `BalancedCPScheduler` itself (installed by
scripts/setup.sh; `--no-megatron-core` leaves it out): its groups become a dynacp Plan priced by the same cost model
(its barrier after each group included), and its solve time is its own Python call, measured here. It schedules only
without pipelines, so its pp > 1 cells read `n/a`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

import dynacp
from dynacp import distributions


def extreme_batches(gbs: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """FCP's extremely unbalanced batch: one 128K sequence and gbs - 1 sequences of 2K-8K."""
    while True:
        yield np.concatenate([[131_072], rng.integers(2048, 8193, gbs - 1)]).astype(np.int64)


def sampled(name: str, gbs: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    dist = distributions.get(name)
    while True:
        yield dist.sample(gbs, rng)


def workloads(gbs: int, seed: int) -> Dict[str, Iterator[np.ndarray]]:
    out: Dict[str, Iterator[np.ndarray]] = {n: sampled(n, gbs, np.random.default_rng(seed)) for n in distributions.names()}
    out["fcp-extreme"] = extreme_batches(gbs, np.random.default_rng(seed))
    return out


def released_peer(enabled: bool) -> Optional[Callable[..., dynacp.Plan]]:
    """Megatron-Core's released scheduler as a planner (None when disabled; fails loudly when not installed)."""
    if not enabled:
        return None
    from dynacp.integration import megatron_core

    megatron_core.released_scheduler_class()  # RuntimeError with the install command when megatron-core is missing
    return megatron_core.released_plan


def run(args: argparse.Namespace) -> Tuple[List[str], bool]:
    cost = dynacp.CostModel()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                             tokens_per_rank=args.tokens_per_rank)
    peer = released_peer(args.megatron_core)
    names = dynacp.strategy_names() + (["megatron-core"] if peer else [])
    lines = [
        f"P = {args.ranks} ({args.ranks_per_node}/node), {args.tokens_per_rank} tokens/rank, GBS {args.gbs}, "
        f"{args.batches} batches per row, cost preset {cost.name}",
        "",
        "| workload | pp | " + " | ".join(f"{n} step s (x, gap)" for n in names) + " | dynacp solve ms | "
        + ("megatron-core solve ms | " if peer else "") + "dynacp <= all |",
        "|---|---|" + "---|" * len(names) + "---|" + ("---|" if peer else "") + "---|",
    ]
    all_ok = True
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    jobs = [(w, pp) for w in workloads(args.gbs, args.seed) for pp in args.pp]
    bar = tqdm(total=len(jobs) * args.batches, desc="bench", unit="batch", file=sys.stderr) if tqdm else None
    for wname, pp in jobs:
        gen = workloads(args.gbs, args.seed)[wname]
        steps = {n: [] for n in names}
        gaps = {n: [] for n in names}
        failed: Dict[str, Dict[str, int]] = {n: {} for n in names}
        solve, peer_solve = [], []
        ok = True
        for _ in range(args.batches):
            lengths = next(gen)
            best_other = np.inf
            for n in names:
                vpp = args.vpp if pp > 1 else 1
                if n == "megatron-core" and pp > 1:  # the released scheduler has no pipelined schedule
                    failed[n]["n/a"] = failed[n].get("n/a", 0) + 1
                    steps[n].append(np.nan)
                    gaps[n].append(np.nan)
                    continue
                try:
                    p = (peer if n == "megatron-core" else dynacp.plan)(lengths, cluster, cost, n, pp=pp, vpp=vpp)
                except (RuntimeError, ValueError) as e:
                    # an anchor's pipelined plan that would deadlock under 1F1B, or under vpp > 1 whose counts are
                    # not multiples of pp; anything else (and any dynacp failure) is a real error
                    why = "deadlock" if "cycle" in str(e) else "no vpp" if "multiple of pp" in str(e) else None
                    if why is None or n == "dynacp":
                        raise
                    failed[n][why] = failed[n].get(why, 0) + 1
                    steps[n].append(np.nan)
                    gaps[n].append(np.nan)
                    continue
                steps[n].append(p.predicted.step_time)
                gaps[n].append(p.predicted.step_time / p.predicted.lower_bound - 1)
                if n == "dynacp":
                    solve.append(p.solve_ms)
                else:
                    if n == "megatron-core":
                        peer_solve.append(p.solve_ms)
                    best_other = min(best_other, p.predicted.step_time)
            ok &= steps["dynacp"][-1] <= best_other * (1 + 1e-12)
            if bar:
                bar.update(1)
        all_ok &= ok
        base = np.asarray(steps["packing"])
        cells = []
        for n in names:
            s = np.asarray(steps[n])
            if np.isnan(s).all():
                cells.append(" / ".join(failed[n]))
                continue
            speedup = f"{np.nanmean(base / s):.2f}x" if not np.isnan(base / s).all() else "-"
            cell = f"{np.nanmean(s):.3f} ({speedup}, {np.nanmean(gaps[n]):.1%})"
            cells.append(cell + "".join(f" [{k} {why}]" for why, k in failed[n].items()))
        label = f"{pp} (vpp {args.vpp})" if pp > 1 and args.vpp > 1 else f"{pp}"
        peer_cell = (f"{np.median(peer_solve):.2f} | " if peer_solve else "n/a | ") if peer else ""
        lines.append(f"| {wname} | {label} | " + " | ".join(cells) + f" | {np.median(solve):.2f} | {peer_cell}"
                     f"{'yes' if ok else 'NO'} |")
    if bar:
        bar.close()
    return lines, all_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--tokens-per-rank", type=int, default=16384)
    ap.add_argument("--gbs", type=int, default=512)
    ap.add_argument("--pp", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--vpp", type=int, default=1, help="virtual stages for the pp > 1 rows (interleaved 1F1B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-megatron-core", dest="megatron_core", action="store_false",
                    help="leave out the released Megatron-Core scheduler's column")
    args = ap.parse_args()
    lines, ok = run(args)
    print("\n".join(lines))
    print(f"\ndynacp <= every other strategy on every batch: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
