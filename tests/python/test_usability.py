"""Issue 24: the traps a new user hit, each reproduced, with the behaviour that replaced it."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dynacp
from dynacp.cli import main
from dynacp.commands import compare as compare_cmd

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str, env_extra: dict = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env_extra or {}))  # the dynacp the tests import: installed, or PYTHONPATH's in a dev tree
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, **kw)


def _strict_json(text: str):
    """json.loads that refuses NaN / Infinity (Python's json accepts them; JSON does not)."""
    def bad(c):
        raise AssertionError(f"not JSON: {c}")

    return json.loads(text, parse_constant=bad)


# 1. the budget in tokens, the default strategy ------------------------------------------------------------------

def test_cluster_takes_the_budget_in_tokens_per_rank() -> None:
    cost = dynacp.CostModel()
    by_tokens = dynacp.Cluster(num_ranks=16, tokens_per_rank=3000)
    assert cost.token_capacity(by_tokens) == 3000
    by_bytes = dynacp.Cluster(num_ranks=16, activation_budget=3000 * cost.mem_per_token)
    assert cost.token_capacity(by_bytes) == 3000 and by_bytes.tokens_per_rank == 0  # bytes stay available
    lengths = np.random.default_rng(0).integers(100, 9000, 200)
    a, b = dynacp.plan(lengths, by_tokens, cost), dynacp.plan(lengths, by_bytes, cost)
    assert a.digest() == b.digest() and a.predicted.peak_tokens_per_rank <= 3000
    assert pickle.loads(pickle.dumps(by_tokens)).tokens_per_rank == 3000
    with pytest.raises(ValueError, match="tokens_per_rank"):
        dynacp.Cluster(tokens_per_rank=-5).validate()
    with pytest.raises(ValueError, match="sequence 1 has 48001 tokens"):  # 16 x 3000 = 48,000 tokens in the pool
        dynacp.plan([10, 48001], by_tokens, cost)


def test_plan_defaults_to_the_dynacp_strategy() -> None:
    lengths = np.random.default_rng(1).integers(100, 20000, 128)
    cluster = dynacp.Cluster(num_ranks=16, tokens_per_rank=8192)
    default = dynacp.plan(lengths, cluster)
    assert default.strategy == "dynacp"
    assert default.digest() == dynacp.plan(lengths, cluster, strategy="dynacp").digest()
    assert dynacp.plan(lengths, cluster, strategy="fcp").strategy == "fcp"
    assert dynacp.PlanOptions().strategy == "dynacp"


# 3. lengths files -----------------------------------------------------------------------------------------------

@pytest.fixture
def lengths_file(tmp_path) -> Path:
    f = tmp_path / "lengths.txt"
    f.write_text("".join(f"{v}\n" for v in [700, 100, 2000, 300, 50, 9000, 40, 1200, 600, 80]))
    return f


def test_a_too_short_lengths_file_is_an_error_unless_wrap(lengths_file, capsys) -> None:
    """It used to wrap silently: a 10-line file was reported as 8 batches x 512 sequences."""
    assert main(["compare", "--lengths", str(lengths_file)]) == 2
    err = capsys.readouterr().err
    assert "holds 10 lengths but 8 batch(es) x 512 sequences from entry 0 need 4096" in err and "--wrap" in err
    assert main(["compare", "--lengths", str(lengths_file), "--gbs", "4", "--batches", "2", "--json", "-q"]) == 0
    capsys.readouterr()
    assert main(["compare", "--lengths", str(lengths_file), "--gbs", "4", "--batches", "3", "--json"]) == 2
    capsys.readouterr()
    assert main(["compare", "--lengths", str(lengths_file), "--gbs", "4", "--batches", "3", "--wrap", "--json",
                 "--strategies", "fcp"]) == 0
    src = _strict_json(capsys.readouterr().out)["metadata"]["lengths_source"]
    assert src["wrap"] is True and src["entries_in_file"] == 10


def test_batches_start_at_entry_0_and_the_plan_records_its_source(lengths_file, tmp_path, capsys) -> None:
    file_lengths = np.loadtxt(lengths_file, dtype=np.int64)
    out = tmp_path / "plan.json"
    base = ["plan", "--lengths", str(lengths_file), "--ranks", "8", "--out", str(out), "-q"]
    assert main([*base, "--gbs", "4"]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"]["entries"] == [0, 1, 2, 3] and doc["source"]["offset"] == 0 and doc["source"]["seed"] is None
    assert doc["source"]["path"] == str(lengths_file) and doc["strategy"] == "dynacp"
    assert main([*base, "--gbs", "4", "--offset", "5"]) == 0
    assert json.loads(out.read_text())["source"]["entries"] == [5, 6, 7, 8]
    assert main([*base, "--gbs", "6", "--shuffle", "--seed", "3"]) == 0
    doc = json.loads(out.read_text())
    entries = doc["source"]["entries"]
    assert entries == np.random.default_rng(3).permutation(10)[:6].tolist() and doc["source"]["seed"] == 3
    # every sequence id maps back to its entry: the plan validates against the file's lengths at those entries
    capsys.readouterr()
    assert main([*base[:-1], "--gbs", "4", "--seed", "3"]) == 0  # a seed without --shuffle changes nothing: said so
    assert json.loads(out.read_text())["source"]["entries"] == [0, 1, 2, 3]
    assert "--seed 3 has no effect on --lengths without --shuffle" in capsys.readouterr().err
    plan = dynacp.Plan.from_dict(doc)
    plan.validate(file_lengths[entries], dynacp.Cluster(num_ranks=8, tokens_per_rank=16384), dynacp.CostModel())
    assert sorted(i for slot in plan.microbatches for g in slot for i in g.sequences) == list(range(6))


def test_plan_without_gbs_plans_what_its_help_says(lengths_file, tmp_path, capsys) -> None:
    """The help said 512 while `plan --lengths` planned the whole file; now the help says what happens."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "default: every entry of --lengths FILE from --offset on; 512 with --dist" in helptext
    out = tmp_path / "p.json"
    assert main(["plan", "--lengths", str(lengths_file), "--ranks", "8", "--out", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["source"]["sequences"] == 10
    assert main(["plan", "--ranks", "8", "--out", str(out), "-q"]) == 0
    assert json.loads(out.read_text())["source"]["sequences"] == 512


# 4. honest machine output ---------------------------------------------------------------------------------------

PP4_VPP2 = ["compare", "--gbs", "128", "--ranks", "16", "--pp", "4", "--vpp", "2", "--batches", "1"]


def test_failed_strategies_give_null_not_nan_and_a_nonzero_exit(capsys) -> None:
    """`compare --pp 4 --vpp 2` printed `nanx`, wrote NaN into --json and exited 0 although strategies failed."""
    assert main(PP4_VPP2) == 1
    cap = capsys.readouterr()
    assert "nan" not in cap.out.lower() and "n/a" in cap.out
    assert "strategies failed: packing" in cap.err
    assert main([*PP4_VPP2, "--json"]) == 1
    res = _strict_json(capsys.readouterr().out)
    assert res["strategies"]["packing"]["step_time_ms"] is None and res["strategies"]["packing"]["error"]
    assert res["strategies"]["dynacp"]["speedup_vs_packing"] is None  # relative to a packing that failed
    assert res["strategies"]["dynacp"]["error"] is None and res["strategies"]["dynacp"]["step_time_ms"] > 0
    assert main(["compare", "--gbs", "64", "--ranks", "16", "--batches", "1", "--strategies", "fcp,dynacp"]) == 0


def test_json_has_run_metadata_and_units_in_key_names(capsys) -> None:
    assert main(["compare", "--gbs", "64", "--ranks", "16", "--batches", "2", "--pp", "2", "--json",
                 "--cost", "h100-distca"]) == 0
    res = _strict_json(capsys.readouterr().out)
    meta = res["metadata"]
    assert meta["cluster"] == {"ranks": 16, "ranks_per_node": 8, "tokens_per_rank": 16384}
    assert (meta["pp"], meta["vpp"], meta["cost_preset"], meta["batches"]) == (2, 1, "h100-distca", 2)
    assert meta["lengths_source"] == {"kind": "distribution", "name": "wikipedia", "seed": 0}
    assert meta["dynacp_version"] == dynacp.__version__ and meta["python_version"] and meta["numpy_version"]
    unitless = {"error", "speedup_vs_packing", "gap_to_lower_bound", "max_over_mean_rank_time", "microbatches_mean",
                "peak_tokens_per_rank", "batches_won_by_family"}  # ratios and counts; their unit is in "columns"
    for row in res["strategies"].values():
        for key in row:
            assert key in unitless or key.endswith("_ms"), key
            assert key in res["columns"]
    fcp = res["strategies"]["fcp"]
    assert 0 < fcp["lower_bound_ms"] <= fcp["step_time_ms"] < 10_000  # milliseconds, not seconds


def test_every_table_column_is_explained_in_help(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    helptext = capsys.readouterr().out
    assert main(["compare", "--gbs", "64", "--ranks", "16", "--batches", "1"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    for hdr, key, _ in compare_cmd.COLUMNS:
        assert hdr in header
        assert f"  {hdr:<14} [{key}] " in helptext
    assert "mb             [microbatches_mean] microbatch slots" in helptext
    assert "exit status: 0" in helptext


# 5. one vocabulary, 0-based ids, --version, logging, from_dict ---------------------------------------------------

def test_megatron_long_names_are_aliases(capsys) -> None:
    short = ["compare", "--gbs", "48", "--pp", "2", "--batches", "1", "--ranks", "8", "--json", "--strategies", "fcp"]
    long = ["compare", "--global-batch-size", "48", "--pipeline-model-parallel-size", "2", "--batches", "1",
            "--ranks", "8", "--json", "--strategies", "fcp", "--virtual-pipeline-model-parallel-size", "1"]
    assert main(short) == 0
    a = _strict_json(capsys.readouterr().out)
    assert main(long) == 0
    b = _strict_json(capsys.readouterr().out)
    assert a["strategies"]["fcp"]["step_time_ms"] == b["strategies"]["fcp"]["step_time_ms"]
    assert b["metadata"]["sequences_per_batch"] == 48 and b["metadata"]["pp"] == 2
    tables = []
    for batch_flags in (["--gbs", "64", "--mbs", "1"], ["--global-batch-size", "64", "--micro-batch-size", "1"],
                        ["--global-batch", "64", "--micro-batch", "1"]):
        assert main(["configs", "--model", "llama3-8b", "--cluster", "h100-64", *batch_flags, "--seq-length", "8192",
                     "--json"]) == 0
        tables.append(json.loads(capsys.readouterr().out))
    assert tables[0]["batch"] == tables[1]["batch"] == tables[2]["batch"] == {
        "global_batch": 64, "seq_length": 8192, "micro_batch": 1}
    assert main(["configs", "--model", "llama3-8b", "--cluster", "h100-64", "--tensor-model-parallel-size", "2",
                 "--context-parallel-size", "1,2", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["feasible"] and all(r["tp"] == 2 and r["cp"] in (1, 2) for r in t["feasible"])


def test_sequence_ids_and_file_entries_count_from_0(tmp_path, capsys) -> None:
    f = tmp_path / "bad.txt"
    f.write_text("12\n\nabc\n")
    assert main(["plan", "--lengths", str(f)]) == 2
    assert ":3: entry 1:" in capsys.readouterr().err  # line numbers as editors show them, ids from 0
    with pytest.raises(ValueError, match="sequence 0 has"):
        dynacp.plan([10**9], dynacp.Cluster(num_ranks=8, tokens_per_rank=100))


def test_version_flag(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"dynacp {dynacp.__version__} (python ")
    r = _run("-m", "dynacp", "--version")
    assert r.returncode == 0 and r.stdout.startswith("dynacp ")


def test_plan_from_dict_names_a_wrong_type() -> None:
    with pytest.raises(ValueError, match="expects a dict .* got list"):
        dynacp.Plan.from_dict([1, 2])
    d = dynacp.plan([100, 200], dynacp.Cluster(num_ranks=8)).to_dict()
    d["predicted"] = 3
    with pytest.raises(ValueError, match="'predicted' is not an object"):
        dynacp.Plan.from_dict(d)


NEAR_CAPACITY = ("import dynacp{setup}; dynacp.plan([7500, 10], dynacp.Cluster(num_ranks=8, tokens_per_rank=1000))")


def test_the_library_is_silent_unless_logging_is_configured() -> None:
    """The core logs through spdlog into Python's `dynacp.core` logger; with no handler configured nothing is
    printed (not even the near-capacity warning), with one the warning arrives, with DEBUG the solve statistics."""
    quiet = _run("-c", NEAR_CAPACITY.format(setup=""))
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    warn = _run("-c", NEAR_CAPACITY.format(setup="; import logging; logging.basicConfig(level=logging.WARNING)"))
    assert "WARNING:dynacp.core:1 sequence(s) hold at least 90% of the pool's capacity of 8000 tokens" in warn.stderr
    assert "e.g. sequence 0 with 7500 tokens" in warn.stderr and "solve_ms" not in warn.stderr
    debug = _run("-c", NEAR_CAPACITY.format(setup="; import logging; logging.basicConfig(level=logging.DEBUG)"))
    assert "DEBUG:dynacp.core:plan: strategy=dynacp sequences=2 tokens=7510" in debug.stderr


def test_core_records_reach_python_handlers_at_their_levels(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="dynacp"):
        dynacp._core._log_test("debug", "not kept")
        dynacp._core._log_test("info", "kept info")
        dynacp._core._log_test("error", "kept error")
    got = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [("dynacp.core", logging.INFO, "kept info"), ("dynacp.core", logging.ERROR, "kept error")]


def test_a_poor_calibration_fit_is_a_warning(caplog) -> None:
    rng = np.random.default_rng(0)
    lengths = [[int(s)] for s in rng.integers(1000, 60000, 30)]
    noise = rng.uniform(0.3, 3.0, 30)  # timings off by up to 3x: no a, b, c explains them
    seconds = [float(dynacp.CostModel().time(x, 1, dynacp.Cluster())) * k for x, k in zip(lengths, noise)]
    with caplog.at_level(logging.WARNING, logger="dynacp"):
        _, rep = dynacp._core.fit_compute(dynacp.CostModel(), lengths, [1] * 30, seconds)
    assert rep.rms_relative_error > 0.2
    assert any("fit_compute: poor fit" in r.getMessage() for r in caplog.records)
    caplog.clear()
    exact = [float(dynacp.CostModel().time(x, 1, dynacp.Cluster())) for x in lengths]
    with caplog.at_level(logging.WARNING, logger="dynacp"):
        dynacp._core.fit_compute(dynacp.CostModel(), lengths, [1] * 30, exact)
    assert not caplog.records


def test_cli_log_levels(tmp_path, capsys) -> None:
    args = ["compare", "--gbs", "64", "--ranks", "16", "--batches", "1", "--strategies", "fcp"]
    assert main(args) == 0
    assert "dynacp.core" not in capsys.readouterr().err  # default: warnings only, and there are none
    assert main(["-vv", *args]) == 0
    assert "dynacp.core: DEBUG: plan: strategy=fcp sequences=64" in capsys.readouterr().err
    assert main([*args, "-vv"]) == 0  # after the command name too
    assert "DEBUG: plan: strategy=fcp" in capsys.readouterr().err
    near = ["compare", "--lengths", str(tmp_path / "near.txt"), "--gbs", "2", "--ranks", "8", "--tokens-per-rank",
            "1000", "--batches", "1", "--strategies", "fcp", "--json"]
    (tmp_path / "near.txt").write_text("7500\n10\n")
    assert main(near) == 0
    assert "dynacp.core: WARNING: 1 sequence(s) hold at least 90%" in capsys.readouterr().err
    assert main([*near, "-q"]) == 0
    assert capsys.readouterr().err == ""


# 6. plots -------------------------------------------------------------------------------------------------------

def _plans(pp: int = 1):
    lengths = dynacp.distributions.sample("wikipedia", 256, np.random.default_rng(0))
    cluster = dynacp.Cluster(num_ranks=64, tokens_per_rank=16384)
    return lengths, cluster, {n: dynacp.plan(lengths, cluster, strategy=n, pp=pp) for n in dynacp.strategy_names()}


def test_gantt_is_screen_sized_titled_with_a_legend_and_optional_own_axes(tmp_path) -> None:
    """It was 1440 x 4752 pixels, untitled, colours without a legend, one shared axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    from dynacp.plots import gantt

    lengths, cluster, plans = _plans()
    path = tmp_path / "g.png"
    fig = gantt(plans, lengths, cluster, dynacp.CostModel(), title="settings line here")
    w, h = fig.get_size_inches() * fig.dpi
    assert w <= 1400 and h <= 900
    assert fig._suptitle.get_text() == "settings line here"
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "lower bound" in labels and any(t.startswith("CP degree") for t in labels)
    assert len({ax.get_xlim() for ax in fig.axes}) == 1  # shared
    for ax in fig.axes:  # the lower bound is marked in every panel
        lb = plans[ax.get_title(loc="left").split(":")[0]].predicted.lower_bound
        assert any(abs(ln.get_xdata()[0] - lb) < 1e-12 for ln in ax.get_lines())
    own = gantt(plans, lengths, cluster, dynacp.CostModel(), str(path), shared_time=False)
    assert own is not None and len({ax.get_xlim() for ax in own.axes}) == len(plans)
    assert mpimg.imread(path).shape[:2] == (900, 1400)


def test_gantt_distinguishes_forward_and_backward_with_pipelines() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from dynacp.plots import bars, gantt

    lengths, cluster, plans = _plans(pp=2)
    b = bars(plans["dynacp"], lengths, cluster, dynacp.CostModel(), pp=2)
    assert {x.backward for x in b} == {True, False}
    fig = gantt({"dynacp": plans["dynacp"]}, lengths, cluster, dynacp.CostModel(), pp=2)
    hatches = {c.get_hatch() for c in fig.axes[0].collections}
    assert hatches == {"///", None}  # forward hatched, backward solid
    assert {"forward", "backward"} <= {t.get_text() for t in fig.legends[0].get_texts()}


def test_length_histogram(tmp_path, capsys) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from dynacp.plots import histogram

    x = np.array([100] * 50 + [5000] * 10 + [40000])
    fig = histogram(x, title="t")
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend[0].startswith("< 1K: 50 seqs") and legend[3].startswith(">= 32K: 1 seqs")
    assert "n=61, median 100" in fig.axes[0].get_title(loc="left")
    with pytest.raises(ValueError, match="no lengths"):
        histogram(np.array([], dtype=np.int64))
    import matplotlib.image as mpimg

    png = tmp_path / "h.png"
    assert main(["compare", "--gbs", "64", "--ranks", "16", "--batches", "2", "--strategies", "fcp", "--hist",
                 str(png)]) == 0
    assert mpimg.imread(png).shape[:2] == (500, 1000)


# 7. the HTML report (the browser test is in test_report_browser.py) ---------------------------------------------

def test_report_is_one_self_contained_page(tmp_path, capsys) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--out", str(out), "--batches", "1", "--gbs", "64", "--ranks", "16",
                 "--strategies", "packing,dynacp"]) == 0
    page = out.read_text()
    assert page.count("<img class='gantt'") == 2 and page.count("data:image/png;base64,") == 3
    assert "<table id='comparison'>" in page and "<table id='metadata'>" in page
    assert "src='http" not in page and 'src="http' not in page and "<script" not in page
    assert "wrote" in capsys.readouterr().err
    assert main(["report", "--out", str(out), *PP4_VPP2[1:], "-q"]) == 1
    assert "failed: batch 0" in out.read_text()


# 8. progress bars -----------------------------------------------------------------------------------------------

def _stderr_on_a_terminal(*cli: str) -> str:
    """What `python -m dynacp CLI...` writes to stderr when stderr is a terminal (a pty), and its exit status."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    env = dict(os.environ)
    try:
        r = subprocess.run([sys.executable, "-m", "dynacp", *cli], stderr=slave, stdout=subprocess.DEVNULL,
                           timeout=300, env=env)
    finally:
        os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal is drained and closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return b"".join(chunks).decode(errors="replace") + f"\n[rc={r.returncode}]"


def test_progress_bars_on_a_terminal_only() -> None:
    args = ("compare", "--gbs", "64", "--ranks", "16", "--batches", "3")
    tty = _stderr_on_a_terminal(*args)
    assert "planning:" in tty and "%|" in tty and "/15 [" in tty and "[rc=0]" in tty  # 3 batches x 5 strategies
    assert "planning" not in _stderr_on_a_terminal(*args, "-q")
    piped = _run("-m", "dynacp", *args)
    assert piped.returncode == 0 and "planning" not in piped.stderr
