"""Megatron-Core integration: the released hybrid-CP scheduler as a measured peer, a dynacp-backed drop-in for it,
real ``megatron.core`` models trained through dynacp at any per-microbatch CP size, and Megatron-LM main's
sequence-packing entry point.

* :mod:`~dynacp.integration.megatron_core.peer` -- :func:`released_plan`, the ``megatron-core`` peer of
  ``dynacp compare`` (the released ``BalancedCPScheduler``'s groups as a dynacp Plan);
* :mod:`~dynacp.integration.megatron_core.scheduler` -- :class:`DynacpCPScheduler`, the released scheduler's
  interface backed by dynacp's cost model (:func:`use_dynacp_scheduler`: the one-line switch);
* :mod:`~dynacp.integration.megatron_core.model` -- :func:`core_attention_spec` and :func:`gpt_layer_spec`: a GPT
  layer spec whose attention runs every microbatch on its own ring (any CP size, GQA, RoPE, THD document masks);
* :mod:`~dynacp.integration.megatron_core.batch` -- a dynacp microbatch as ``GPTModel`` inputs and as Megatron-LM
  main's ``get_batch_on_this_rank_for_sequence_packing`` tuple;
* :mod:`~dynacp.integration.megatron_core.steps` -- Megatron's per-token ``loss_func`` and ``forward_step``, and its
  no-pipelining steps for the CPU (``forward_backward_per_token``);
* :mod:`~dynacp.integration.megatron_core.entry` -- Megatron-LM main's ``wrap_data_iterator(data_iterator, config,
  num_microbatches, pg_collection=None)`` and its ``scheduler_map`` registration;
* :mod:`~dynacp.integration.megatron_core.cpu` -- the one shim Megatron-Core needs to run on a CPU-only torch.

megatron-core is imported only where needed (its import takes seconds and warns about missing Transformer Engine);
importing this package does not import it. See docs/integration.md.
"""

import importlib
from typing import Any

from dynacp.integration.megatron_core.cpu import cpu_shim
from dynacp.integration.megatron_core.peer import (
    PEER_NAME,
    PEER_STRATEGIES,
    RELEASED_VERSION,
    PoolSize,
    SampleIdGroups,
    plan_from_sample_id_groups,
    rank_lists_to_slots,
    released_groups,
    released_plan,
    released_scheduler_class,
)
from dynacp.integration.megatron_core.scheduler import (
    DynacpCPScheduler,
    check_megatron_schedule,
    compare_with_reimplementation,
    megatron_blocks,
    megatron_degrees,
    use_dynacp_scheduler,
)

#: Names served from the submodules that import megatron-core, loaded on first use (PEP 562): a missing
#: megatron-core raises ImportError naming it and the install command when one of them is first used.
_LAZY = {
    "CORE_ATTENTION_KINDS": "model", "DynacpCoreAttention": "model", "RingCPGroup": "model",
    "RingSelfAttention": "model", "core_attention_spec": "model", "gpt_layer_spec": "model",
    "set_te_context_parallel": "model",
    "RingPackedSeqParams": "batch", "get_batch_on_this_rank_for_sequence_packing": "batch",
    "megatron_inputs": "batch", "padding_mask": "batch", "ring_packed_seq_params": "batch",
    "forward_backward_per_token": "steps", "forward_step": "steps", "global_loss": "steps", "loss_func": "steps",
    "DynacpPackingScheduler": "entry", "SCHEDULER_NAME": "entry", "last_global_batch": "entry", "megatron_items": "entry",
    "process_groups_from_megatron": "entry", "register_packing_scheduler": "entry", "wrap_data_iterator": "entry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = sorted(_LAZY) + [
    "cpu_shim", "PEER_NAME", "PEER_STRATEGIES", "RELEASED_VERSION", "DynacpCPScheduler", "PoolSize", "SampleIdGroups",
    "check_megatron_schedule", "compare_with_reimplementation", "megatron_blocks", "megatron_degrees",
    "plan_from_sample_id_groups", "rank_lists_to_slots", "released_groups", "released_plan",
    "released_scheduler_class", "use_dynacp_scheduler",
]
