"""Issue 37 items 1-3: the scheduler priced from a model and a layout (compare/plan/report --model --layout
--cluster agree with configs --lengths), no silent clipping of the lengths, units and idle-pool warnings."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import dynacp
import dynacp.planner as pl
from dynacp.cli import main
from dynacp.planner import layout_cost as lcm

LAYOUT = "TP8/PP2/CP8"


@pytest.fixture(scope="module")
def long_tail(tmp_path_factory):
    """The issue's data: a 2K body and a 3 % tail up to 128K tokens (a lengths file)."""
    rng = np.random.default_rng(7)
    n = 20_000
    body = np.rint(rng.lognormal(np.log(2048), 0.5, n))
    tail = np.rint(np.exp(rng.uniform(np.log(8192), np.log(131072), n)))
    x = np.clip(np.where(rng.random(n) < 0.03, tail, body), 16, 131072).astype(np.int64)
    x[0] = 131072  # the longest length the file holds
    f = tmp_path_factory.mktemp("lengths") / "long_tail.txt"
    f.write_text("\n".join(map(str, x)))
    return f


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_and_configs_agree_on_the_same_batches(long_tail, tmp_path, capsys) -> None:
    table = pl.configs("llama3-70b", "h100-512", {"global_batch": 64}, lengths=long_tail, sample_batches=2,
                       predict_top=0, cp_sizes=(8,))
    assert table.batch.seq_length == 131072  # taken from the file (its longest entry), not 4096
    (row,) = [r for r in table.find(tp=8, pp=2, cp=8) if r.feasible]
    sched = row.scheduled
    assert sched["static"] > sched["dynamic"] > 0
    speedups, static, dyn = [], [], []
    for k, batch in enumerate(table.sampled):  # each configs batch, planned by compare on its own
        f = tmp_path / f"batch{k}.txt"
        f.write_text("\n".join(map(str, batch)))
        res = _json(capsys, ["compare", "--model", "llama3-70b", "--layout", LAYOUT, "--cluster", "h100-512",
                             "--lengths", str(f), "--gbs", str(batch.size), "--batches", "1", "--seq-length", "131072",
                             "--strategies", "packing,dynacp", "--json"])
        meta = res["metadata"]
        assert meta["cost"]["kind"] == "derived" and meta["cost"]["global_batch_packs"] == 64
        assert meta["cost"]["label"].startswith("cost: derived from llama3-70b on TP8/PP2/CP8/DP4, h100-512")
        speedups.append(res["strategies"]["dynacp"]["speedup_vs_packing"])
        static.append(res["strategies"]["packing"]["step_time_ms"] / 1e3)
        dyn.append(res["strategies"]["dynacp"]["step_time_ms"] / 1e3)
    # the same quantity: mean over the batches of packing / dynacp layout step time
    assert np.mean(speedups) == pytest.approx(sched["speedup"], rel=0.01)
    assert np.mean(static) == pytest.approx(sched["static"], rel=0.01)
    assert np.mean(dyn) == pytest.approx(sched["dynamic"], rel=0.01)
    assert sched["speedup"] > 1.02  # the long tail is priced: dynamic CP gains on it


def test_the_outputs_say_which_cost_model_and_what_is_predicted(capsys) -> None:
    assert main(["compare", "--gbs", "64", "--ranks", "16", "--batches", "1", "--strategies", "packing,fcp"]) == 0
    out = capsys.readouterr().out
    assert "cost: preset bytescale-fig6a (quick look, not your hardware" in out.splitlines()[0]
    assert "predicted: every step time" in out and "measured: solve times only" in out
    res = _json(capsys, ["compare", "--model", "llama3-8b", "--layout", "TP2/CP8", "--cluster", "h100-64",
                         "--lengths", "examples/lengths.txt", "--gbs", "256", "--batches", "1", "--json"])
    meta = res["metadata"]
    assert meta["cost"]["label"].startswith("cost: derived from llama3-8b on TP2/PP1/CP8/DP4, h100-64")
    assert meta["cluster"]["ranks"] == 32 and meta["cluster"]["ranks_per_node"] == 4  # DP x CP; 8 GPUs / TP
    assert meta["cost_source"] == "dynacp.planner layout model" and "solve" in meta["measured"]


def test_plan_with_a_layout_records_the_layout_step(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3-8b", "--layout", "TP1/PP2/CP8", "--cluster", "h100-64", "--lengths",
                 "examples/lengths.txt", "--gbs", "128", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    st = doc["settings"]
    assert st["cost"]["kind"] == "derived" and st["pp"] == 1 and st["cost"]["pipeline_stretch"] > 1
    assert st["layout_step_time"] == pytest.approx(doc["predicted"]["step_time"] * st["cost"]["pipeline_stretch"]
                                                   + st["cost"]["dp_seconds"])
    assert "cost: derived from llama3-8b" in capsys.readouterr().err


def test_layout_cost_api_prices_plans_like_the_commands() -> None:
    lengths = np.loadtxt("examples/lengths.txt", dtype=np.int64)[:256]
    lc = dynacp.layout_cost("llama3-8b", "TP2/CP8", "h100-64", [lengths])
    assert isinstance(lc, dynacp.LayoutCost)
    assert (lc.cluster.num_ranks, lc.pp, lc.vpp, lc.cost.name) == (32, 1, 1, "planner")
    assert lc.batch.seq_length == 18432  # the longest of these 256, 17,634, rounded up to a multiple of 1024
    assert 17408 < lengths.max() <= 18432
    p = dynacp.plan(lengths, lc.cluster, lc.cost, "dynacp", pp=lc.pp, vpp=lc.vpp)
    assert lc.step(p.predicted.step_time) == p.predicted.step_time * lc.stretch + lc.dp_seconds
    with pytest.raises(ValueError, match="memory: needs"):
        dynacp.layout_cost("llama3-70b", "TP1", "h100-64", [lengths])
    with pytest.raises(ValueError, match="longer than seq_length 4096"):
        dynacp.layout_cost("llama3-8b", "TP2/CP8", "h100-64", [lengths], seq_length=4096)


def test_layouts_are_read_and_checked() -> None:
    m, c = pl.model_preset("qwen3-30b-a3b"), pl.cluster_preset("h100-64")
    assert lcm.parse_layout("tp2/pp4x2/cp2/ep8", m, c) == pl.Layout(2, 4, 2, 4, 8, 1, 2, 2)
    assert lcm.parse_layout("TP2/PP4/VPP2/DP8", m, c).vpp == 2
    for bad, match in [("TP4/PP4/CP8", "does not divide the 64 GPUs"), ("TP2/DP4", "DP 4 is not"),
                       ("TP2/XX4", "cannot read 'XX4'"), ("TP2/TP4", "cannot read"), ("TP0", "degree >= 1")]:
        with pytest.raises(ValueError, match=match):
            lcm.parse_layout(bad, m, c)
    with pytest.raises(ValueError, match="EP / ETP apply to MoE models"):
        lcm.parse_layout("EP8", pl.model_preset("llama3-8b"), c)


def test_layout_flags_go_together_and_exclude_the_preset_flags(capsys) -> None:
    base = ["compare", "--batches", "1", "--gbs", "64"]
    assert main(base + ["--model", "llama3-8b"]) == 2
    assert "missing --layout, --cluster" in capsys.readouterr().err
    assert main(base + ["--model", "llama3-8b", "--layout", "TP2/CP8", "--cluster", "h100-64", "--ranks", "8",
                        "--cost", "h100-distca"]) == 2
    assert "--cost, --ranks cannot be given with --model/--layout/--cluster" in capsys.readouterr().err


# ---- item 2: no silent clipping ------------------------------------------------------------------------------------


def test_configs_takes_the_sequence_length_from_the_lengths_and_prices_the_tail(long_tail, capsys) -> None:
    table = pl.configs("llama3-70b", "h100-512", {"global_batch": 64}, lengths=long_tail, sample_batches=1,
                       predict_top=1)
    assert table.batch.seq_length == 131072 and not table.warnings
    assert max(int(b.max()) for b in table.sampled) > 8192  # the tail is in the batches, unclipped
    assert pl.configs("llama3-8b", "h100-64", {"global_batch": 8}, lengths="wikipedia", sample_batches=1,
                      predict_top=1).batch.seq_length == 131072  # an embedded distribution: its context window
    assert main(["configs", "--model", "llama3-70b", "--cluster", "h100-512", "--lengths", str(long_tail),
                 "--seq-length", "8192"]) == 2
    err = capsys.readouterr().err
    assert "sequences up to 131072 tokens, longer than --seq-length 8192" in err and "usage:" not in err
    with pytest.raises(ValueError, match="longer than --seq-length 8192"):
        pl.configs("llama3-70b", "h100-512", {"global_batch": 64, "seq_length": 8192}, lengths=long_tail)


def test_a_derived_sequence_length_rounds_up_to_1024() -> None:
    assert lcm.resolve_seq_length(100_001, None) == 100_352
    assert lcm.resolve_seq_length(2048, None) == 2048
    assert lcm.resolve_seq_length(100_001, 100_001) == 100_001
    with pytest.raises(ValueError, match="--seq-length 4097 or more, or leave --seq-length out to use 5120"):
        lcm.resolve_seq_length(4097, 4000)


# ---- item 3: units and sanity --------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, flag, byte_option", [
    (["compare", "--tokens-per-rank", "40e9"], "--tokens-per-rank 40000000000", "--activation-budget"),
    (["plan", "--tokens-per-rank", str(2**31)], "--tokens-per-rank 2147483648", "--activation-budget"),
    (["configs", "--model", "llama3-8b", "--cluster", "h100-64", "--seq-length", "80e9"], "--seq-length 80000000000",
     "gpu_memory"),
])
def test_a_byte_count_in_a_token_flag_names_the_byte_option(argv, flag, byte_option, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "looks like a byte count" in err and byte_option in err
    assert "usage:" not in err


def test_token_counts_below_the_threshold_and_byte_budgets_are_accepted(capsys) -> None:
    res = _json(capsys, ["compare", "--tokens-per-rank", "16e3", "--gbs", "64", "--ranks", "16", "--batches", "1",
                         "--strategies", "fcp", "--json"])
    assert res["metadata"]["cluster"]["tokens_per_rank"] == 16000
    res = _json(capsys, ["compare", "--activation-budget", "20e9", "--gbs", "64", "--ranks", "16", "--batches", "1",
                         "--strategies", "fcp", "--json"])
    cost = dynacp.preset("bytescale-fig6a")
    assert res["metadata"]["cluster"]["tokens_per_rank"] == cost.token_capacity(dynacp.Cluster(
        num_ranks=16, activation_budget=20e9, tokens_per_rank=0))
    assert main(["compare", "--activation-budget", "20e9", "--tokens-per-rank", "8192", "--batches", "1"]) == 2
    assert "give the activation budget once" in capsys.readouterr().err


def test_a_pool_larger_than_the_batch_warns_with_the_numbers(caplog, capsys) -> None:
    with caplog.at_level(logging.WARNING, logger="dynacp"):
        assert main(["compare", "--ranks", "2048", "--gbs", "64", "--batches", "1", "--strategies", "fcp,dynacp",
                     "--json"]) == 0
    text = caplog.text
    assert "the pool has 2048 ranks but a batch holds 64 sequences: 1984 more ranks than sequences" in text
    assert "most of the pool is idle: on batch 0 the fastest plan (dynacp) leaves" in text and "of 2048 ranks" in text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dynacp"):
        assert main(["compare", "--ranks", "16", "--gbs", "256", "--batches", "1", "--strategies", "fcp",
                     "--json"]) == 0
    assert "idle" not in caplog.text and "more ranks than sequences" not in caplog.text


def test_idle_is_judged_on_the_fastest_plan() -> None:
    from dynacp.commands.common import warn_idle

    # a slow strategy spreading over every rank does not hide that the fastest plan needs few of them
    assert warn_idle({"slow": [(7.5, 0)], "fast": [(0.15, 900)]}, 1000)
    assert not warn_idle({"slow": [(7.5, 900)], "fast": [(0.15, 100)]}, 1000)
    assert not warn_idle({"a": [(1.0, 5)]}, 10)  # exactly half idle: not "most"
    assert warn_idle({"a": [(1.0, 0), (1.0, 6)]}, 10)  # any batch


def test_training_options_price_both_commands_alike(tmp_path, capsys) -> None:
    table = pl.configs("llama3-8b", "h100-64", {"global_batch": 64}, lengths="examples/lengths.txt",
                       sample_batches=1, predict_top=0, cp_sizes=(4,), recompute="full", fp8=True)
    (row,) = [r for r in table.find(tp=2, pp=1, cp=4) if r.feasible]
    f = tmp_path / "batch.txt"
    f.write_text("\n".join(map(str, table.sampled[0])))
    argv = ["compare", "--model", "llama3-8b", "--layout", "TP2/CP4", "--cluster", "h100-64", "--lengths", str(f),
            "--gbs", str(table.sampled[0].size), "--batches", "1", "--seq-length", str(table.batch.seq_length),
            "--strategies", "packing,dynacp", "--json"]
    res = _json(capsys, argv + ["--recompute", "full", "--fp8"])
    assert res["strategies"]["dynacp"]["speedup_vs_packing"] == pytest.approx(row.scheduled["speedup"], rel=0.01)
    assert res["strategies"]["dynacp"]["step_time_ms"] / 1e3 == pytest.approx(row.scheduled["dynamic"], rel=0.01)
    plain = _json(capsys, argv + ["--recompute", "full"])  # without --fp8 the layout is priced differently
    assert plain["strategies"]["dynacp"]["step_time_ms"] != res["strategies"]["dynacp"]["step_time_ms"]
    assert main(["compare", "--batches", "1", "--gbs", "64", "--fp8"]) == 2
    assert "give them with --model, --layout and --cluster" in capsys.readouterr().err
