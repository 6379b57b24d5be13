"""Issue 22 and 37 acceptance: the planner against published H100 training runs (docs/planner.md, "Validation
against published runs"). Every row must be feasible, rank in the top 5 distinct layouts and be predicted within
its round's tolerance of the published tokens/s/GPU (+-25 % for the issue-22 rows the planner was tuned on, +-35 %
for the issue-37 rows held out from it); the rows that do not are listed in KNOWN_SHORTFALLS with the reason, as
strict xfails (they fail the test suite the moment they start to pass, so the list cannot go stale)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

import pytest

from dynacp.planner import validation as V

ROOT = Path(__file__).resolve().parents[2]

# run key -> why the planner does not confirm it (kept in sync with docs/planner.md)
KNOWN_SHORTFALLS: Dict[str, str] = {
    "Llama3-405B x8192": "rejected on memory (84.6 GB > 78.2 GB): none of the Llama 3 paper's stated measures "
                         "(Sec. 3.3.2: FSDP sharding, one layer less on the first and last stages, V = 8 one-layer "
                         "chunks, N >= PP, deallocated stage inputs and outputs) brings Megatron-Core's per-layer "
                         "activations of 141 in-flight chunks under the usable memory, and the paper states no "
                         "recompute",
    "Qwen3-235B-A22B": "rank 15: the host floor puts the first 16 within 2.4 %; without it the published layout "
                       "still ranks 16th (EP16 crosses fewer nodes), so the rank is a near-tie the model cannot "
                       "resolve, not the floor alone",
    "Qwen3-235B-A22B GBS2048": "rank 15, as Qwen3-235B-A22B",
    "DeepSeek-V3": "rank 7: six layouts (EP16/EP32, PP16) within 6 % are predicted ahead of the published EP64",
    "Qwen3-30B-A3B mbs2": "predicted 2.31x: the host floor is per micro-batch, so micro-batch 2 halves it; the "
                          "published throughput is about the micro-batch-1 row's, which a per-launch floor cannot "
                          "reproduce and no source explains",
    "GPT-OSS-120B mbs1": "rank 7: the host floor binds on most layouts (PP 1 and EP 32/64 ahead, within 2 %), the "
                         "near-tie of the Qwen3 rows",
    "GPT-OSS-120B mbs4": "rejected on memory (102.5 GB): the row's 25.11 recipe is not published; the current "
                         "H100 recipe (layernorm and moe_act recompute) runs micro-batch 1",
    "Qwen3-235B-A22B tokendrop": "rank 15, as Qwen3-235B-A22B",
}


@pytest.fixture(scope="module")
def verdicts() -> Dict[str, V.Verdict]:
    return {v.run.key: v for v in V.validate()}


def _rows() -> List:
    out = []
    for run in V.published_runs():
        marks = []
        if run.key in KNOWN_SHORTFALLS:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_SHORTFALLS[run.key]))
        out.append(pytest.param(run.key, marks=marks, id=run.key))
    return out


@pytest.mark.parametrize("key", _rows())
def test_published_layout_is_feasible_top5_and_within_tolerance(verdicts, key: str) -> None:
    v = verdicts[key]
    assert v.feasible, v.reason
    assert v.rank is not None and v.rank <= 5, f"rank {v.rank} of {v.feasible_count}; first choice {v.best}"
    bound = V.TOLERANCE[v.run.added]
    assert 1 - bound <= v.ratio <= 1 + bound, f"predicted {v.predicted:.0f} vs published {v.run.tokens_per_gpu_s:.0f}"
    if v.run.added == V.ROUND_ISSUE22:  # the tuned-on rows keep issue 22's bound
        assert 0.75 <= v.ratio <= 1.25


def test_table_covers_dense_and_moe_from_8_to_16384_gpus(verdicts) -> None:
    runs = [v.run for v in verdicts.values()]
    assert min(r.gpus for r in runs) == 8 and max(r.gpus for r in runs) == 16384
    moe = [r for r in runs if r.ep > 1]
    assert len(moe) >= 3 and len(runs) - len(moe) >= 12
    assert all(r.source for r in runs)
    # the converted figures say how: Llama 3's TFLOPs/GPU through the planner's FLOP count
    assert all("TFLOPs/GPU" in r.derived for r in runs if "Llama 3 paper" in r.source)
    passing = [v for v in verdicts.values() if v.passes]
    assert len(passing) >= 25
    assert set(verdicts) - {v.run.key for v in passing} == set(KNOWN_SHORTFALLS)


def test_rounds_say_which_rows_were_tuned_on(verdicts) -> None:
    """17 issue-22 rows (tuned on) come first, then the issue-37 rows added before its model changes: BF16 and FP8,
    dense and MoE (one interleaved), 16 to 6,144 GPUs, each from a source none of the issue-22 rows uses or from
    another container / batch of it."""
    runs = V.published_runs()
    old = [r for r in runs if r.added == V.ROUND_ISSUE22]
    new = [r for r in runs if r.added == V.ROUND_ISSUE37]
    assert len(old) == 17 and runs[:17] == old and len(new) == 14
    assert {r.fp8 for r in new} == {True, False} and any(r.ep > 1 and r.vpp for r in new)
    assert min(r.gpus for r in new) == 16 and max(r.gpus for r in new) == 6144
    old_keys = {(r.model_name, r.gpus, r.global_batch, r.micro_batch, r.seq_length, r.tp, r.pp, r.cp, r.ep)
                for r in old}
    assert not old_keys & {(r.model_name, r.gpus, r.global_batch, r.micro_batch, r.seq_length, r.tp, r.pp, r.cp,
                            r.ep) for r in new}


def test_second_held_out_round() -> None:
    """Issue 37's second pass added five Megatron-Bridge H100 rows (2026-12-03, before its model changes): after the
    first two rounds, each a layout, container or MoE routing mode (token-drop) none of them has, every option one
    the table or its recipe states. GPT-OSS-120B is given inline: 116.8B parameters, 5.13B active, as its model card
    states (116.83B, 5.13B)."""
    from dynacp.planner.memory import param_counts
    from dynacp.planner.presets import resolve_model
    from dynacp.planner.timing import linear_flops_per_token

    runs = V.published_runs()
    new = [r for r in runs if r.added == V.ROUND_ISSUE37B]
    assert runs[-len(new):] == new and len(new) == 5 and V.TOLERANCE[V.ROUND_ISSUE37B] == 0.35
    assert all("Megatron-Bridge" in r.source for r in new)
    earlier = {(r.model_name, r.gpus, r.global_batch, r.micro_batch, r.tp, r.pp, r.ep, r.tokens_per_gpu_s)
               for r in runs if r.added != V.ROUND_ISSUE37B}
    assert not earlier & {(r.model_name, r.gpus, r.global_batch, r.micro_batch, r.tp, r.pp, r.ep,
                           r.tokens_per_gpu_s) for r in new}
    assert {r.options.get("optimizer") for r in new if r.ep == 1} == {"zero3"}  # FSDP 8
    oss = resolve_model(V.GPT_OSS_120B)
    assert param_counts(oss).total == pytest.approx(116.8e9, rel=1e-3)
    assert sum(linear_flops_per_token(oss)) / 6 == pytest.approx(5.13e9, rel=1e-3)


def test_megatron_r08_flop_count_reproduces_nemo_pairs() -> None:
    """The TFLOP/s -> tokens/s conversion of the held-out rows reproduces NeMo 24.07's own pairs of columns: Llama 2
    7B 780 TFLOP/s at 16,934 tokens/s, GPT-3 175B 771 at 716."""
    from dynacp.planner.presets import model_preset

    assert V.megatron_r08_flops_per_token(model_preset("llama2-7b"), 4096) == pytest.approx(780e12 / 16934, rel=1e-3)
    assert V.megatron_r08_flops_per_token(model_preset("gpt3-175b"), 2048) == pytest.approx(771e12 / 716, rel=1e-3)


def test_llama3_8192_memory_term_by_term(verdicts) -> None:
    """What the 8,192-GPU row is charged, term by term. Its FSDP shards gradients and optimizer states (zero2:
    4 + 12 B per parameter / DP 64); the bf16 weights are whole, as FSDP without resharding after the forward keeps
    them; 141 one-layer chunks on the second stage (interleaved 1F1B, N = PP = 16, V = 8, 32 micro-batches) of
    Megatron-Core's 8h + 4h_q + 4h_kv + 6f bytes per token and layer / TP: 83.8 GB, over the 78.2 GB usable. Issue
    22 gave the row recompute_layernorm and recompute_mlp_act, inferred from the LLaMA 1 paper's hand-written backward
    (4h + 4h_q + 4h_kv + 4f, 58.9 GB); the Llama 3 paper does not state that saving, so issue 37 removed it and the
    row is a known shortfall."""
    v = verdicts["Llama3-405B x8192"]
    assert v.run.options == {"optimizer": "zero2", "allow_uneven_pp": True}
    assert not v.feasible and v.reason.startswith("memory: needs 84.6 GB > 78.2 GB usable")
    mem = v.row.memory
    assert mem.stage == "middle" and mem.layers == 8 and mem.in_flight * 8 == pytest.approx(141)
    assert mem.weights == pytest.approx(2 * mem.params_dense)
    assert mem.grads == pytest.approx(4 * mem.params_dense / 64)
    assert mem.optimizer == pytest.approx(12 * mem.params_dense / 64)
    assert mem.activations / (141 * 8192) == pytest.approx(520192 / 8)
    inferred = V.validate_run(v.run, recompute_layernorm=True, recompute_mlp_act=True)
    assert inferred.feasible and inferred.row is not None
    h, h_kv, f = 16384, 8 * 128, 53248
    kept = inferred.row.memory
    per_token_layer = kept.activations / (kept.in_flight * kept.layers * 8192)
    assert per_token_layer == pytest.approx((4 * h + 4 * h + 4 * h_kv + 4 * f) / 8)  # 43,520 B
    assert kept.total == pytest.approx(59.7e9, abs=0.05e9) and kept.total < 0.92 * V.H100_MEMORY
    # no reading of the schedule fits: even p stage-micro-batches (the v -> infinity limit of interleaved 1F1B with
    # N >= PP, 128 one-layer chunks instead of 141) leave 77.6 GB, and V = 8 is the most a 126 + 2-slot model has
    bound = mem.total - mem.activations * (1 - 128 / 141)
    assert bound == pytest.approx(77.6e9, abs=0.05e9)


def test_llama3_70b_pp8_ranks_fifth_because_the_backward_working_set_rejects_tp4_pp4() -> None:
    """Issue 37: TP4/PP4 x 5/CP1 (ranked 2nd before) needed 78.05 GB of the 78.2 usable; one layer's backward
    gradients (0.47 GB: memory.backward_working_bytes) take it over, so the published PP8 layout ranks 5th."""
    run = next(r for r in V.published_runs() if r.key == "Llama3-70B PP8")
    from dynacp.planner.configs import configs

    table = configs(run.model, V.h100_cluster(64), {"global_batch": 128, "micro_batch": 1, "seq_length": 8192},
                    {"fp8": True, "max_vpp": 5, **run.options})
    (row,) = table.find(tp=4, pp=4, cp=1, dp=4, vpp=5)
    usable = 0.92 * V.H100_MEMORY
    assert row.reason.startswith("memory:") and row.memory.backward == pytest.approx(0.4698e9, rel=1e-3)
    assert row.memory.total - row.memory.backward < usable < row.memory.total


def test_llama3_table4_conversion() -> None:
    """430 TFLOPs/GPU at 8K: 6 x 405B-ish GEMM parameters plus causal attention is ~2.52 TFLOP per token."""
    tokens, text = V._llama3_tokens(430, 8192)
    assert tokens == pytest.approx(430e12 / 2.524e12, rel=1e-3)
    assert "2.524 TFLOP per token" in text


def test_docs_table_is_the_generated_one(verdicts) -> None:
    """docs/planner.md holds exactly what tools/planner_validation.py prints."""
    doc = (ROOT / "docs" / "planner.md").read_text()
    table = V.markdown(list(verdicts.values()))
    assert table in doc
    assert "python3 tools/planner_validation.py" in doc
    for key in KNOWN_SHORTFALLS:
        assert re.search(re.escape(key), doc), key
