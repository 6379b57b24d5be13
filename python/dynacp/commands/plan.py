"""``dynacp plan``: plan one global batch and write it as JSON (the plan format plus where its lengths came from)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, Optional

from dynacp.api import plan as make_plan
from dynacp.commands import common, options


def add_parser(sub: argparse._SubParsersAction, parents: Optional[list] = None) -> None:
    p = options.command(
        sub, "plan", parents, "plan one global batch and write the plan as JSON",
        "Plans one global batch and writes the plan (docs/plan_format.md) with a 'source' object: the lengths file, "
        "offset and seed, and for every sequence id i the 0-based file entry it came from (source.entries[i]).")
    options.add_lengths(p, gbs_help="sequences in the batch (default: every entry of --lengths FILE from --offset on; "
                        "512 with --dist)")
    options.add_strategy(p, many=False)
    options.add(p, "--out", help="write the plan JSON here (default: stdout)")
    options.add_cluster(p)
    options.add_layout(p)
    p.set_defaults(func=run)


def plan_document(args: argparse.Namespace) -> Dict[str, Any]:
    """The JSON ``dynacp plan`` writes: ``Plan.to_dict()`` plus ``source`` (``Plan.from_dict`` ignores it)."""
    gbs = args.gbs
    if gbs is None:
        if args.lengths:
            from dynacp.distributions import read_lengths

            gbs = read_lengths(args.lengths).size - args.offset
            if gbs <= 0:
                raise ValueError(f"--offset {args.offset} leaves no lengths of {args.lengths}")
        else:
            gbs = 512
    batches = common.load(args, 1, gbs)
    batch = batches.batches[0]
    price = common.pricing(args, batches)
    cluster, cost = price.cluster, price.cost
    pp, vpp = (price.layout.pp, price.layout.vpp) if price.layout is not None else (args.pp, args.vpp)
    common.check_pool(cluster, int(batch.lengths.size))
    p = make_plan(batch.lengths, cluster, cost, args.strategy, pp=pp, vpp=vpp,
                  count_policy=args.count_policy, **common.solver_kwargs(args))
    common.warn_idle({args.strategy: [(p.predicted.step_time, common.idle_ranks(p.predicted.per_rank_time))]},
                     cluster.num_ranks)
    doc = p.to_dict()
    source = dict(batches.source)
    if batch.entries is not None:
        source["entries"] = batch.entries.tolist()
    doc["source"] = {**source, "sequences": int(batch.lengths.size),
                     "note": "sequence id i is entry source.entries[i] (0-based) of the file"
                     if batch.entries is not None else "sequence ids are positions in the sampled batch"}
    doc["settings"] = {"ranks": cluster.num_ranks, "ranks_per_node": cluster.ranks_per_node,
                       "tokens_per_rank": int(cost.token_capacity(cluster)),
                       "cost_preset": args.cost if price.layout is None else price.layout.label, "pp": pp,
                       "vpp": vpp, "count_policy": args.count_policy, "cost": price.describe(),
                       "predicted": common.PREDICTED, "measured": common.MEASURED}
    if price.layout is not None:  # the layout's step: scheduler step x pipeline stretch + DP time
        doc["settings"]["layout_step_time"] = price.step(p.predicted.step_time)
        doc["settings"]["layout_lower_bound"] = price.step(p.predicted.lower_bound)
    return doc


def run(args: argparse.Namespace) -> int:
    doc = plan_document(args)
    text = json.dumps(doc, indent=1, allow_nan=False)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        pr = doc["predicted"]
        if not getattr(args, "quiet", False):
            print(doc["settings"]["cost"]["label"], file=sys.stderr)
            st = doc["settings"]
            step, lb = st.get("layout_step_time", pr["step_time"]), st.get("layout_lower_bound", pr["lower_bound"])
            print(f"wrote {args.out}: {doc['source']['sequences']} sequences, {len(doc['microbatches'])} microbatch "
                  f"slots, predicted step {step * 1e3:.1f} ms (lower bound {lb * 1e3:.1f} ms), solved in "
                  f"{doc['solve_ms']:.2f} ms (measured)", file=sys.stderr)
    else:
        print(text)
    return 0
