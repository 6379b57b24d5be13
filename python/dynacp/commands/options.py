"""The command-line options more than one ``dynacp`` command takes, each spelled, typed and explained here once.

One vocabulary for every command: short names first, the long names Megatron-LM users know accepted as aliases
(``--gbs`` = ``--global-batch-size``, ``--pp`` = ``--pipeline-model-parallel-size``, ...; :data:`ALIASES`).

Groups, and the commands that take them:

* logging, ``-v``/``--verbose`` and ``-q``/``--quiet`` (:func:`logging_parent`): every command;
* cluster and cost model, ``--ranks --ranks-per-node --tokens-per-rank --cost --pp --vpp --count-policy``, and the
  dynacp solver, ``--threads --time-limit`` (:func:`add_cluster`): compare, plan, report;
* lengths, ``--dist --lengths --gbs --offset --shuffle --wrap --seed`` (:func:`add_lengths`): compare, plan, report;
* strategy, ``--strategy`` or ``--strategies`` (:func:`add_strategy`): plan; compare, report;
* single options of :data:`OPTIONS` through :func:`add`, e.g. output ``--out`` (plan, report, calibrate) and
  ``--json`` (compare, configs, calibrate fit), ``--batches`` (compare, report, configs), ``--seed``, ``--gbs``,
  ``--mbs``, ``--lengths``, ``--tp``, ``--pp``, ``--cp`` (configs), ``--model`` (configs, calibrate profile),
  ``--ranks-per-node`` (calibrate profile);
* :func:`command` registers a subcommand with the shared parents.

A single option keeps its spelling, aliases, type and metavar from :data:`OPTIONS`; where its meaning differs
between commands (``--out`` names a plan, an HTML page, a profile or a preset), the command passes its own help text
and default to :func:`add`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

from dynacp import _core, distributions

# canonical flag -> aliases (Megatron-LM's long names, and the names older dynacp versions used)
ALIASES: Dict[str, List[str]] = {
    "--gbs": ["--global-batch-size", "--global-batch"],
    "--mbs": ["--micro-batch-size", "--micro-batch"],
    "--pp": ["--pipeline-model-parallel-size"],
    "--vpp": ["--virtual-pipeline-model-parallel-size"],
    "--tp": ["--tensor-model-parallel-size"],
    "--cp": ["--context-parallel-size"],
}

Target = Union[argparse.ArgumentParser, argparse._ArgumentGroup]


def flags(name: str) -> List[str]:
    """``name`` and its aliases, for ``add_argument``."""
    return [name, *ALIASES.get(name, [])]


@dataclass(frozen=True)
class Option:
    """One option as every command that takes it spells it."""

    name: str
    """The canonical flag (its aliases come from :data:`ALIASES`)."""
    kwargs: Dict[str, Any] = field(default_factory=dict)
    """``add_argument`` keywords every command shares (dest, type or action, metavar; default and help where every
    command means the same)."""


OPTIONS: Dict[str, Option] = {o.name: o for o in [
    Option("--out", {"metavar": "FILE"}),
    Option("--json", {"action": "store_true"}),
    Option("--batches", {"type": int, "default": 8, "help": "global batches K (count, default 8)"}),
    Option("--seed", {"type": int}),
    Option("--gbs", {"dest": "gbs", "type": int}),
    Option("--mbs", {"dest": "mbs", "type": int}),
    Option("--pp", {"dest": "pp"}),
    Option("--vpp", {"dest": "vpp"}),
    Option("--tp", {"dest": "tp"}),
    Option("--cp", {"dest": "cp"}),
    Option("--lengths", {"metavar": "FILE"}),
    Option("--model", {}),
    Option("--ranks-per-node", {"type": int, "default": 8, "help": "ranks (GPUs) per node (default 8)"}),
]}


def add(p: Target, name: str, *, aliases: bool = True, **kwargs: Any) -> argparse.Action:
    """Add the option ``name`` (a key of :data:`OPTIONS`) to a parser or argument group; ``kwargs`` are what this
    command says differently (its help text, default, ``required``...); ``aliases=False`` leaves out the
    Megatron-LM long names (for an option that only shares the short name)."""
    opt = OPTIONS[name]
    names = flags(name) if aliases else [name]
    return p.add_argument(*names, **{**opt.kwargs, **kwargs})


def command(sub: argparse._SubParsersAction, name: str, parents: Optional[List[argparse.ArgumentParser]],
            summary: str, description: str, **kwargs: Any) -> argparse.ArgumentParser:
    """Register subcommand ``name`` with the shared parents (the logging flags), its one-line ``summary`` (the
    ``dynacp -h`` listing) and ``description``."""
    return sub.add_parser(name, parents=parents or [], help=summary, description=description, **kwargs)


def logging_parent(suppress: bool) -> argparse.ArgumentParser:
    """The ``-v``/``-q`` flags; ``suppress`` leaves them unset when absent (for subparsers, so that flags given
    before the command name are not overwritten by the subparser's defaults)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("logging")
    g.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS if suppress else 0,
                   help="more log output on stderr: -v info, -vv debug (solve statistics of every plan)")
    g.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS if suppress else False,
                   help="errors only: no warnings, no progress bars")
    return p


def add_cluster(p: argparse.ArgumentParser) -> None:
    """The cluster, cost-model and dynacp-solver options (read back by ``common.cluster_and_cost`` and
    ``common.solver_kwargs``)."""
    g = p.add_argument_group("cluster and cost model")
    g.add_argument("--ranks", type=int, default=64,
                   help="ranks P (GPUs) in the DP x CP pool (default 64)")
    add(g, "--ranks-per-node")
    g.add_argument("--tokens-per-rank", type=int, default=16384,
                   help="activation budget: tokens one rank holds per microbatch (default 16384)")
    g.add_argument("--cost", default="bytescale-fig6a", help=f"cost preset: {', '.join(_core.preset_names())} "
                   "(default %(default)s; docs/cost_model.md), or a cost preset file written by `dynacp calibrate "
                   "fit` (its measured links set the cluster's; docs/calibration.md)")
    add(g, "--pp", type=int, default=1, help="pipeline stages per rank of the pool (default 1 = no pipeline)")
    add(g, "--vpp", type=int, default=1, help="virtual (interleaved) stages per pipeline stage (default 1)")
    g.add_argument("--count-policy", choices=["equal", "variable"], default="variable",
                   help="microbatch counts per rank when pp > 1: equal, or variable per rank (default variable)")
    s = p.add_argument_group("dynacp solver")
    s.add_argument("--threads", type=int, default=0,
                   help="threads that build and score dynacp's candidates (default 0 = every hardware thread; the "
                   "plan is the same for any count)")
    s.add_argument("--time-limit", dest="time_limit", type=float, default=None, metavar="SECONDS",
                   help="stop building dynacp candidates after this many seconds and keep the best plan so far "
                   "(default: no limit)")


def add_lengths(p: argparse.ArgumentParser, gbs_help: str = "sequences per global batch (default 512)") -> None:
    """Where the global batches come from: an embedded distribution or a lengths file (read by ``common.load``)."""
    g = p.add_argument_group("global batches")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--dist", default=distributions.names()[0],
                     help=f"embedded length distribution: {', '.join(distributions.names())} (default %(default)s)")
    add(src, "--lengths", help="lengths file: one integer (tokens) per line, or a 1-D .npy. Batch k holds entries "
        "[offset + k*gbs, offset + (k+1)*gbs) of the file (0-based, blank lines skipped)")
    add(g, "--gbs", default=None, help=gbs_help)
    g.add_argument("--offset", type=int, default=0,
                   help="with --lengths: 0-based entry of the file the first batch starts at (default 0)")
    g.add_argument("--shuffle", action="store_true",
                   help="with --lengths: draw batches from a permutation of the file seeded by --seed")
    g.add_argument("--wrap", action="store_true",
                   help="with --lengths: reuse entries from the start when the file is too short (default: error)")
    add(g, "--seed", default=None, help="seed of --dist sampling and of --shuffle (default 0)")


_STRATEGIES_HELP = "comma-separated strategy names (default: all registered)"
_PEERS_HELP = "; also `megatron-core`: Megatron-Core 0.16.1's released scheduler (pp = 1; needs megatron-core)"


def add_strategy(p: argparse.ArgumentParser, many: bool, peers: bool = False) -> None:
    """``--strategy NAME`` (one, default dynacp) or, with ``many``, ``--strategies A,B`` (default: all registered;
    ``peers`` says that the Python-side peers may be named too)."""
    if many:
        p.add_argument("--strategies", help=_STRATEGIES_HELP + (_PEERS_HELP if peers else ""))
    else:
        p.add_argument("--strategy", default="dynacp",
                       help=f"one of {', '.join(_core.strategy_names())} (default %(default)s)")
