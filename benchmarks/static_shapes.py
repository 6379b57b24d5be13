#!/usr/bin/env python3
"""What CUDA-graph mode costs: the free dynacp plan against plans under static shapes (issue 35, item 4).

For every workload of benchmarks/bench.py (the embedded distributions and FCP's extreme batch) and each ``--pp``,
plans ``--batches`` global batches at ``--ranks`` ranks four ways and prints a markdown table of the mean and worst
predicted step time (seconds, dynacp's cost model, default preset) and the padding fraction (bucket padding rows /
rows held, ``plan.predicted.padding_fraction``):

* **free**: ``dynacp.plan`` without shapes;
* **CUDA-graph mode**: ``dynacp.plan(..., static_shapes=dynacp.default_static_shapes(cluster, cost, buckets=4,
  cp_sizes=--cp-sizes, max_microbatches=8, max_sequences=--max-sequences))``: the solver plans under the shapes;
* **pad-to-cap** (Megatron-LM dev's rule for CUDA graphs: one bucket, the token capacity per rank): dynacp planning
  under ``StaticShapes(token_buckets=[cap], ...)``, and Megatron's own plan (strategy ``megatron``) with every
  group padded to the cap (``dynacp.predict(..., static_shapes=...)`` prices the padding).

Every time is predicted by the cost model, not measured.

    python3 benchmarks/static_shapes.py --batches 20 --pp 1 4
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

import numpy as np
from bench import workloads

import dynacp


def _cell(times: list[float], base: Optional[list[float]] = None) -> str:
    """Mean and worst step time (s) as two table cells, with their change against ``base`` when given."""
    t = np.asarray(times)
    if base is None:
        return f"{t.mean():.3f} | {t.max():.3f}"
    b = np.asarray(base)
    return f"{t.mean():.3f} ({100 * (t.mean() / b.mean() - 1):+.1f} %) | {t.max():.3f} ({100 * (t.max() / b.max() - 1):+.1f} %)"


def _shapes(cluster: dynacp.Cluster, cost: dynacp.CostModel, args: argparse.Namespace) -> tuple:
    """(CUDA-graph mode's shapes, the pad-to-cap shapes)."""
    graph = dynacp.default_static_shapes(cluster, cost, buckets=args.buckets, cp_sizes=args.cp_sizes,
                                         max_microbatches=args.slots, max_sequences=args.max_sequences)
    cap = max(graph.token_buckets)
    to_cap = dynacp.StaticShapes(token_buckets=[cap], cp_sizes=list(graph.cp_sizes), max_microbatches=args.slots,
                                 max_sequences=args.max_sequences)
    return graph, to_cap


def run(args: argparse.Namespace) -> list[str]:
    cost = dynacp.CostModel()
    cluster = dynacp.Cluster(num_ranks=args.ranks, ranks_per_node=args.ranks_per_node,
                             tokens_per_rank=args.tokens_per_rank)
    graph, to_cap = _shapes(cluster, cost, args)
    megatron_cap = dynacp.StaticShapes(token_buckets=[max(graph.token_buckets)])  # rows only: megatron's own plan
    lines = [f"P = {args.ranks} ({args.ranks_per_node}/node), {args.tokens_per_rank} tokens/rank, GBS {args.gbs}, "
             f"{args.batches} batches per row, cost preset {cost.name}; CUDA-graph mode: buckets "
             f"{list(graph.token_buckets)} rows per rank, cp {list(graph.cp_sizes)}, <= {graph.max_microbatches} "
             f"slots, <= {graph.max_sequences or 'any'} sequences per microbatch; pad-to-cap: one bucket of "
             f"{max(graph.token_buckets)} rows. Step times in seconds, predicted by the cost model (mean | worst "
             "batch; change against the free plan); padding = bucket padding rows / rows held.", "",
             "| workload | pp | free mean | free worst | CUDA-graph mean | CUDA-graph worst | CUDA-graph padding | "
             "pad-to-cap mean | pad-to-cap worst | pad-to-cap padding | megatron free mean | megatron to cap mean | "
             "megatron to cap padding |",
             "|---|---|" + "---:|" * 11]
    for name in workloads(args.gbs, args.seed):
        for pp in args.pp:
            gen = workloads(args.gbs, args.seed)[name]
            t = {k: [] for k in ("free", "graph", "cap", "meg", "meg_cap")}
            pad = {k: [] for k in ("graph", "cap", "meg_cap")}
            for _ in range(args.batches):
                lengths = next(gen)
                common = dict(cluster=cluster, cost=cost, pp=pp, tight_bound=False)
                for key, shapes in (("free", None), ("graph", graph), ("cap", to_cap)):
                    p = dynacp.plan(lengths, static_shapes=shapes, **common)
                    t[key].append(p.predicted.step_time)
                    if shapes is not None:
                        pad[key].append(p.predicted.padding_fraction)
                meg = dynacp.plan(lengths, strategy="megatron", **common)
                t["meg"].append(meg.predicted.step_time)
                priced = dynacp.predict(meg, lengths, cluster, cost, pp=pp, tight_bound=False,
                                        static_shapes=megatron_cap)
                t["meg_cap"].append(priced.step_time)
                pad["meg_cap"].append(priced.padding_fraction)
            lines.append(f"| {name} | {pp} | {_cell(t['free'])} | {_cell(t['graph'], t['free'])} | "
                         f"{np.mean(pad['graph']):.1%} | {_cell(t['cap'], t['free'])} | {np.mean(pad['cap']):.1%} | "
                         f"{np.mean(t['meg']):.3f} | {np.mean(t['meg_cap']):.3f} | {np.mean(pad['meg_cap']):.1%} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=20, help="global batches per workload")
    ap.add_argument("--ranks", type=int, default=64, help="DP x CP pool size (ranks)")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--tokens-per-rank", type=int, default=16384, help="token capacity of a rank (tokens)")
    ap.add_argument("--gbs", type=int, default=512, help="sequences per global batch")
    ap.add_argument("--pp", type=int, nargs="+", default=[1], help="pipeline stages (one row per value)")
    ap.add_argument("--buckets", type=int, default=4, help="token buckets of CUDA-graph mode")
    ap.add_argument("--cp-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64],
                    help="allowed CP sizes (ranks); {1, 2, 4, 8} cannot hold the long sequences of github, longcontext "
                         "and fcp-extreme at 16,384 tokens per rank")
    ap.add_argument("--slots", type=int, default=8, help="microbatch slots per rank per step")
    ap.add_argument("--max-sequences", type=int, default=64, help="sequences per microbatch (0 = unbounded)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("\n".join(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
