"""Step time of one layout: FLOPs priced by the efficiency model, communication priced at the right link and by
what overlaps, and the pipeline bubble.

* Compute per micro-batch on the slowest pipeline stage (the stages' layer counts come from
  :func:`dynacp.planner.memory.stage_split`; the last stage also runs the output layer): dense GEMMs, grouped
  expert GEMMs, causal attention and the memory-bound kernels, each at the efficiency of
  :class:`dynacp.planner.efficiency.Efficiency` for this layout's per-GPU shapes. FLOPs follow Megatron's counter:
  6 x parameters per token for the GEMMs (routed experts scaled by k / n_e) and 6 h_q s^2 per causal attention layer.
  Full recompute re-runs one forward (x 4/3), ``recompute_mlp`` the dense MLPs', ``recompute_moe`` the MoE
  layers' (with their all-to-alls), ``recompute_mla_up_proj`` MLA's up-projections'; the memory-bound kernels move
  every activation byte a forward produces, and the bytes any recompute module drops from memory once more (the
  backward produces them again). A dropless MoE layer takes at least ``Efficiency.moe_layer_floor`` per micro-batch
  (host-bound). ``PlannerOptions.mfu`` set to a number replaces all of this by FLOPs / (mfu x peak), the earlier
  constant model.
* Communication per micro-batch per GPU (nccl-tests bus-bandwidth convention): TP 4 all-reduce equivalents per
  layer of b (s/c) h 2 bytes (6 with full recompute), on NVLink when the group fits in a node, only
  ``tp_exposed`` of it counted with TP comm overlap; CP ring KV 3 (c-1) T 2 g_t d_h 2 bytes per attention layer,
  exposed only beyond the attention it overlaps; EP 4 all-to-alls per MoE layer of (T/t) k h 2 bytes (e-1)/e, the
  cross-node share at the inter-node bandwidth when ETP x EP spans nodes (once per remote node with
  ``ep_dedup_nodes``, fewer nodes with group-limited routing), ``a2a_exposed`` of it counted with
  ``ep_comm_overlap``, all of it without; PP 2 v b (s/c) h 2 / t bytes of P2P, at the inter-node rate when stages
  sit on different nodes, hidden behind the stage's compute with interleaving and ``pp_comm_overlap`` (Megatron's
  overlap-p2p-communication).
* Per step: the DP reduce-scatter of gradients and all-gather of bf16 weights over DP x CP (dense) and EDP
  (experts), at the inter-node bandwidth once the group leaves the node. With ``dp_overlap`` (Megatron's
  overlap-grad-reduce / overlap-param-gather) only what exceeds the backward (reduce-scatter) and the forward
  (all-gather) of ``Efficiency.dp_overlap_microbatches`` micro-batches is exposed, plus half the bubble each with
  interleaving. ZeRO-2 reduce-scatters every micro-batch instead, ZeRO-3 also all-gathers every forward and
  backward; each hides behind its own micro-batch (:func:`dp_traffic`).
* Pipeline: step = (m + (p-1)/v) x t_microbatch + t_DP exposed, m = B / (b d). The bubble is reported both as a share
  of the total time, (p-1)/(v m + p - 1), and relative to the ideal time, (p-1)/(v m) (Narayanan et al. 2021).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional, Tuple

from dynacp.planner.efficiency import Efficiency
from dynacp.planner.memory import (
    mla_up_proj_params,
    param_counts,
    params_per_gpu,
    recomputed_bytes_per_token,
    stage_layer_count,
    stage_split,
    weight_bytes_per_param,
)
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


def alltoall_seconds(cluster: ClusterConfig, size: int, nbytes: float) -> float:
    """Seconds for an all-to-all in which each of ``size`` consecutive ranks sends ``nbytes`` spread evenly over
    its peers: the peers in the same node over NVLink, the others over the NIC, both at once."""
    g = cluster.gpus_per_node
    if size <= 1:
        return 0.0
    if size <= g and g % size == 0:
        return nbytes / cluster.intra_node_bandwidth
    local = (min(size, g) - 1) / (size - 1)
    return max(nbytes * local / cluster.intra_node_bandwidth, nbytes * (1 - local) / cluster.inter_node_bandwidth)


def remote_nodes_per_token(nodes: int, top_k: int, groups: Optional[int] = None, group_topk: Optional[int] = None
                           ) -> float:
    """Expected number of other nodes a token is dispatched to when its ``top_k`` experts are drawn uniformly (with
    replacement) from experts spread evenly over ``nodes`` nodes: (N-1)(1 - (1 - 1/N)^k). With group-limited
    routing (``groups`` contiguous expert groups, ``group_topk`` of them chosen per token) the experts are drawn
    from the chosen groups only. When a node holds G/N whole groups, it is reached unless none of its chosen groups
    gets an expert: 1 - sum_j P(j of its groups chosen) (1 - j/G_k)^k, j hypergeometric. When a group spans N/G
    nodes, a node is reached with (G_k/G)(1 - (1 - G/(G_k N))^k). Other splits fall back to the ungrouped value.
    DeepSeek-V3 at EP64 on 8 nodes (8 groups, 4 chosen, k = 8): 3.15 nodes instead of 4.60."""
    if nodes <= 1 or top_k <= 0:
        return 0.0
    plain = (nodes - 1) * (1 - (1 - 1 / nodes) ** top_k)
    if not groups or not group_topk or group_topk >= groups:
        return plain
    if groups % nodes == 0:
        per_node = groups // nodes
        miss = sum(math.comb(per_node, j) * math.comb(groups - per_node, group_topk - j) / math.comb(groups, group_topk)
                   * (1 - j / group_topk) ** top_k for j in range(0, min(per_node, group_topk) + 1))
        return (nodes - 1) * (1 - miss)
    if nodes % groups == 0:
        hit = group_topk / groups * (1 - (1 - groups / (group_topk * nodes)) ** top_k)
        return (nodes - 1) * hit
    return plain


def moe_dispatch_seconds(cluster: ClusterConfig, size: int, top_k: int, nbytes: float, dedup: bool,
                         groups: Optional[int] = None, group_topk: Optional[int] = None) -> float:
    """Seconds of EP dispatch/combine traffic of ``nbytes`` per GPU (k copies of each token) in a group of ``size``
    consecutive ranks. With ``dedup`` (hierarchical dispatch as in DeepEP / Megatron's HybridEP) a token crosses
    the network once per remote node it is routed to (:func:`remote_nodes_per_token`, which group-limited routing
    bounds) and fans out over NVLink there; without it every copy to another node uses the NIC."""
    g = cluster.gpus_per_node
    if size <= g or not dedup or top_k <= 0:
        return alltoall_seconds(cluster, size, nbytes)
    nodes = -(-size // g)
    inter = nbytes / top_k * remote_nodes_per_token(nodes, top_k, groups, group_topk)
    return max(nbytes / cluster.intra_node_bandwidth, inter / cluster.inter_node_bandwidth)


@dataclass
class TimeBreakdown:
    """Seconds per optimizer step on the slowest GPU, and the volumes behind them."""

    compute: float
    """Kernel time of all m micro-batches on the slowest stage (GEMMs, attention, memory-bound; recompute in)."""
    tp_comm: float
    """Exposed TP all-reduces (or SP all-gather + reduce-scatter)."""
    cp_comm: float
    """CP ring KV traffic not hidden behind attention."""
    ep_comm: float
    """Exposed EP dispatch/combine all-to-alls."""
    pp_comm: float
    """Pipeline point-to-point sends."""
    dp_comm: float
    """Exposed gradient reduce-scatter + parameter all-gather over DP x CP (dense) and EDP (experts), per step."""
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
    dp_total: float = 0.0
    """DP traffic time per step before overlap."""
    tokens_per_second: float = 0.0
    """Global batch tokens / step, per GPU (tokens/s/GPU)."""
    parts: Dict[str, float] = field(default_factory=dict)
    """Per micro-batch seconds on the slowest stage: 'gemm', 'grouped_gemm', 'attention', 'memory_bound', 'tp',
    'cp', 'ep', 'pp', 'host_bound' and their sum 'total'."""

    def to_dict(self) -> Dict[str, float]:
        return asdict(self)


def _efficiency(opts: PlannerOptions) -> Efficiency:
    return Efficiency.from_overrides(opts.efficiency)


def _gemm_seconds(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
    layers: int, last: bool,
) -> Tuple[float, float]:
    """(dense GEMM, grouped expert GEMM) seconds of one micro-batch (fwd + bwd) on a stage of ``layers`` layers."""
    eff = _efficiency(opts)
    t, c, L = layout.tp, layout.cp, model.num_layers
    h, tokens = model.hidden_size, batch.micro_batch * batch.seq_length / c
    lin_r = 4 / 3 if opts.recompute == "full" else 1.0
    pc = param_counts(model)
    speed = cluster.peak_flops * (eff.fp8_gemm_speedup if opts.fp8 else 1.0)
    output = model.vocab_size * h * (1 + model.num_mtp_layers) if last else 0.0  # MTP runs the head again
    dense_params = (pc.layers_tp + pc.layers_replicated) * layers / L + output
    dense_flops = 6.0 * dense_params * tokens * lin_r / t
    partial = opts.recompute != "full"
    mlp_r = 4 / 3 if opts.recompute_mlp and partial else 1.0
    moe_r = 4 / 3 if opts.recompute_moe and partial and model.moe_layers else 1.0
    if mlp_r > 1 or moe_r > 1:  # the recomputed share of the dense GEMMs runs its forward twice
        mult = 3 if model.gated_mlp else 2
        mlp = ((L - model.moe_layers) * mult * h * model.ffn_hidden_size * (mlp_r - 1)
               + model.moe_layers * model.num_shared_experts * mult * h * model.shared_ffn * (moe_r - 1)) * layers / L
        dense_flops += 6.0 * min(mlp, dense_params / 3) * tokens / t
    if opts.recompute_mla_up_proj and partial:  # MLA's up-projections run their forward twice
        dense_flops += 2.0 * mla_up_proj_params(model) * model.attention_layers * layers / L * tokens / t
    fc1 = (2 if model.gated_mlp else 1) * max(model.ffn_hidden_size, model.expert_ffn_hidden_size or 1)
    if opts.mfu is not None:
        dense_s = dense_flops / (cluster.peak_flops * opts.mfu)
    else:
        dense_s = dense_flops / (speed * eff.gemm(tokens, max(1.0, fc1 / t), h))
    if not (model.is_moe and model.num_experts):
        return dense_s, 0.0
    e, te = layout.ep, layout.etp
    active = pc.experts * model.top_k / model.num_experts * layers / L
    exp_flops = 6.0 * active * tokens * lin_r * moe_r * opts.moe_imbalance / t
    if opts.mfu is not None:
        return dense_s, exp_flops / (cluster.peak_flops * opts.mfu)
    # tokens each local expert receives per micro-batch: the EP group's tokens (T/t per rank, gathered over ETP)
    tpe = tokens / t * e * te * model.top_k / model.num_experts * opts.moe_imbalance
    width = (2 if model.gated_mlp else 1) * model.expert_ffn_hidden_size / te
    return dense_s, exp_flops / (speed * eff.grouped(tpe, max(1.0, width), h))


def _other_seconds(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
    layers: int, sum_sq_mb: float,
) -> Tuple[float, float]:
    """(attention, memory-bound) seconds of one micro-batch (fwd + bwd) on a stage of ``layers`` layers;
    ``sum_sq_mb``: sum of squared sequence lengths in one micro-batch."""
    eff = _efficiency(opts)
    t, c, L = layout.tp, layout.cp, model.num_layers
    full = opts.recompute == "full"
    attn_r = 4 / 3 if full or (opts.recompute == "selective" and not opts.flash_attention) else 1.0
    attn_layers = model.attention_layers * layers / L
    attn_flops = 6.0 * model.q_size * attn_layers * sum_sq_mb * attn_r / (t * c)
    tokens = batch.micro_batch * batch.seq_length
    if opts.mfu is not None:
        return attn_flops / (cluster.peak_flops * opts.mfu), 0.0
    seq = sum_sq_mb / tokens if tokens else batch.seq_length  # token-weighted mean sequence length
    attn_s = attn_flops / (cluster.peak_flops * eff.attention(seq / c))
    produced, dropped = recomputed_bytes_per_token(model, opts, batch.seq_length)
    per_token = eff.elementwise_passes * produced + dropped  # the dropped bytes are produced again in the backward
    mem_bytes = per_token * layers * tokens / (t * c) * (4 / 3 if full else 1.0)
    return attn_s, mem_bytes / cluster.hbm_bandwidth


def _comm_seconds(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
    layers: int, attn_s: float,
) -> Dict[str, float]:
    """Exposed TP, CP, EP and PP seconds of one micro-batch on a stage of ``layers`` layers, and the volumes."""
    eff = _efficiency(opts)
    t, p, c, e, v = layout.tp, layout.pp, layout.cp, layout.ep, layout.vpp
    h, L = model.hidden_size, model.num_layers
    full = opts.recompute == "full"
    T = batch.micro_batch * batch.seq_length / c
    out = {"tp": 0.0, "cp": 0.0, "ep": 0.0, "pp": 0.0}
    tp_vol = tp_message_volume(model, batch, layout, layers)
    if t > 1:
        out["tp"] = tp_vol * (1.5 if full else 1.0) * 2 * (t - 1) / t / link_bandwidth(cluster, t)
        out["tp"] *= eff.tp_exposed if opts.tp_comm_overlap else 1.0
    ep_vol = 0.0
    if model.is_moe and e > 1:
        moe_layers = model.moe_layers * layers / L
        passes = 6 if full or opts.recompute_moe else 4
        ep_vol = passes * moe_layers * (T / t) * model.top_k * h * 2 * (e - 1) / e * opts.moe_imbalance
        a2a = moe_dispatch_seconds(cluster, layout.etp * e, model.top_k, ep_vol, opts.ep_dedup_nodes,
                                   model.num_expert_groups, model.expert_group_topk)
        out["ep"] = a2a * (eff.a2a_exposed if opts.ep_comm_overlap else 1.0)
    if c > 1:
        attn_layers = model.attention_layers * layers / L
        kv = 2 * max(1.0, model.kv_heads / t) * model.dh * 2
        cp_time = 3 * attn_layers * (c - 1) * T * kv / link_bandwidth(cluster, t * c)
        out["cp"] = max(0.0, cp_time - attn_s)
    if p > 1:
        out["pp"] = 2 * v * T * h * 2 / t / link_bandwidth(cluster, cluster.world // p * 2)
    out["tp_volume"], out["ep_volume"] = tp_vol, ep_vol
    return out


def _stage_microbatch(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions,
    sum_sq_mb: float,
) -> Dict[str, float]:
    """The slowest stage's per-micro-batch seconds by part ('total' = their sum)."""
    split = stage_split(model.num_layers, layout.pp)
    last_layers = stage_layer_count(model, layout.pp, layout.pp - 1)
    cands = {(stage_layer_count(model, layout.pp, 0), layout.pp == 1), (max(split), False), (last_layers, True)}
    worst: Dict[str, float] = {}
    for layers, last in sorted(cands):
        gemm, grouped = _gemm_seconds(model, cluster, batch, layout, opts, layers, last)
        attn, membound = _other_seconds(model, cluster, batch, layout, opts, layers, sum_sq_mb)
        parts = {"gemm": gemm, "grouped_gemm": grouped, "attention": attn, "memory_bound": membound}
        parts.update(_comm_seconds(model, cluster, batch, layout, opts, layers, attn))
        busy = sum(parts[k] for k in ("gemm", "grouped_gemm", "attention", "memory_bound", "tp", "cp", "ep"))
        if layout.vpp > 1 and opts.pp_comm_overlap:  # asynchronous P2P behind the next chunk's compute
            parts["pp"] = max(0.0, parts["pp"] - busy)
        parts["host_bound"] = _host_floor(model, opts, layers, busy)
        parts["total"] = busy + parts["pp"] + parts["host_bound"]
        if not worst or parts["total"] > worst["total"]:
            worst = parts
    return worst


def _host_floor(model: ModelConfig, opts: PlannerOptions, layers: int, busy: float) -> float:
    """Seconds the GPU idles on a stage because a MoE layer cannot take less than Efficiency.moe_layer_floor per
    micro-batch: a dropless MoE layer waits for the tokens-per-expert counts on the host before it can launch its
    expert kernels, so small experts are bound by the host, not by the GPU."""
    if opts.mfu is not None or not model.moe_layers or layers <= 0:
        return 0.0
    floor = _efficiency(opts).moe_layer_floor
    moe_layers = model.moe_layers * layers / model.num_layers
    per_layer = busy / layers
    return moe_layers * max(0.0, floor - per_layer)


def _dp_seconds_per_byte(cluster: ClusterConfig, layout: Layout, model: ModelConfig) -> float:
    """Seconds to reduce-scatter (or all-gather) one byte per parameter over DP x CP (dense) and EDP (experts), on
    the stage with the most parameters."""
    dp_bw = link_bandwidth(cluster, cluster.world // layout.pp)
    n_dense, n_exp = layout.dp * layout.cp, layout.edp
    worst = 0.0
    for st in ("first", "middle", "last"):
        pd, pe = params_per_gpu(model, layout, st)
        worst = max(worst, pd * (n_dense - 1) / n_dense + pe * (n_exp - 1) / n_exp)
    return worst / dp_bw


def dp_traffic(cluster: ClusterConfig, layout: Layout, opts: PlannerOptions, model: ModelConfig) -> Dict[str, float]:
    """DP seconds before overlap: 'rs_step' / 'ag_step' once per step, 'rs_mb' / 'ag_mb_fwd' / 'ag_mb_bwd' once per
    micro-batch. The distributed optimizer and ZeRO-1 keep whole gradients over the micro-batches and reduce-scatter
    them once per step (gb bytes per parameter) and all-gather the updated weights once (2 B bf16, 1 B FP8 primary
    weights: memory.weight_bytes_per_param); plain DDP
    (zero0) all-reduces once (2 gb). ZeRO-2 keeps only a gradient shard, so each micro-batch's backward
    reduce-scatters its gradients (as DeepSpeed's ZeRO-2 and FSDP without no_sync do; the Llama 3 paper's FSDP
    "shards optimizer states and gradients" and reduce-scatters them in fp32). ZeRO-3 also all-gathers the weights
    in each micro-batch's forward and again in its backward."""
    unit = _dp_seconds_per_byte(cluster, layout, model)
    gb = 4.0 if opts.grad_dtype == "fp32" else 2.0
    wb = weight_bytes_per_param(opts)[0] * unit  # the primary weights: 1 B with FP8 primary weights
    out = {"rs_step": 0.0, "ag_step": 0.0, "rs_mb": 0.0, "ag_mb_fwd": 0.0, "ag_mb_bwd": 0.0}
    if opts.optimizer == "zero0":
        out["rs_step"] = 2 * gb * unit
    elif opts.optimizer in ("distributed", "zero1"):
        out["rs_step"], out["ag_step"] = gb * unit, wb
    elif opts.optimizer == "zero2":
        out["rs_mb"], out["ag_step"] = gb * unit, wb
    else:
        out["rs_mb"], out["ag_mb_fwd"], out["ag_mb_bwd"] = gb * unit, wb, wb
    return out


def _dp_exposed(dp: Dict[str, float], opts: PlannerOptions, m: int, t_mb: float, bubble: float, v: int) -> float:
    """Exposed DP seconds per step. With ``dp_overlap`` the step-level reduce-scatter hides behind the backward of
    the last ``dp_overlap_microbatches`` micro-batches (2/3 of each) and the all-gather behind the forward of the
    first (1/3), each with half the bubble under interleaving; a per-micro-batch reduce-scatter (ZeRO-2/3) hides
    behind its own micro-batch's backward and a per-micro-batch all-gather behind its forward (backward)."""
    per_mb = dp["rs_mb"] + dp["ag_mb_fwd"] + dp["ag_mb_bwd"]
    if not opts.dp_overlap:
        return dp["rs_step"] + dp["ag_step"] + m * per_mb
    share = 0.5 * bubble if v > 1 else 0.0
    window = min(m, _efficiency(opts).dp_overlap_microbatches) * t_mb
    step = max(0.0, dp["rs_step"] - 2 / 3 * window - share) + max(0.0, dp["ag_step"] - window / 3 - share)
    mb = max(0.0, dp["rs_mb"] + dp["ag_mb_bwd"] - 2 / 3 * t_mb) + max(0.0, dp["ag_mb_fwd"] - t_mb / 3)
    return step + m * mb


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
    p, d, v = layout.pp, layout.dp, layout.vpp
    b, s = batch.micro_batch, batch.seq_length
    m = batch.global_batch // (b * d)
    tokens_step = batch.global_batch * s
    if sum_sq_per_step is None:
        sum_sq_per_step = batch.global_batch * float(s) ** 2
    mb = _stage_microbatch(model, cluster, batch, layout, opts, sum_sq_per_step / (m * d))
    t_mb = mb["total"]
    compute_mb = mb["gemm"] + mb["grouped_gemm"] + mb["attention"] + mb["memory_bound"]
    bubble = (p - 1) / v * t_mb if p > 1 else 0.0
    traffic = dp_traffic(cluster, layout, opts, model)
    dp_total = traffic["rs_step"] + traffic["ag_step"] + m * (traffic["rs_mb"] + traffic["ag_mb_fwd"]
                                                              + traffic["ag_mb_bwd"])
    dp = _dp_exposed(traffic, opts, m, t_mb, bubble, v)
    step = m * t_mb + bubble + dp
    of_total, vs_ideal = bubble_fractions(p, m, v)
    mflops = model_flops(model, tokens_step, sum_sq_per_step)
    return TimeBreakdown(
        compute=m * compute_mb, tp_comm=m * mb["tp"], cp_comm=m * mb["cp"], ep_comm=m * mb["ep"],
        pp_comm=m * mb["pp"], dp_comm=dp, bubble=bubble, step=step, microbatches=m, bubble_of_total=of_total,
        bubble_vs_ideal=vs_ideal, tp_volume=mb["tp_volume"], ep_volume=mb["ep_volume"], model_flops=mflops,
        mfu=mflops / (cluster.world * cluster.peak_flops * step) if step > 0 else 0.0, dp_total=dp_total,
        tokens_per_second=tokens_step / step / cluster.world if step > 0 else 0.0,
        parts={k: v for k, v in mb.items() if not k.endswith("volume")},
    )


def ring_factor(n: int) -> float:
    """Per-rank wire bytes of a ring all-reduce relative to the message: 2 (n-1) / n."""
    return 2 * (n - 1) / n if n > 1 else 0.0


__all__ = [
    "TimeBreakdown", "alltoall_seconds", "attention_flops", "bubble_fractions", "linear_flops_per_token",
    "link_bandwidth", "model_flops", "moe_dispatch_seconds", "recompute_factors", "remote_nodes_per_token", "ring_factor",
    "step_time", "tp_message_volume",
]
