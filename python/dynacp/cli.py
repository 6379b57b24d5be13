"""The ``dynacp`` command line: ``dynacp compare``, ``dynacp plan``, ``dynacp configs``.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which registers the parser and sets
``func``); this file only collects them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# name -> module implementing add_parser(subparsers)
SUBCOMMANDS = {
    "compare": "dynacp.commands.compare",
    "plan": "dynacp.commands.plan",
    "configs": "dynacp.planner.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynacp", description="Plan variable-length LLM training batches over DP x CP rank pools."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"dynacp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
