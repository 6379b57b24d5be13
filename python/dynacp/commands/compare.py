"""``dynacp compare``: plan K global batches with several strategies and compare predicted step times."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from dynacp import _core
from dynacp.api import plan as make_plan
from dynacp.commands import common, options

#: Strategies planned in Python rather than the C++ registry: the names of
#: dynacp.integration.megatron_core.PEER_STRATEGIES, written here so that `dynacp compare` imports that module (and
#: torch with it) only when a peer is asked for; named explicitly with --strategies.
PEERS = ["megatron-core"]

# (table header, JSON key, what it means -- with its unit); the --help epilog, the JSON "columns" and the HTML
# report are all generated from this one list.
COLUMNS = [
    ("step ms", "step_time_ms", "predicted time of one training step (one global batch) in milliseconds, mean over "
     "the batches; with --model/--layout/--cluster the layout's: scheduler step x pipeline stretch + DP time"),
    ("speedup", "speedup_vs_packing", "packing's step time / this strategy's (x), mean of the per-batch ratios "
     "(the speed-up `dynacp configs --lengths` reports for dynamic vs static); n/a when packing was not run or failed"),
    ("gap to LB", "gap_to_lower_bound", "step time / lower bound - 1 (%), mean of the per-batch ratios; no plan "
     "can have a negative gap"),
    ("max/mean", "max_over_mean_rank_time", "busiest rank's busy time / the mean rank's (x; 1 = perfect balance), "
     "mean over the batches"),
    ("peak tok/rank", "peak_tokens_per_rank", "most tokens one rank holds in one microbatch (its share of a CP group), "
     "max over the batches; never above --tokens-per-rank"),
    ("mb", "microbatches_mean", "microbatch slots of the plan (count; each rank runs its groups slot by slot), mean "
     "over the batches"),
    ("solve ms", "median_solve_ms", "wall-clock milliseconds the strategy took to plan one batch, measured on this "
     "machine, median over the batches"),
]
KEYS = [key for _, key, _ in COLUMNS]


def columns_help() -> str:
    lines = ["table columns (the --json keys in brackets; times are predicted by the cost model unless said):"]
    lines += [f"  {hdr:<14} [{key}] {text}" for hdr, key, text in COLUMNS]
    lines += ["", "exit status: 0 every strategy planned every batch; 1 a strategy failed (its row and its JSON "
              "'error' say why); 2 bad input (e.g. every strategy rejected the batch)"]
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction, parents: Optional[list] = None) -> None:
    p = options.command(
        sub, "compare", parents, "compare strategies on sampled global batches",
        "Plans K global batches with each strategy and prints predicted step time, speed-up over `packing`, gap to "
        "the lower bound, rank imbalance, peak tokens per rank and solve time.",
        epilog=columns_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_comparison_options(p, peers=True)
    add_output_args(p)
    options.add(p, "--json", help="print one JSON object: metadata, columns, strategies")
    p.set_defaults(func=run)


def add_comparison_options(p: argparse.ArgumentParser, peers: bool) -> None:
    """What :func:`run_comparison` reads, for ``compare`` and ``report``: the batches, the strategies (``peers``: the
    help names the Python-side peers), the cluster and cost model."""
    options.add_lengths(p)
    options.add(p, "--batches")
    options.add_strategy(p, many=True, peers=peers)
    options.add_cluster(p)
    options.add_layout(p)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """The plots ``compare`` can draw (``report`` draws its own)."""
    g = p.add_argument_group("plots")
    g.add_argument("--plot", metavar="FILE.png", help="Gantt chart of the first batch, one panel per strategy")
    g.add_argument("--hist", metavar="FILE.png", help="histogram of the sequence lengths of all the batches")
    g.add_argument("--per-panel-time", action="store_true",
                   help="each Gantt panel gets its own time axis (default: one shared axis, comparable bars)")


@dataclass
class Comparison:
    """A finished comparison: the JSON-able ``result`` and what plots and the report need."""

    result: Dict[str, Any]
    batches: common.Batches
    cluster: _core.Cluster
    cost: _core.CostModel
    first_plans: Dict[str, _core.Plan] = field(default_factory=dict)

    @property
    def failed(self) -> List[str]:
        return [n for n, r in self.result["strategies"].items() if r["error"] is not None]


def _finite(x: float) -> Optional[float]:
    """``x`` as a float, or None when it is NaN or infinite (JSON has no NaN)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _plan_all(args: argparse.Namespace, names: List[str], batches: common.Batches, price: common.Pricing) -> tuple:
    """Plans every batch with every strategy: (per-strategy lists of per-batch metrics, batch 0's plans, errors).
    A strategy that fails on a batch is not run on the later ones. Step times and bounds are ``price.step`` of the
    scheduler's (the layout's with a derived cost model); a pool most of which the fastest plan leaves idle is warned
    about (common.warn_idle)."""
    cluster, cost = price.cluster, price.cost
    pp, vpp = (price.layout.pp, price.layout.vpp) if price.layout is not None else (args.pp, args.vpp)
    rows: Dict[str, Dict[str, List[float]]] = {n: {} for n in names}
    first_plans: Dict[str, _core.Plan] = {}
    errors: Dict[str, str] = {}
    invalid: List[ValueError] = []
    todo = [(b, n) for b in range(len(batches.batches)) for n in names]
    for b, name in common.progress(todo, args, desc="planning", unit="plan"):
        if name in errors:
            continue
        try:
            planner, extra = make_plan, common.solver_kwargs(args)
            if name in PEERS:  # Python-side peers: the released Megatron-Core scheduler
                from dynacp.integration.megatron_core import PEER_STRATEGIES

                planner, extra = PEER_STRATEGIES[name], {}
            p = planner(batches.batches[b].lengths, cluster, cost, name, pp=pp, vpp=vpp,
                        count_policy=args.count_policy, **extra)
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
        step, lb = price.step(pr.step_time), price.step(pr.lower_bound)
        gap = pr.gap if price.layout is None else step / lb - 1
        for key, val in [("step", step), ("lb", lb), ("gap", gap),
                         ("balance", per_rank.max() / per_rank.mean() if per_rank.mean() > 0 else 1.0),
                         ("peak", float(pr.peak_tokens_per_rank)), ("solve", p.solve_ms),
                         ("mb", float(len(p.microbatches)))]:
            r.setdefault(key, []).append(val)
        r.setdefault("families", []).append(p.family)
        r.setdefault("idle", []).append((pr.step_time, common.idle_ranks(per_rank)))
    if invalid and len(errors) == len(names):
        raise invalid[0]  # every strategy rejected the input: report it as the input error it is
    common.warn_idle({n: rows[n].pop("idle") for n in names if "idle" in rows[n]}, cluster.num_ranks)
    return rows, first_plans, errors


def run_comparison(args: argparse.Namespace) -> Comparison:
    """Plans every batch with every strategy; ``result`` has times in milliseconds (keys say so), null for a
    number that does not exist (e.g. the speed-up over a packing that failed)."""
    # Python-side peers (`megatron-core`, the released Megatron-Core scheduler) run only when named
    names = common.split_names(args.strategies, _core.strategy_names() + (PEERS if args.strategies else []))
    batches = common.load(args, args.batches, args.gbs if args.gbs is not None else 512)
    price = common.pricing(args, batches)
    cluster, cost = price.cluster, price.cost
    common.check_pool(cluster, int(batches.batches[0].lengths.size))
    rows, first_plans, errors = _plan_all(args, names, batches, price)
    base = np.asarray(rows["packing"]["step"]) if "packing" in rows and "packing" not in errors else None
    out: Dict[str, Dict[str, Any]] = {}
    for name in names:
        if name in errors:
            out[name] = {"error": errors[name], **{k: None for k in KEYS}, "lower_bound_ms": None,
                         "batches_won_by_family": {}}
            continue
        families = [f for f in rows[name].pop("families") if f]
        r = {k: np.asarray(v) for k, v in rows[name].items()}
        out[name] = {
            "error": None,
            "step_time_ms": _finite(r["step"].mean() * 1e3),
            "speedup_vs_packing": _finite((base / r["step"]).mean()) if base is not None else None,
            "gap_to_lower_bound": _finite(r["gap"].mean()),
            "max_over_mean_rank_time": _finite(r["balance"].mean()),
            "peak_tokens_per_rank": int(r["peak"].max()),
            "microbatches_mean": _finite(r["mb"].mean()),
            "median_solve_ms": _finite(np.median(r["solve"])),
            "lower_bound_ms": _finite(r["lb"].mean() * 1e3),
            "batches_won_by_family": {f: families.count(f) for f in sorted(set(families))},
        }
    lbs = [r["lower_bound_ms"] for r in out.values() if r.get("lower_bound_ms") is not None]
    result = {
        "metadata": common.run_metadata(args, batches, price),
        "columns": {key: text for _, key, text in COLUMNS} | {
            "lower_bound_ms": "no plan of the batch can be faster (milliseconds, predicted), mean over the batches",
            "error": "null, or why the strategy failed (then every number is null)",
            "batches_won_by_family": "dynacp only: how many batches each candidate family won "
                                     "(dynacp.dynacp_families())"},
        "lower_bound_ms": lbs[0] if lbs else None,
        "strategies": out,
    }
    if args.plot:
        from dynacp.plots import gantt, settings_title

        gantt(first_plans, batches.batches[0].lengths, cluster, cost, args.plot, pp=result["metadata"]["pp"],
              vpp=result["metadata"]["vpp"],
              title=settings_title(result["metadata"], batch=0), shared_time=not args.per_panel_time)
    if args.hist:
        from dynacp.plots import histogram

        histogram(np.concatenate([b.lengths for b in batches.batches]), args.hist,
                  title=f"{len(batches.batches)} batches from {batches.describe()}")
    return Comparison(result, batches, cluster, cost, first_plans)


def format_table(result: Dict[str, Any], describe: str) -> str:
    """The text table ``dynacp compare`` prints."""
    m = result["metadata"]
    cl = m["cluster"]
    lines = [
        f"dynacp compare: {m['batches']} batches x {m['sequences_per_batch']} sequences from {describe}; "
        f"P={cl['ranks']} ({cl['ranks_per_node']}/node), {cl['tokens_per_rank']} tokens/rank, pp={m['pp']}, "
        f"vpp={m['vpp']}; {m['cost']['label']}",
    ]
    w = max([10] + [len(n) for n in result["strategies"]])  # 10 unless a longer name (megatron-core) is shown
    hdr = (f"{'strategy':<{w}} {'step ms':>10} {'speedup':>8} {'gap to LB':>9} {'max/mean':>9} "
           f"{'peak tok/rank':>13} {'mb':>5} {'solve ms':>9}")
    lines += [hdr, "-" * len(hdr)]
    for name, r in result["strategies"].items():
        if r["error"] is not None:
            lines.append(f"{name:<{w}} failed: {r['error'][:150]}")
            continue
        sp = f"{r['speedup_vs_packing']:>7.3f}x" if r["speedup_vs_packing"] is not None else f"{'n/a':>8}"
        lines.append(
            f"{name:<{w}} {r['step_time_ms']:>10.1f} {sp} {r['gap_to_lower_bound']:>8.1%} "
            f"{r['max_over_mean_rank_time']:>9.3f} {r['peak_tokens_per_rank']:>13d} {r['microbatches_mean']:>5.1f} "
            f"{r['median_solve_ms']:>9.3f}")
    lb = result["lower_bound_ms"]
    lines.append(f"lower bound (mean over batches): {'n/a' if lb is None else f'{lb:.1f} ms'}; speed-up and gap are "
                 f"means of per-batch ratios; predicted: {m['predicted']}; measured: {m['measured']} (dynacp compare "
                 "-h explains every column)")
    packing = result["strategies"].get("packing")
    if packing is None or packing["error"] is not None:
        lines.append(f"speedup n/a: it is relative to packing, which {'was not run' if packing is None else 'failed'}")
    return "\n".join(lines)


def report_failures(cmp: Comparison, command: str) -> int:
    """Exit status 1 (and one line on stderr naming them) when a requested strategy failed, else 0."""
    if not cmp.failed:
        return 0
    print(f"dynacp {command}: {len(cmp.failed)} of {len(cmp.result['strategies'])} strategies failed: "
          f"{', '.join(cmp.failed)} (exit status 1)", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    cmp = run_comparison(args)
    if args.json:
        json.dump(cmp.result, sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(format_table(cmp.result, cmp.batches.describe()))
    return report_failures(cmp, "compare")
