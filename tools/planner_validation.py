#!/usr/bin/env python3
"""The planner's validation table: published H100 training runs with the planner's verdict, rank and predicted
throughput (docs/planner.md, "Validation against published runs").

    PYTHONPATH=python python3 tools/planner_validation.py [--sources]   # with the built extension, or
    DYNACP_EXT_DIR=<build>/python PYTHONPATH=python python3 tools/planner_validation.py

Prints the Markdown table and a summary per round of rows: how many meet all three acceptance properties
(published layout feasible, ranked in the top 5 distinct layouts, predicted tokens/s/GPU within the round's
tolerance of the published figure: +-25 % for the issue-22 rows the planner was tuned on, +-35 % for the issue-37
rows held out from it). ``--sources`` adds the source and, where the throughput was converted, the conversion of every row.
The planner is pure Python, but importing dynacp loads its C++ extension (see docs/development.md); no GPU.
About 15 s on one core.
"""

from __future__ import annotations

import argparse
import sys

from dynacp.planner.validation import TOLERANCE, markdown, validate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sources", action="store_true", help="list each row's source and unit conversion")
    args = ap.parse_args()
    verdicts = validate()
    print(markdown(verdicts))
    print()
    for added, tol in TOLERANCE.items():
        rows = [v for v in verdicts if v.run.added == added]
        passing = [v for v in rows if v.passes]
        print(f"{added}: {len(passing)} of {len(rows)} rows feasible, in the top 5 and within +-{tol:.0%}: "
              + ", ".join(v.run.key for v in passing))
    failing = [v for v in verdicts if not v.passes]
    if failing:
        print("not met: " + "; ".join(f"{v.run.key} ({v.shortfall})" for v in failing))
    if args.sources:
        print()
        for v in verdicts:
            print(f"- {v.run.key}: {v.run.source}" + (f"; {v.run.derived}" if v.run.derived else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
