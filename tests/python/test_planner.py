"""Parallel-configuration planner (issue #6): seed 003's worked example, the real model's rejections, parity with
Megatron's theoretical memory formula and the ZeRO paper, bad input, the CLI and the scheduler-based prediction."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import dynacp.planner as pl
from dynacp.planner import cli as planner_cli
from dynacp.planner.memory import memory_breakdown, params_per_gpu
from dynacp.planner.timing import bubble_fractions, tp_message_volume

SEED_BATCH = pl.BatchConfig(global_batch=80, seq_length=49152, micro_batch=1)
# The seed's own assumptions: ETP = 1, EP | DP, no CP in the search, bf16 grads with a ZeRO-1 style optimizer, and
# the full recompute + chunked cross-entropy its TP1/PP1 plan needs to fit (planner_anchors.md 1.5).
SEED_OPTIONS = dict(etp="1", ep_divides_dp=True, cp_sizes=(1,), grad_dtype="bf16", recompute="full", chunked_ce=True)


def _layout(tp: int, ep: int, pp: int = 1, cp: int = 1, etp: int = 1, world: int = 40) -> pl.Layout:
    return pl.Layout(tp, pp, cp, world // (tp * pp * cp), ep, etp, 1, world // (etp * ep * pp))


def _opts(**kw) -> pl.PlannerOptions:
    o = pl.PlannerOptions(**kw)
    o.validate()
    return o


# ---- acceptance 1: the seed's table under the seed's assumptions -----------------------------------------------


@pytest.mark.parametrize(
    "tp,ep,billions",
    [(1, 8, 6.91), (2, 5, 7.87), (2, 4, 9.47), (4, 5, 7.14), (5, 8, 4.59), (8, 5, 6.78)],
)
def test_seed_per_gpu_params_x_over_tp_plus_e_over_ep(tp: int, ep: int, billions: float) -> None:
    dense, expert = params_per_gpu(pl.model_preset("seed-35b-moe"), _layout(tp, ep))
    # the seed truncates 9.475 to 9.47; every other figure is rounded
    assert abs((dense + expert) / 1e9 - billions) < 0.006


def test_seed_weights_optimizer_bubble_and_tp_volume() -> None:
    model = pl.model_preset("seed-35b-moe")
    mem = memory_breakdown(model, SEED_BATCH, _layout(1, 8), _opts(**SEED_OPTIONS), m=2)
    assert mem.weights / 1e9 == pytest.approx(13.8, abs=0.05)  # 6.9125B x 2 B
    assert mem.optimizer_dense / 1e9 == pytest.approx(0.87, abs=0.005)  # 2.9e9 x 12 / DP 40
    assert mem.optimizer_expert / 1e9 == pytest.approx(9.63, abs=0.005)  # 4.0125e9 x 12 / EDP 5
    # the seed's m = 2 bubbles, (p-1)/(m+p-1) of the total, and the other definition (p-1)/m
    assert [round(bubble_fractions(p, 2)[0], 2) for p in (2, 4, 5)] == [0.33, 0.60, 0.67]
    assert [bubble_fractions(p, 2)[1] for p in (2, 4, 5)] == [0.5, 1.5, 2.0]
    # 4 all-reduces x 48 layers x 49152 x 2048 x 2 B at TP 2
    assert tp_message_volume(model, SEED_BATCH, _layout(2, 4)) / 1e9 == pytest.approx(38.65, abs=0.01)


def test_seed_choice_is_tp1_pp1_ep8_dp40() -> None:
    table = pl.configs("seed-35b-moe", "seed-40xh20", SEED_BATCH, SEED_OPTIONS)
    best = table.best
    assert best is not None
    assert (best.layout.tp, best.layout.pp, best.layout.cp, best.layout.ep, best.layout.dp) == (1, 1, 1, 8, 40)
    assert best.time.microbatches == 2 and best.memory.total < table.cluster.gpu_memory * 0.8
    # model states with bf16 grads: 13.8 + 13.8 + 10.5 = 38.1 GB (planner_anchors.md 1.3)
    assert best.memory.model_states / 1e9 == pytest.approx(38.1, abs=0.1)
    # the planner flags the seed's layer count: 48 layers of 256 x 3 x 2048 x 512 experts are 38.65B, not 32.1B
    assert any("38.65B" in w and "num_layers" in w for w in table.warnings)
    # without chunked cross-entropy the 49k x 248k fp32 logits (~49 GB, anchors 1.5) push TP1/PP1 over the limit
    unchunked = pl.configs("seed-35b-moe", "seed-40xh20", SEED_BATCH, {**SEED_OPTIONS, "chunked_ce": False})
    (row,) = [r for r in unchunked.find(tp=1, pp=1, ep=8)]
    assert not row.feasible and row.reason.startswith("memory:") and row.memory.logits / 1e9 > 45


def test_anchor_etp_table_model_states() -> None:
    """planner_anchors.md 1.3: 6 + 12/d model states for TP2/EP4 with ETP = 1 (EDP 10) vs ETP = TP (EDP 5)."""
    model = pl.model_preset("seed-35b-moe")
    opts = _opts(grad_dtype="fp32")
    etp1 = memory_breakdown(model, SEED_BATCH, _layout(2, 4, etp=1), opts, m=4)
    etp2 = memory_breakdown(model, SEED_BATCH, _layout(2, 4, etp=2), opts, m=4)
    assert etp1.model_states / 1e9 == pytest.approx(67.3, abs=0.1)
    assert etp2.model_states / 1e9 == pytest.approx(43.3, abs=0.1)


# ---- acceptance 2: the real structure -----------------------------------------------------------------------------


def test_real_structure_rejects_ep5_and_tp5_and_derives_m_from_dp() -> None:
    # ep_in_node is off by default since issue 22 (EP may span nodes); the seed's table applies it
    table = pl.configs("qwen3.5-35b-a3b", "seed-40xh20", SEED_BATCH,
                       dict(grad_dtype="bf16", recompute="full", chunked_ce=True, ep_in_node=True))
    ep5 = table.find(ep=5)
    assert ep5 and all(not r.feasible and "experts % EP: EP 5 does not divide 256 experts" in r.reason for r in ep5)
    assert all("EP in node" in r.reason for r in ep5)
    tp5 = table.find(tp=5)
    assert tp5 and all("heads % TP: TP 5 does not divide 16 attention heads" in r.reason for r in tp5)
    assert all("TP in node" in r.reason for r in tp5)
    # 40 layers: PP 5 divides them (the seed's 48 did not)
    assert not any("layers % PP" in r.reason for r in table.find(pp=5))
    assert all("layers % PP" in r.reason for r in pl.configs(
        "seed-35b-moe", "seed-40xh20", SEED_BATCH, SEED_OPTIONS).find(pp=5))
    # m = GBS / (mbs x DP) with DP = 40 / (TP PP CP): bubbles 20% / 27% / 29% at TP1, PP 2 / 4 / 5 (anchors 1.4)
    for pp, m, bubble in [(2, 4, 0.20), (4, 8, 0.27), (5, 10, 0.29)]:
        rows = [r for r in table.find(tp=1, pp=pp, cp=1, vpp=1) if r.time is not None]
        assert rows, pp
        for r in rows:
            assert r.time.microbatches == m == 80 // r.layout.dp
            assert round(r.time.bubble_of_total, 2) == bubble
            assert r.time.bubble_vs_ideal == pytest.approx((pp - 1) / m)
    # TP traffic with the real 40 layers: 32.2 GB per micro-batch at TP 2
    assert tp_message_volume(table.model, SEED_BATCH, _layout(2, 4)) / 1e9 == pytest.approx(32.2, abs=0.05)
    # the EP all-to-all is priced: ~225 GB per micro-batch per GPU at TP1/EP8, 4 a2a x 40 layers (anchors 1.4)
    opts = _opts(grad_dtype="bf16", recompute="selective")
    t = pl.step_time(table.model, table.cluster, SEED_BATCH, _layout(1, 8), opts)
    assert t.ep_volume / 1e9 == pytest.approx(225.5, rel=0.01)
    assert t.ep_comm > 0 and t.tp_comm == 0


# ---- acceptance 3: dense memory vs Megatron's theoretical memory formula -------------------------------------------

MIB = 1024 * 1024


def megatron_theoretical_memory(L: int, h: int, a: int, V: int, t: int, p: int, s: int, b: int, m: int) -> tuple:
    """Transcription of megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM, the version before MoE
    support: GPT with MHA, 4h GeLU MLP, tied embeddings, distributed optimizer with DP 1, SP + selective recompute).
    Returns (weight and optimizer MiB, activation MiB)."""
    ffn = 4 * h
    layers = 2 * L * h * h * (1 + ffn / h + 1 + 2 / h + 1 / (L * h))
    most_loaded = (layers / p + h * V) / t
    weight_and_optimizer = most_loaded * (6 + 12 / 1)
    act = s * b * h * (18 + 4 * ffn / h) * L + 8 * s * b * p + s * b * h * p
    if p > 1:
        act *= min(1, m / p)
    else:
        act += s * b * h * 4 * (1 + V / h)
    return weight_and_optimizer / MIB, act / t / MIB


# Korthikanti et al. 2022 (arXiv 2205.05198) Table 3 shapes and TP/PP, sequence 2048, vocab 51200; micro batch 1 and
# one micro-batch per GPU in the global batch (DP 1). Figures: Megatron's formula, MiB (weight+optimizer, activation).
MEGATRON_CASES = [
    ("22B", 48, 6144, 64, 8, 1, 4, 47333.56, 2505.50),
    ("175B", 96, 12288, 96, 8, 8, 64, 48007.27, 9816.02),
    ("530B", 105, 20480, 128, 8, 35, 280, 34650.53, 18025.07),
    ("1T", 128, 25600, 160, 8, 64, 512, 36562.94, 27600.12),
]


@pytest.mark.parametrize("name,L,h,a,tp,pp,gbs,wo_mib,act_mib", MEGATRON_CASES)
def test_dense_memory_matches_megatron(name, L, h, a, tp, pp, gbs, wo_mib, act_mib) -> None:
    ref_wo, ref_act = megatron_theoretical_memory(L, h, a, 51200, tp, pp, 2048, 1, gbs)
    assert (ref_wo, ref_act) == (pytest.approx(wo_mib, abs=0.01), pytest.approx(act_mib, abs=0.01))
    model = pl.ModelConfig(num_layers=L, hidden_size=h, num_attention_heads=a, vocab_size=51200, ffn_hidden_size=4 * h,
                           gated_mlp=False, tied_embeddings=True, dropout=True, name=name)
    batch = pl.BatchConfig(global_batch=gbs, seq_length=2048, micro_batch=1)
    opts = _opts(optimizer="distributed", grad_dtype="fp32", recompute="selective", flash_attention=False,
                 nccl_buffer_bytes=0.0)
    mem = memory_breakdown(model, batch, pl.Layout(tp, pp, 1, 1), opts, m=gbs)
    # replicated LayerNorm weights are not divided by TP here (Megatron divides them): < 0.1% apart
    assert mem.model_states / MIB == pytest.approx(wo_mib, rel=1e-3)
    assert (mem.activations + mem.logits) / MIB == pytest.approx(act_mib, rel=1e-6)
    assert mem.stage in ("only", "first")


@pytest.mark.parametrize("stage,gb", [("zero0", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_zero_paper_example(stage: str, gb: float) -> None:
    """ZeRO paper (arXiv 1910.02054) Fig. 1: 7.5B parameters, DP 64: 120 / 31.4 / 16.6 / 1.9 GB of model states."""
    model = pl.ModelConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, vocab_size=32000,
                           ffn_hidden_size=16384, non_expert_params=7.5e9)
    batch = pl.BatchConfig(global_batch=64, seq_length=1024)
    mem = memory_breakdown(model, batch, pl.Layout(1, 1, 1, 64), _opts(optimizer=stage, grad_dtype="bf16"), m=1)
    assert mem.model_states / 1e9 == pytest.approx(gb, abs=0.05)


# ---- acceptance 4: bad input ----------------------------------------------------------------------------------------


def test_bad_inputs_name_the_problem(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"world_size 48 is not num_nodes x gpus_per_node = 5 x 8 = 40"):
        pl.configs("llama3-8b", dict(num_nodes=5, gpus_per_node=8, gpu_memory=80e9, peak_flops=1e15, world_size=48))
    bad = dict(json.loads((pl.presets.PRESET_DIR / "llama3-8b.json").read_text())["config"], num_layers=0)
    with pytest.raises(ValueError, match=r"ModelConfig.num_layers must be a positive number, got 0"):
        pl.configs(bad, "h100-64")
    missing = tmp_path / "model.json"
    missing.write_text(json.dumps({"num_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}))
    with pytest.raises(ValueError, match=r"model file .*model.json is missing required field\(s\): hidden_size"):
        pl.configs(missing, "h100-64")
    with pytest.raises(ValueError, match=r"unknown field\(s\) hidden"):
        pl.ModelConfig.from_dict({"num_layers": 2, "hidden": 8, "hidden_size": 8, "num_attention_heads": 2,
                                  "vocab_size": 10, "ffn_hidden_size": 8})
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt-9'"):
        pl.configs("gpt-9", "h100-64")
    with pytest.raises(ValueError, match=r"PlannerOptions.recompute must be one of"):
        pl.configs("llama3-8b", "h100-64", recompute="some")
    with pytest.raises(ValueError, match=r"top_k must be in \[1, num_experts=8\]"):
        pl.ModelConfig(num_layers=2, hidden_size=8, num_attention_heads=2, vocab_size=10, num_experts=8,
                       expert_ffn_hidden_size=4).validate()


def test_cli_reports_errors_with_exit_2(tmp_path, capsys) -> None:
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps({"num_nodes": 2, "gpus_per_node": 8, "gpu_memory": 80e9}))
    assert planner_cli.main(["--model", "llama3-8b", "--cluster", str(f)]) == 2
    assert "missing required field(s): peak_flops" in capsys.readouterr().err


# ---- the table, the CLI and speed ------------------------------------------------------------------------------------


def test_dense_table_ranks_and_explains() -> None:
    t0 = time.perf_counter()
    table = pl.configs("llama3-70b", "h100-64", {"global_batch": 512, "seq_length": 8192}, max_vpp=2)
    assert time.perf_counter() - t0 < 1.0
    assert table.rows and table.rejected
    steps = [r.step for r in table.rows]
    # ranked by step time, up to the tie tolerance (ties go to the layout with more memory headroom)
    assert steps[0] <= min(steps) * (1 + table.options.tie_tolerance)
    assert steps[-1] >= steps[len(steps) // 2] >= steps[0]
    for r in table.rows:
        assert r.memory.total <= table.cluster.gpu_memory * table.options.memory_headroom and r.feasible
        assert r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp == 64
    for r in table.rejected:
        assert r.reason and "\n" not in r.reason
    # a 70B model does not fit without model parallelism
    (dp64,) = table.find(tp=1, pp=1, cp=1)
    assert dp64.reason.startswith("memory: needs")
    text = table.format(top=5)
    assert "(p-1)/(v m + p - 1)" in text and "(p-1)/(v m)" in text and "rejections by rule" in text


def test_enumeration_is_fast_for_40_gpus() -> None:
    t0 = time.perf_counter()
    table = pl.configs("qwen3.5-35b-a3b", "seed-40xh20", SEED_BATCH, max_vpp=2)
    assert time.perf_counter() - t0 < 1.0
    assert len(table.rows) + len(table.rejected) > 500


def test_cli_text_and_json(capsys) -> None:
    args = ["--model", "seed-35b-moe", "--cluster", "seed-40xh20", "--global-batch", "80", "--seq-length", "49152",
            "--etp", "1", "--ep-divides-dp", "--cp", "1", "--recompute", "full", "--chunked-ce", "--grad-dtype", "bf16"]
    assert planner_cli.main([*args, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "TP1/PP1/CP1/EP8/ETP1/DP40" in out.splitlines()[4]
    assert planner_cli.main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    best = res["feasible"][0]
    assert (best["tp"], best["ep"], best["dp"]) == (1, 8, 40)
    assert set(best["memory"]) >= {"weights", "grads", "optimizer", "activations", "logits", "buffers", "total"}
    assert all(r["reason"] for r in res["rejected"])
    assert planner_cli.main([*args, "--rejected"]) == 0
    assert "rejected TP1/PP1/CP1/EP5/ETP1/DP40: experts % EP" in capsys.readouterr().out


def test_dynacp_cli_has_configs_when_wired(capsys) -> None:
    from dynacp import cli

    if "configs" not in cli.SUBCOMMANDS:
        pytest.skip("dynacp.cli does not wire 'configs' yet")
    assert cli.main(["configs", "--model", "llama3-8b", "--cluster", "h100-64", "--top", "2"]) == 0
    assert "llama3-8b on h100-64" in capsys.readouterr().out


# ---- length distributions and the scheduler ------------------------------------------------------------------------


def test_length_distribution_prediction(tmp_path) -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(7.5, 1.2, 4000).astype(np.int64), 16, 32768)
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(map(str, lengths)))
    batch = {"global_batch": 32, "seq_length": 32768}
    fixed = pl.configs("llama3-8b", "h100-64", batch)
    table = pl.configs("llama3-8b", "h100-64", batch, lengths=f, sample_batches=1, predict_top=4)
    assert table.strategies["static"] == "packing" and table.lengths.startswith("lengths.txt")
    top = table.rows[:4]
    for r in top:
        assert r.scheduled["static"] > 0 and r.scheduled["dynamic"] > 0
        assert r.step == r.scheduled["dynamic"]
    # real lengths: sum s^2 is far below B x s^2, so the analytic attention time drops
    (a,) = [r for r in fixed.rows if r.layout == top[0].layout]
    assert top[0].time.compute < a.time.compute
    assert all(not r.scheduled for r in table.rows[4:])
    assert "static s" in table.format(top=4)
    # arrays work too, and a wrong spec is named
    assert pl.configs("llama3-8b", "h100-64", batch, lengths=lengths, sample_batches=1, predict_top=1).rows
    with pytest.raises(ValueError, match="neither a file nor an embedded distribution"):
        pl.configs("llama3-8b", "h100-64", batch, lengths="no-such-dist")
