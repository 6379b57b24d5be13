"""``dynacp configs``: rank the parallel layouts of a model on a cluster."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import List, Optional

from dynacp.planner.configs import configs
from dynacp.planner.model import ETP_CHOICES
from dynacp.planner.presets import preset_names


def add_parser(sub: argparse._SubParsersAction, parents: Optional[list] = None) -> None:
    """Register the ``configs`` subcommand (options shared with the other commands, Megatron-LM's long names
    accepted as aliases, come from :mod:`dynacp.commands.options`)."""
    from dynacp.commands import options

    p = options.command(
        sub, "configs", parents, "enumerate and rank TP/PP/CP/EP/DP layouts of a model on a cluster",
        "Enumerates every (TP, PP, CP, EP, ETP, DP, VPP) with TP*PP*CP*DP = W, prices per-GPU memory and step time, "
        "ranks the feasible layouts and gives a one-line reason for each rejected one. With --lengths, each feasible "
        "layout is also planned by the per-batch scheduler (static packing vs dynamic CP).")
    options.add(p, "--model", required=True, help=f"model JSON file or preset ({', '.join(preset_names('model'))})")
    options.add(p, "--cluster", required=True,
                help=f"cluster JSON file or preset ({', '.join(preset_names('cluster'))})")
    g = p.add_argument_group("batch")
    options.add(g, "--gbs", default=256, help="sequences (or packs) per optimizer step (default 256)")
    options.add(g, "--mbs", default=1, help="sequences per micro-batch (default 1)")
    options.add(g, "--seq-length", help="tokens per sequence or pack (default 4096; with --lengths the longest length "
                "it can give, rounded up to a multiple of 1024: a file's longest entry, an embedded distribution's "
                "context window; a value shorter than that is an error, nothing is clipped)")
    options.add(g, "--lengths", metavar="FILE|DIST",
                help="length distribution: a file (one integer per line, or .npy) or an embedded distribution")
    o = p.add_argument_group("training options")
    options.add_training(o)
    o.add_argument("--etp", choices=ETP_CHOICES, default="any", help="expert TP: 1, =TP, or any (default)")
    o.add_argument("--ep-divides-dp", action="store_true", help="require EP | DP (no MoE parallel folding)")
    options.add(o, "--cp", metavar="LIST", help="allowed CP degrees, comma-separated (default: all)")
    options.add(o, "--tp", metavar="LIST", help="show only layouts with these TP degrees, comma-separated (default: all)")
    options.add(o, "--pp", metavar="LIST", help="show only layouts with these PP degrees, comma-separated (default: all)")
    o.add_argument("--max-vpp", type=int, default=1, help="largest interleaving (virtual pipeline) degree (default 1)")
    options.add(o, "--batches", default=4, help="global batches sampled with --lengths (count, default 4)")
    options.add(o, "--seed", default=0, help="sampling seed (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--top", type=int, default=10, help="feasible layouts to print (default 10)")
    out.add_argument("--rejected", action="store_true", help="list every rejected layout with its reason")
    options.add(out, "--json", help="print the whole table as JSON (bytes and seconds)")
    p.set_defaults(func=run)


def _cp_list(text: str, flag: str = "--cp") -> tuple:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from e
    if not vals:
        raise ValueError(f"{flag} is empty")
    return vals


def _only(table, args: argparse.Namespace):
    """The table restricted to the --tp / --pp degrees asked for (rows and rejections alike)."""
    dims = {k: _cp_list(getattr(args, k), f"--{k}") for k in ("tp", "pp") if getattr(args, k)}
    if not dims:
        return table

    def keep(row) -> bool:
        return all(getattr(row.layout, k) in v for k, v in dims.items())

    return dataclasses.replace(table, rows=[r for r in table.rows if keep(r)],
                               rejected=[r for r in table.rejected if keep(r)])


def run(args: argparse.Namespace) -> int:
    """Run ``dynacp configs``; returns the exit status (ValueError is reported by the caller)."""
    from dynacp.commands import options as cli_options

    if args.top < 0:
        raise ValueError(f"--top must be >= 0, got {args.top}")
    options = {
        **cli_options.training_options(args), "etp": args.etp, "ep_divides_dp": args.ep_divides_dp,
        "cp_sizes": _cp_list(args.cp) if args.cp else None, "max_vpp": args.max_vpp, "sample_batches": args.batches,
        "seed": args.seed,
    }
    batch = {"global_batch": args.gbs, "micro_batch": args.mbs}
    if args.seq_length is not None:
        batch["seq_length"] = args.seq_length
    table = configs(args.model, args.cluster, batch, options, lengths=args.lengths,
                    progress=not args.json and not getattr(args, "quiet", False) and sys.stderr.isatty())
    table = _only(table, args)
    if args.json:
        print(table.to_json())
    else:
        print(table.format(top=args.top, show_rejected=args.rejected))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Standalone entry (``python -m dynacp.planner.cli ...``), same as ``dynacp configs ...``."""
    from dynacp.cli import main as dynacp_main

    return dynacp_main(["configs", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
