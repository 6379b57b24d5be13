"""``dynacp report --out report.html``: run a comparison and write it as one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from dynacp.commands import compare, options


def add_parser(sub: argparse._SubParsersAction, parents: Optional[list] = None) -> None:
    p = options.command(
        sub, "report", parents, "compare strategies and write one self-contained HTML page",
        "Runs what `dynacp compare` runs (same flags) and writes one HTML file that opens offline: the comparison "
        "table, a Gantt chart per strategy of the first batch, a histogram of the sequence lengths and the run's "
        "metadata.", epilog=compare.columns_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add(p, "--out", metavar="FILE.html", required=True, help="the HTML file to write")
    p.add_argument("--title", default="dynacp report", help="page title (default %(default)r)")
    compare.add_comparison_options(p, peers=False)
    p.set_defaults(func=run, plot=None, hist=None, per_panel_time=False)


def run(args: argparse.Namespace) -> int:
    from dynacp.report import render

    cmp = compare.run_comparison(args)
    page = render(cmp, title=args.title)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    if not args.quiet:
        print(f"wrote {args.out} ({len(page.encode()) / 1e6:.2f} MB, {len(cmp.first_plans)} Gantt charts)",
              file=sys.stderr)
    return compare.report_failures(cmp, "report")
