"""How fast the kernels of one micro-batch run on one GPU: the efficiency model behind the planner's compute time.

A constant utilisation cannot be right for every layout: TP and CP shrink the per-GPU matrices and sequences, MoE
experts see few tokens each, and normalisation, activation and permutation kernels are bound by memory bandwidth,
not FLOPs. The planner therefore prices four kinds of work separately (all fractions are of the bf16 peak):

* **Dense GEMMs** run at ``gemm_max * I / (I + gemm_half_intensity)``, where I = 1 / (1/M + 1/N + 1/K) is the
  arithmetic-intensity proxy of the per-GPU matrix shape (M tokens, N the TP-sharded output width, K the input
  width); big matrices approach ``gemm_max``, TP/CP-shrunk ones fall off.
* **Grouped expert GEMMs** run at the dense GEMM efficiency of their shape times
  ``tpe / (tpe + grouped_half_tokens)``, tpe being the tokens each local expert receives per micro-batch.
* **Attention** (flash, causal) runs at ``attn_max * s / (s + attn_half_length)`` for a per-rank query length s
  (s / CP with context parallelism). Fitted to ``h100_compute-attn-megatron.csv`` (H100, 64 q / 4 kv heads, d 128,
  Megatron's 6 h_q s^2 FLOP count): 177, 243, 293, 326, 352 TFLOP/s of 989 at 512, 1K, 4K, 8K and 16K-32K
  tokens; the least-squares fit (:func:`fit_attention`) gives 177, 234, 309, 327, 336-341.
* **Memory-bound work** moves ``elementwise_passes`` x the stored activation bytes of each layer (Korthikanti's
  per-token bytes, the same terms as the memory model) through HBM at ``ClusterConfig.hbm_bandwidth``.

FP8 divides the GEMM time by ``fp8_gemm_speedup``. Communication that overlaps with compute is counted only by its
exposed share: ``tp_exposed`` (TP with comm overlap), ``a2a_exposed`` (EP all-to-all).

``fit_attention`` and ``fit_gemm`` turn measurements (a profile of your own GPUs) into the corresponding overrides.

Calibration: ``attn_*`` were fitted to the H100 attention profile above (/work/shared/data/profiles, from
hao-ai-lab/distca). ``gemm_max``, ``gemm_half_intensity``, ``dp_overlap_microbatches`` and ``moe_layer_floor`` were
fitted by hand to the published runs of docs/planner.md's validation table, which is therefore not an independent
test of them (see the calibration caveat there). The rest were set beforehand and not tuned. Every field can be
overridden with ``PlannerOptions.efficiency``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Efficiency:
    """Kernel efficiencies (fractions of the bf16 peak) and overlap shares; see the module docstring."""

    gemm_max: float = 0.72
    """Fraction of peak reached by large bf16 GEMMs."""
    gemm_half_intensity: float = 300.0
    """I (elements) at which a GEMM reaches half of gemm_max."""
    grouped_half_tokens: float = 384.0
    """Tokens per local expert per micro-batch at which grouped-GEMM efficiency halves."""
    attn_max: float = 0.35
    """Fraction of peak reached by causal flash attention (fwd + bwd) at long lengths."""
    attn_half_length: float = 490.0
    """Per-rank query length (tokens) at which attention efficiency halves."""
    elementwise_passes: float = 3.0
    """HBM bytes moved by the memory-bound kernels per stored activation byte (fwd write + bwd read + recompute)."""
    fp8_gemm_speedup: float = 1.45
    """GEMM time ratio bf16 / FP8 (Transformer Engine, with its casts and amax bookkeeping)."""
    tp_exposed: float = 0.35
    """Share of TP communication not hidden when PlannerOptions.tp_comm_overlap is on."""
    a2a_exposed: float = 0.6
    """Share of the EP all-to-all not hidden behind expert compute."""
    dp_overlap_microbatches: float = 2.0
    """Micro-batches whose backward (forward) hides the DP reduce-scatter (all-gather) when dp_overlap is on."""
    moe_layer_floor: float = 14e-3
    """Seconds (fwd + bwd) below which one dropless MoE layer's micro-batch cannot go: the host waits for the
    tokens-per-expert counts before it launches the expert kernels (fitted to the two Qwen3 MoE runs)."""

    @classmethod
    def from_overrides(cls, overrides: Optional[Dict[str, float]]) -> Efficiency:
        """Defaults with ``overrides`` applied; unknown names and non-positive values raise ValueError."""
        if not overrides:
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"PlannerOptions.efficiency: unknown field(s) {', '.join(unknown)}; known: "
                             f"{', '.join(sorted(names))}")
        for k, v in overrides.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"PlannerOptions.efficiency.{k} must be a positive number, got {v!r}")
        for k in ("gemm_max", "attn_max", "tp_exposed", "a2a_exposed"):
            if overrides.get(k, 0) > 1:
                raise ValueError(f"PlannerOptions.efficiency.{k} must be in (0, 1], got {overrides[k]}")
        return dataclasses.replace(cls(), **{k: float(v) for k, v in overrides.items()})

    def gemm(self, m: float, n: float, k: float) -> float:
        """Efficiency of an (m x k) @ (k x n) GEMM."""
        if min(m, n, k) <= 0:
            return self.gemm_max
        intensity = 1.0 / (1.0 / m + 1.0 / n + 1.0 / k)
        return self.gemm_max * intensity / (intensity + self.gemm_half_intensity)

    def grouped(self, tokens_per_expert: float, n: float, k: float) -> float:
        """Efficiency of a grouped expert GEMM whose experts each receive ``tokens_per_expert`` tokens."""
        tpe = max(tokens_per_expert, 1e-9)
        return self.gemm(tpe, n, k) * tpe / (tpe + self.grouped_half_tokens)

    def attention(self, length: float) -> float:
        """Efficiency of causal flash attention with per-rank query length ``length``."""
        s = max(length, 1.0)
        return self.attn_max * s / (s + self.attn_half_length)


def _fit_saturating(xs: Sequence[float], effs: Sequence[float], what: str) -> Tuple[float, float]:
    """(top, half) of eff = top x / (x + half), by least squares on 1/eff = 1/top + (half/top) (1/x)."""
    pts = [(1.0 / x, 1.0 / e) for x, e in zip(xs, effs) if x > 0 and e > 0]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        raise ValueError(f"fitting {what} needs at least two measurements at different sizes, got {len(pts)}")
    n = len(pts)
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    intercept = my - slope * mx
    if intercept <= 0 or slope < 0:
        raise ValueError(f"the {what} measurements do not saturate with size (intercept {intercept:.3g}, slope "
                         f"{slope:.3g}); check their units")
    return 1.0 / intercept, slope / intercept


def fit_attention(points: Iterable[Tuple[float, float]], peak_flops: float) -> Dict[str, float]:
    """``{"attn_max", "attn_half_length"}`` from measured causal attention (fwd + bwd): ``points`` are (length in
    tokens, achieved FLOP/s counted as Megatron does, 6 h_q s^2 per layer); ``peak_flops`` the GPU's bf16 peak."""
    pts = list(points)
    top, half = _fit_saturating([p[0] for p in pts], [p[1] / peak_flops for p in pts], "attention")
    return {"attn_max": top, "attn_half_length": half}


def fit_gemm(points: Iterable[Tuple[float, float, float, float]], peak_flops: float) -> Dict[str, float]:
    """``{"gemm_max", "gemm_half_intensity"}`` from measured GEMMs: ``points`` are (M, N, K, achieved FLOP/s)."""
    pts = list(points)
    inten = [1.0 / (1.0 / m + 1.0 / n + 1.0 / k) for m, n, k, _ in pts]
    top, half = _fit_saturating(inten, [p[3] / peak_flops for p in pts], "GEMM")
    return {"gemm_max": top, "gemm_half_intensity": half}


__all__ = ["Efficiency", "fit_attention", "fit_gemm"]
