"""The ``dynacp`` command line: ``dynacp compare``, ``dynacp plan``, ``dynacp report``, ``dynacp configs``,
``dynacp calibrate``.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` (which registers the parser and sets
``func``); this file only collects them and adds what every command shares: ``--version`` and the logging flags
``-v``/``-q`` (accepted before or after the command name). Options that several commands take are defined once in
:mod:`dynacp.commands.options`.

Exit status: 0 success; 1 the command ran but a requested strategy failed (``compare``, ``report``); 2 bad input
(the message names it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import List, Optional

from dynacp import log
from dynacp.commands import options

# name -> module implementing add_parser(subparsers)
SUBCOMMANDS = {
    "compare": "dynacp.commands.compare",
    "plan": "dynacp.commands.plan",
    "report": "dynacp.commands.report",
    "configs": "dynacp.planner.cli",
    "calibrate": "dynacp.commands.calibrate",
}


def version_text() -> str:
    """``dynacp X.Y.Z (python A.B.C, numpy N)``: what ``--version`` prints and the JSON outputs record."""
    import numpy as np

    import dynacp

    return f"dynacp {dynacp.__version__} (python {sys.version.split()[0]}, numpy {np.__version__})"


#: The ``-v``/``-q`` flags (defined with the other shared options in :mod:`dynacp.commands.options`).
verbosity_parent = options.logging_parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynacp", description="Plan variable-length LLM training batches over DP x CP rank pools.",
        parents=[verbosity_parent(suppress=False)],
        epilog="Exit status: 0 success; 1 a requested strategy failed (its row says why); 2 bad input.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    parent = verbosity_parent(suppress=True)
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).add_parser(sub, parents=[parent])
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    verbosity = -1 if args.quiet else args.verbose
    log.configure(verbosity)
    logging.getLogger(log.LOGGER_NAME).debug("%s; command line: %s", version_text(), argv if argv else sys.argv[1:])
    try:
        options.check_units(args)  # a byte count in a token flag: a message naming the byte option, not usage
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"dynacp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
