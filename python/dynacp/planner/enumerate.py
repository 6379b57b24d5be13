"""Enumeration of (TP, PP, CP, EP, ETP, DP, VPP) layouts with TP*PP*CP*DP = W, and the named hard constraints.

Each constraint returns a one-line reason when violated; a layout is feasible when none is (memory is checked
later, in :mod:`dynacp.planner.configs`). The constraints are the launch-time checks of Megatron-LM plus the
placement rules of planner_anchors.md section 6.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List

from dynacp.planner.memory import stage_split
from dynacp.planner.model import BatchConfig, ClusterConfig, Layout, ModelConfig, PlannerOptions


def divisors(n: int) -> List[int]:
    """Positive divisors of n in increasing order."""
    return [k for k in range(1, n + 1) if n % k == 0]


@dataclass
class Candidate:
    """A layout and the hard constraints it violates."""

    layout: Layout
    """The layout."""
    violations: List[str] = field(default_factory=list)
    """One line per violated constraint, each naming the rule and the numbers."""
    flags: List[str] = field(default_factory=list)
    """Accepted but notable properties (e.g. an uneven pipeline split)."""

    @property
    def feasible(self) -> bool:
        return not self.violations


def check(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, layout: Layout, opts: PlannerOptions
) -> Candidate:
    """Apply every hard constraint to ``layout``."""
    t, p, c, d, e, te, v = layout.tp, layout.pp, layout.cp, layout.dp, layout.ep, layout.etp, layout.vpp
    G, W, L = cluster.gpus_per_node, cluster.world, model.num_layers
    a, g, h = model.num_attention_heads, model.kv_heads, model.hidden_size
    out = Candidate(layout)
    bad = out.violations.append
    if a % t:
        bad(f"heads % TP: TP {t} does not divide {a} attention heads")
    if h % t:
        bad(f"hidden % TP: TP {t} does not divide hidden size {h}")
    if g % t and t % g:
        bad(f"KV heads vs TP: TP {t} neither divides nor is a multiple of {g} KV heads")
    if model.ffn_hidden_size and model.moe_layers < L and model.ffn_hidden_size % t:
        bad(f"FFN % TP: TP {t} does not divide FFN size {model.ffn_hidden_size}")
    if opts.tp_in_node and (t > G or G % t):
        bad(f"TP in node: a TP group of {t} GPUs does not fit inside a {G}-GPU node")
    if p > L:
        bad(f"PP stage without layers: PP {p} exceeds the {L} layers")
    elif L % p:
        split = stage_split(L, p)
        if not opts.allow_uneven_pp:
            bad(f"layers % PP: PP {p} does not divide {L} layers (set allow_uneven_pp for an uneven split)")
        elif min(split) < 1:
            bad(f"PP stage without layers: {L} layers over {p} stages give the middle stages {split[1]} each and "
                f"leave the first / last stage {split[0]} / {split[-1]}")
        elif min(split) + 1 < v:  # the embedding (first) and the loss (last) fill one chunk each
            bad(f"layers per stage < VPP: the smallest stage has {min(split)} layers plus its embedding or loss "
                f"chunk, fewer than VPP {v} chunks")
        else:
            out.flags.append(f"uneven PP: {L} layers as {split[0]} + {split[1]} x {p - 2} + {split[-1]}"
                             if p > 2 else f"uneven PP: {L} layers as {split[0]} + {split[-1]}")
    elif (L // p) % v:
        bad(f"layers per stage % VPP: {L // p} layers per stage are not divisible by VPP {v}")
    if batch.global_batch % (batch.micro_batch * d):
        bad(f"GBS % (mbs x DP): global batch {batch.global_batch} is not divisible by micro batch "
            f"{batch.micro_batch} x DP {d}")
    if c > 1 and batch.seq_length % (2 * c):
        bad(f"seq % 2CP: sequence length {batch.seq_length} is not divisible by 2 x CP = {2 * c}")
    if model.is_moe:
        if model.num_experts and model.num_experts % e:
            bad(f"experts % EP: EP {e} does not divide {model.num_experts} experts")
        if model.expert_ffn_hidden_size and model.expert_ffn_hidden_size % te:
            bad(f"expert FFN % ETP: ETP {te} does not divide expert FFN size {model.expert_ffn_hidden_size}")
        if (W // p) % (te * e):
            bad(f"expert grid: ETP x EP = {te * e} does not divide W / PP = {W // p}, so EDP is not an integer")
        if opts.ep_in_node and (te * e > G or G % (te * e)):
            bad(f"EP in node: an ETP x EP group of {te * e} GPUs crosses nodes of {G} (all-to-all would use the "
                "inter-node link)")
        if opts.ep_divides_dp and d % e:
            bad(f"EP | DP: EP {e} does not divide DP {d} (ep_divides_dp is set, MoE parallel folding lifts this rule)")
    return out


def enumerate_layouts(
    model: ModelConfig, cluster: ClusterConfig, batch: BatchConfig, opts: PlannerOptions
) -> Iterator[Candidate]:
    """Every layout with TP*PP*CP*DP = W (CP limited to ``opts.cp_sizes`` when set), checked."""
    W = cluster.world
    for t in divisors(W):
        for p in divisors(W // t):
            for c in divisors(W // (t * p)):
                if opts.cp_sizes is not None and c not in opts.cp_sizes:
                    continue
                d = W // (t * p * c)
                vpps = [v for v in range(1, opts.max_vpp + 1)] if p > 1 else [1]
                if model.is_moe:
                    etps = sorted({1, t} if opts.etp == "any" else {1 if opts.etp == "1" else t})
                    experts = [(te, e) for te in etps for e in divisors(W // p)]
                else:
                    experts = [(1, 1)]
                for te, e in experts:
                    edp = max(1, W // (te * e * p))
                    for v in vpps:
                        yield check(model, cluster, batch, Layout(t, p, c, d, e, te, v, edp), opts)
