"""Training-loop integration: a Megatron-style data-iterator wrapper over dynacp plans, loss/FLOPs helpers,
and attention entry points for packed zigzag-CP microbatches. See docs/integration.md."""

from dynacp.integration.attention import (
    allgather_kv_attention,
    cp_attention,
    reference_attention,
    ring_attention_available,
)
from dynacp.integration.config import CPGroupPool, CPRing, Planner, ProcessGroups, make_process_groups
from dynacp.integration.layout import padded_length, zigzag_chunk_rows, zigzag_global_rows, zigzag_rows
from dynacp.integration.loss import finalize_grads, gpt_flops, masked_token_loss, reduce_num_tokens, report_loss
from dynacp.integration.packed import (
    PackedSeqParams,
    TEContextParallel,
    make_packed_seq_params,
    make_te_context_parallel,
    megatron_packed_seq_params_class,
)
from dynacp.integration.rings import distinct_rings, restrict_plan, ring_set
from dynacp.integration.shapes import MicrobatchShape, declared_shapes
from dynacp.integration.status import CommunicationError, Failure, RankFailedError
from dynacp.integration.wrapper import (
    FIELDS,
    DynamicCPDataIterator,
    GlobalBatch,
    PlanMismatchError,
    RerouteStats,
    get_wrapper,
    split_samples,
    wrap_data_iterator,
)

__all__ = [
    "CPGroupPool", "CPRing", "CommunicationError", "DynamicCPDataIterator", "FIELDS", "Failure", "GlobalBatch",
    "MicrobatchShape", "PackedSeqParams", "declared_shapes",
    "PlanMismatchError", "Planner", "ProcessGroups", "RankFailedError", "RerouteStats", "TEContextParallel",
    "distinct_rings", "make_te_context_parallel", "restrict_plan", "ring_set",
    "allgather_kv_attention", "cp_attention", "finalize_grads", "get_wrapper", "gpt_flops", "make_process_groups",
    "make_packed_seq_params", "masked_token_loss", "megatron_packed_seq_params_class", "padded_length", "reduce_num_tokens", "reference_attention", "report_loss",
    "ring_attention_available", "split_samples", "wrap_data_iterator", "zigzag_chunk_rows", "zigzag_global_rows", "zigzag_rows",
]
