"""``dynacp compare``: plan K global batches with several strategies and compare predicted step times."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List

import numpy as np

from dynacp import _core
from dynacp.api import plan as make_plan
from dynacp.commands import common


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare strategies on sampled global batches",
        description="Plans K global batches with each strategy and prints predicted step time, speed-up over "
        "`packing`, gap to the lower bound, rank imbalance, peak tokens per rank and solve time.",
    )
    common.add_batch_args(p)
    p.add_argument("--batches", type=int, default=8, help="global batches K (default 8)")
    p.add_argument("--strategies", help="comma-separated strategy names (default: all registered); also "
                   "`megatron-core`: Megatron-Core 0.16.1's released scheduler (pp = 1; needs megatron-core)")
    common.add_cluster_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by strategy")
    p.add_argument("--plot", metavar="FILE.png", help="Gantt chart of the first batch, one panel per strategy")
    p.add_argument("--progress", action="store_true", help="show a progress bar")
    p.set_defaults(func=run)


def compare(args: argparse.Namespace) -> Dict[str, Dict[str, float]]:
    """Runs the comparison and returns per-strategy aggregate metrics (times in seconds)."""
    cluster, cost = common.cluster_and_cost(args)
    # Python-side peers (e.g. `megatron-core`, the released Megatron-Core scheduler) run only when named
    peers = ["megatron-core"]
    names = common.split_names(args.strategies, _core.strategy_names() + (peers if args.strategies else []))
    batch_list = list(common.batches(args, args.batches))
    rows: Dict[str, Dict[str, List[float]]] = {n: {} for n in names}
    first_plans = {}
    it = [(b, n) for b in range(len(batch_list)) for n in names]
    if args.progress:
        try:
            from tqdm import tqdm

            it = tqdm(it, desc="planning", unit="plan")
        except ImportError:
            pass
    errors: Dict[str, str] = {}
    invalid: List[ValueError] = []
    for b, name in it:
        lengths = batch_list[b]
        if name in errors:
            continue
        try:
            planner = make_plan
            if name in peers:
                from dynacp.integration.megatron_core import PEER_STRATEGIES

                planner = PEER_STRATEGIES[name]
            p = planner(lengths, cluster, cost, name, pp=args.pp, vpp=args.vpp, count_policy=args.count_policy)
        except (RuntimeError, ValueError) as e:
            # RuntimeError: e.g. a pipelined plan that would deadlock under 1F1B; ValueError: e.g. an anchor whose
            # microbatch counts break the vpp rule. Either way the other strategies still run.
            errors[name] = f"batch {b}: {e}"
            if isinstance(e, ValueError):
                invalid.append(e)
            continue
        if b == 0:
            first_plans[name] = p
        pr = p.predicted
        per_rank = np.asarray(pr.per_rank_time)
        r = rows[name]
        for key, val in [
            ("step_time", pr.step_time),
            ("lower_bound", pr.lower_bound),
            ("gap", pr.step_time / pr.lower_bound - 1.0),
            ("max_over_mean", per_rank.max() / per_rank.mean() if per_rank.mean() > 0 else 1.0),
            ("peak_tokens_per_rank", float(pr.peak_tokens_per_rank)),
            ("solve_ms", p.solve_ms),
            ("microbatches", float(len(p.microbatches))),
        ]:
            r.setdefault(key, []).append(val)
    if invalid and len(errors) == len(names):
        raise invalid[0]  # every strategy rejected the input: report it as the input error it is
    out: Dict[str, Dict[str, float]] = {}
    base = np.asarray(rows["packing"]["step_time"]) if "packing" in rows and "packing" not in errors else None
    for name in names:
        if name in errors:
            out[name] = {"error": errors[name]}
            continue
        r = {k: np.asarray(v) for k, v in rows[name].items()}
        out[name] = {
            "step_time": float(r["step_time"].mean()),
            "speedup_vs_packing": float((base / r["step_time"]).mean()) if base is not None else float("nan"),
            "gap_to_lower_bound": float(r["gap"].mean()),
            "lower_bound": float(r["lower_bound"].mean()),
            "max_over_mean_rank_time": float(r["max_over_mean"].mean()),
            "peak_tokens_per_rank": float(r["peak_tokens_per_rank"].max()),
            "solve_ms_median": float(np.median(r["solve_ms"])),
            "microbatches_mean": float(r["microbatches"].mean()),
        }
    if args.plot:
        from dynacp.plots import gantt

        gantt(first_plans, batch_list[0], cluster, cost, args.plot, pp=args.pp, vpp=args.vpp,
              count_policy=args.count_policy)
    return out


def run(args: argparse.Namespace) -> int:
    result = compare(args)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    src = args.lengths or args.dist
    print(
        f"dynacp compare: {args.batches} batches x {args.gbs} sequences from {src}; P={args.ranks} "
        f"({args.ranks_per_node}/node), {args.tokens_per_rank} tokens/rank, cost={args.cost}, pp={args.pp}"
    )
    w = max([10] + [len(n) for n in result])  # name column: 10 unless a longer name (megatron-core) is shown
    hdr = (f"{'strategy':<{w}} {'step ms':>10} {'speedup':>8} {'gap to LB':>9} {'max/mean':>9} "
           f"{'peak tok/rank':>13} {'mb':>5} {'solve ms':>9}")
    print(hdr)
    print("-" * len(hdr))
    for name, r in result.items():
        if "error" in r:
            print(f"{name:<{w}} failed: {r['error'][:150]}")
            continue
        print(
            f"{name:<{w}} {r['step_time'] * 1e3:>10.1f} {r['speedup_vs_packing']:>7.3f}x {r['gap_to_lower_bound']:>8.1%} "
            f"{r['max_over_mean_rank_time']:>9.3f} {r['peak_tokens_per_rank']:>13.0f} {r['microbatches_mean']:>5.1f} "
            f"{r['solve_ms_median']:>9.3f}"
        )
    lb = next((r["lower_bound"] for r in result.values() if "lower_bound" in r), float("nan"))
    print(f"lower bound (mean over batches): {lb * 1e3:.1f} ms; speed-up and gap are means of per-batch ratios")
    return 0
