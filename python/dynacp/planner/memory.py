"""Per-GPU memory of one layout: parameters by sharding class, model states, activations, logits, buffers.

Formulas (bytes; t = TP, p = PP, c = CP, d = DP, e = EP, t_e = ETP, d_e = EDP, v = VPP, m = micro-batches per DP
rank, T = b*s/c tokens per rank per micro-batch):

* Parameters on the most-loaded stage follow Megatron's estimator: TP-sharded (attention, dense MLP, shared
  experts, embedding/output) / t, replicated (norms, router) undivided, routed experts / (t_e * e); transformer
  layers / p; the first stage adds the input embedding, the last the output layer (both when p = 1 and untied).
* Model states: weights 2 B (bf16), or with FP8 (:func:`weight_bytes_per_param`) 1 B FP8 + 1 B transposed copy
  (FP8 primary weights) or 2 B bf16 + 2 B cached FP8 workspace; gradients 4 B (fp32 main grads) or 2 B, Adam +
  fp32 master 12 B. Distributed optimizer / ZeRO-1 shard the 12 B, ZeRO-2 also the grads, ZeRO-3 also the weights.
  Dense parameters shard over DP x CP (Megatron's gradient-buffer group), routed experts over EDP.
* Activations per layer and token (Korthikanti et al. 2022, Table 2, with sequence parallelism so everything / t):
  attention 4h + 4h_q + 4h_kv (+ h dropout mask) (= 13h for MHA with dropout; MLA: its latents and per-head
  widths, see :func:`_mla_bytes_per_token`) plus (4 + dropout) * a * s for the
  score tensor unless flash attention or recompute; dense MLP 4h + (4 or 6) f (+ h dropout) (gated fc1 is 2f
  wide) (= 21h at f = 4h with dropout, so 34h per layer as in the paper); MoE MLP 4h + 4 n_e + imbalance * k *
  (2h + (4 or 6) f_e) + shared experts: per routed copy the experts' input and their fc1 and activation outputs;
  the expert output is not kept, as Megatron-Core 0.16's grouped MLP applies the router probabilities inside the
  activation, so the combine keeps nothing (docs/planner.md, memory terms).
  ``recompute_mlp`` keeps 2h for dense MLPs only (Megatron's ``mlp`` module), ``recompute_moe`` 2h for MoE layers
  (its ``moe`` module). ``recompute_layernorm`` drops the two norm outputs, ``recompute_moe_act`` /
  ``recompute_mlp_act`` the activation-function outputs (:func:`_elementwise_dropped_bytes`). Full
  recompute keeps 2h per layer plus one layer's working set. Stage i (0-based) holds min(p - i, m) micro-batches
  of its layers (interleaved: min(p + (p - 2i - 1)/v, m), Megatron's warm-up; :func:`in_flight`); the first,
  the second and the last stage are priced and the largest reported. The first stage adds Megatron's input-id and
  embedding-dropout terms.
* Logits and cross-entropy on the last stage: (4h + 4V) per token / t, or 4h per token + 4V per chunk token when
  the cross-entropy is chunked.
* Communication buffers: nccl_buffer_bytes per process group larger than one, plus, for a MoE model with EP > 1,
  the token dispatch's send and receive buffers of one MoE layer, which exist together while a layer dispatches
  (forward) or combines (backward): 2 x imbalance x k x T / t tokens x h x 2 B (:func:`dispatch_buffer_bytes`).
* Backward working set, once: one layer's gradient tensors while it runs its backward, the incoming residual
  gradient, the larger block's intermediate gradients and, with sequence parallelism, the full-sequence data
  gradient beside the re-gathered GEMM input (:func:`backward_working_bytes`; Korthikanti et al. 2022, Sec. 4.2.2).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

from dynacp.planner.model import RECOMPUTE_MODULES, BatchConfig, Layout, ModelConfig, PlannerOptions

GB = 1e9


@dataclass
class ParamCounts:
    """Parameter counts of the whole model by sharding class."""

    layers_tp: float
    """TP-sharded parameters inside the transformer layers (attention, dense MLP, shared experts)."""
    layers_replicated: float
    """Replicated parameters inside the layers (norms, router)."""
    experts: float
    """Routed-expert parameters (all MoE layers)."""
    embedding: float
    """Input embedding V*h."""
    output: float
    """Output layer V*h (0 when tied)."""

    @property
    def non_expert(self) -> float:
        return self.layers_tp + self.layers_replicated + self.embedding + self.output

    @property
    def total(self) -> float:
        return self.non_expert + self.experts


def param_counts(model: ModelConfig) -> ParamCounts:
    """Counts from the shapes, or from non_expert_params / expert_params when the model gives them directly."""
    h, L = model.hidden_size, model.num_layers
    mlp_mult = 3 if model.gated_mlp else 2
    attn = 2 * h * model.q_size + 2 * h * model.kv_size
    dense_mlp = mlp_mult * h * model.ffn_hidden_size
    shared = model.num_shared_experts * mlp_mult * h * model.shared_ffn
    routed = model.num_experts * mlp_mult * h * model.expert_ffn_hidden_size
    L_moe = model.moe_layers
    embedding = float(model.vocab_size * h)
    output = 0.0 if model.tied_embeddings else embedding
    layers_tp = L * attn + (L - L_moe) * dense_mlp + L_moe * shared
    layers_rep = 2.0 * h * L + h + L_moe * h * model.num_experts
    experts = float(L_moe * routed)
    if model.expert_params is not None:
        experts = float(model.expert_params)
    if model.non_expert_params is not None:
        # All of X is TP-sharded (as in X/TP); the embeddings are the part of X that lives on the end stages.
        emb = embedding + output
        if model.non_expert_params > emb:
            return ParamCounts(model.non_expert_params - emb, 0.0, experts, embedding, output)
        return ParamCounts(float(model.non_expert_params), 0.0, experts, 0.0, 0.0)
    return ParamCounts(float(layers_tp), float(layers_rep), experts, embedding, output)


def stage_split(num_layers: int, pp: int) -> List[int]:
    """Transformer layers of each pipeline stage. Even when PP divides L; otherwise the middle stages get ceil(L/PP)
    and the first and last stages share the rest, the first taking the larger half (Megatron's
    --decoder-first/last-pipeline-num-layers, or --account-for-embedding/loss-in-pipeline-split when L + 2 splits
    evenly; Llama 3 405B: 126 layers over 16 stages = 7, 8 x 14, 7, the embedding and the loss filling the gaps). A
    stage
    may come out with zero layers (e.g. PP 128 for 126 layers): :func:`dynacp.planner.enumerate.check` rejects it."""
    if pp <= 1:
        return [num_layers]
    if num_layers % pp == 0:
        return [num_layers // pp] * pp
    per = math.ceil(num_layers / pp)
    if pp == 2:
        return [per, num_layers - per]
    rest = num_layers - (pp - 2) * per
    first = max(0, math.ceil(rest / 2))
    return [first] + [per] * (pp - 2) + [max(0, rest - first)]


def stage_layers(model: ModelConfig, pp: int) -> int:
    """Transformer layers on the most-loaded pipeline stage (ceil(L/PP))."""
    return max(stage_split(model.num_layers, pp))


def stage_layer_count(model: ModelConfig, pp: int, index: int) -> int:
    """Transformer layers on stage ``index``, the last one's MTP blocks included."""
    return stage_split(model.num_layers, pp)[index] + (model.num_mtp_layers if index == pp - 1 else 0)


def weight_bytes_per_param(opts: PlannerOptions) -> Tuple[float, float]:
    """(primary weight bytes, extra FP8 copy bytes) per parameter. bf16 training: (2, 0). FP8 with FP8 primary
    weights (``fp8_param``, Megatron's --fp8-param-gather): (1, 1), the FP8 weight and the transposed (column-wise)
    copy that Hopper's FP8 GEMMs need for the backward. FP8 without: (2, 2), the bf16 weight and Transformer
    Engine's cached FP8 workspace, row-wise and column-wise. The primary bytes are also what the DP parameter
    all-gather moves (:func:`dynacp.planner.timing.dp_traffic`)."""
    if not opts.fp8:
        return 2.0, 0.0
    return (1.0, 1.0) if opts.fp8_param else (2.0, 2.0)


def _stage_index(pp: int, stage: str) -> int:
    return {"first": 0, "only": 0, "middle": min(1, pp - 1), "last": pp - 1}[stage]


def params_per_gpu(model: ModelConfig, layout: Layout, stage: str = "first") -> Tuple[float, float]:
    """(non-expert, routed-expert) parameters on one GPU of ``stage`` ('first', 'middle' (the second stage) or
    'last'; all equal when PP = 1).

    With PP = 1, ETP = 1 and embeddings inside X this is the seed's X/TP + E/EP."""
    pc = param_counts(model)
    idx = _stage_index(layout.pp, stage)
    frac = stage_split(model.num_layers, layout.pp)[idx] / model.num_layers
    dense = (pc.layers_tp * frac) / layout.tp + pc.layers_replicated * frac
    experts = pc.experts * frac
    if idx == layout.pp - 1 and model.num_mtp_layers:  # the MTP blocks sit on the last stage
        tp, rep, exp = mtp_layer_params(model)
        dense += model.num_mtp_layers * (tp / layout.tp + rep)
        experts += model.num_mtp_layers * exp
    if layout.pp == 1:
        dense += (pc.embedding + pc.output) / layout.tp
    elif stage == "first":
        dense += pc.embedding / layout.tp
    elif stage == "last":  # the output layer, or the tied copy of the embedding (a middle stage holds neither)
        dense += (pc.output or pc.embedding) / layout.tp
    return dense, experts / (layout.etp * layout.ep)


def mtp_layer_params(model: ModelConfig) -> Tuple[float, float, float]:
    """(TP-sharded, replicated, routed-expert) parameters of one multi-token-prediction block: a transformer layer
    of the model's last layer's kind (MoE when the model has MoE layers), as Megatron's estimator counts it. When
    the model gives its parameter counts directly, an average layer of each class."""
    if model.non_expert_params is not None or model.expert_params is not None:
        pc, L = param_counts(model), model.num_layers
        return pc.layers_tp / L, pc.layers_replicated / L, pc.experts / L
    h = model.hidden_size
    mlp_mult = 3 if model.gated_mlp else 2
    attn = 2 * h * model.q_size + 2 * h * model.kv_size
    if model.moe_layers:
        shared = model.num_shared_experts * mlp_mult * h * model.shared_ffn
        routed = model.num_experts * mlp_mult * h * model.expert_ffn_hidden_size
        return float(attn + shared), float(2 * h + h * model.num_experts), float(routed)
    return float(attn + mlp_mult * h * model.ffn_hidden_size), float(2 * h), 0.0


@dataclass
class MemoryBreakdown:
    """Bytes per GPU on the most-loaded pipeline stage; :meth:`terms` names every term."""

    weights: float
    """Primary parameters: bf16 (2 B), or FP8 (1 B) with FP8 primary weights."""
    grads: float
    """Main gradients (fp32 or bf16; sharded under ZeRO-2/3)."""
    optimizer: float
    """fp32 master weights + Adam moments (12 B/param), sharded by DP x CP (dense) and EDP (experts)."""
    optimizer_dense: float
    """The non-expert part of ``optimizer``."""
    optimizer_expert: float
    """The routed-expert part of ``optimizer``."""
    activations: float
    """Activations of the in-flight micro-batches (transformer layers and embedding terms)."""
    logits: float
    """Output-layer input and fp32 logits for the cross-entropy (last stage only)."""
    buffers: float
    """Communicator buffers: NCCL's per group, and one MoE layer's token dispatch buffers."""
    stage: str
    """Which stage is the most loaded: 'only' (PP = 1), 'first', 'middle' (the second stage) or 'last'."""
    params_dense: float
    """Non-expert parameters on this GPU."""
    params_expert: float
    """Routed-expert parameters on this GPU."""
    fp8_weights: float = 0.0
    """FP8 copies beside the primary weights when PlannerOptions.fp8: the transposed copy (1 B/param) with FP8
    primary weights, else the cached row- and column-wise FP8 workspace (2 B/param); see weight_bytes_per_param."""
    activation_embedding: float = 0.0
    """The part of ``activations`` that is token ids and the embedding-dropout mask (first stage)."""
    in_flight: float = 1.0
    """Micro-batches whose activations this stage holds."""
    layers: int = 0
    """Transformer layers on this stage."""
    backward: float = 0.0
    """The backward pass's transient gradient tensors of one layer (:func:`backward_working_bytes`)."""

    @property
    def model_states(self) -> float:
        return self.weights + self.fp8_weights + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.logits + self.buffers + self.backward

    def terms(self) -> Dict[str, float]:
        """Every byte of :attr:`total`, by name, in a fixed order."""
        return {
            "weights (bf16)": self.weights, "weights (fp8 copy)": self.fp8_weights, "main grads": self.grads,
            "optimizer (dense)": self.optimizer_dense, "optimizer (experts)": self.optimizer_expert,
            "activations (layers)": self.activations - self.activation_embedding,
            "activations (embedding)": self.activation_embedding, "logits + cross-entropy": self.logits,
            "communicator buffers": self.buffers, "backward working set": self.backward,
        }

    def to_dict(self) -> Dict[str, float]:
        d = asdict(self)
        d["model_states"] = self.model_states
        d["total"] = self.total
        d["terms"] = self.terms()
        return d


def _mla_bytes_per_token(model: ModelConfig, opts: PlannerOptions) -> float:
    """Activation bytes per token of one MLA block (bf16, before / TP): the norm input and the down-projections'
    input (2h each), the query latent before and after its norm (2 x 2 q_lora), the key-value latent with its
    rotary part and the normed latent (2 (kv_lora + rope) + 2 kv_lora), the per-head q and k (2 a (d_qk + rope) each)
    and v (2 a d_v) unless ``recompute_mla_up_proj`` discards them, and the attention output (2 a d_v). Like every
    term this is divided by TP: with sequence parallelism Megatron-Core 0.16 scatters the latents back to s / TP
    tokens before their norms (``get_query_key_value_tensors``); the up-projections gather them only transiently."""
    h, a = model.hidden_size, model.num_attention_heads
    kv, rope = model.kv_lora_rank or 0, model.qk_pos_emb_head_dim
    qk, v = model.qk_head_dim + rope, model.v_head_dim
    latents = 4 * (model.q_lora_rank or 0) + 2 * (kv + rope) + 2 * kv
    per_head = 0.0 if opts.recompute_mla_up_proj else 2 * a * (2 * qk + v)
    return 4 * h + latents + per_head + 2 * a * v


def mla_up_proj_params(model: ModelConfig) -> float:
    """Parameters of one MLA block's up-projections (query: q_lora or h to a (d_qk + rope); key-value: kv_lora to
    a (d_qk + d_v)), which ``recompute_mla_up_proj`` runs forward twice; 0 without MLA."""
    if not model.is_mla:
        return 0.0
    a = model.num_attention_heads
    q_in = model.q_lora_rank or model.hidden_size
    return float(q_in * a * (model.qk_head_dim + model.qk_pos_emb_head_dim)
                 + (model.kv_lora_rank or 0) * a * (model.qk_head_dim + model.v_head_dim))


def _layer_bytes_per_token(model: ModelConfig, opts: PlannerOptions, seq: int) -> Dict[str, float]:
    """Activation bytes per token of one layer of each kind, before dividing by TP. With FP8 the inputs of the
    QKV, fc1 and fc2 GEMMs are saved as 1-byte FP8 casts (Transformer Engine), saving h, h and f bytes, and the
    output projection keeps a 1-byte cast of the attention output beside the attention kernel's bf16 copy, h_q
    bytes more (a * d_v with MLA)."""
    h, drop = model.hidden_size, 1.0 if model.dropout else 0.0
    f8 = 1.0 if opts.fp8 else 0.0
    fc1 = 4 if model.gated_mlp else 2  # bytes per f-wide element of the fc1 output (2f wide when gated)
    # FP8: the QKV input is kept as its 1-byte cast (h less); the attention output is kept twice, in bf16 by the
    # attention kernel for its backward and as the output projection's 1-byte cast (a * d_v more)
    out_width = model.num_attention_heads * model.v_head_dim if model.is_mla else model.q_size
    attn_lin = (_mla_bytes_per_token(model, opts) if model.is_mla
                else 4 * h + 4 * model.q_size + 4 * model.kv_size) + drop * h - f8 * h + f8 * out_width
    scores = 0.0
    if not opts.flash_attention and opts.recompute == "none":
        scores = (4 + drop) * model.num_attention_heads * seq
    dense = 4 * h + (fc1 + 2) * model.ffn_hidden_size + drop * h - f8 * (h + model.ffn_hidden_size)
    moe = 0.0
    if model.moe_layers:
        f_e = model.expert_ffn_hidden_size
        # per routed copy: the experts' fc1 input (2h, its FP8 cast with FP8), fc1 output and activation output;
        # not the expert output: Megatron-Core's grouped MLP applies the router probabilities inside the activation
        # (weighted_bias_swiglu_impl), so the combine is an unweighted scatter-add that keeps nothing
        routed = model.top_k * ((2 - f8) * h + (fc1 + 2 - f8) * f_e) * opts.moe_imbalance
        shared = model.num_shared_experts * (fc1 + 2 - f8) * model.shared_ffn
        moe = 4 * h + 4 * model.num_experts + routed + shared + drop * h
    if opts.recompute_mlp:  # only the dense MLP's input survives the forward (Megatron: dense layers only)
        dense = 2.0 * h
    if opts.recompute_moe and model.moe_layers:  # only the MoE layer's input survives the forward
        moe = 2.0 * h
    drop = _elementwise_dropped_bytes(model, opts)
    return {"attn": attn_lin + scores - drop["attn"], "linear_attn": attn_lin - drop["linear_attn"],
            "dense_mlp": dense - drop["dense_mlp"], "moe_mlp": moe - drop["moe_mlp"]}


def _elementwise_dropped_bytes(model: ModelConfig, opts: PlannerOptions) -> Dict[str, float]:
    """Bytes per token of one layer of each kind that the elementwise recomputes do not keep, before / TP:
    ``recompute_layernorm`` the two norm outputs ((2 - FP8) h each: the QKV / MLA down-projection input, the fc1
    input; 2h for a MoE layer's router and dispatch input, which is never an FP8 cast), ``recompute_mlp_act`` a
    dense MLP's activation output ((2 - FP8) f, the fc2 input) and ``recompute_moe_act`` the routed experts' (top-k
    copies of (2 - FP8) f_e, times the routing imbalance). Nothing under full recompute, and nothing for an MLP
    that ``recompute_mlp`` / ``recompute_moe`` already reduce to its input."""
    h, f8 = model.hidden_size, 1.0 if opts.fp8 else 0.0
    out = {"attn": 0.0, "linear_attn": 0.0, "dense_mlp": 0.0, "moe_mlp": 0.0}
    if opts.recompute == "full":
        return out
    if opts.recompute_layernorm:
        out["attn"] = out["linear_attn"] = (2 - f8) * h
    if not opts.recompute_mlp:
        out["dense_mlp"] = ((2 - f8) * h if opts.recompute_layernorm else 0.0) + (
            (2 - f8) * model.ffn_hidden_size if opts.recompute_mlp_act else 0.0)
    if model.moe_layers and not opts.recompute_moe:
        routed = model.top_k * (2 - f8) * model.expert_ffn_hidden_size * opts.moe_imbalance
        out["moe_mlp"] = (2.0 * h if opts.recompute_layernorm else 0.0) + (routed if opts.recompute_moe_act else 0.0)
    return out


def _mean_over_layers(model: ModelConfig, k: Dict[str, float]) -> float:
    L, La, Lm = model.num_layers, model.attention_layers, model.moe_layers
    return (La * k["attn"] + (L - La) * k["linear_attn"] + Lm * k["moe_mlp"] + (L - Lm) * k["dense_mlp"]) / L


def layer_bytes_per_token(model: ModelConfig, opts: PlannerOptions, seq: int) -> Tuple[float, float]:
    """(mean over layers, largest layer) activation bytes per token of one transformer layer, before / TP."""
    k = _layer_bytes_per_token(model, opts, seq)
    La, Lm = model.attention_layers, model.moe_layers
    largest = (k["attn"] if La else k["linear_attn"]) + (k["moe_mlp"] if Lm else k["dense_mlp"])
    return _mean_over_layers(model, k), largest


def recomputed_bytes_per_token(model: ModelConfig, opts: PlannerOptions, seq: int) -> Tuple[float, float]:
    """(produced, dropped): mean over layers of the activation bytes per token, before / TP, that a layer's forward
    produces for its backward, and how many of them the recompute modules (``recompute_mlp``, ``_moe``,
    ``_mla_up_proj``, ``_layernorm``, ``_moe_act``, ``_mlp_act``) drop from memory. The memory-bound kernels move
    every produced byte, and the dropped ones once more when the backward pass produces them again
    (:mod:`dynacp.planner.timing`). Under full recompute nothing is dropped by a module: the whole layer runs again."""
    plain = dataclasses.replace(opts, **{f: False for f in RECOMPUTE_MODULES.values() if f is not None})
    produced, _ = layer_bytes_per_token(model, plain, seq)
    if opts.recompute == "full":
        return produced, 0.0
    kept, _ = layer_bytes_per_token(model, opts, seq)
    return produced, produced - kept


def in_flight(layout: Layout, m: int, stage: int = 0) -> float:
    """Micro-batches (in whole-stage units) whose activations pipeline stage ``stage`` = i (0-based) holds:
    1F1B min(p - i, m); interleaved min(p + (p - 2i - 1) / v, m), i.e. Megatron's 2 (p - i - 1) + (v - 1) p warm-up
    chunks plus one, of L / (p v) layers each (for the first stage Megatron's p (1 + (p-1)/(p v))), capped as
    Megatron caps the warm-up at all m v chunks of the step (``get_pp_rank_microbatches`` in Megatron-Core 0.16,
    and PyTorch's ``ScheduleInterleaved1F1B``, count the same). With m = p the first p/2 stages run all their
    forwards before the first backward and hold m; the later ones hold fewer (older Megatron-LM put every stage in
    warm-up when m = p; current Megatron-Core does not)."""
    p, v = layout.pp, layout.vpp
    if p <= 1:
        return 1.0
    if v > 1:
        return min(p + (p - 2 * stage - 1) / v, float(m))
    return float(min(p - stage, m))


def _stage_activations(
    model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions, m: int, stage: int
) -> Tuple[float, float]:
    """(activation bytes, of which embedding terms) of pipeline stage ``stage`` per GPU."""
    t, c = layout.tp, layout.cp
    s, b, h = batch.seq_length, batch.micro_batch, model.hidden_size
    T = b * s / c
    mean, largest = layer_bytes_per_token(model, opts, s)
    n_layers = stage_layer_count(model, layout.pp, stage)
    if opts.recompute == "full":
        per_stage = n_layers * 2 * h * T  # each layer's input
        working = largest * T
    else:
        per_stage = n_layers * mean * T
        working = 0.0
    flight = in_flight(layout, m, stage)
    embed = (8 * T + (h * T if model.dropout else 0.0)) * flight if stage == 0 else 0.0  # ids, dropout mask
    return (per_stage * flight + embed + working) / t, embed / t


def activation_bytes(
    model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions, m: int
) -> Tuple[float, float, float]:
    """(first-stage activations, last-stage activations, logits) in bytes per GPU for micro-batches of
    ``batch.micro_batch`` sequences of ``batch.seq_length`` tokens."""
    first, _ = _stage_activations(model, batch, layout, opts, m, 0)
    last, _ = _stage_activations(model, batch, layout, opts, m, layout.pp - 1)
    return first, last, _logit_bytes(model, batch, layout, opts)


def _logit_bytes(model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions) -> float:
    T = batch.micro_batch * batch.seq_length / layout.cp
    ce_tokens = min(T, opts.ce_chunk_tokens) if opts.chunked_ce else T
    return (4 * model.hidden_size * T + 4 * model.vocab_size * ce_tokens) * (1 + model.num_mtp_layers) / layout.tp


def dispatch_buffer_bytes(model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions) -> float:
    """Bytes per GPU of one MoE layer's token dispatch in flight: the permuted tokens to send and the tokens
    received, k copies of each of the rank's T / t tokens (sequence parallel; T = b s / c), bf16, times the
    routing imbalance on the busiest rank. Transient (one layer at a time, forward dispatch or backward combine),
    so counted once, not per in-flight micro-batch; 0 without EP. Megatron-Core's all-to-all dispatcher allocates
    them per call; DeepEP / HybridEP preallocate buffers of at least this size."""
    if not model.moe_layers or layout.ep <= 1:
        return 0.0
    tokens = batch.micro_batch * batch.seq_length / layout.cp / layout.tp
    return 2 * opts.moe_imbalance * model.top_k * tokens * model.hidden_size * 2.0


def backward_working_bytes(model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions) -> float:
    """Bytes per GPU of the gradient tensors that exist together while one layer runs its backward (transient: one
    layer at a time, counted once). For the larger of the layer's two blocks: the incoming gradient of the residual
    stream (2h per token / t); the block's intermediate gradients (MLP: the fc1-output gradient, (4 if gated else
    2) f / t; MoE: per routed copy the fc1-output and expert-input gradients, k (fc1 f_e + 2h) x the imbalance / t;
    attention: the gradients of q, k, v and the output, 2 (q + k + v + out widths) / t, plus flash attention's fp32
    dq accumulator, 4 h_q / t); and the first GEMM's data gradient, 2h per token of the full sequence before
    sequence parallelism reduce-scatters it, beside that GEMM's input, all-gathered again for the weight gradient
    ((2 - FP8) h; Korthikanti et al. 2022, Sec. 4.2.2; Megatron-Core's
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``). Without TP the data gradient is 2h and the input
    is the saved activation. T = b s / c tokens per rank."""
    t, h = layout.tp, model.hidden_size
    f8 = 1.0 if opts.fp8 else 0.0
    fc1 = 4 if model.gated_mlp else 2
    if model.is_mla:
        a = model.num_attention_heads
        widths = a * (2 * (model.qk_head_dim + model.qk_pos_emb_head_dim) + 2 * model.v_head_dim)
    else:
        widths = 2 * model.q_size + 2 * model.kv_size
    attn = 2 * widths + 4 * model.q_size
    mlp = fc1 * model.ffn_hidden_size if model.moe_layers < model.num_layers else 0.0
    if model.moe_layers:
        routed = model.top_k * (fc1 * model.expert_ffn_hidden_size + 2 * h) * opts.moe_imbalance
        mlp = max(mlp, routed + model.num_shared_experts * fc1 * model.shared_ffn)
    sp_pair = 2 * h + (2 - f8) * h if t > 1 else 2 * h
    per_token = (2 * h + max(attn, mlp)) / t + sp_pair
    return per_token * batch.micro_batch * batch.seq_length / layout.cp


def process_groups(model: ModelConfig, layout: Layout) -> Dict[str, int]:
    """Sizes of the process groups a GPU belongs to."""
    g = {"TP": layout.tp, "PP": layout.pp, "CP": layout.cp, "DPxCP": layout.dp * layout.cp}
    if model.is_moe:
        g.update({"EP": layout.ep, "EDP": layout.edp})
        if layout.etp != layout.tp:
            g["ETP"] = layout.etp
    return g


def memory_breakdown(
    model: ModelConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions, m: int, stage: Optional[str] = None
) -> MemoryBreakdown:
    """Per-GPU memory of the most-loaded pipeline stage (the first, the second and the last are compared), or of
    ``stage`` ('first', 'middle' = the second, 'last'; 'only' when PP = 1) when given."""
    p = layout.pp
    stages = ["only"] if p == 1 else (["first", "middle", "last"] if p > 2 else ["first", "last"])
    if stage is not None:
        if stage not in stages:
            raise ValueError(f"stage must be one of {', '.join(stages)} for PP = {p}, got {stage!r}")
        stages = [stage]
    logits = _logit_bytes(model, batch, layout, opts)
    buffers = opts.nccl_buffer_bytes * sum(1 for v in process_groups(model, layout).values() if v > 1)
    buffers += dispatch_buffer_bytes(model, batch, layout, opts)
    backward = backward_working_bytes(model, batch, layout, opts)
    gb = 4.0 if opts.grad_dtype == "fp32" else 2.0
    n_dense, n_exp = layout.dp * layout.cp, layout.edp
    shard_w = opts.optimizer == "zero3"
    shard_g = opts.optimizer in ("zero2", "zero3")
    shard_o = opts.optimizer != "zero0"
    w_primary, w_fp8 = weight_bytes_per_param(opts)
    best = None
    for st in stages:
        idx = _stage_index(p, st)
        pd, pe = params_per_gpu(model, layout, st)
        weights = w_primary * (pd / n_dense + pe / n_exp if shard_w else pd + pe)
        fp8 = w_fp8 * (pd + pe)
        grads = gb * (pd / n_dense + pe / n_exp if shard_g else pd + pe)
        od = 12 * pd / (n_dense if shard_o else 1)
        oe = 12 * pe / (n_exp if shard_o else 1)
        acts, embed = _stage_activations(model, batch, layout, opts, m, idx)
        lg = logits if st in ("only", "last") else 0.0
        mb = MemoryBreakdown(weights, grads, od + oe, od, oe, acts, lg, buffers, st, pd, pe, fp8, embed,
                             in_flight(layout, m, idx), stage_layer_count(model, p, idx), backward)
        if best is None or mb.total > best.total:
            best = mb
    assert best is not None
    return best
