"""``dynacp calibrate``: measure this machine and fit the cost model to it (docs/calibration.md).

* ``dynacp calibrate profile --out profile.json``: micro-benchmarks through torch (:mod:`dynacp.calibrate.profiler`);
* ``dynacp calibrate fit profile.json --out preset.json``: the whole cost model from a profile, with a fit report;
  ``--distca DIR`` fits the distca H100 CSV files instead. The preset is read by every ``--cost FILE`` and by
  ``dynacp.CostModel.load``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from dynacp.commands import options


def add_parser(sub: argparse._SubParsersAction, parents: Optional[list] = None) -> None:
    p = options.command(sub, "calibrate", parents, "profile this machine and fit the cost model to it",
                        "Measure this machine (`dynacp calibrate profile`) and fit the cost model to the measurements "
                        "(`dynacp calibrate fit`); docs/calibration.md.")
    cal = p.add_subparsers(dest="calibrate_command", metavar="STEP")
    cal.required = True
    pr = options.command(cal, "profile", parents, "micro-benchmarks -> a profile file",
                         "Times the runtime's ring attention (THD packs, causal and full, forward + backward), the "
                         "model's linear work and the ring P2P exchange on WORLD processes (gloo on CPU, NCCL on GPUs) "
                         "and writes a versioned profile file (docs/calibration.md).")
    options.add(pr, "--out", required=True, help="profile file to write (JSON)")
    options.add(pr, "--model", default="tiny", help="'tiny' (default; small enough for a CPU), a planner model preset "
                "name or a model JSON file (layers, hidden, heads, KV heads, head dim, FFN width)")
    pr.add_argument("--world-size", type=int, default=2, help="processes (ranks) to spawn (default 2)")
    options.add(pr, "--ranks-per-node", default=None, help="ranks per node (default: all on one node)")
    pr.add_argument("--max-tokens", type=options.token_count, default=None,
                    help="longest pack in tokens (default 1024 on CPU, 32768 on CUDA)")
    pr.add_argument("--repeats", type=int, default=5, help="timed runs per point (default 5)")
    pr.add_argument("--warmup", type=int, default=1, help="untimed runs per point (default 1)")
    pr.add_argument("--passes", type=int, default=5, help="passes over all the points that share each point's timed "
                    "runs, so that a burst of load from other processes hits only some of them (default 5; 1: "
                    "every point's runs back to back)")
    pr.set_defaults(func=run_profile)
    ft = options.command(cal, "fit", parents, "fit the cost model to a profile -> a cost preset",
                         "Fits a, b, c, the causal factor, kv_bytes_per_token and the links by least squares on "
                         "relative error of whole-group times, prints the fit report (rms / max relative error per "
                         "term and length band; POOR marks a poor fit, also logged as a warning) and writes a cost "
                         "preset for --cost FILE.")
    src = ft.add_mutually_exclusive_group(required=True)
    src.add_argument("profile", nargs="?", help="profile file written by `dynacp calibrate profile`")
    src.add_argument("--distca", metavar="DIR", help="fit the distca H100 CSV files in DIR instead")
    options.add(ft, "--out", required=True, help="cost preset file to write (JSON)")
    ft.add_argument("--name", default="calibrated", help="the preset's name (default %(default)s)")
    options.add(ft, "--tp", aliases=False, type=int, default=1,
                help="with --distca: tensor-parallel degree of the attention rows")
    ft.add_argument("--layers", type=int, default=32, help="with --distca: layers of the step (default 32)")
    ft.add_argument("--form", choices=("auto", "classic", "extended"), default="auto",
                    help="model form to fit: 'extended' adds the per-document terms and the node overhead "
                    "(docs/cost_model.md); 'auto' (default) picks extended when the profile has enough points for it "
                    "and says which it chose in the report")
    options.add(ft, "--json", help="print the report as JSON instead of text")
    ft.set_defaults(func=run_fit)


def run_profile(args: argparse.Namespace) -> int:
    from dynacp import calibrate

    prof = calibrate.profile(model=args.model, world_size=args.world_size, ranks_per_node=args.ranks_per_node,
                             max_tokens=args.max_tokens, repeats=args.repeats, warmup=args.warmup,
                             passes=args.passes,
                             progress=not getattr(args, "quiet", False) and sys.stderr.isatty())
    calibrate.save_profile(prof, args.out)
    n = sum(len(rows) for rows in prof.tables.values())
    print(f"dynacp calibrate profile: {n} points in {prof.meta['seconds']} s on {prof.meta['device']} "
          f"({prof.meta['backend']}, {prof.meta['world_size']} ranks) -> {args.out}")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from dynacp import calibrate

    if args.distca:
        prof = calibrate.import_distca(args.distca, tp=args.tp, layers=args.layers)
    else:
        prof = calibrate.load_profile(args.profile)
    result = calibrate.fit(prof, name=args.name, form=args.form)
    calibrate.save_preset(args.out, result.cost, result.links, result.report_dict(), prof.meta)
    if args.json:
        json.dump(result.report_dict(), sys.stdout, indent=1)
        print()
    else:
        print(result.format())
        print(f"-> {args.out} (use it with --cost {args.out} or dynacp.CostModel.load)")
    return 0
