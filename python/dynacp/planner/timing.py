"""Step time of one layout: FLOPs, communication volumes priced at the right link, and the pipeline bubble.

* Compute (per token, fwd + bwd): 6 x active non-embedding parameters (routed experts scaled by k / n_e, the output
  layer included) plus causal attention 6 * h_q * s per token per softmax-attention layer, i.e. 6 * h_q * sum s_i^2
  per layer over the real sequences (Megatron's num_floating_point_operations). Full recompute adds one forward
  (x 4/3); selective recompute without flash attention re-runs the attention core. A GPU does 1/(t c p) of a
  micro-batch at ``mfu`` x peak.
* Communication per micro-batch per GPU (nccl-tests bus-bandwidth convention: ring all-reduce moves
  2(n-1)/n x message, all-gather / reduce-scatter / all-to-all (n-1)/n):
  TP 4 all-reduces per layer of b (s/c) h 2 bytes (6 with full recompute); EP 4 all-to-alls per MoE layer of
  (T/t) k h 2 bytes (6 with full recompute); CP ring KV 3 (c-1) T 2 g_t d_h 2 bytes per attention layer, exposed only
  beyond the attention compute it overlaps; PP 2 v b (s/c) h 2 / t bytes. Per step: DP reduce-scatter of gradients
  + all-gather of bf16 weights (all-reduce for ZeRO-0, one more gather for ZeRO-3) over DP x CP for dense and EDP
  for expert parameters. A group inside one node uses the intra-node bandwidth, otherwise the inter-node one. TP,
  EP, PP and DP traffic is counted as exposed (not overlapped), which is conservative for DP.
* Pipeline: step = (m + (p-1)/v) x t_microbatch + t_DP with m = B / (b d). The bubble is reported both as a share of
  the total time, (p-1)/(v m + p - 1), and relative to the ideal time, (p-1)/(v m) (Narayanan et al. 2021).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional, Tuple

from dynacp.planner.memory import param_counts, params_per_gpu, stage_layers
from dynacp.planner.model import BatchConfig, ClusterConfig, Layout, ModelConfig, PlannerOptions


def bubble_fractions(pp: int, m: int, vpp: int = 1) -> Tuple[float, float]:
    """Pipeline bubble as (share of total time (p-1)/(v m + p - 1), relative to ideal time (p-1)/(v m))."""
    if pp <= 1:
        return 0.0, 0.0
    return (pp - 1) / (vpp * m + pp - 1), (pp - 1) / (vpp * m)


def linear_flops_per_token(model: ModelConfig) -> Tuple[float, float]:
    """(dense, routed-expert) training FLOPs per token without recompute: 6 x active parameters doing GEMMs (the
    output layer counts, the input embedding lookup does not)."""
    pc = param_counts(model)
    dense = pc.layers_tp + pc.layers_replicated + model.vocab_size * model.hidden_size
    expert = pc.experts * model.top_k / model.num_experts if model.num_experts else 0.0
    return 6.0 * dense, 6.0 * expert


def attention_flops(model: ModelConfig, sum_sq: float) -> float:
    """Causal attention training FLOPs of sequences with sum of squared lengths ``sum_sq``: 6 h_q L_attn sum s^2."""
    return 6.0 * model.q_size * model.attention_layers * sum_sq


def model_flops(model: ModelConfig, tokens: float, sum_sq: float) -> float:
    """Model FLOPs (no recompute) of ``tokens`` tokens in sequences with sum of squares ``sum_sq``."""
    d, e = linear_flops_per_token(model)
    return (d + e) * tokens + attention_flops(model, sum_sq)


def recompute_factors(opts: PlannerOptions) -> Tuple[float, float]:
    """(linear, attention) FLOPs multipliers for the recompute mode."""
    if opts.recompute == "full":
        return 4 / 3, 4 / 3
    if opts.recompute == "selective" and not opts.flash_attention:
        return 1.0, 4 / 3
    return 1.0, 1.0


def tp_message_volume(model: ModelConfig, batch: BatchConfig, layout: Layout, layers: Optional[int] = None) -> float:
    """TP all-reduce message bytes per micro-batch: 4 per layer x b (s/c) h x 2 B (the seed's 38.7 GB figure)."""
    n = model.num_layers if layers is None else layers
    return 4 * n * batch.micro_batch * (batch.seq_length / layout.cp) * model.hidden_size * 2


def link_bandwidth(cluster: ClusterConfig, span: int) -> float:
    """Bandwidth of a group spanning ``span`` consecutive ranks."""
    g = cluster.gpus_per_node
    return cluster.intra_node_bandwidth if span <= g and g % span == 0 else cluster.inter_node_bandwidth


@dataclass
class TimeBreakdown:
    """Seconds per optimizer step on the slowest GPU, and the volumes behind them."""

    compute: float
    """FLOPs of all m micro-batches at mfu x peak (recompute included)."""
    tp_comm: float
    """TP all-reduces (or SP all-gather + reduce-scatter)."""
    cp_comm: float
    """CP ring KV traffic not hidden behind attention."""
    ep_comm: float
    """EP dispatch/combine all-to-alls."""
    pp_comm: float
    """Pipeline point-to-point sends."""
    dp_comm: float
    """Gradient reduce-scatter + parameter all-gather over DP x CP (dense) and EDP (experts), once per step."""
    bubble: float
    """Idle pipeline time (p-1)/v micro-batch slots."""
    step: float
    """Predicted step time."""
    microbatches: int
    """m = B / (b d)."""
    bubble_of_total: float
    """(p-1)/(v m + p - 1)."""
    bubble_vs_ideal: float
    """(p-1)/(v m)."""
    tp_volume: float
    """TP message bytes per micro-batch on the stage (seed convention, before the ring factor)."""
    ep_volume: float
    """All-to-all bytes per GPU per micro-batch on the stage."""
    model_flops: float
    """Model FLOPs per step over all GPUs (6N + attention, no recompute)."""
    mfu: float
    """model_flops / (W x peak x step)."""

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


def step_time(
    model: ModelConfig,
    cluster: ClusterConfig,
    batch: BatchConfig,
    layout: Layout,
    opts: PlannerOptions,
    sum_sq_per_step: Optional[float] = None,
) -> TimeBreakdown:
    """Predicted step time of ``layout``. ``sum_sq_per_step``: sum of squared sequence lengths of one global batch
    (default B x s^2, i.e. full-length sequences)."""
    t, p, c, d, e, v = layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.vpp
    b, s, h = batch.micro_batch, batch.seq_length, model.hidden_size
    m = batch.global_batch // (b * d)
    tokens_step = batch.global_batch * s
    if sum_sq_per_step is None:
        sum_sq_per_step = batch.global_batch * float(s) ** 2
    lin_r, attn_r = recompute_factors(opts)
    f_dense, f_exp = linear_flops_per_token(model)
    speed = cluster.peak_flops * opts.mfu
    mb_tokens = b * s
    attn_mb = attention_flops(model, sum_sq_per_step / (m * d)) * attn_r
    lin_mb = (f_dense + f_exp * opts.moe_imbalance) * mb_tokens * lin_r
    share = t * c * p
    compute_mb = (lin_mb + attn_mb) / share / speed
    attn_time_mb = attn_mb / share / speed

    n_layers = stage_layers(model, p)
    full = opts.recompute == "full"
    T = b * s / c  # tokens per rank per micro-batch
    tp_mb = 0.0
    tp_vol = tp_message_volume(model, batch, layout, n_layers)
    if t > 1:
        tp_mb = tp_vol * (1.5 if full else 1.0) * 2 * (t - 1) / t / link_bandwidth(cluster, t)
    ep_mb, ep_vol = 0.0, 0.0
    moe_layers = model.moe_layers * n_layers / model.num_layers
    if model.is_moe and e > 1:
        ep_vol = (6 if full else 4) * moe_layers * (T / t) * model.top_k * h * 2 * (e - 1) / e * opts.moe_imbalance
        ep_mb = ep_vol / link_bandwidth(cluster, layout.etp * e)
    cp_mb = 0.0
    if c > 1:
        attn_layers = model.attention_layers * n_layers / model.num_layers
        kv = 2 * max(1.0, model.kv_heads / t) * model.dh * 2
        cp_time = 3 * attn_layers * (c - 1) * T * kv / link_bandwidth(cluster, t * c)
        cp_mb = max(0.0, cp_time - attn_time_mb)
    pp_mb = 0.0
    if p > 1:
        pp_mb = 2 * v * T * h * 2 / t / link_bandwidth(cluster, cluster.world)
    t_mb = compute_mb + tp_mb + ep_mb + cp_mb + pp_mb

    pd, pe = params_per_gpu(model, layout)
    gb = 4.0 if opts.grad_dtype == "fp32" else 2.0
    per_param = {"zero0": 2 * gb, "zero3": gb + 4.0}.get(opts.optimizer, gb + 2.0)
    dp_bw = link_bandwidth(cluster, cluster.world // p)
    n_dense, n_exp = d * c, layout.edp
    dp = (pd * per_param * (n_dense - 1) / n_dense + pe * per_param * (n_exp - 1) / n_exp) / dp_bw

    bubble = (p - 1) / v * t_mb if p > 1 else 0.0
    step = m * t_mb + bubble + dp
    of_total, vs_ideal = bubble_fractions(p, m, v)
    mflops = model_flops(model, tokens_step, sum_sq_per_step)
    return TimeBreakdown(
        compute=m * compute_mb, tp_comm=m * tp_mb, cp_comm=m * cp_mb, ep_comm=m * ep_mb, pp_comm=m * pp_mb,
        dp_comm=dp, bubble=bubble, step=step, microbatches=m, bubble_of_total=of_total, bubble_vs_ideal=vs_ideal,
        tp_volume=tp_vol, ep_volume=ep_vol, model_flops=mflops,
        mfu=mflops / (cluster.world * cluster.peak_flops * step) if step > 0 else 0.0,
    )


def ring_factor(n: int) -> float:
    """Per-rank wire bytes of a ring all-reduce relative to the message: 2 (n-1) / n."""
    return 2 * (n - 1) / n if n > 1 else 0.0


__all__ = [
    "TimeBreakdown", "attention_flops", "bubble_fractions", "linear_flops_per_token", "link_bandwidth", "model_flops",
    "recompute_factors", "ring_factor", "step_time", "tp_message_volume",
]
