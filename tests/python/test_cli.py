"""The dynacp CLI: compare prints the table (fcp faster than packing), plan writes valid JSON, errors are named."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np
import pytest

import dynacp
from dynacp import distributions
from dynacp.cli import main


def test_compare_default_distribution_fcp_beats_packing(capsys) -> None:
    assert main(["compare", "--batches", "3"]) == 0
    out = capsys.readouterr().out
    assert "gap to LB" in out and "lower bound" in out
    assert main(["compare", "--batches", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["strategies"]
    assert res["fcp"]["step_time_ms"] < res["packing"]["step_time_ms"]
    assert res["fcp"]["speedup_vs_packing"] > 1.0
    assert res["fcp"]["gap_to_lower_bound"] >= 0.0
    assert set(res) == set(dynacp.strategy_names())


def test_compare_on_a_lengths_file(tmp_path, capsys) -> None:
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(str(x) for x in [100, 5000, 20000, 300] * 50))
    assert main(["compare", "--lengths", str(f), "--gbs", "64", "--batches", "2", "--json",
                 "--strategies", "fcp,packing"]) == 0
    assert set(json.loads(capsys.readouterr().out)["strategies"]) == {"fcp", "packing"}
    npy = tmp_path / "lengths.npy"
    np.save(npy, np.array([100, 200, 300]))
    assert main(["compare", "--lengths", str(npy), "--gbs", "3", "--batches", "1", "--json"]) == 0


def test_compare_interleaved_reports_anchors_that_cannot_interleave(capsys) -> None:
    """Under vpp > 1 the anchors whose microbatch counts break the rule show as failed rows (ValueError from the
    simulator, RuntimeError from megatron's alignment); dynacp still plans. It used to abort the whole command;
    now the table and the JSON still come out and the exit status is 1 (a requested strategy failed)."""
    args = ["compare", "--dist", "wikipedia", "--gbs", "128", "--ranks", "16", "--pp", "4", "--vpp", "2",
            "--batches", "1", "--json"]
    assert main(args) == 1
    res = json.loads(capsys.readouterr().out)["strategies"]
    assert "multiple of pp = 4" in res["packing"]["error"]
    assert "multiple of pp = 4" in res["megatron"]["error"]
    assert res["dynacp"]["error"] is None
    assert res["dynacp"]["step_time_ms"] >= res["dynacp"]["lower_bound_ms"] > 0
    # one sequence cannot give any rank a multiple of 4 microbatches: every strategy rejects the batch, and the
    # command reports it as an input error (exit 2) instead of a table of failures
    assert main(["compare", "--gbs", "1", "--pp", "4", "--vpp", "2", "--batches", "1"]) == 2
    assert "multiple of pp = 4" in capsys.readouterr().err


def test_plan_writes_a_valid_plan(tmp_path) -> None:
    f = tmp_path / "lengths.txt"
    lengths = [7000, 300, 12000, 50, 900]
    f.write_text("\n".join(map(str, lengths)) + "\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--lengths", str(f), "--strategy", "fcp", "--out", str(out), "--ranks", "8"]) == 0
    d = json.loads(out.read_text())
    p = dynacp.Plan.from_dict(d)
    cost = dynacp.CostModel()
    p.validate(np.array(lengths), dynacp.Cluster(num_ranks=8, tokens_per_rank=16384), cost)
    assert p.strategy == "fcp" and d["source"]["entries"] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("content, match", [("12\nabc\n", ":2: entry 1:"), ("5\n-1\n", "must be >= 1"),
                                            ("", "no lengths")])
def test_malformed_length_files_are_named(tmp_path, capsys, content, match) -> None:
    f = tmp_path / "bad.txt"
    f.write_text(content)
    assert main(["compare", "--lengths", str(f), "--batches", "1"]) == 2
    assert match in capsys.readouterr().err


def test_bad_cluster_flags(capsys) -> None:
    assert main(["compare", "--ranks", "12", "--ranks-per-node", "8"]) == 2
    assert "does not divide" in capsys.readouterr().err
    assert main(["compare", "--strategies", "fcp,nope"]) == 2
    assert "unknown strategy" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    r = subprocess.run([sys.executable, "-m", "dynacp", "compare", "--batches", "1", "--gbs", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "fcp" in r.stdout


def test_distributions_are_capped_and_named() -> None:
    rng = np.random.default_rng(0)
    for name in distributions.names():
        d = distributions.get(name)
        x = d.sample(5000, rng)
        assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= d.context
        assert d.source
    with pytest.raises(ValueError, match="unknown length distribution"):
        distributions.get("nope")


def test_wikipedia_table_matches_the_public_file(shared_data) -> None:
    x = distributions.sample("wikipedia", 400_000, np.random.default_rng(1))
    s = distributions.summary(x)
    # published: median 347, mean 1,014 (before the 128K cap), 27.5 % of tokens from documents >= 8K
    assert 330 <= s["p50"] <= 365
    assert 0.25 <= s["tokens_ge_8k"] <= 0.30


#: Every option string each command's parser had before the shared options moved to dynacp.commands.options
#: (captured at commit 67c0210 from dynacp.cli.build_parser()); `-h` must keep listing every one.
FLAGS_AT_67C0210 = {
    "dynacp": "--help --quiet --verbose --version -h -q -v",
    "calibrate": "--help --quiet --verbose -h -q -v",
    "calibrate fit": "--distca --form --help --json --layers --name --out --quiet --tp --verbose -h -q -v",
    "calibrate profile": "--help --max-tokens --model --out --passes --quiet --ranks-per-node --repeats --verbose "
                         "--warmup --world-size -h -q -v",
    "compare": "--batches --cost --count-policy --dist --gbs --global-batch --global-batch-size --help --hist --json "
               "--lengths --offset --per-panel-time --pipeline-model-parallel-size --plot --pp --quiet --ranks "
               "--ranks-per-node --seed --shuffle --strategies --threads --time-limit --tokens-per-rank --verbose "
               "--virtual-pipeline-model-parallel-size --vpp --wrap -h -q -v",
    "configs": "--allow-uneven-pp --batches --chunked-ce --cluster --context-parallel-size --cp --ep-divides-dp "
               "--ep-in-node --etp --fp8 --gbs --global-batch --global-batch-size --grad-dtype --headroom --help "
               "--json --lengths --max-vpp --mbs --mfu --micro-batch --micro-batch-size --model --no-dp-overlap "
               "--no-ep-overlap --no-pp-overlap --optimizer --pipeline-model-parallel-size --pp --quiet --recompute "
               "--recompute-modules --rejected --seed --seq-length --tensor-model-parallel-size --top --tp --verbose "
               "-h -q -v",
    "plan": "--cost --count-policy --dist --gbs --global-batch --global-batch-size --help --lengths --offset --out "
            "--pipeline-model-parallel-size --pp --quiet --ranks --ranks-per-node --seed --shuffle --strategy "
            "--threads --time-limit --tokens-per-rank --verbose --virtual-pipeline-model-parallel-size --vpp --wrap "
            "-h -q -v",
    "report": "--batches --cost --count-policy --dist --gbs --global-batch --global-batch-size --help --lengths "
              "--offset --out --pipeline-model-parallel-size --pp --quiet --ranks --ranks-per-node --seed --shuffle "
              "--strategies --threads --time-limit --title --tokens-per-rank --verbose "
              "--virtual-pipeline-model-parallel-size --vpp --wrap -h -q -v",
}


def _parsers() -> dict:
    """Every parser of the ``dynacp`` command line by its command path (``"calibrate fit"``; ``"dynacp"`` the top)."""
    import argparse

    from dynacp.cli import build_parser

    out, todo = {}, [("dynacp", build_parser())]
    while todo:
        path, p = todo.pop()
        out[path] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(name if path == "dynacp" else f"{path} {name}", sp) for name, sp in a.choices.items()]
    return out


#: Flags added since 67c0210 (issue 37: the cost model from a model and a layout, the activation budget in bytes).
_LAYOUT_FLAGS = ("--activation-budget --cluster --layout --mbs --micro-batch --micro-batch-size --model --seq-length "
                 # the training options of dynacp configs, which price the layout
                 "--allow-uneven-pp --chunked-ce --ep-in-node --fp8 --grad-dtype --headroom --mfu --no-dp-overlap "
                 "--no-ep-overlap --no-pp-overlap --optimizer --recompute --recompute-modules --no-fp8-param")
FLAGS_ADDED = {"compare": _LAYOUT_FLAGS, "plan": _LAYOUT_FLAGS, "report": _LAYOUT_FLAGS,
               "configs": "--no-fp8-param"}  # issue 37: FP8 weights kept as bf16 + cached FP8 copy


def test_every_command_keeps_every_flag_it_had() -> None:
    parsers = _parsers()
    assert set(parsers) == set(FLAGS_AT_67C0210)
    for path, p in parsers.items():
        got = sorted(s for a in p._actions for s in a.option_strings)
        assert got == sorted(FLAGS_AT_67C0210[path].split() + FLAGS_ADDED.get(path, "").split()), path
        text = p.format_help()
        assert all(flag in text for flag in got), f"{path} -h does not list every flag"


def test_a_shared_option_reads_alike_in_every_command_that_takes_it() -> None:
    """compare, plan and report take the cluster, cost and lengths options from one definition: same flags, defaults
    and help (plan's --gbs help says what its own default is)."""
    parsers = _parsers()

    def actions(path: str) -> dict:
        return {a.option_strings[0]: (tuple(a.option_strings), a.default, a.help, a.type)
                for a in parsers[path]._actions if a.option_strings}

    compare, plan, report = actions("compare"), actions("plan"), actions("report")
    shared = ["--ranks", "--ranks-per-node", "--tokens-per-rank", "--cost", "--pp", "--vpp", "--count-policy",
              "--threads", "--time-limit", "--dist", "--lengths", "--offset", "--shuffle", "--wrap", "--seed"]
    for flag in shared:
        assert compare[flag] == plan[flag] == report[flag], flag
    assert compare["--gbs"] == report["--gbs"] and plan["--gbs"][:2] == compare["--gbs"][:2]
    assert compare["--batches"] == report["--batches"]
    assert compare["--ranks-per-node"][1:] == (8, "ranks (GPUs) per node (default 8)", int)


def test_no_fp8_param_turns_fp8_primary_weights_off() -> None:
    from dynacp.commands import options

    p = argparse.ArgumentParser()
    options.add_training(p)
    assert options.training_options(p.parse_args(["--fp8"]))["fp8_param"] is True
    assert options.training_options(p.parse_args(["--fp8", "--no-fp8-param"]))["fp8_param"] is False
    with pytest.raises(ValueError, match="--no-fp8-param .* with --fp8"):
        options.training_options(p.parse_args(["--no-fp8-param"]))
