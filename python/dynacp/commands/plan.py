"""``dynacp plan``: plan one global batch and write it as JSON."""

from __future__ import annotations

import argparse
import json
import sys

from dynacp import _core
from dynacp.api import plan as make_plan
from dynacp.commands import common


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="plan one global batch and write the plan as JSON",
        description="Plans the first global batch (all of --lengths FILE when --gbs is 0) and writes the plan.",
    )
    common.add_batch_args(p)
    p.set_defaults(gbs=0)
    p.add_argument("--strategy", default="fcp", help=f"one of {', '.join(_core.strategy_names())}")
    p.add_argument("--out", metavar="FILE", help="write the plan JSON here (default: stdout)")
    common.add_cluster_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster, cost = common.cluster_and_cost(args)
    if args.gbs == 0:
        if not args.lengths:
            args.gbs = 512
        else:
            from dynacp.distributions import read_lengths

            lengths = read_lengths(args.lengths)
    if args.gbs:
        lengths = next(common.batches(args, 1))
    p = make_plan(lengths, cluster, cost, args.strategy, pp=args.pp, vpp=args.vpp, count_policy=args.count_policy)
    text = json.dumps(p.to_dict(), indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        pr = p.predicted
        print(
            f"wrote {args.out}: {len(lengths)} sequences, {len(p.microbatches)} microbatches, "
            f"predicted step {pr.step_time * 1e3:.1f} ms (lower bound {pr.lower_bound * 1e3:.1f} ms), "
            f"solved in {p.solve_ms:.2f} ms",
            file=sys.stderr,
        )
    else:
        print(text)
    return 0
