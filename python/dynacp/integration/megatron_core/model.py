"""Megatron-Core GPT layers whose attention runs every microbatch on its own dynacp ring (any CP size).

``GPTModel(config, gpt_layer_spec(get_gpt_layer_local_spec()), ...)`` builds a model whose layers take a dynacp
microbatch (:func:`~dynacp.integration.megatron_core.batch.megatron_inputs`) as they are. Two pieces go into the
layer spec:

* **core attention** (:func:`core_attention_spec`): ``kind="dynacp"`` is :class:`DynacpCoreAttention`, dynacp's ring
  attention on the microbatch's ring (torch blocks on the CPU, FlashAttention blocks on CUDA; GQA; causal or not;
  one document per sequence of ``packed_seq_params``); ``kind="te"`` is TransformerEngine's attention
  (``TEDotProductAttention``), pointed at the microbatch's ring before each forward.
* **self attention** (:class:`RingSelfAttention`): Megatron's ``SelfAttention`` itself, with one documented hook:
  Megatron's rotary code reads the CP size and rank from the attention's ``pg_collection.cp``, which in a dynamic-CP
  run is Megatron's static CP group (size 1), not the microbatch's ring. :class:`RingSelfAttention` gives its
  ``pg_collection`` a :class:`RingCPGroup` whose ``size()`` / ``rank()`` are the microbatch's ring size and zigzag
  chunk index (from ``packed_seq_params``), so Megatron's own ``RotaryEmbedding`` and ``apply_rotary_pos_emb`` place
  every local row at its position in its sequence. Nothing of Megatron is patched; learned-absolute positions come
  from the microbatch's ``position_ids`` and need no hook.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from typing import Any, Callable, Dict, Iterator, Optional

import torch
import torch.distributed as dist

from dynacp.integration.attention import cp_attention, ring_attention_available
from dynacp.integration.megatron_core.cpu import import_megatron_quietly

import_megatron_quietly()

from megatron.core.transformer.attention import SelfAttention  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.module import MegatronModule  # noqa: E402
from megatron.core.transformer.spec_utils import ModuleSpec  # noqa: E402

#: Attention mask types the dynacp core attention runs, and whether each is causal. THD masks are per document
#: (``packed_seq_params``); ``padding*`` adds nothing, padding rows are never attended to.
CAUSAL_OF_MASK: Dict[AttnMaskType, bool] = {
    AttnMaskType.causal: True, AttnMaskType.padding_causal: True,
    AttnMaskType.no_mask: False, AttnMaskType.padding: False,
}


def causal_of(mask_type: Any) -> bool:
    """Whether ``mask_type`` (an ``AttnMaskType``) is causal; ValueError naming it when dynacp cannot run it."""
    if mask_type not in CAUSAL_OF_MASK:
        raise ValueError(f"dynacp's core attention runs attn_mask_type {[m.name for m in CAUSAL_OF_MASK]}, got "
                         f"{getattr(mask_type, 'name', mask_type)!r} (arbitrary masks and bottom-right causal "
                         "alignment are not supported; masks come from packed_seq_params per document)")
    return CAUSAL_OF_MASK[mask_type]


def _ring_of(p: Any) -> tuple[Any, Optional[list[int]]]:
    """``(group, ranks)`` of the ring of a CP > 1 microbatch: its :class:`~dynacp.integration.config.CPRing` when
    ``packed_seq_params`` carries one (``cp_ring``), else its ``cp_group`` in group order."""
    ring = getattr(p, "cp_ring", None)
    if ring is not None and ring.group is not None:
        return ring.group, list(ring.ranks)
    if p.cp_group is None:
        raise ValueError(f"this microbatch runs on a {p.local_cp_size}-rank ring but its packed_seq_params has neither "
                         "a cp_ring nor a cp_group; build the forward inputs with megatron_inputs(mb)")
    return p.cp_group, None


def ring_core_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, p: Any, causal: bool,
                        softmax_scale: Optional[float], timeout: float, block: Any = None) -> torch.Tensor:
    """Attention of one zigzag THD microbatch: ``query`` ``[T, H, D]``, ``key`` / ``value`` ``[T, Hkv, D]`` (this
    rank's rows), documents and ring from ``packed_seq_params`` ``p``. Returns ``[T, H, D]``.

    Runs ``dynacp.torch.ring_attention`` (GQA native; a ring of one rank runs locally) when the runtime's kernels are
    built and torch.distributed is initialised, else the all-gather oracle with K/V heads repeated (CP > 1 needs a
    process group per ring; CP 1 runs in one process without torch.distributed)."""
    cp = int(p.local_cp_size or 1)
    if ring_attention_available() and dist.is_initialized():
        from dynacp.torch import ring_attention

        if cp == 1:
            group, ranks = dist.group.WORLD, [dist.get_rank()]
        else:
            group, ranks = _ring_of(p)
        return ring_attention(query, key, value, p.cu_seqlens_q, group, causal, ranks=ranks,
                              cu_seqlens_padded=p.cu_seqlens_q_padded, softmax_scale=softmax_scale, timeout=timeout,
                              block=block)
    repeat = query.shape[1] // key.shape[1]
    key, value = (t.repeat_interleave(repeat, dim=1) for t in (key, value))
    if softmax_scale is not None:  # the oracle scales by 1 / sqrt(D)
        query = query * (softmax_scale * math.sqrt(query.shape[-1]))
    return cp_attention(query, key, value, p, causal=causal, impl="allgather")


class DynacpCoreAttention(MegatronModule):
    """Megatron's core-attention slot (``SelfAttentionSubmodules.core_attention``) on dynacp's ring attention.

    Takes the constructor arguments Megatron's ``Attention`` passes and ``forward(query, key, value, attention_mask,
    attn_mask_type=..., attention_bias=None, packed_seq_params=...)``. Every microbatch runs on the ring its
    ``packed_seq_params`` names (any size, a different one per microbatch); the masks are per document
    (``cu_seqlens_q`` / ``cu_seqlens_q_padded``), causal or not by ``attn_mask_type``.

    Raises:
        ValueError: an unsupported mask type, cross attention, attention dropout, an attention mask tensor or
            bias, or a microbatch that is not THD (naming which).
    """

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str = "self",
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection: Any = None, timeout: float = 60.0,
                 block: Any = None, **_: Any) -> None:
        super().__init__(config=config)
        if attention_type != "self":
            raise ValueError(f"dynacp's core attention runs self attention, got attention_type={attention_type!r}")
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(f"dynacp's ring attention has no attention dropout; set attention_dropout=0.0 in the "
                             f"TransformerConfig (got {dropout})")
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type
        self.causal = causal_of(attn_mask_type)
        self.softmax_scale = softmax_scale
        self.timeout = float(timeout)
        """Seconds each ring hop may wait for a neighbour (gloo) before it raises TimeoutError."""
        self.block = block
        """The ring loop's block function (``dynacp.torch.ring_attention(block=...)``): ``None`` picks torch blocks on
        the CPU and FlashAttention blocks on CUDA (float16 / bfloat16); ``"torch"`` runs float32 on CUDA."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type: Any = None,
                attention_bias: Optional[torch.Tensor] = None, packed_seq_params: Any = None,
                **_: Any) -> torch.Tensor:
        """``[T, H, D]`` THD inputs of this rank's rows -> ``[T, H * D]``."""
        if packed_seq_params is None or getattr(packed_seq_params, "qkv_format", None) != "thd":
            raise ValueError("dynacp's core attention needs the microbatch's THD packed_seq_params (qkv_format='thd'), "
                             f"got {packed_seq_params!r}; build the forward inputs with megatron_inputs(mb)")
        if attention_mask is not None or attention_bias is not None:
            raise ValueError("dynacp's core attention takes its masks from packed_seq_params; pass attention_mask=None "
                             "and no attention_bias")
        causal = self.causal if attn_mask_type is None else causal_of(attn_mask_type)
        out = ring_core_attention(query, key, value, packed_seq_params, causal, self.softmax_scale, self.timeout,
                                  self.block)
        return out.reshape(out.shape[0], -1)


class RingCPGroup:
    """What Megatron's rotary code reads of an attention's CP group -- ``size()`` and ``rank()`` -- answered from the
    microbatch bound by :meth:`bind`: its ring size (``local_cp_size``) and this rank's zigzag chunk index
    (``cp_rank``, else the rank in ``cp_group``). Unbound, or bound to a microbatch without ring information, it
    answers as the group it wraps (``base``; ``None`` counts as one rank), so the model behaves as stock Megatron.
    Every other attribute is the wrapped group's."""

    def __init__(self, base: Any) -> None:
        self.__dict__["base"] = base
        self.__dict__["_bound"] = None

    @staticmethod
    def _size_and_rank(p: Any) -> Optional[tuple[int, int]]:
        size = getattr(p, "local_cp_size", None)
        if p is None or size is None:
            return None
        rank = getattr(p, "cp_rank", None)
        if rank is None:
            rank = 0 if int(size) == 1 else dist.get_rank(p.cp_group)
        return int(size), int(rank)

    @contextlib.contextmanager
    def bind(self, packed_seq_params: Any) -> Iterator[None]:
        """Answer for this microbatch inside the block (nests: the previous binding comes back on exit)."""
        saved = self._bound
        self.__dict__["_bound"] = self._size_and_rank(packed_seq_params)
        try:
            yield
        finally:
            self.__dict__["_bound"] = saved

    def size(self) -> int:
        if self._bound is not None:
            return self._bound[0]
        return 1 if self.base is None else self.base.size()

    def rank(self) -> int:
        if self._bound is not None:
            return self._bound[1]
        return 0 if self.base is None else self.base.rank()

    def __getattr__(self, name: str) -> Any:
        base = self.__dict__.get("base")
        if base is None or name.startswith("__"):  # copy / pickle probe dunders on a bare instance
            raise AttributeError(name)
        return getattr(base, name)


_SELF_ATTENTION_FORWARD = inspect.signature(SelfAttention.forward)


class RingSelfAttention(SelfAttention):
    """Megatron's ``SelfAttention`` for dynamic CP: during each forward its ``pg_collection.cp`` is a
    :class:`RingCPGroup` bound to the microbatch's ``packed_seq_params``, so Megatron's rotary embedding (unfused or
    TE-fused, both read ``cp_group.size()`` / ``rank()``) sees the microbatch's ring. When the core attention is
    TransformerEngine's (anything with ``set_context_parallel_group``) and the microbatch carries its TE parameters
    (``packed_seq_params.te``), the ring's group, global ranks and the module's ``cp_stream`` are set on it before the
    forward. Everything else is ``SelfAttention``'s own code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ring_cp = RingCPGroup(self.pg_collection.cp)
        collection = copy.copy(self.pg_collection)
        collection.cp = self.ring_cp
        self.pg_collection = collection

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        bound = _SELF_ATTENTION_FORWARD.bind(self, hidden_states, *args, **kwargs)
        p = bound.arguments.get("packed_seq_params")
        te = getattr(p, "te", None)
        if te is not None and hasattr(self.core_attention, "set_context_parallel_group"):
            te.apply(self.core_attention, cp_stream=getattr(self.core_attention, "cp_stream", None))
        with self.ring_cp.bind(p):
            return super().forward(hidden_states, *args, **kwargs)


def _te_core_attention() -> type:
    try:
        from megatron.core.extensions.transformer_engine import HAVE_TE, TEDotProductAttention
    except ImportError as exc:
        raise RuntimeError(f"core_attention_spec(kind='te') needs megatron.core.extensions.transformer_engine: {exc}"
                           ) from exc
    if not HAVE_TE:
        raise RuntimeError("core_attention_spec(kind='te') needs TransformerEngine, which is not installed (pip "
                           "install transformer-engine); or pass te_module= a class with TE's DotProductAttention "
                           "interface")
    return TEDotProductAttention


CORE_ATTENTION_KINDS: Dict[str, Callable[[Optional[type]], type]] = {
    "dynacp": lambda _: DynacpCoreAttention,
    "te": lambda te_module: te_module or _te_core_attention(),
}
"""The core-attention kinds :func:`core_attention_spec` builds: name -> (``te_module`` -> module class)."""


def core_attention_spec(kind: str = "dynacp", *, te_module: Optional[type] = None,
                        params: Optional[dict] = None) -> ModuleSpec:
    """The ``ModuleSpec`` of a core attention that runs each microbatch on its own ring.

    Args:
        kind: ``"dynacp"`` (:class:`DynacpCoreAttention`) or ``"te"`` (TransformerEngine's ``TEDotProductAttention``,
            which needs TE and a process group per ring: ``make_process_groups(cp_groups="prebuilt" or "lazy")``).
        te_module: for ``kind="te"``, the class to use instead of Megatron's ``TEDotProductAttention``.
        params: extra constructor arguments (for ``"dynacp"``: ``{"timeout": 120.0}``, ``{"block": "torch"}``).

    Raises:
        ValueError: an unknown kind. RuntimeError: ``kind="te"`` without TransformerEngine or ``te_module``.
    """
    if kind not in CORE_ATTENTION_KINDS:
        raise ValueError(f"core attention kind must be one of {sorted(CORE_ATTENTION_KINDS)}, got {kind!r}")
    return ModuleSpec(module=CORE_ATTENTION_KINDS[kind](te_module), params=dict(params or {}))


def _layer_specs(spec: Any) -> list:
    """The transformer-layer ModuleSpecs of a layer spec or a block spec (``TransformerBlockSubmodules``)."""
    return list(spec.layer_specs) if hasattr(spec, "layer_specs") else [spec]


def _swap_attention(layer: Any, core: ModuleSpec, where: str) -> None:
    attention = getattr(getattr(layer, "submodules", None), "self_attention", None)
    slots = getattr(attention, "submodules", None)
    if attention is None or slots is None or not hasattr(slots, "core_attention"):
        raise ValueError(f"{where} has no self_attention.submodules.core_attention slot to put dynacp's attention in "
                         f"(got {type(layer).__name__} with self_attention {attention!r})")
    module = attention.module
    if not (isinstance(module, type) and issubclass(module, SelfAttention)):
        raise ValueError(f"{where}: self_attention is {getattr(module, '__name__', module)!r}; dynacp's ring needs "
                         "Megatron's SelfAttention (multi-latent and cross attention are not supported)")
    if module is SelfAttention:
        attention.module = RingSelfAttention
    elif not issubclass(module, RingSelfAttention):
        raise ValueError(f"{where}: self_attention is a subclass of SelfAttention ({module.__name__}); derive it from "
                         "dynacp's RingSelfAttention instead so rotary embeddings see the microbatch's ring")
    causal_of(attention.params.get("attn_mask_type", AttnMaskType.causal))
    slots.core_attention = core


def gpt_layer_spec(base_spec: Any, kind: str = "dynacp", *, te_module: Optional[type] = None,
                   params: Optional[dict] = None) -> Any:
    """A copy of a GPT layer spec (``get_gpt_layer_local_spec()``, ``get_gpt_layer_with_transformer_engine_spec()``)
    or block spec (its ``layer_specs``) whose self attention is :class:`RingSelfAttention` with
    :func:`core_attention_spec` ``(kind, te_module=..., params=...)`` in its core-attention slot. The base spec is
    not modified.

    Raises:
        ValueError: a layer without a ``self_attention.submodules.core_attention`` slot, attention that is not
            Megatron's ``SelfAttention``, or an attention mask type dynacp cannot run (each naming the layer).
    """
    out = copy.deepcopy(base_spec)
    core = core_attention_spec(kind, te_module=te_module, params=params)
    for i, layer in enumerate(_layer_specs(out)):
        _swap_attention(layer, core, f"layer spec {i}")
    return out


def set_te_context_parallel(model: torch.nn.Module, microbatch: dict, cp_stream: Any = None) -> int:
    """Point every TransformerEngine attention module of ``model`` (each module with ``set_context_parallel_group``)
    at the microbatch's ring -- its group, global ranks in ring order, ``cp_stream`` and ``cp_comm_type`` (see
    :class:`~dynacp.integration.packed.TEContextParallel`). One call per microbatch for models whose attention is not
    :class:`RingSelfAttention` (which does this itself). Returns how many modules were set.

    Raises:
        ValueError: the model has no such module. RuntimeError: the microbatch has no group of its own
            (``cp_groups="pool"``).
    """
    modules = [m for m in model.modules() if hasattr(m, "set_context_parallel_group")]
    if not modules:
        raise ValueError("the model has no TransformerEngine attention module (set_context_parallel_group); build it "
                         "with gpt_layer_spec(..., kind='te')")
    for m in modules:
        microbatch["te"].apply(m, cp_stream=cp_stream)
    return len(modules)
