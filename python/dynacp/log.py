"""Logging: everything dynacp reports goes to the ``dynacp`` logger of Python's standard :mod:`logging`.

* ``dynacp`` -- the Python package (CLI, planner glue, plots, report).
* ``dynacp.core`` -- the C++ core. It logs through spdlog into one sink that forwards each record to this logger
  (``bindings/log.cpp``), so Python's levels and handlers are the only ones that apply. Solve statistics are at
  DEBUG; suspicious input (a sequence near the pool's capacity, a poor calibration fit) at WARNING.

As a library dynacp prints nothing on its own: the ``dynacp`` logger has a :class:`logging.NullHandler`, so records
reach only the handlers an application configures (e.g. ``logging.basicConfig(level=logging.DEBUG)``). The CLI calls
:func:`configure`: warnings by default, ``-v`` info, ``-vv`` debug, ``-q`` errors only, all on stderr.
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, TextIO

LOGGER_NAME = "dynacp"
logger = logging.getLogger(LOGGER_NAME)
logger.addHandler(logging.NullHandler())

_CLI_HANDLER_FLAG = "_dynacp_cli_handler"


def level_for(verbosity: int) -> int:
    """The logging level of a CLI verbosity: -1 (``-q``) ERROR, 0 WARNING, 1 (``-v``) INFO, >= 2 (``-vv``) DEBUG."""
    if verbosity < 0:
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


def configure(verbosity: int = 0, stream: Optional[TextIO] = None) -> logging.Handler:
    """Sets the ``dynacp`` logger's level from ``verbosity`` (see :func:`level_for`) and gives it one stderr handler
    (``dynacp: LEVEL: message``). Idempotent: a second call replaces the handler a first call installed, so records
    are never printed twice. Returns the handler."""
    for h in list(logger.handlers):
        if getattr(h, _CLI_HANDLER_FLAG, False):
            logger.removeHandler(h)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _CLI_HANDLER_FLAG, True)
    handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level_for(verbosity))
    return handler
