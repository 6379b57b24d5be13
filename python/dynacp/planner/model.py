"""Planner inputs: the model, the cluster, the batch and the options, as dataclasses with one docstring per field.

Every size is in elements or bytes (decimal units are only used for display). ``from_dict`` builds a config from a
JSON object and raises :class:`ValueError` naming a missing or unknown field; ``validate`` names the first bad value.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple, Type, TypeVar, Union

T = TypeVar("T")


def _from_dict(cls: Type[T], data: Dict[str, Any], where: str) -> T:
    """Builds dataclass ``cls`` from ``data``; unknown keys and missing required fields raise ValueError."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; known fields: {', '.join(fields)}")
    missing = [
        n for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{where} is missing required field(s): {', '.join(missing)}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    obj = cls(**kwargs)
    obj.validate()  # type: ignore[attr-defined]
    return obj


def _load_json(path: Union[str, Path]) -> Dict[str, Any]:
    """A JSON object of config fields; a preset-style file ``{"kind", "description", "config"}`` is unwrapped."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from e
    if isinstance(data, dict) and "kind" in data and isinstance(data.get("config"), dict):
        return data["config"]
    return data


class _JsonConfig:
    """``from_dict`` and ``load`` of a config dataclass (the class's ``_WHAT`` names it in messages)."""

    _WHAT = "config"

    @classmethod
    def from_dict(cls: Type[T], data: Dict[str, Any], where: Optional[str] = None) -> T:
        """Build from a dict of fields; unknown keys and missing required fields raise ValueError."""
        return _from_dict(cls, data, where or cls._WHAT)  # type: ignore[attr-defined]

    @classmethod
    def load(cls: Type[T], path: Union[str, Path]) -> T:
        """Read a JSON file (field names as in this class)."""
        return cls.from_dict(_load_json(path), f"{cls._WHAT} file {path}")  # type: ignore[attr-defined]


def _positive(obj: Any, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{type(obj).__name__}.{n} must be a positive number, got {v!r}")


def _integral(obj: Any, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise ValueError(f"{type(obj).__name__}.{n} must be an integer, got {v!r}")


@dataclass
class ModelConfig(_JsonConfig):
    """A decoder-only transformer, dense or MoE, described by its shapes (Megatron argument names in brackets)."""

    _WHAT = "model"

    num_layers: int
    """L: transformer layers [--num-layers]."""
    hidden_size: int
    """h: model width [--hidden-size]."""
    num_attention_heads: int
    """a: query heads [--num-attention-heads]; TP must divide it."""
    vocab_size: int
    """V: vocabulary size, padded as trained [--padded-vocab-size]."""
    ffn_hidden_size: int = 0
    """f: FFN width of the dense (non-MoE) layers [--ffn-hidden-size]; 0 when every layer is MoE."""
    num_kv_heads: Optional[int] = None
    """g: KV heads / query groups (GQA) [--num-query-groups]; None = a (multi-head attention)."""
    head_dim: Optional[int] = None
    """d_h: per-head width [--kv-channels]; None = h / a."""
    gated_mlp: bool = True
    """SwiGLU-style gated MLP (fc1 is 2f wide) [--swiglu]; False for a GeLU MLP (GPT-3)."""
    tied_embeddings: bool = False
    """Input embedding and output layer share weights (False = [--untie-embeddings-and-output-weights])."""
    dropout: bool = False
    """Dropout is on, so 1-byte masks are stored (Korthikanti's 34 sbh assumes it; Llama-style runs use none)."""
    num_attention_layers: Optional[int] = None
    """Layers with softmax attention (quadratic FLOPs, CP ring traffic); None = all. Hybrid models (Gated DeltaNet,
    Mamba) have fewer; the others are priced as linear layers."""
    num_experts: int = 0
    """n_e: routed experts per MoE layer [--num-experts]; 0 for a dense model. EP must divide it."""
    top_k: int = 0
    """k: routed experts per token [--moe-router-topk]."""
    expert_ffn_hidden_size: int = 0
    """f_e: FFN width of one routed expert [--moe-ffn-hidden-size]."""
    num_shared_experts: int = 0
    """Shared experts per MoE layer (each of width shared_expert_ffn_hidden_size)."""
    shared_expert_ffn_hidden_size: Optional[int] = None
    """Width of one shared expert; None = expert_ffn_hidden_size."""
    num_moe_layers: Optional[int] = None
    """Layers whose MLP is MoE; None = all layers when num_experts > 0, else 0."""
    num_expert_groups: Optional[int] = None
    """Group-limited routing [--moe-router-num-groups]: the routed experts form this many contiguous groups and a
    token picks its top_k experts inside expert_group_topk of them (DeepSeek-V3: 8 groups, 4 chosen; with its 256
    experts on 8 nodes a group is a node, which is the paper's node-limited routing, at most 4 nodes per token).
    None = no groups. It bounds how many nodes an EP all-to-all sends a token to."""
    expert_group_topk: Optional[int] = None
    """Groups a token may route to [--moe-router-group-topk]; required with num_expert_groups."""
    kv_lora_rank: Optional[int] = None
    """Multi-head latent attention (MLA, DeepSeek-V2/V3) [--multi-latent-attention --kv-lora-rank]: width of the
    compressed key-value latent (DeepSeek-V3: 512). None = ordinary attention. With MLA the four fields below give
    the real per-head widths for the activation memory; head_dim stays the width that prices the attention FLOPs
    (the mean of the q/k and v widths: 160 for DeepSeek-V3)."""
    q_lora_rank: Optional[int] = None
    """MLA: width of the compressed query latent [--q-lora-rank] (DeepSeek-V3: 1536); None = queries projected
    straight from the hidden state."""
    qk_head_dim: int = 0
    """MLA: per-head query/key width without the rotary part [--qk-head-dim] (DeepSeek-V3: 128)."""
    qk_pos_emb_head_dim: int = 0
    """MLA: per-head rotary (decoupled RoPE) width [--qk-pos-emb-head-dim] (DeepSeek-V3: 64)."""
    v_head_dim: int = 0
    """MLA: per-head value width [--v-head-dim] (DeepSeek-V3: 128)."""
    num_mtp_layers: int = 0
    """Multi-token-prediction blocks [--mtp-num-layers] (DeepSeek-V3: 1). Each is one more transformer layer (MoE
    when the model is) plus one more output-layer pass, on the last pipeline stage."""
    non_expert_params: Optional[float] = None
    """X: non-expert parameter count (attention, dense MLP, shared experts, embeddings, norms, router), when given
    directly instead of derived from the shapes (e.g. hybrid layers). Treated as TP-sharded."""
    expert_params: Optional[float] = None
    """E: routed-expert parameter count, when given directly instead of L_moe * n_e * (3 or 2) * h * f_e."""
    name: str = "model"
    """Label used in reports."""

    # ---- derived shapes ---------------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """g, defaulting to a."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def dh(self) -> int:
        """d_h, defaulting to h / a."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_size(self) -> int:
        """h_q = a * d_h."""
        return self.num_attention_heads * self.dh

    @property
    def kv_size(self) -> int:
        """g * d_h."""
        return self.kv_heads * self.dh

    @property
    def is_mla(self) -> bool:
        """Attention is multi-head latent attention (kv_lora_rank given)."""
        return self.kv_lora_rank is not None

    @property
    def attention_layers(self) -> int:
        return self.num_layers if self.num_attention_layers is None else self.num_attention_layers

    @property
    def moe_layers(self) -> int:
        if self.num_moe_layers is not None:
            return self.num_moe_layers
        return self.num_layers if self.num_experts > 0 else 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 or bool(self.expert_params)

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden_size or self.expert_ffn_hidden_size

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        _integral(self, "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_hidden_size",
                  "num_kv_heads", "head_dim", "num_attention_layers", "num_experts", "top_k",
                  "expert_ffn_hidden_size", "num_shared_experts", "shared_expert_ffn_hidden_size", "num_moe_layers",
                  "num_mtp_layers", "num_expert_groups", "expert_group_topk", "kv_lora_rank", "q_lora_rank",
                  "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        _positive(self, "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "num_kv_heads", "head_dim",
                  "kv_lora_rank", "q_lora_rank")
        if self.is_mla and (self.qk_head_dim <= 0 or self.v_head_dim <= 0 or self.qk_pos_emb_head_dim < 0):
            raise ValueError("ModelConfig: an MLA model (kv_lora_rank set) needs qk_head_dim > 0, v_head_dim > 0 and "
                             f"qk_pos_emb_head_dim >= 0, got {self.qk_head_dim}, {self.v_head_dim} and "
                             f"{self.qk_pos_emb_head_dim}")
        for n in ("ffn_hidden_size", "num_experts", "top_k", "expert_ffn_hidden_size", "num_shared_experts",
                  "num_mtp_layers",
                  "num_attention_layers", "num_moe_layers", "non_expert_params", "expert_params"):
            v = getattr(self, n)
            if v is not None and v < 0:
                raise ValueError(f"ModelConfig.{n} must be >= 0, got {v!r}")
        if self.num_attention_layers is not None and self.num_attention_layers > self.num_layers:
            raise ValueError(f"ModelConfig.num_attention_layers ({self.num_attention_layers}) exceeds num_layers "
                             f"({self.num_layers})")
        if self.num_moe_layers is not None and self.num_moe_layers > self.num_layers:
            raise ValueError(
                f"ModelConfig.num_moe_layers ({self.num_moe_layers}) exceeds num_layers ({self.num_layers})")
        if self.num_experts > 0:
            if not 0 < self.top_k <= self.num_experts:
                raise ValueError(f"ModelConfig.top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}")
            if self.expert_ffn_hidden_size <= 0 and self.expert_params is None:
                raise ValueError(
                    "ModelConfig.expert_ffn_hidden_size is required for a MoE model (or give expert_params)")
            self._validate_groups()
        elif self.expert_params:
            raise ValueError("ModelConfig.expert_params is set but num_experts is 0; give num_experts and top_k too")
        if self.num_experts == 0 and self.ffn_hidden_size <= 0 and self.non_expert_params is None:
            raise ValueError("ModelConfig.ffn_hidden_size is required for a dense model")
        if self.moe_layers < self.num_layers and self.ffn_hidden_size <= 0 and self.non_expert_params is None:
            raise ValueError(f"ModelConfig.ffn_hidden_size is required: {self.num_layers - self.moe_layers} layers "
                             "are dense")

    def _validate_groups(self) -> None:
        """Group-limited routing: both fields or neither, groups dividing the experts, enough experts to pick from."""
        g, gk = self.num_expert_groups, self.expert_group_topk
        if g is None and gk is None:
            return
        if g is None or gk is None or g < 1 or gk < 1:
            raise ValueError("ModelConfig.num_expert_groups and expert_group_topk go together and must be positive, "
                             f"got {g!r} and {gk!r}")
        if self.num_experts % g:
            raise ValueError(f"ModelConfig.num_expert_groups ({g}) must divide num_experts ({self.num_experts})")
        if gk > g or gk * (self.num_experts // g) < self.top_k:
            raise ValueError(f"ModelConfig.expert_group_topk ({gk}) must be at most num_expert_groups ({g}) and its "
                             f"groups must hold at least top_k = {self.top_k} experts")


@dataclass
class ClusterConfig(_JsonConfig):
    """The GPUs: nodes x GPUs per node, memory, links and peak throughput."""

    _WHAT = "cluster"

    num_nodes: int
    """Nodes in the job."""
    gpus_per_node: int
    """G: GPUs per node sharing the fast intra-node fabric (NVLink)."""
    gpu_memory: float
    """Bytes of memory per GPU as CUDA reports its total capacity. An "80 GB" H100 has 80 GiB of HBM3, of which
    CUDA reports about 79.2 GiB = 85.0e9 bytes (the h100 presets); state binary capacities as 2**30 multiples."""
    peak_flops: float
    """Peak dense bf16 FLOP/s per GPU (H100 SXM 989e12)."""
    intra_node_bandwidth: float = 350e9
    """Bytes/s per GPU for collectives inside a node (bus bandwidth, nccl-tests convention)."""
    inter_node_bandwidth: float = 50e9
    """Bytes/s per GPU for collectives across nodes (one 400 Gb/s NIC per GPU = 50e9)."""
    hbm_bandwidth: float = 3.35e12
    """Bytes/s of GPU memory bandwidth (H100 SXM 3.35e12); prices the memory-bound (elementwise) work."""
    world_size: Optional[int] = None
    """Optional cross-check: must equal num_nodes * gpus_per_node."""
    name: str = "cluster"
    """Label used in reports."""

    @property
    def world(self) -> int:
        """W = num_nodes * gpus_per_node."""
        return self.num_nodes * self.gpus_per_node

    def validate(self) -> None:
        _integral(self, "num_nodes", "gpus_per_node", "world_size")
        _positive(self, "num_nodes", "gpus_per_node", "gpu_memory", "peak_flops", "intra_node_bandwidth",
                  "inter_node_bandwidth", "world_size", "hbm_bandwidth")
        if self.world_size is not None and self.world_size != self.world:
            raise ValueError(f"ClusterConfig.world_size {self.world_size} is not num_nodes x gpus_per_node = "
                             f"{self.num_nodes} x {self.gpus_per_node} = {self.world}; fix one of them")


@dataclass
class BatchConfig:
    """One optimizer step's data. With a length distribution, a global batch is global_batch * seq_length tokens
    of sampled sequences (each at most seq_length long) instead of global_batch full sequences."""

    global_batch: int
    """B: sequences (or packs of seq_length tokens) per optimizer step."""
    seq_length: int
    """s: tokens per sequence or pack."""
    micro_batch: int = 1
    """b: sequences (packs) per micro-batch; m = B / (b * DP) micro-batches per DP rank."""

    def validate(self) -> None:
        _integral(self, "global_batch", "seq_length", "micro_batch")
        _positive(self, "global_batch", "seq_length", "micro_batch")

    @classmethod
    def from_dict(cls, data: Dict[str, Any], where: str = "batch") -> BatchConfig:
        return _from_dict(cls, data, where)


RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("zero0", "zero1", "zero2", "zero3", "distributed")
ETP_CHOICES = ("1", "tp", "any")
RECOMPUTE_MODULES: Dict[str, Optional[str]] = {
    "core_attn": None,  # what 'selective' already means; with flash attention nothing is stored to drop
    "mlp": "recompute_mlp",
    "moe": "recompute_moe",
    "mla_up_proj": "recompute_mla_up_proj",
    "layernorm": "recompute_layernorm",
    "moe_act": "recompute_moe_act",
    "mlp_act": "recompute_mlp_act",  # dynacp's name: not a Megatron-Core module (see PlannerOptions)
}
"""Megatron-LM's ``--recompute-modules`` names (plus ``mlp_act``) -> the PlannerOptions field each one sets."""


def recompute_module_options(names: Union[str, Iterable[str]]) -> Dict[str, bool]:
    """PlannerOptions fields for a list of recompute module names (Megatron-LM's ``--recompute-modules``), e.g.
    ``["mlp", "moe_act"]`` -> ``{"recompute_mlp": True, "recompute_moe_act": True}``. Unknown names raise
    ValueError naming them and the known ones (Megatron's ``shared_experts`` is not modelled)."""
    names = [names] if isinstance(names, str) else list(names)
    bad = [n for n in names if n not in RECOMPUTE_MODULES]
    if bad:
        raise ValueError(f"unknown recompute module(s) {', '.join(map(repr, bad))}; known: "
                         f"{', '.join(RECOMPUTE_MODULES)} (Megatron's shared_experts is not modelled)")
    return {RECOMPUTE_MODULES[n]: True for n in names if RECOMPUTE_MODULES[n] is not None}


def recompute_modules_of(opts: PlannerOptions) -> Tuple[str, ...]:
    """The recompute module names that ``opts`` turns on, in RECOMPUTE_MODULES' order (``core_attn`` left out)."""
    return tuple(n for n, f in RECOMPUTE_MODULES.items() if f is not None and getattr(opts, f))


@dataclass
class PlannerOptions:
    """Training options and planner knobs."""

    optimizer: str = "distributed"
    """How data parallelism shards the model states (bytes per parameter: bf16 weights 2, main grads g = 4 or 2 by
    ``grad_dtype``, fp32 master + Adam moments 12; sharded over DP x CP, routed experts over EDP), and the DP
    traffic that goes with it:

    * 'distributed': Megatron's distributed optimizer, what NeMo / Megatron-Bridge run. Shards the 12 B; keeps the
      whole gradient buffer over the micro-batches, reduce-scatters it once per step and all-gathers the updated
      bf16 weights once. 'zero1' is the same.
    * 'zero2': optimizer and gradients sharded (DeepSpeed ZeRO-2; FSDP with ``reshard_after_forward=False``, i.e.
      SHARD_GRAD_OP, which the Llama 3 paper describes): every micro-batch's backward reduce-scatters its gradients
      into the shard, hidden behind that backward; weights stay whole during the step, all-gathered once.
    * 'zero3': weights sharded too (FSDP FULL_SHARD): a weight all-gather in every micro-batch's forward and again
      in its backward.
    * 'zero0': plain DDP, nothing sharded; one gradient all-reduce per step."""
    grad_dtype: str = "fp32"
    """Main-gradient dtype: 'fp32' (Megatron default with bf16 params: 6 + 12/d bytes/param) or 'bf16' (4 + 12/d)."""
    recompute: str = "selective"
    """Activation recompute: 'none', 'selective' (core attention) or 'full' (keep only each layer's input)."""
    recompute_mlp: bool = False
    """Also recompute the dense MLPs (Megatron's --recompute-modules mlp, which Megatron-Core applies to dense MLP
    layers only, not to MoE layers): each keeps only its 2h-byte input per token and re-runs its forward GEMMs in
    the backward pass."""
    recompute_mla_up_proj: bool = False
    """Recompute MLA's query and key-value up-projections and RoPE (Megatron's --recompute-modules mla_up_proj, an
    output-discarding checkpoint): the per-head q, k and v are not kept, and the up-projection GEMMs run their
    forward again in the backward pass. No effect on a model without MLA."""
    recompute_moe: bool = False
    """Also recompute the MoE layers (Megatron's --recompute-modules moe): each keeps only its 2h-byte input per
    token and re-runs its forward (router, shared and routed expert GEMMs, dispatch and combine all-to-alls) in the
    backward pass."""
    recompute_layernorm: bool = False
    """Recompute the two norms of each layer (Megatron's --recompute-modules layernorm, an output-discarding
    checkpoint of input_layernorm and pre_mlp_layernorm): their outputs, the inputs of the QKV (or MLA
    down-projection) and fc1 (or router and dispatch) GEMMs, are not kept, (2 - 1 with FP8) h bytes each per token
    and layer; each norm runs its forward again in the backward pass (memory-bound)."""
    recompute_moe_act: bool = False
    """Recompute the routed experts' activation function (Megatron's --recompute-modules moe_act): its output, the
    experts' fc2 input ((2 - 1 with FP8) f_e bytes per routed copy), is not kept and is recomputed from the fc1
    output in the backward pass. No effect on a dense model."""
    recompute_mlp_act: bool = False
    """Recompute the dense MLPs' activation function (SwiGLU / GeLU): its output, the fc2 input ((2 - 1 with FP8) f
    bytes per token and layer), is not kept and is recomputed from the fc1 output in the backward pass. Not a
    Megatron-Core module (its moe_act covers routed experts only): a fused activation that recomputes its output,
    as hand-written backward passes that keep only the linear layers' outputs do (LLaMA, Touvron et al. 2023,
    Sec. 2.4)."""
    flash_attention: bool = True
    """Fused attention: no a*s^2 score tensor is stored, so 'none' and 'selective' keep the same memory."""
    chunked_ce: bool = False
    """Fused/chunked linear cross-entropy: fp32 logits exist for ce_chunk_tokens at a time instead of all tokens."""
    ce_chunk_tokens: int = 1024
    """Tokens per cross-entropy chunk when chunked_ce."""
    etp: str = "any"
    """Expert tensor parallel size: '1', 'tp' (Megatron's default ETP = TP) or 'any' (enumerate both)."""
    ep_divides_dp: bool = False
    """Require EP | DP (legacy Megatron, the seed's rule). False = MoE parallel folding: attention uses
    TPxCPxDPxPP and experts ETPxEPxEDPxPP, each = W."""
    tp_in_node: bool = True
    """TP groups must stay inside a node (TP divides G)."""
    ep_in_node: bool = False
    """EP x ETP groups must stay inside a node. Off by default: published MoE runs use EP 32-64 across nodes, and
    the all-to-all of a group that spans nodes is priced at the inter-node bandwidth for its cross-node share."""
    ep_dedup_nodes: bool = True
    """Hierarchical EP dispatch (DeepEP, Megatron's HybridEP): a token crosses the network once per remote node it
    is routed to, not once per expert; False prices every cross-node copy on the NIC."""
    allow_uneven_pp: bool = False
    """Accept L % PP != 0: the middle stages get ceil(L/PP) layers and the first and last stages share the rest
    (Megatron's --decoder-first/last-pipeline-num-layers, as Llama 3 405B did); the layout is flagged 'uneven'. A
    split that would leave a stage without layers is rejected."""
    max_vpp: int = 1
    """Largest virtual-pipeline (interleaving) degree to enumerate; 1 = none."""
    cp_sizes: Optional[Tuple[int, ...]] = None
    """Restrict CP to these degrees (e.g. (1,) for a search without CP); None = every divisor of W."""
    memory_headroom: float = 0.92
    """Usable fraction of GPU memory. 0.92 leaves 8 % (6.8 GB of an H100's 85.0e9 bytes) for the CUDA context,
    library workspaces (cuBLAS, Transformer Engine's TP-overlap buffers) and allocator fragmentation beyond
    ``nccl_buffer_bytes``. It was chosen against docs/planner.md's validation table (see its calibration note):
    every published layout except Llama 3's PP16 x V8 on 8,192 GPUs fits under it (issue 22; not refitted since). Fujii et al.'s stricter 0.8 (no
    OOM in 454 runs) is the safe choice for a new model."""
    nccl_buffer_bytes: float = 0.5e9
    """Communicator buffer bytes per process group of size > 1 (~0.5 GB per communicator, Fujii et al.)."""
    mfu: Optional[float] = None
    """None (default): compute time from the efficiency model (GEMM efficiency by per-GPU matrix size, attention by
    length, grouped GEMM by tokens per expert, memory-bound work by bytes; see :mod:`dynacp.planner.efficiency`).
    A number in (0, 1] instead prices all FLOPs at this fraction of peak (the planner's earlier constant model)."""
    efficiency: Optional[Dict[str, float]] = None
    """Overrides of :class:`dynacp.planner.efficiency.Efficiency` fields, e.g. ``{"gemm_max": 0.75}``."""
    fp8: bool = False
    """FP8 GEMMs (Transformer Engine): GEMM time / Efficiency.fp8_gemm_speedup; attention and the memory-bound work
    stay in bf16. The weights' FP8 copies are set by ``fp8_param``."""
    fp8_param: bool = True
    """With ``fp8``: the weights are kept in FP8 only (Megatron's --fp8-param-gather, which every FP8 recipe of
    Megatron-Bridge and NeMo 2 sets except the blockwise one: tensorwise current and delayed scaling, MXFP8): 1 B
    per parameter plus the 1 B transposed (column-wise) copy that the backward GEMMs need on Hopper
    (``post_all_gather_processing`` in megatron/core/fp8_utils.py creates it), no bf16 copy, and the DP parameter
    all-gather moves 1 B. False: bf16 weights (2 B) plus Transformer Engine's cached FP8 workspace, row-wise and
    column-wise (2 B; Megatron-Core keeps it across micro-batches, ``is_first_microbatch``), as Megatron-Bridge's
    blockwise (DeepSeek-V3 subchannel) recipe runs. The fp32 master copy and the moments are the optimizer's 12 B
    either way."""
    dp_overlap: bool = True
    """Overlap the DP gradient reduce-scatter with the last micro-batch's backward and the parameter all-gather
    with the first forward (Megatron's --overlap-grad-reduce / --overlap-param-gather); False = fully exposed."""
    pp_comm_overlap: bool = True
    """With interleaving (VPP > 1) the pipeline sends and receives run asynchronously behind the next chunk's compute
    (Megatron's --overlap-p2p-communication, which NeMo and Megatron-Bridge turn on whenever VPP > 1; the Llama 3
    paper's asynchronous point-to-point): only the part longer than the stage's compute is exposed. Without
    interleaving the 1F1B sends block and are always counted. False = always counted."""
    tp_comm_overlap: bool = True
    """TP communication overlapped with the GEMMs (Transformer Engine userbuffers, --tp-comm-overlap): only
    Efficiency.tp_exposed of it is counted; False = fully exposed."""
    ep_comm_overlap: bool = True
    """The EP dispatch/combine all-to-alls overlap other work (Megatron's --overlap-moe-expert-parallel-comm,
    Megatron-Bridge's moe_a2a_overlap, or the shared-expert overlap of the all-to-all dispatcher): only
    Efficiency.a2a_exposed of them is counted. False = fully exposed: without those overlaps Megatron runs the
    dispatch and the combine between the router and the experts on the critical path."""
    moe_imbalance: float = 1.0
    """Load on the busiest expert rank / mean (1 = uniform routing); scales routed-expert compute, memory, a2a."""
    tie_tolerance: float = 0.01
    """Predicted step times within this relative distance of each other are ties, broken by the least model
    parallelism TP x PP x CP (the simpler layout), then by the most memory headroom (the analytic model is not more
    accurate than this)."""
    sample_batches: int = 4
    """Global batches sampled from a length distribution for the scheduler-based prediction."""
    predict_top: int = 16
    """With a length distribution, plan only the best ``predict_top`` layouts by analytic time (0 = all)."""
    dynamic_strategy: str = "auto"
    """Scheduler strategy for the dynamic prediction: 'auto' = 'dynacp' when built, else 'fcp'."""
    group_overhead: float = 2e-3
    """c in the scheduler's cost model: fixed seconds per CP group (launches, synchronisation)."""
    seed: int = 0
    """Random seed for sampling global batches."""

    def validate(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"PlannerOptions.optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.grad_dtype not in ("fp32", "bf16"):
            raise ValueError(f"PlannerOptions.grad_dtype must be 'fp32' or 'bf16', got {self.grad_dtype!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"PlannerOptions.recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if str(self.etp) not in ETP_CHOICES:
            raise ValueError(f"PlannerOptions.etp must be one of {', '.join(ETP_CHOICES)}, got {self.etp!r}")
        self.etp = str(self.etp)
        _integral(self, "max_vpp", "ce_chunk_tokens", "sample_batches", "seed", "predict_top")
        if self.predict_top < 0:
            raise ValueError(f"PlannerOptions.predict_top must be >= 0, got {self.predict_top}")
        _positive(self, "max_vpp", "ce_chunk_tokens", "mfu", "moe_imbalance", "sample_batches")
        if not 0 < self.memory_headroom <= 1:
            raise ValueError(f"PlannerOptions.memory_headroom must be in (0, 1], got {self.memory_headroom}")
        if self.mfu is not None and self.mfu > 1:
            raise ValueError(f"PlannerOptions.mfu must be in (0, 1], got {self.mfu}")
        if self.efficiency is not None:
            from dynacp.planner.efficiency import Efficiency

            self.efficiency = dict(self.efficiency)
            Efficiency.from_overrides(self.efficiency)
        for n in ("nccl_buffer_bytes", "tie_tolerance", "group_overhead"):
            if getattr(self, n) < 0:
                raise ValueError(f"PlannerOptions.{n} must be >= 0, got {getattr(self, n)}")
        if self.cp_sizes is not None:
            self.cp_sizes = tuple(self.cp_sizes)
            if not self.cp_sizes or any(not isinstance(c, int) or c < 1 for c in self.cp_sizes):
                raise ValueError(f"PlannerOptions.cp_sizes must be positive integers, got {self.cp_sizes!r}")

    @classmethod
    def from_dict(cls, data: Dict[str, Any], where: str = "options") -> PlannerOptions:
        return _from_dict(cls, data, where)


@dataclass(frozen=True)
class Layout:
    """One parallel layout. TP*PP*CP*DP = W (attention side) and ETP*EP*EDP*PP = W (expert side)."""

    tp: int
    """Tensor parallel size t."""
    pp: int
    """Pipeline parallel size p."""
    cp: int
    """Context parallel size c."""
    dp: int
    """Data parallel size d = W / (t p c)."""
    ep: int = 1
    """Expert parallel size e."""
    etp: int = 1
    """Expert tensor parallel size t_e."""
    vpp: int = 1
    """Virtual pipeline chunks per rank v."""
    edp: int = field(default=1)
    """Expert data parallel size d_e = W / (t_e e p)."""

    @property
    def name(self) -> str:
        """E.g. 'TP1/PP1/CP1/EP8/ETP1/DP40' (EP and ETP omitted when both are 1; 'PP4x2' = PP 4 with VPP 2)."""
        return self.label(self.ep > 1 or self.etp > 1)

    def label(self, moe: bool) -> str:
        """The name, with EP and ETP always shown when ``moe``."""
        s = f"TP{self.tp}/PP{self.pp}" + (f"x{self.vpp}" if self.vpp > 1 else "") + f"/CP{self.cp}"
        if moe:
            s += f"/EP{self.ep}/ETP{self.etp}"
        return s + f"/DP{self.dp}"
