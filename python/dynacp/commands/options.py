"""The command-line options more than one ``dynacp`` command takes, each spelled, typed and explained here once.

One vocabulary for every command: short names first, the long names Megatron-LM users know accepted as aliases
(``--gbs`` = ``--global-batch-size``, ``--pp`` = ``--pipeline-model-parallel-size``, ...; :data:`ALIASES`).

Groups, and the commands that take them:

* logging, ``-v``/``--verbose`` and ``-q``/``--quiet`` (:func:`logging_parent`): every command;
* cluster and cost model, ``--ranks --ranks-per-node --tokens-per-rank --activation-budget --cost --pp --vpp
  --count-policy``, and the dynacp solver, ``--threads --time-limit`` (:func:`add_cluster`): compare, plan, report;
* cost model from a model and a layout, ``--model --layout --cluster --seq-length --mbs`` and the training
  options ``--optimizer --recompute --fp8 ...`` (:func:`add_layout`, :func:`add_training`): compare, plan, report;
  the training options also configs;
* token counts (``--tokens-per-rank``, ``--seq-length``, ``--max-tokens``) parse with :func:`token_count` and are
  checked by :func:`check_units` (a value that looks like bytes names the byte option);
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
    Option("--cluster", {}),
    Option("--seq-length", {"type": "tokens", "default": None, "metavar": "TOKENS"}),
    Option("--ranks-per-node", {"type": int, "default": 8, "help": "ranks (GPUs) per node (default 8)"}),
]}


#: A token-count flag given this many tokens or more (2**31 = 2,147,483,648, beyond any rank's or sequence's token
#: count) is refused as a byte count typed into the wrong flag (:func:`check_units`).
TOKENS_LOOK_LIKE_BYTES = 2**31

#: Token-count options: dest -> (flag, where a byte count belongs instead). :func:`check_units` reads this.
TOKEN_FLAGS: Dict[str, tuple] = {
    "tokens_per_rank": ("--tokens-per-rank", "give a memory size in bytes with --activation-budget BYTES (activation "
                        "memory of one rank per microbatch)"),
    "seq_length": ("--seq-length", "GPU memory in bytes is the cluster's gpu_memory (--cluster FILE) and --headroom"),
    "max_tokens": ("--max-tokens", "it is a token count of one profiled point, not a memory size"),
}

#: The cluster and cost flags a derived cost model (--model/--layout/--cluster) sets itself, with their defaults.
#: (:func:`add_cluster` takes its defaults from here.)
PRESET_FLAGS = {"--cost": ("cost", "bytescale-fig6a"), "--ranks": ("ranks", 64),
                "--ranks-per-node": ("ranks_per_node", OPTIONS["--ranks-per-node"].kwargs["default"]),
                "--tokens-per-rank": ("tokens_per_rank", 16384), "--activation-budget": ("activation_budget", None),
                "--pp": ("pp", 1), "--vpp": ("vpp", 1)}


def token_count(text: str) -> int:
    """argparse type of a token count: a whole number, also written ``16e3`` or ``16_384``. Its size is checked
    by :func:`check_units` after parsing (so that a byte count gets a message naming the byte option, not usage)."""
    try:
        value = float(str(text).replace("_", ""))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of tokens") from e
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def check_units(args: argparse.Namespace) -> None:
    """Refuse a token flag of :data:`TOKEN_FLAGS` whose value is below 1 or looks like bytes (>=
    :data:`TOKENS_LOOK_LIKE_BYTES`); the ValueError names the flag, the value and the byte option."""
    for dest, (flag, hint) in TOKEN_FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if value < 1:
            raise ValueError(f"{flag} must be >= 1 token, got {value}")
        if value >= TOKENS_LOOK_LIKE_BYTES:
            raise ValueError(f"{flag} {value} is a token count, and {value:.3g} tokens looks like a byte count "
                             f"(token flags refuse {TOKENS_LOOK_LIKE_BYTES:,} or more): {hint}")


def add(p: Target, name: str, *, aliases: bool = True, **kwargs: Any) -> argparse.Action:
    """Add the option ``name`` (a key of :data:`OPTIONS`) to a parser or argument group; ``kwargs`` are what this
    command says differently (its help text, default, ``required``...); ``aliases=False`` leaves out the
    Megatron-LM long names (for an option that only shares the short name)."""
    opt = OPTIONS[name]
    names = flags(name) if aliases else [name]
    merged = {**opt.kwargs, **kwargs}
    if merged.get("type") == "tokens":
        merged["type"] = token_count
    return p.add_argument(*names, **merged)


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
    g.add_argument("--ranks", type=int, default=PRESET_FLAGS["--ranks"][1],
                   help="ranks P (GPUs) in the DP x CP pool (default %(default)s)")
    add(g, "--ranks-per-node")
    g.add_argument("--tokens-per-rank", type=token_count, default=PRESET_FLAGS["--tokens-per-rank"][1],
                   help="activation budget: tokens one rank holds per microbatch (default %(default)s)")
    g.add_argument("--activation-budget", type=float, default=PRESET_FLAGS["--activation-budget"][1], metavar="BYTES",
                   help="activation budget in bytes instead: memory one rank holds per microbatch (e.g. 40e9); the "
                   "tokens per rank are then BYTES / the cost model's bytes per token")
    g.add_argument("--cost", default=PRESET_FLAGS["--cost"][1], help=f"cost preset: {', '.join(_core.preset_names())} "
                   "(default %(default)s; docs/cost_model.md), or a cost preset file written by `dynacp calibrate "
                   "fit` (its measured links set the cluster's; docs/calibration.md)")
    add(g, "--pp", type=int, default=PRESET_FLAGS["--pp"][1],
        help="pipeline stages per rank of the pool (default %(default)s = no pipeline)")
    add(g, "--vpp", type=int, default=PRESET_FLAGS["--vpp"][1],
        help="virtual (interleaved) stages per pipeline stage (default %(default)s)")
    g.add_argument("--count-policy", choices=["equal", "variable"], default="variable",
                   help="microbatch counts per rank when pp > 1: equal, or variable per rank (default variable)")
    s = p.add_argument_group("dynacp solver")
    s.add_argument("--threads", type=int, default=0,
                   help="threads that build and score dynacp's candidates (default 0 = every hardware thread; the "
                   "plan is the same for any count)")
    s.add_argument("--time-limit", dest="time_limit", type=float, default=None, metavar="SECONDS",
                   help="stop building dynacp candidates after this many seconds and keep the best plan so far "
                   "(default: no limit)")


def add_layout(p: argparse.ArgumentParser) -> None:
    """``--model M --layout L --cluster C`` (and ``--seq-length``, ``--mbs``): the cost model derived from the
    planner's per-layer model of a layout instead of a preset (read by ``common.pricing``)."""
    from dynacp.planner.presets import preset_names

    g = p.add_argument_group("cost model from a model and a layout (instead of --cost; docs/planner.md)")
    add(g, "--model", help=f"model JSON file or preset ({', '.join(preset_names('model'))}); with --layout and "
        "--cluster the cost model, pool and activation budget are derived from them (then --cost, --ranks, "
        "--ranks-per-node, --tokens-per-rank, --activation-budget, --pp and --vpp are not given)")
    g.add_argument("--layout", metavar="TP4/PP4/CP2",
                   help="the static layout: TP, PP (PP4x2 = VPP 2), CP, EP, ETP, '/'-separated, absent ones 1; DP is "
                   "the rest of the cluster. The pool is DP x CP ranks, each a TP x PP slice")
    add(g, "--cluster", help=f"cluster JSON file or preset ({', '.join(preset_names('cluster'))})")
    add(g, "--seq-length", help="tokens per pack (default: the longest length --lengths or --dist can give, rounded "
        "up to a multiple of 1024; a shorter value is an error)")
    add(g, "--mbs", default=None, help="packs per micro-batch (default 1)")
    add_training(p.add_argument_group("training options of the layout (with --model; as in `dynacp configs`)"))


def add_training(g: Target) -> None:
    """The training options that price a layout (``dynacp configs``; ``compare``, ``plan``, ``report`` with
    ``--model``), read back by :func:`training_options`."""
    from dynacp.planner.model import OPTIMIZERS, RECOMPUTE, RECOMPUTE_MODULES, PlannerOptions

    g.add_argument("--optimizer", choices=OPTIMIZERS, default="distributed",
                   help="data-parallel sharding of the model states: distributed (Megatron's distributed optimizer, "
                        "= zero1: optimizer states), zero2 (also the gradients, reduce-scattered every micro-batch; "
                        "FSDP without resharding after forward, as Llama 3), zero3 (also the weights; FSDP full "
                        "shard), zero0 (plain DDP). Default distributed")
    g.add_argument("--grad-dtype", choices=["fp32", "bf16"], default="fp32", help="main gradients (default fp32)")
    g.add_argument("--recompute", choices=RECOMPUTE, default="selective", help="default selective")
    g.add_argument("--recompute-modules", nargs="+", default=[], metavar="MODULE",
                   help="also recompute these parts of each layer, Megatron-LM's names (space- or comma-separated): "
                        f"{', '.join(RECOMPUTE_MODULES)}; mlp_act is the dense MLPs' activation function (not a "
                        "Megatron-Core module). Not with --recompute full")
    g.add_argument("--chunked-ce", action="store_true", help="fused/chunked cross-entropy")
    g.add_argument("--allow-uneven-pp", action="store_true", help="accept PP not dividing the layers")
    g.add_argument("--headroom", type=float, default=PlannerOptions.memory_headroom,
                   help=f"usable fraction of GPU memory (0..1, default {PlannerOptions.memory_headroom})")
    g.add_argument("--mfu", type=float, default=None,
                   help="price all FLOPs at this fraction of peak (0..1; default: the efficiency model)")
    g.add_argument("--fp8", action="store_true",
                   help="FP8 GEMMs; weights as FP8 primary weights by default (1 B FP8 + 1 B transpose per parameter "
                        "instead of 2 B bf16; the DP all-gather moves 1 B per parameter)")
    g.add_argument("--no-fp8-param", action="store_true",
                   help="with --fp8: keep bf16 primary weights plus Transformer Engine's cached FP8 copy (2 + 2 B per "
                        "parameter), as blockwise recipes such as DeepSeek-V3's do")
    g.add_argument("--no-dp-overlap", action="store_true",
                   help="count the DP reduce-scatter / all-gather as fully exposed (default: overlapped)")
    g.add_argument("--no-pp-overlap", action="store_true",
                   help="count interleaved pipeline sends as exposed (default: hidden behind the next chunk)")
    g.add_argument("--no-ep-overlap", action="store_true",
                   help="count the EP all-to-alls as fully exposed (default: a share hidden by EP comm overlap)")
    g.add_argument("--ep-in-node", action="store_true", help="keep ETP x EP groups inside a node")


def training_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The :class:`dynacp.planner.PlannerOptions` fields of the :func:`add_training` flags (ValueError for
    ``--recompute-modules`` with ``--recompute full``)."""
    from dynacp.planner.model import recompute_module_options

    out = {"optimizer": args.optimizer, "grad_dtype": args.grad_dtype, "recompute": args.recompute,
           "chunked_ce": args.chunked_ce, "allow_uneven_pp": args.allow_uneven_pp, "memory_headroom": args.headroom,
           "mfu": args.mfu, "fp8": args.fp8, "fp8_param": not args.no_fp8_param, "dp_overlap": not args.no_dp_overlap,
           "pp_comm_overlap": not args.no_pp_overlap, "ep_comm_overlap": not args.no_ep_overlap,
           "ep_in_node": args.ep_in_node}
    if args.no_fp8_param and not args.fp8:
        raise ValueError("--no-fp8-param chooses how FP8 weights are kept: give it with --fp8")
    modules = [n for item in args.recompute_modules for n in item.split(",") if n]
    if modules and args.recompute == "full":
        raise ValueError("--recompute-modules applies to --recompute selective or none; full recompute already "
                         "keeps only each layer's input")
    out.update(recompute_module_options(modules))
    return out


def training_defaults() -> Dict[str, Any]:
    """:func:`training_options` of no flags (what a command without ``--model`` must leave them at)."""
    p = argparse.ArgumentParser(add_help=False)
    add_training(p)
    return training_options(p.parse_args([]))


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
