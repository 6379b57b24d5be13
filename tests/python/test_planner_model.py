"""Issue 22: the planner's memory, time, efficiency and rules beyond the validation table -- the concrete problems
the issue lists (llama3-8b on 64 H100, Llama 3 405B PP16, PP128 over 126 layers, EP across nodes) and the
properties of the new terms."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import dynacp.planner as pl
from dynacp.cli import main
from dynacp.planner import cli as planner_cli
from dynacp.planner.efficiency import Efficiency
from dynacp.planner.memory import _layer_bytes_per_token, in_flight, memory_breakdown, mla_up_proj_params, stage_split
from dynacp.planner.timing import alltoall_seconds, moe_dispatch_seconds, step_time
from dynacp.planner.validation import h100_cluster


def _opts(**kw) -> pl.PlannerOptions:
    o = pl.PlannerOptions(**kw)
    o.validate()
    return o


# ---- the problems the issue names ----------------------------------------------------------------------------------


def test_llama3_8b_on_64_h100_at_4k_favours_data_parallel_layouts() -> None:
    table = pl.configs("llama3-8b", "h100-64", {"global_batch": 256, "seq_length": 4096})
    best = table.best.layout
    assert (best.pp, best.cp) == (1, 1) and best.tp <= 2, best
    top10 = [r.layout for r in table.rows[:10]]
    assert pl.Layout(1, 1, 1, 64) in [pl.Layout(x.tp, x.pp, x.cp, x.dp) for x in top10]
    # the old first choice, a deep pipeline with a large CP group and DP 1, is far down
    (deep,) = [i for i, r in enumerate(table.rows) if (r.layout.tp, r.layout.pp, r.layout.cp) == (1, 8, 8)]
    assert deep >= 20
    assert table.best.time.step < table.rows[deep].time.step * 0.85


def test_llama3_405b_pp16_fits_with_uneven_first_and_last_stages() -> None:
    batch = {"global_batch": 2048, "seq_length": 8192}
    table = pl.configs("llama3.1-405b", h100_cluster(8192), batch, allow_uneven_pp=True, optimizer="zero2",
                       max_vpp=8)
    (row,) = table.find(tp=8, pp=16, cp=1, vpp=1)
    assert row.feasible, row.reason
    assert row.flags == ["uneven PP: 126 layers as 7 + 8 x 14 + 7"]
    assert stage_split(126, 16) == [7] + [8] * 14 + [7]
    # the most loaded stage is the second: 8 layers x 15 in-flight micro-batches (1F1B) beat 7 x 16
    assert row.memory.stage == "middle" and row.memory.layers == 8 and row.memory.in_flight == 15
    # interleaving (V = 8, as the paper's chunks of one layer imply) needs Megatron's extra warm-up micro-batches
    (v8,) = table.find(tp=8, pp=16, cp=1, vpp=8)
    assert v8.reason.startswith("memory: needs") and v8.memory.activations > row.memory.activations


def test_pp128_for_126_layers_is_rejected_by_its_rule() -> None:
    table = pl.configs("llama3.1-405b", h100_cluster(1024), {"global_batch": 1024, "seq_length": 4096},
                       allow_uneven_pp=True)
    rows = table.find(pp=128)
    assert rows and all("PP stage without layers: PP 128 exceeds the 126 layers" in r.reason for r in rows)
    # an uneven split that would leave the last stage empty is rejected too, naming the split
    model = pl.ModelConfig(num_layers=10, hidden_size=64, num_attention_heads=4, vocab_size=100, ffn_hidden_size=128)
    assert stage_split(10, 9) == [0] + [2] * 7 + [0]
    cand = pl.check(model, pl.ClusterConfig(num_nodes=9, gpus_per_node=1, gpu_memory=80e9, peak_flops=1e15),
                    pl.BatchConfig(9, 128), pl.Layout(1, 9, 1, 1), _opts(allow_uneven_pp=True))
    assert any(v.startswith("PP stage without layers: 10 layers over 9 stages") for v in cand.violations)


def test_ep_spans_nodes_and_is_priced_so() -> None:
    batch = {"global_batch": 2048, "seq_length": 4096}
    table = pl.configs("qwen3-235b-a22b", h100_cluster(256), batch, etp="1", allow_uneven_pp=True)
    ep32 = [r for r in table.find(tp=2, pp=8, cp=1, ep=32, vpp=1)]
    assert ep32 and ep32[0].feasible
    strict = pl.configs("qwen3-235b-a22b", h100_cluster(256), batch, etp="1", allow_uneven_pp=True, ep_in_node=True)
    assert all("EP in node" in r.reason for r in strict.find(ep=32))
    # the same bytes cost more once the group leaves the node, less with per-node deduplication
    c = h100_cluster(64)
    assert alltoall_seconds(c, 8, 1e9) == pytest.approx(1e9 / 350e9)
    plain = moe_dispatch_seconds(c, 32, 8, 1e9, dedup=False)
    dedup = moe_dispatch_seconds(c, 32, 8, 1e9, dedup=True)
    assert plain == pytest.approx(1e9 * 24 / 31 / 50e9)
    assert alltoall_seconds(c, 8, 1e9) < dedup < plain
    # 8 experts over 4 nodes reach 3 (1 - (3/4)^8) = 2.70 remote nodes per token instead of 8 x 24/31 copies
    assert dedup == pytest.approx(1e9 / 8 * 3 * (1 - 0.75 ** 8) / 50e9)


# ---- memory -----------------------------------------------------------------------------------------------------


def test_breakdown_names_every_term_and_sums_to_the_total() -> None:
    model = pl.model_preset("qwen3-30b-a3b")
    batch = pl.BatchConfig(512, 4096, 1)
    lay = pl.Layout(1, 2, 1, 8, 8, 1, 2, 1)
    mem = memory_breakdown(model, batch, lay, _opts(fp8=True), m=64)
    terms = mem.terms()
    assert set(terms) == {"weights (bf16)", "weights (fp8 copy)", "main grads", "optimizer (dense)",
                          "optimizer (experts)", "activations (layers)", "activations (embedding)",
                          "logits + cross-entropy", "communicator buffers", "backward working set"}
    assert sum(terms.values()) == pytest.approx(mem.total)
    assert terms["weights (fp8 copy)"] == pytest.approx(mem.params_dense + mem.params_expert)
    assert json.dumps(mem.to_dict())  # serialisable, terms included


def test_grad_dtype_fp8_and_mlp_recompute_change_memory_as_stated() -> None:
    model = pl.model_preset("llama3-70b")
    batch = pl.BatchConfig(128, 8192, 1)
    lay = pl.Layout(4, 8, 1, 2, vpp=5)
    base = memory_breakdown(model, batch, lay, _opts(), m=64)
    bf16 = memory_breakdown(model, batch, lay, _opts(grad_dtype="bf16"), m=64)
    assert base.grads == pytest.approx(2 * bf16.grads)  # fp32 main grads are 4 B, bf16 2 B
    fp8 = memory_breakdown(model, batch, lay, _opts(fp8=True), m=64)
    # FP8 saves the QKV, fc1 and fc2 inputs' second byte: h + h + f per token and layer, and keeps the output
    # projection's 1-byte cast of the attention output beside its bf16 copy: h_q more (issue 37)
    h, f, hq = 8192, 28672, 8192
    saved = (2 * h + f - hq) * 8192 / 4 * base.layers * base.in_flight
    assert base.activations - fp8.activations == pytest.approx(saved, rel=1e-9)
    mlp = memory_breakdown(model, batch, lay, _opts(recompute_mlp=True), m=64)
    assert mlp.activations < fp8.activations


def test_interleaved_in_flight_follows_megatrons_warmup() -> None:
    lay = pl.Layout(8, 16, 1, 64, vpp=8)
    # rank i holds 2 (p - i - 1) + (v - 1) p + 1 chunks of L / (p v) layers
    for i in (0, 1, 15):
        chunks = 2 * (16 - i - 1) + 7 * 16 + 1
        assert in_flight(lay, 32, i) == pytest.approx(chunks / 8)
    assert in_flight(pl.Layout(8, 16, 1, 64), 32, 1) == 15 and in_flight(pl.Layout(8, 16, 1, 64), 8, 1) == 8
    # Megatron caps the warm-up at the step's m v chunks: with m = p the first p/2 ranks run all m v forwards first
    assert in_flight(lay, 16, 1) == 16 and in_flight(lay, 16, 7) == 16
    assert in_flight(lay, 16, 8) == pytest.approx(127 / 8) and in_flight(lay, 16, 15) == pytest.approx(113 / 8)
    assert in_flight(lay, 20, 1) == pytest.approx((2 * 14 + 7 * 16 + 1) / 8) and in_flight(lay, 17, 0) == 17


# ---- time -------------------------------------------------------------------------------------------------------


def test_efficiency_falls_with_smaller_matrices_and_shorter_sequences() -> None:
    e = Efficiency()
    by_tp = [e.gemm(8192, 28672 * 2 / t, 8192) for t in (1, 2, 4, 8)]
    assert by_tp == sorted(by_tp, reverse=True) and by_tp[0] <= e.gemm_max
    by_len = [e.attention(s) for s in (256, 1024, 4096, 16384)]
    assert by_len == sorted(by_len)
    # the H100 profile it is fitted to (h100_compute-attn-megatron.csv, Megatron's 6 h_q s^2 count): 177, 243,
    # 293, 352 TFLOP/s of 989 at 512, 1K, 4K, 16K tokens
    for s, tflops in [(512, 177), (1024, 243), (4096, 293), (16384, 352)]:
        assert e.attention(s) * 989 == pytest.approx(tflops, rel=0.1)
    by_tpe = [e.grouped(t, 1536, 4096) for t in (64, 256, 1024, 4096)]
    assert by_tpe == sorted(by_tpe) and by_tpe[-1] < e.gemm(4096, 1536, 4096)


def test_fit_from_a_profile_recovers_the_constants() -> None:
    from dynacp.planner.efficiency import fit_attention, fit_gemm

    # H100 attention profile (h100_compute-attn-megatron.csv): length, TFLOP/s in Megatron's count
    prof = [(512, 177e12), (1024, 243e12), (2048, 276e12), (4096, 293e12), (8192, 326e12), (16384, 352e12)]
    fit = fit_attention(prof, 989e12)
    assert fit["attn_max"] == pytest.approx(Efficiency().attn_max, abs=0.01)
    assert fit["attn_half_length"] == pytest.approx(Efficiency().attn_half_length, rel=0.1)
    # synthetic GEMMs from known constants come back exactly
    e = Efficiency(gemm_max=0.8, gemm_half_intensity=200)
    shapes = [(m, n, k) for m, n, k in [(512, 1024, 1024), (2048, 4096, 4096), (8192, 8192, 8192), (1024, 512, 4096)]]
    g = fit_gemm([(m, n, k, e.gemm(m, n, k) * 989e12) for m, n, k in shapes], 989e12)
    assert g == pytest.approx({"gemm_max": 0.8, "gemm_half_intensity": 200})
    assert _opts(efficiency={**fit, **g}).efficiency["gemm_max"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="at least two measurements"):
        fit_attention([(1024, 2e14)], 989e12)


def test_efficiency_overrides_and_bad_values() -> None:
    model, cluster, batch = pl.model_preset("llama3-8b"), pl.cluster_preset("h100-64"), pl.BatchConfig(256, 4096)
    lay = pl.Layout(1, 1, 1, 64)
    fast = step_time(model, cluster, batch, lay, _opts(efficiency={"gemm_max": 0.9}))
    slow = step_time(model, cluster, batch, lay, _opts(efficiency={"gemm_max": 0.5}))
    assert fast.parts["gemm"] < slow.parts["gemm"]
    assert slow.parts["gemm"] / fast.parts["gemm"] == pytest.approx(0.9 / 0.5)
    with pytest.raises(ValueError, match=r"efficiency: unknown field\(s\) gemm_peak"):
        _opts(efficiency={"gemm_peak": 0.9})
    with pytest.raises(ValueError, match=r"efficiency.gemm_max must be in \(0, 1\]"):
        _opts(efficiency={"gemm_max": 1.5})
    with pytest.raises(ValueError, match=r"ClusterConfig.hbm_bandwidth must be a positive number"):
        pl.ClusterConfig(1, 8, 80e9, 1e15, hbm_bandwidth=-1).validate()


def test_constant_mfu_prices_every_flop_alike() -> None:
    model, cluster, batch = pl.model_preset("llama3-8b"), pl.cluster_preset("h100-64"), pl.BatchConfig(256, 4096)
    t = step_time(model, cluster, batch, pl.Layout(1, 1, 1, 64), _opts(mfu=0.4))
    assert t.compute * cluster.world == pytest.approx(t.model_flops / (0.4 * cluster.peak_flops), rel=1e-9)


def test_dp_overlap_hides_traffic_and_fp8_speeds_up_gemms() -> None:
    model, cluster, batch = pl.model_preset("llama3-8b"), pl.cluster_preset("h100-64"), pl.BatchConfig(256, 4096)
    lay = pl.Layout(1, 1, 1, 64)
    exposed = step_time(model, cluster, batch, lay, _opts(dp_overlap=False))
    hidden = step_time(model, cluster, batch, lay, _opts())
    assert exposed.dp_comm == pytest.approx(exposed.dp_total) and 0 <= hidden.dp_comm < exposed.dp_comm
    # 8.03B params x (4 B fp32 grads + 2 B bf16 weights) x 63/64 over 50 GB/s
    assert hidden.dp_total == pytest.approx(8.03e9 * 6 * 63 / 64 / 50e9, rel=0.01)
    fp8 = step_time(model, cluster, batch, lay, _opts(fp8=True))
    assert fp8.parts["gemm"] == pytest.approx(hidden.parts["gemm"] / Efficiency().fp8_gemm_speedup)
    assert fp8.parts["attention"] == pytest.approx(hidden.parts["attention"])


def test_tp_inside_a_node_uses_nvlink_and_overlap_counts_a_share() -> None:
    model, cluster, batch = pl.model_preset("llama3-70b"), pl.cluster_preset("h100-64"), pl.BatchConfig(64, 4096)
    t8 = step_time(model, cluster, batch, pl.Layout(8, 1, 1, 8), _opts(tp_comm_overlap=False))
    t16 = step_time(model, cluster, batch, pl.Layout(16, 1, 1, 4), _opts(tp_comm_overlap=False, tp_in_node=False))
    # TP 16 crosses nodes: its (smaller per-GPU) traffic runs at 50 GB/s instead of 350 GB/s
    assert t16.parts["tp"] > t8.parts["tp"] * 3
    hidden = step_time(model, cluster, batch, pl.Layout(8, 1, 1, 8), _opts())
    assert hidden.parts["tp"] == pytest.approx(t8.parts["tp"] * Efficiency().tp_exposed)


def test_moe_host_floor_binds_small_experts_only() -> None:
    batch = pl.BatchConfig(1024, 4096, 1)
    small = step_time(pl.model_preset("qwen3-30b-a3b"), h100_cluster(16), batch, pl.Layout(1, 2, 1, 8, 8, 1, 1, 1),
                      _opts(fp8=True))
    assert small.parts["host_bound"] > 0
    big = step_time(pl.model_preset("deepseek-v3"), h100_cluster(1024), pl.BatchConfig(8192, 4096),
                    pl.Layout(2, 8, 1, 64, 64, 1, 4, 2), _opts(fp8=True, allow_uneven_pp=True))
    assert big.parts["host_bound"] == 0


# ---- CLI --------------------------------------------------------------------------------------------------------


def test_cli_new_flags_and_old_ones(capsys) -> None:
    args = ["--model", "llama3-8b", "--cluster", "h100-64", "--top", "3"]
    assert planner_cli.main([*args, "--fp8", "--no-dp-overlap", "--no-pp-overlap", "--no-ep-overlap", "--ep-in-node",
                             "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["options"]["fp8"] and not res["options"]["dp_overlap"] and res["options"]["ep_in_node"]
    assert not res["options"]["pp_comm_overlap"] and not res["options"]["ep_comm_overlap"]
    assert res["options"]["memory_headroom"] == pytest.approx(0.92)
    assert planner_cli.main([*args, "--mfu", "0.45", "--headroom", "0.8"]) == 0
    assert "usable 80%" in capsys.readouterr().out


# ---- published-run modelling: node-limited routing, P2P overlap, ZeRO-2 per micro-batch, H100 capacity --------------


def test_group_limited_routing_bounds_the_nodes_a_token_reaches() -> None:
    from dynacp.planner.timing import remote_nodes_per_token as remote

    # no groups: (N-1)(1 - (1 - 1/N)^k); one group per node with every group allowed is the same thing
    assert remote(8, 8) == pytest.approx(7 * (1 - (7 / 8) ** 8))
    assert remote(8, 8, 8, 8) == pytest.approx(remote(8, 8))
    # DeepSeek-V3 at EP64 on 8 nodes, 8 groups, 4 chosen: a node is chosen with 4/8 and then reached unless all
    # 8 experts miss it, 7 x 0.5 x (1 - 0.75^8) = 3.15 other nodes (4.59 without the limit)
    assert remote(8, 8, 8, 4) == pytest.approx(7 * 0.5 * (1 - 0.75 ** 8))
    # two groups per node (EP32 on 4 nodes): hypergeometric count of a node's chosen groups
    miss = (15 / 70) + (40 / 70) * 0.75 ** 8 + (15 / 70) * 0.5 ** 8
    assert remote(4, 8, 8, 4) == pytest.approx(3 * (1 - miss))
    # a group spread over two nodes (16 nodes, 8 groups): chosen with 4/8, then hit by 1/8 of the draws each
    assert remote(16, 8, 8, 4) == pytest.approx(15 * 0.5 * (1 - (7 / 8) ** 8))
    assert remote(1, 8, 8, 4) == 0.0
    c = h100_cluster(64)
    limited = moe_dispatch_seconds(c, 64, 8, 1e9, dedup=True, groups=8, group_topk=4)
    assert limited == pytest.approx(1e9 / 8 * remote(8, 8, 8, 4) / 50e9)
    assert limited < moe_dispatch_seconds(c, 64, 8, 1e9, dedup=True)


def test_expert_groups_are_validated() -> None:
    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=100, num_experts=16, top_k=4,
                expert_ffn_hidden_size=32)
    pl.ModelConfig(**base, num_expert_groups=4, expert_group_topk=2).validate()
    for bad, words in [({"num_expert_groups": 4}, "go together"), ({"num_expert_groups": 3, "expert_group_topk": 1},
                       "must divide"), ({"num_expert_groups": 8, "expert_group_topk": 1}, "at least top_k")]:
        with pytest.raises(ValueError, match=words):
            pl.ModelConfig(**base, **bad).validate()
    ds = pl.model_preset("deepseek-v3")
    assert (ds.num_expert_groups, ds.expert_group_topk) == (8, 4)


def test_p2p_hides_behind_compute_only_with_interleaving() -> None:
    model, cluster, batch = pl.model_preset("llama3-70b"), h100_cluster(64), pl.BatchConfig(128, 8192)
    lay = pl.Layout(4, 8, 1, 2, vpp=5)
    shown = step_time(model, cluster, batch, lay, _opts(pp_comm_overlap=False))
    # 2 v sends of b s h x 2 B / t per micro-batch across nodes at 50 GB/s
    assert shown.parts["pp"] == pytest.approx(2 * 5 * 8192 * 8192 * 2 / 4 / 50e9)
    hidden = step_time(model, cluster, batch, lay, _opts())
    assert hidden.parts["pp"] == 0 and hidden.step < shown.step
    plain = pl.Layout(4, 8, 1, 2)  # 1F1B without interleaving: blocking sends, always counted
    assert step_time(model, cluster, batch, plain, _opts()).parts["pp"] == pytest.approx(
        step_time(model, cluster, batch, plain, _opts(pp_comm_overlap=False)).parts["pp"])


def test_zero2_reduce_scatters_every_micro_batch() -> None:
    from dynacp.planner.timing import dp_traffic

    model, cluster, batch = pl.model_preset("llama3-8b"), h100_cluster(64), pl.BatchConfig(256, 4096)
    lay = pl.Layout(1, 1, 1, 64)
    unit = 8.03e9 * 63 / 64 / 50e9  # one byte per parameter over DP 64 across nodes
    dist = dp_traffic(cluster, lay, _opts(), model)
    assert dist["rs_step"] == pytest.approx(4 * unit, rel=0.01) and dist["rs_mb"] == 0
    z2 = dp_traffic(cluster, lay, _opts(optimizer="zero2"), model)
    assert z2["rs_mb"] == pytest.approx(4 * unit, rel=0.01) and z2["ag_step"] == pytest.approx(2 * unit, rel=0.01)
    z3 = dp_traffic(cluster, lay, _opts(optimizer="zero3"), model)
    assert z3["ag_mb_fwd"] == z3["ag_mb_bwd"] == pytest.approx(2 * unit, rel=0.01) and z3["ag_step"] == 0
    m = 256 // 64
    t = step_time(model, cluster, batch, lay, _opts(optimizer="zero2", dp_overlap=False))
    assert t.dp_total == pytest.approx(m * z2["rs_mb"] + z2["ag_step"]) and t.dp_comm == pytest.approx(t.dp_total)
    # overlapped: each micro-batch's reduce-scatter hides behind its own backward (2/3 of the micro-batch)
    o = step_time(model, cluster, batch, lay, _opts(optimizer="zero2"))
    t_mb = o.parts["total"]
    assert o.dp_comm >= m * max(0.0, z2["rs_mb"] - 2 / 3 * t_mb) - 1e-12


def test_h100_presets_hold_what_cuda_reports() -> None:
    from dynacp.planner.validation import H100_MEMORY

    assert H100_MEMORY == 85.0e9 and 79 * 2**30 < H100_MEMORY < 80 * 2**30
    assert pl.cluster_preset("h100-64").gpu_memory == pl.cluster_preset("h100-512").gpu_memory == H100_MEMORY
    assert h100_cluster(8).gpu_memory == H100_MEMORY


# ---- Megatron's recompute modules, MLA, EP overlap -------------------------------------------------------------------


def test_mlp_recompute_leaves_moe_layers_and_moe_recompute_takes_them() -> None:
    """Megatron-Core's recompute module 'mlp' is the dense MLP only; 'moe' recomputes the MoE layer (all-to-alls
    included)."""
    model = pl.model_preset("deepseek-v3")
    batch = pl.BatchConfig(8192, 4096, 1)
    lay = pl.Layout(2, 8, 1, 64, ep=64, etp=1, vpp=4, edp=2)
    cluster = h100_cluster(1024)
    base, mlp, moe = _opts(fp8=True), _opts(fp8=True, recompute_mlp=True), _opts(fp8=True, recompute_moe=True)
    k_base = _layer_bytes_per_token(model, base, 4096)
    k_mlp = _layer_bytes_per_token(model, mlp, 4096)
    k_moe = _layer_bytes_per_token(model, moe, 4096)
    h = 7168
    assert k_mlp["dense_mlp"] == 2 * h and k_mlp["moe_mlp"] == k_base["moe_mlp"]
    assert k_moe["moe_mlp"] == 2 * h and k_moe["dense_mlp"] == k_base["dense_mlp"]
    t_base, t_mlp, t_moe = (step_time(model, cluster, batch, lay, o) for o in (base, mlp, moe))
    assert t_mlp.ep_volume == t_base.ep_volume and t_mlp.parts["grouped_gemm"] == t_base.parts["grouped_gemm"]
    assert t_moe.ep_volume == pytest.approx(1.5 * t_base.ep_volume)  # 6 all-to-alls instead of 4
    assert t_moe.parts["grouped_gemm"] > t_base.parts["grouped_gemm"]


def test_mla_activations_use_its_latent_and_head_widths() -> None:
    """DeepSeek-V3's MLA block per token, bf16: norm input and down-projection input 4h, latents 4 x 1536 + 2 x 576
    + 2 x 512, q and k 2 x 128 x 192 each, v and the attention output 2 x 128 x 128 each; mla_up_proj recompute
    drops q, k and v; FP8 keeps the down-projection input as 1 byte and the output projection's 1-byte cast of the
    attention output (128 x 128) beside the bf16 copy (issue 37)."""
    model = pl.model_preset("deepseek-v3")
    h = 7168
    full = 4 * h + 8320 + 2 * 49152 + 2 * 32768
    assert _layer_bytes_per_token(model, _opts(), 4096)["attn"] == full == 200832
    up = _opts(recompute_mla_up_proj=True, fp8=True)
    assert _layer_bytes_per_token(model, up, 4096)["attn"] == full - 131072 - h + 128 * 128 == 78976
    assert mla_up_proj_params(model) == 1536 * 128 * 192 + 512 * 128 * 256
    assert mla_up_proj_params(pl.model_preset("llama3-8b")) == 0.0
    # the up-projections' second forward costs GEMM time, nothing else
    batch, lay, cluster = pl.BatchConfig(8192, 4096, 1), pl.Layout(2, 8, 1, 64, ep=64, etp=1, vpp=4, edp=2), \
        h100_cluster(1024)
    t0 = step_time(model, cluster, batch, lay, _opts(fp8=True))
    t1 = step_time(model, cluster, batch, lay, up)
    assert t1.parts["gemm"] > t0.parts["gemm"] and t1.parts["attention"] == t0.parts["attention"]
    # q, k and v are produced twice (forward, backward): the memory-bound kernels move them once more
    assert t1.parts["memory_bound"] > t0.parts["memory_bound"]
    with pytest.raises(ValueError, match="qk_head_dim"):
        pl.ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=10, ffn_hidden_size=128,
                       kv_lora_rank=16).validate()


def test_ep_comm_overlap_off_exposes_the_whole_all_to_all() -> None:
    model = pl.model_preset("deepseek-v3")
    batch, lay, cluster = pl.BatchConfig(8192, 4096, 1), pl.Layout(2, 8, 1, 64, ep=64, etp=1, vpp=4, edp=2), \
        h100_cluster(1024)
    on = step_time(model, cluster, batch, lay, _opts(fp8=True))
    off = step_time(model, cluster, batch, lay, _opts(fp8=True, ep_comm_overlap=False))
    assert off.parts["ep"] == pytest.approx(on.parts["ep"] / Efficiency().a2a_exposed)
    assert off.step > on.step


def test_in_flight_is_megatron_cores_warm_up() -> None:
    """The installed Megatron-Core's own warm-up count (get_pp_rank_microbatches), peak = warm-up + 1 chunks, or all
    m v chunks when every micro-batch is in the warm-up."""
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    from types import SimpleNamespace

    for p, v, m in ((16, 8, 32), (16, 8, 16), (8, 4, 8), (8, 4, 24), (4, 5, 16), (8, 1, 4), (8, 1, 64)):
        for i in range(p):
            comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda p=p: p, rank=lambda i=i: i),
                                   virtual_pipeline_model_parallel_size=v if v > 1 else None)
            total, all_warm, warm, _ = schedules.get_pp_rank_microbatches(m, v, p, p2p_communicator=comm)
            chunks = total if all_warm else warm + 1
            assert in_flight(pl.Layout(1, p, 1, 1, vpp=v), m, i) == pytest.approx(min(chunks, m * v) / v), (p, v, m, i)


def test_in_flight_is_pytorchs_interleaved_warm_up() -> None:
    """PyTorch's ScheduleInterleaved1F1B, the flexible-N schedule of the Llama 3 paper (N = M // (M // PP)
    micro-batches per round, which is the paper's Figure 6 example, N = 5 for M = 10 and PP = 4), warms up
    (v - 1) N + 2 (p - i - 1) chunks, capped at m v, and runs one more forward before its first backward. Where PP
    divides M, N = PP and that is the planner's count: 141 one-layer chunks on rank 1 for Llama 3's PP16 x V8 at
    M = 32."""
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    warmup_ops = getattr(sched, "_get_warmup_ops", None)
    if warmup_ops is None:
        pytest.skip("this torch has no _get_warmup_ops")
    for p, v, m in ((16, 8, 32), (16, 8, 16), (8, 4, 24), (4, 2, 8), (4, 5, 16)):
        n = m // max(1, m // p)
        assert n == p
        for i in range(p):
            chunks = min(warmup_ops(i, v, n, p, m) + 1, m * v)
            assert in_flight(pl.Layout(1, p, 1, 1, vpp=v), m, i) == pytest.approx(chunks / v), (p, v, m, i)
    assert min(warmup_ops(1, 8, 16, 16, 32) + 1, 256) == 141


# ---- elementwise recomputes: Megatron's layernorm and moe_act modules, and the dense activation ----------------------


def test_layernorm_and_activation_recompute_drop_exactly_their_outputs() -> None:
    """Llama 3 405B layer, bf16: 8h + 4h_q + 4h_kv + 6f = 520,192 B per token; 'layernorm' drops the two norm
    outputs (2 x 2h), 'mlp_act' the SwiGLU output (2f); with FP8 those tensors were 1-byte casts (h, h, f)."""
    model = pl.model_preset("llama3.1-405b")
    h, hq, hkv, f = 16384, 16384, 1024, 53248

    def layer(**kw) -> float:
        k = _layer_bytes_per_token(model, _opts(**kw), 8192)
        return k["attn"] + k["dense_mlp"]

    assert layer() == 8 * h + 4 * hq + 4 * hkv + 6 * f == 520192
    assert layer(recompute_layernorm=True) == 520192 - 4 * h
    assert layer(recompute_mlp_act=True) == 520192 - 2 * f
    assert layer(recompute_layernorm=True, recompute_mlp_act=True) == 4 * h + 4 * hq + 4 * hkv + 4 * f == 348160
    fp8 = layer(fp8=True)
    assert fp8 == 520192 - (2 * h + f) + hq  # issue 37: the attention output's FP8 cast is kept beside it
    assert layer(fp8=True, recompute_layernorm=True, recompute_mlp_act=True) == fp8 - 2 * h - f
    # moe_act is the routed experts' only; full recompute keeps each layer's input whatever the modules say;
    # 'mlp' already keeps only the dense MLP's input, so 'mlp_act' on top changes nothing
    assert layer(recompute_moe_act=True) == 520192
    assert layer(recompute_mlp=True, recompute_mlp_act=True) == layer(recompute_mlp=True)
    batch, lay = pl.BatchConfig(2048, 8192, 1), pl.Layout(8, 16, 1, 64, vpp=8)
    full = memory_breakdown(model, batch, lay, _opts(recompute="full"), m=32)
    full_ln = memory_breakdown(model, batch, lay, _opts(recompute="full", recompute_layernorm=True,
                                                        recompute_mlp_act=True), m=32)
    assert full_ln.activations == full.activations


def test_moe_act_and_layernorm_recompute_on_moe_layers() -> None:
    """Qwen3-30B-A3B (MoE layers only, top-8 of 128 experts of f_e = 768): 'moe_act' drops the 8 routed copies'
    activation outputs (2 f_e each, f_e with FP8, times the routing imbalance); 'layernorm' drops the pre-MLP norm
    output (2h: the router and dispatch input, never an FP8 cast) and the attention norm output."""
    model = pl.model_preset("qwen3-30b-a3b")
    h, f_e = 2048, 768
    base = _layer_bytes_per_token(model, _opts(), 4096)
    act = _layer_bytes_per_token(model, _opts(recompute_moe_act=True), 4096)
    assert base["moe_mlp"] - act["moe_mlp"] == 8 * 2 * f_e and act["attn"] == base["attn"]
    skew = _layer_bytes_per_token(model, _opts(recompute_moe_act=True, moe_imbalance=1.5), 4096)
    skew0 = _layer_bytes_per_token(model, _opts(moe_imbalance=1.5), 4096)
    assert skew0["moe_mlp"] - skew["moe_mlp"] == pytest.approx(1.5 * 8 * 2 * f_e)
    f8 = _layer_bytes_per_token(model, _opts(fp8=True), 4096)
    f8_act = _layer_bytes_per_token(model, _opts(fp8=True, recompute_moe_act=True), 4096)
    assert f8["moe_mlp"] - f8_act["moe_mlp"] == 8 * f_e
    ln = _layer_bytes_per_token(model, _opts(fp8=True, recompute_layernorm=True), 4096)
    assert f8["moe_mlp"] - ln["moe_mlp"] == 2 * h and f8["attn"] - ln["attn"] == h
    # the 'moe' module keeps only the layer's input: nothing left for moe_act to drop
    both = _layer_bytes_per_token(model, _opts(recompute_moe=True, recompute_moe_act=True), 4096)
    assert both["moe_mlp"] == 2 * h


def test_elementwise_recompute_costs_memory_bound_time_not_gemm_time() -> None:
    """The dropped outputs are produced in the forward and again in the backward: the memory-bound kernels move
    them once more, the GEMMs and attention are unchanged, and less memory is needed."""
    model, cluster = pl.model_preset("llama3.1-405b"), h100_cluster(8192)
    batch, lay = pl.BatchConfig(2048, 8192, 1), pl.Layout(8, 16, 1, 64, vpp=8)
    base = _opts(optimizer="zero2", allow_uneven_pp=True, max_vpp=8)
    rec = _opts(optimizer="zero2", allow_uneven_pp=True, max_vpp=8, recompute_layernorm=True, recompute_mlp_act=True)
    t0, t1 = step_time(model, cluster, batch, lay, base), step_time(model, cluster, batch, lay, rec)
    assert t1.parts["gemm"] == t0.parts["gemm"] and t1.parts["attention"] == t0.parts["attention"]
    h, f = 16384, 53248
    dropped = 4 * h + 2 * f  # bytes per token and layer, before / TP
    eff = Efficiency()
    tokens_per_gpu = 8192 / 8
    assert t1.parts["memory_bound"] - t0.parts["memory_bound"] == pytest.approx(
        dropped * 8 * tokens_per_gpu / cluster.hbm_bandwidth, rel=1e-9)  # 8 layers on the slowest stage
    assert eff.elementwise_passes > 0
    # the same holds for the GEMM-recomputing modules: 'mlp' keeps 2h of the dense MLP, moves 2h + 4f + 2f once more
    mlp = step_time(model, cluster, batch, lay, _opts(optimizer="zero2", allow_uneven_pp=True, recompute_mlp=True))
    assert mlp.parts["memory_bound"] - t0.parts["memory_bound"] == pytest.approx(
        (2 * h + 6 * f) * 8 * tokens_per_gpu / cluster.hbm_bandwidth, rel=1e-9)
    assert mlp.parts["gemm"] > t0.parts["gemm"]
    m0, m1 = (memory_breakdown(model, batch, lay, o, m=32) for o in (base, rec))
    assert m0.activations - m1.activations == pytest.approx(
        dropped / 8 * 8192 * m0.layers * m0.in_flight, rel=1e-9)


def test_recompute_modules_by_megatron_name() -> None:
    assert pl.recompute_module_options(["core_attn", "mlp", "moe_act"]) == {
        "recompute_mlp": True, "recompute_moe_act": True}
    assert pl.recompute_module_options("layernorm") == {"recompute_layernorm": True}
    with pytest.raises(ValueError, match=r"unknown recompute module\(s\) 'shared_experts'.*not modelled"):
        pl.recompute_module_options(["mlp", "shared_experts"])
    args = ["configs", "--model", "llama3-8b", "--cluster", "h100-64", "--gbs", "64", "--tp", "8", "--pp", "1",
            "--top", "1", "--json"]
    out = {}
    for extra in ([], ["--recompute-modules", "layernorm,mlp_act"], ["--recompute-modules", "layernorm", "mlp_act"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*args, *extra]) == 0
        out[" ".join(extra)] = json.loads(buf.getvalue())
    a, b, c = out.values()
    assert b["options"]["recompute_layernorm"] and b["options"]["recompute_mlp_act"] and b == c
    assert b["feasible"][0]["memory"]["activations"] < a["feasible"][0]["memory"]["activations"]
    assert main([*args, "--recompute", "full", "--recompute-modules", "mlp"]) == 2
    assert main([*args, "--recompute-modules", "mlp", "attn"]) == 2
