"""Issue 37, item 5: the planner's per-GPU memory terms against Megatron-LM's theoretical memory estimate
(megatron/training/theoretical_memory_usage.py, NVIDIA/Megatron-LM at d98e8a64: compute_weight_and_optimizer_memory
and compute_activation_memory, the sequence-parallel + selective-recompute path), term by term, on eight
configurations: dense GPT shapes of Korthikanti et al. with 1F1B, interleaving and m < p, a GQA + SwiGLU model
without dropout, a Llama-like model at PP 1 with its logits, and two MoE models with EP, ETP and expert data
parallelism (one with MTP and shared experts).

`megatron_estimate` is this test's own re-derivation of that file's formulas (not a copy): the same parameter
classes (TP-sharded, replicated, expert-sharded) on the most-loaded shard, 18 B or 6 + 12/d B per parameter, and
(18 + 4 f/h) s b h bytes per layer plus the embedding terms and Megatron's pipeline factors. Where the planner
deliberately differs (GQA widths, the gated MLP's second fc1 half, no dropout masks, FP8 weight copies, MoE
activations, DP x CP sharding), the test asserts the exact difference; docs/planner.md's memory-term table gives each
difference with its source."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import pytest

import dynacp.planner as pl
from dynacp.planner.memory import activation_bytes, memory_breakdown

MIB = 1024 * 1024


@dataclasses.dataclass
class MArgs:
    """The Megatron arguments the estimate reads (names as in megatron/training/arguments.py)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    padded_vocab_size: int
    seq_length: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    world_size: int
    micro_batch_size: int = 1
    num_query_groups: Optional[int] = None
    kv_channels: Optional[int] = None
    swiglu: bool = False
    normalization: str = "LayerNorm"
    untie_embeddings_and_output_weights: bool = False
    virtual_pipeline_model_parallel_size: Optional[int] = None
    num_experts: Optional[int] = None
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 1
    moe_shared_expert_intermediate_size: Optional[int] = None
    first_k_dense: int = 0
    mtp_num_layers: int = 0
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // (self.tensor_model_parallel_size * self.pipeline_model_parallel_size)


def megatron_estimate(a: MArgs, num_microbatches: Optional[int]) -> Dict[str, float]:
    """Megatron's estimate in bytes for the most-loaded (first) pipeline stage, split into its terms."""
    h, L, t, p = a.hidden_size, a.num_layers, a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    g = a.num_query_groups or a.num_attention_heads
    q = (a.kv_channels or h // a.num_attention_heads) * a.num_attention_heads
    gate = 1.5 if a.swiglu else 1.0
    norm = 1 if a.normalization == "RMSNorm" else 2
    attn = 2 * h * h * (1 + g / a.num_attention_heads) * q / h
    mlp = 2 * h * a.ffn_hidden_size * gate
    n_moe = 0 if a.num_experts is None else L - a.first_k_dense
    n_dense = L - n_moe
    shared = 2 * h * (a.moe_shared_expert_intermediate_size or 0) * gate
    routed = 2 * h * a.moe_ffn_hidden_size * (a.num_experts or 0) * gate
    router = h * (a.num_experts or 0)
    ln = 2 * h * norm
    mtp_moe = a.mtp_num_layers if n_moe else 0
    mtp_dense = a.mtp_num_layers - mtp_moe
    emb = h * a.padded_vocab_size
    tp_block = (attn + mlp) * n_dense + (attn + shared) * n_moe
    rep_block = ln * n_dense + (ln + router) * n_moe + norm * h
    exp_block = routed * n_moe
    tp_mtp = (attn + mlp) * mtp_dense + (attn + shared) * mtp_moe
    rep_mtp = ln * mtp_dense + (ln + router) * mtp_moe
    dense_shard = (tp_block / p + tp_mtp + emb) / t + rep_block / p + rep_mtp
    if a.untie_embeddings_and_output_weights and p == 1:
        dense_shard += emb / t
    expert_shard = (exp_block / p + routed * mtp_moe) / (a.expert_tensor_parallel_size * a.expert_model_parallel_size)
    edp = a.world_size // (a.expert_tensor_parallel_size * a.expert_model_parallel_size * p)

    def per_param(d: int) -> float:  # distributed optimizer, bf16 params, fp32 main grads
        return 6 + 12 / d

    s, b = a.seq_length, a.micro_batch_size
    layers = s * b * h * (18 + 4 * a.ffn_hidden_size / h) * L
    embed = 8 * s * b * p + s * b * h * p
    factor = 1.0
    if a.virtual_pipeline_model_parallel_size is not None:
        factor = 1 + (p - 1) / (p * a.virtual_pipeline_model_parallel_size)
    elif p > 1 and num_microbatches is not None:
        factor = min(1.0, num_microbatches / p)
    logits = s * b * h * 4 * (1 + a.padded_vocab_size / h) if p == 1 else 0.0
    return {
        "params_dense": dense_shard, "params_expert": expert_shard,
        "states_dense": dense_shard * per_param(a.data_parallel_size),
        "states_expert": expert_shard * per_param(edp),
        "act_layers": layers * factor / t, "act_embedding": embed * factor / t, "logits": logits / t,
    }


def planner_inputs(a: MArgs, dropout: bool, m: int):
    model = pl.ModelConfig(
        num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
        vocab_size=a.padded_vocab_size, ffn_hidden_size=a.ffn_hidden_size if a.first_k_dense or not a.num_experts
        else 0, num_kv_heads=a.num_query_groups, head_dim=a.kv_channels, gated_mlp=a.swiglu,
        tied_embeddings=not a.untie_embeddings_and_output_weights, dropout=dropout, num_experts=a.num_experts or 0,
        top_k=a.moe_router_topk if a.num_experts else 0, expert_ffn_hidden_size=a.moe_ffn_hidden_size,
        num_shared_experts=1 if a.moe_shared_expert_intermediate_size else 0,
        shared_expert_ffn_hidden_size=a.moe_shared_expert_intermediate_size,
        num_moe_layers=(a.num_layers - a.first_k_dense) if a.num_experts else None, num_mtp_layers=a.mtp_num_layers)
    t, p = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    ep, etp = a.expert_model_parallel_size, a.expert_tensor_parallel_size
    layout = pl.Layout(t, p, 1, a.world_size // (t * p), ep=ep, etp=etp,
                       vpp=a.virtual_pipeline_model_parallel_size or 1, edp=a.world_size // (etp * ep * p))
    batch = pl.BatchConfig(global_batch=m * a.micro_batch_size * layout.dp, seq_length=a.seq_length,
                           micro_batch=a.micro_batch_size)
    opts = pl.PlannerOptions(optimizer="distributed", grad_dtype="fp32", recompute="selective", flash_attention=True,
                             nccl_buffer_bytes=0.0)
    return model, batch, layout, opts


# name, Megatron arguments, dropout (Megatron's 18 + 4f/h counts the masks), micro-batches per step
CASES = [
    ("GPT-22B TP8", MArgs(48, 6144, 64, 4 * 6144, 51200, 2048, 8, 1, 8), True, 4),
    ("GPT-175B TP8 PP8 1F1B", MArgs(96, 12288, 96, 4 * 12288, 51200, 2048, 8, 8, 128), True, 64),
    ("GPT-175B TP8 PP8 m<p", MArgs(96, 12288, 96, 4 * 12288, 51200, 2048, 8, 8, 64), True, 4),
    ("GPT-175B TP4 PP8 VPP6", MArgs(96, 12288, 96, 4 * 12288, 50304, 2048, 4, 8, 512,
                                    virtual_pipeline_model_parallel_size=6), True, 64),
    ("GQA SwiGLU 70B TP4 PP4 VPP5", MArgs(80, 8192, 64, 28672, 128256, 8192, 4, 4, 64, num_query_groups=8,
                                          kv_channels=128, swiglu=True, normalization="RMSNorm",
                                          untie_embeddings_and_output_weights=True,
                                          virtual_pipeline_model_parallel_size=5), False, 32),
    ("Llama 8B TP2 PP1", MArgs(32, 4096, 32, 14336, 128256, 8192, 2, 1, 16, num_query_groups=8, kv_channels=128,
                               swiglu=True, normalization="RMSNorm", untie_embeddings_and_output_weights=True), False,
     8),
    ("MoE 235B TP2 PP8 EP32", MArgs(96, 4096, 64, 0, 151936, 4096, 2, 8, 256, num_query_groups=4, kv_channels=128,
                                    swiglu=True, normalization="RMSNorm", untie_embeddings_and_output_weights=True,
                                    num_experts=128, moe_ffn_hidden_size=1536, moe_router_topk=8,
                                    expert_model_parallel_size=32), False, 32),
    ("MoE + shared + MTP TP1 PP1 EP8 ETP2", MArgs(
        24, 2048, 16, 8192, 102400, 4096, 1, 1, 32, swiglu=True, normalization="RMSNorm",
        untie_embeddings_and_output_weights=True, num_experts=64, moe_ffn_hidden_size=1408, moe_router_topk=6,
        moe_shared_expert_intermediate_size=2816, first_k_dense=1, mtp_num_layers=1, expert_model_parallel_size=8,
        expert_tensor_parallel_size=2), False, 4),
]


def _first_stage(a: MArgs, dropout: bool, m: int, **opts):
    model, batch, layout, base = planner_inputs(a, dropout, m)
    o = dataclasses.replace(base, **opts)
    stage = "only" if layout.pp == 1 else "first"
    return model, batch, layout, o, memory_breakdown(model, batch, layout, o, m, stage=stage)


@pytest.mark.parametrize("name,args,dropout,m", CASES, ids=[c[0] for c in CASES])
def test_weights_and_optimizer_match_megatron(name: str, args: MArgs, dropout: bool, m: int) -> None:
    """Parameters by class and 2 + 4 + 12/d bytes each = Megatron's 6 + 12/d. The planner's only difference: it
    counts norms without the LayerNorm bias (Megatron counts 2h per layer and h for the final norm, all replicated
    and spread over the stages), an exact, small term."""
    ref = megatron_estimate(args, m)
    *_, mem = _first_stage(args, dropout, m)
    norm_bias = 0.0 if args.normalization == "RMSNorm" else (
        2 * args.hidden_size * args.num_layers + args.hidden_size) / args.pipeline_model_parallel_size
    assert mem.params_dense == pytest.approx(ref["params_dense"] - norm_bias, rel=1e-12)
    assert mem.params_expert == pytest.approx(ref["params_expert"], rel=1e-12)
    d = args.data_parallel_size
    assert mem.weights + mem.grads + mem.optimizer_dense + mem.optimizer_expert == pytest.approx(
        ref["states_dense"] + ref["states_expert"] - norm_bias * (6 + 12 / d), rel=1e-12)
    assert mem.optimizer_expert == pytest.approx(12 * ref["params_expert"] * args.pipeline_model_parallel_size
                                                 * args.expert_model_parallel_size
                                                 * args.expert_tensor_parallel_size / args.world_size, rel=1e-12)


@pytest.mark.parametrize("name,args,dropout,m", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_dense_activations_match_megatron(name: str, args: MArgs, dropout: bool, m: int) -> None:
    """Per layer and token Megatron keeps (18 + 4f/h) h bytes / t, which is the planner's 4h + 4h_q + 4h_kv + h
    (attention) + 4h + 4f + h (MLP) for multi-head attention, a GeLU MLP and dropout masks. With GQA the planner
    keeps 4 (h_q - h) + 4 (h_kv - h) bytes more, with SwiGLU 2f more (fc1 is 2f wide), without dropout 2h less.
    The in-flight factors (1F1B min(1, m/p), interleaved 1 + (p-1)/(p v)) and the embedding and logit terms are
    Megatron's."""
    ref = megatron_estimate(args, m)
    model, batch, layout, opts, mem = _first_stage(args, dropout, m)
    h = args.hidden_size
    diff = 4 * (model.q_size - h) + 4 * (model.kv_size - h) + (2 * args.ffn_hidden_size if args.swiglu else 0) \
        - (0 if dropout else 2 * h)
    tokens = args.seq_length * args.micro_batch_size
    flight = mem.in_flight * mem.layers / (args.num_layers / args.pipeline_model_parallel_size)
    expected_layers = ref["act_layers"] + diff * tokens * args.num_layers * flight / (
        args.pipeline_model_parallel_size * args.tensor_model_parallel_size)
    assert mem.activations - mem.activation_embedding == pytest.approx(expected_layers, rel=1e-12)
    embed_ref = ref["act_embedding"] if dropout else ref["act_embedding"] * 8 / (8 + h)  # no dropout mask
    assert mem.activation_embedding == pytest.approx(embed_ref, rel=1e-12)
    first, last, logits = activation_bytes(model, batch, layout, opts, m)
    assert first == pytest.approx(mem.activations, rel=1e-12)
    if args.pipeline_model_parallel_size == 1:
        assert mem.logits == pytest.approx(ref["logits"], rel=1e-12)
    else:  # Megatron prices the first stage only; the planner also prices the last, which holds the logits
        assert mem.logits == 0.0 and logits == pytest.approx(
            4 * tokens * (h + args.padded_vocab_size) / args.tensor_model_parallel_size)


def test_pipeline_factors_are_megatrons() -> None:
    """The two pipeline factors, stated once more on their own: 1F1B holds min(p, m) micro-batches on the first stage
    (Megatron: L x min(1, m/p)), interleaving p + (p - 1)/v (Megatron: L x (1 + (p-1)/(p v)))."""
    for name, args, dropout, m in CASES[1:5]:
        *_, mem = _first_stage(args, dropout, m)
        p, v = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
        expected = p + (p - 1) / v if v else min(p, m)
        assert mem.in_flight == pytest.approx(expected), name
        assert math.isclose(mem.in_flight / p, 1 + (p - 1) / (p * v) if v else min(1, m / p)), name


@pytest.mark.parametrize("fp8_param,extra", [(True, 0.0), (False, 2.0)])
def test_fp8_weight_copies_as_each_recipe_keeps_them(fp8_param: bool, extra: float) -> None:
    """Megatron's estimate assumes bf16 weights. FP8 primary weights (Megatron-Bridge's and NeMo's tensorwise,
    delayed and MXFP8 recipes: fp8_param_gather) keep 1 B of FP8 weight and its 1 B transposed copy
    (megatron/core/fp8_utils.py post_all_gather_processing), the same 2 B as bf16: the model states equal Megatron's
    6 + 12/d. bf16 weights with FP8 GEMMs (the blockwise recipe) also keep Transformer Engine's cached FP8 workspace,
    row- and column-wise: 2 B more per parameter."""
    name, args, dropout, m = CASES[4]
    ref = megatron_estimate(args, m)
    *_, mem = _first_stage(args, dropout, m, fp8=True, fp8_param=fp8_param)
    assert mem.model_states == pytest.approx(ref["states_dense"] + extra * ref["params_dense"], rel=1e-12)
    assert mem.weights == pytest.approx((1.0 if fp8_param else 2.0) * mem.params_dense)


def test_moe_activations_and_dispatch_buffers() -> None:
    """Megatron's estimate prices a MoE layer as a dense one (its issue 1784). The planner's MoE layer keeps, per token
    and layer before / t: the pre-MLP norm's input and output (4h), the router's fp32 logits (4 n_e), and per routed
    copy the experts' input (2h), fc1 output (4 f_e, SwiGLU) and activation output (2 f_e); not the expert output,
    since Megatron-Core's grouped MLP applies the router probabilities inside the activation. One layer's dispatch
    send and receive buffers, 2 x k x T/t x h x 2 B, count once as a buffer."""
    name, args, dropout, m = CASES[6]
    model, batch, layout, opts, mem = _first_stage(args, dropout, m)
    h, f_e, k, n_e = 4096, 1536, 8, 128
    attn = 4 * h + 4 * model.q_size + 4 * model.kv_size
    moe = 4 * h + 4 * n_e + k * (2 * h + 6 * f_e)
    tokens = 4096
    assert mem.activations - mem.activation_embedding == pytest.approx(
        (attn + moe) * tokens * mem.layers * mem.in_flight / 2)
    assert mem.buffers == pytest.approx(2 * k * tokens / 2 * h * 2)
    assert megatron_estimate(args, m)["act_layers"] == pytest.approx(18 * h * tokens * 96 / 2)  # f = 0 in its eyes


def test_fp8_primary_weights_halve_the_dp_parameter_all_gather() -> None:
    """The distributed optimizer all-gathers the updated primary weights once per step: 2 B bf16, 1 B with FP8
    primary weights; the gradient reduce-scatter is unchanged."""
    from dynacp.planner.timing import dp_traffic
    from dynacp.planner.validation import h100_cluster

    model, cluster, lay = pl.model_preset("llama3-70b"), h100_cluster(64), pl.Layout(4, 4, 1, 4, vpp=5)
    bf16 = dp_traffic(cluster, lay, pl.PlannerOptions(), model)
    fp8 = dp_traffic(cluster, lay, pl.PlannerOptions(fp8=True), model)
    cached = dp_traffic(cluster, lay, pl.PlannerOptions(fp8=True, fp8_param=False), model)
    assert fp8["ag_step"] == pytest.approx(bf16["ag_step"] / 2) and cached["ag_step"] == bf16["ag_step"]
    assert fp8["rs_step"] == bf16["rs_step"] > 0


# NVIDIA NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv (NVIDIA/NeMo, last changed
# 2025-08-27): the H100 pre-training configurations NeMo's performance recipes run, for the models the planner has
# presets of. Published layouts that run, so each must fit; the recipes reduce gradients in bf16 and, except
# DeepSeek-V3's, keep FP8 primary weights. model, dtype, GPUs, seq, TP, PP, CP, EP, VPP, mbs, GBS, recompute modules
NEMO_H100_CONFIGS = [
    ("gpt3-175b", "fp8", 512, 2048, 4, 8, 1, 1, 6, 2, 2048, ()),
    ("gpt3-175b", "fp8", 128, 2048, 4, 8, 1, 1, 6, 1, 256, ()),
    ("gpt3-175b", "bf16", 128, 2048, 4, 8, 1, 1, 6, 1, 256, ()),
    ("llama3.1-405b", "fp8", 1024, 8192, 8, 8, 2, 1, 8, 1, 512, ()),
    ("llama3.1-405b", "bf16", 1024, 8192, 8, 8, 2, 1, 8, 1, 512, ()),
    ("llama3-70b", "fp8", 64, 8192, 4, 8, 1, 1, 5, 1, 128, ()),
    ("llama3-70b", "bf16", 64, 8192, 4, 4, 2, 1, 5, 1, 128, ()),
    ("llama3-8b", "bf16", 8, 8192, 1, 1, 2, 1, 1, 1, 128, ()),
    ("nemotron4-340b", "bf16", 256, 4096, 8, 8, 1, 1, 12, 1, 64, ()),
    ("nemotron4-340b", "fp8", 256, 4096, 8, 8, 1, 1, 12, 1, 64, ()),
    ("deepseek-v3", "bf16", 1024, 4096, 2, 16, 1, 64, 1, 1, 8192, ("mla_up_proj", "mlp", "moe")),
    ("deepseek-v3", "fp8", 1024, 4096, 2, 16, 1, 64, 1, 1, 8192, ("mla_up_proj", "mlp", "moe")),
    ("qwen3-30b-a3b", "bf16", 16, 4096, 1, 2, 1, 8, 24, 1, 512, ()),
    ("qwen3-235b-a22b", "bf16", 256, 4096, 2, 8, 1, 32, 4, 1, 2048, ()),
]


@pytest.mark.parametrize("cfg", NEMO_H100_CONFIGS, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in NEMO_H100_CONFIGS])
def test_nemo_recommended_h100_configs_fit(cfg) -> None:
    """Every recommended H100 pre-training layout of NeMo's performance recipes fits the usable memory (92 % of
    85.0e9 B). Issue 22's model rejected Qwen3-235B-A22B BF16 at 80.6 GB, with the expert output double-counted."""
    from dynacp.planner.validation import H100_MEMORY

    name, dtype, gpus, seq, tp, pp, cp, ep, vpp, mbs, gbs, modules = cfg
    model = pl.model_preset(name)
    dp = gpus // (tp * pp * cp)
    layout = pl.Layout(tp, pp, cp, dp, ep=ep, etp=1, vpp=vpp if pp > 1 else 1, edp=gpus // (ep * pp))
    opts = pl.PlannerOptions(grad_dtype="bf16", fp8=dtype == "fp8", fp8_param=name != "deepseek-v3",
                             **pl.recompute_module_options(modules))
    mem = memory_breakdown(model, pl.BatchConfig(gbs, seq, mbs), layout, opts, m=gbs // (mbs * dp))
    assert mem.total <= opts.memory_headroom * H100_MEMORY, mem.terms()


def test_backward_working_set_of_one_layer() -> None:
    """The backward pass's transient gradients of one layer, counted once per GPU (memory.backward_working_bytes):
    the incoming residual gradient 2h / t, the larger block's intermediate gradients / t, and with sequence
    parallelism the first GEMM's full-sequence data gradient (2h) beside its input gathered again for the weight
    gradient ((2 - FP8) h; Korthikanti et al. 2022 Sec. 4.2.2). Exact per-token values, and the total includes it."""
    from dynacp.planner.memory import backward_working_bytes

    llama = pl.model_preset("llama3-70b")
    h, f = 8192, 28672
    batch = pl.BatchConfig(128, 8192, 1)
    fp8 = pl.PlannerOptions(fp8=True)
    tp4 = pl.Layout(4, 8, 1, 2)
    # SwiGLU fc1-output gradient (4f) beats attention's q, k, v, out gradients and fp32 dq (2(2h_q + 2h_kv) + 4h_q)
    assert backward_working_bytes(llama, batch, tp4, fp8) == pytest.approx(((2 * h + 4 * f) / 4 + 2 * h + h) * 8192)
    bf16_tp1_cp2 = backward_working_bytes(llama, batch, pl.Layout(1, 8, 2, 4), pl.PlannerOptions())
    assert bf16_tp1_cp2 == pytest.approx((2 * h + 4 * f + 2 * h) * 4096)
    qwen = pl.model_preset("qwen3-30b-a3b")  # every layer MoE: k copies of the fc1-output and expert-input gradients
    per_token = 2 * 2048 + 8 * (4 * 768 + 2 * 2048) + 2 * 2048
    assert backward_working_bytes(qwen, pl.BatchConfig(512, 4096, 1), pl.Layout(1, 2, 1, 8, 8, 1, 2, 1),
                                  fp8) == pytest.approx(per_token * 4096)
    mem = memory_breakdown(llama, batch, tp4, fp8, m=64)
    assert mem.backward == pytest.approx(backward_working_bytes(llama, batch, tp4, fp8))
    assert mem.terms()["backward working set"] == mem.backward and mem.total == pytest.approx(sum(mem.terms().values()))
