"""Megatron-LM main's sequence-packing entry point, backed by dynacp.

Megatron-LM main (August 2026, not in a megatron-core release; 0.16.1 has none of it) schedules packed sequences in
``megatron/core/datasets/data_schedule.py``: ``wrap_data_iterator(data_iterator, config, num_microbatches,
pg_collection=None)`` builds ``scheduler_map[PackingSchedulerEnum[config.sequence_packing_scheduler.upper()]]`` with
``(config.max_seqlen_per_dp_cp_rank, cp_size, dp_size, microbatch_group_size_per_vp_stage)``, calls its
``run(data_iterator, num_microbatches, dp_group, tp_group, pp_group, dp_cp_group, dev, config)`` and returns
``(data_iterator, num_microbatches, seqlen_sum, seqlen_squared_sum)``; the forward step then reads each microbatch
with ``get_batch_on_this_rank_for_sequence_packing``. This module has both halves:

* :func:`wrap_data_iterator` -- main's signature and return value, dynacp's plan behind it (rings of any size per
  microbatch over the whole DP x CP pool); with
  :func:`~dynacp.integration.megatron_core.batch.get_batch_on_this_rank_for_sequence_packing` a Megatron user
  switches by changing two imports;
* :class:`DynacpPackingScheduler` -- main's scheduler interface, and :func:`register_packing_scheduler`, which
  registers it under ``scheduler_map`` / ``PackingSchedulerEnum`` (as ``"dynacp"``) when that module has them, so
  ``config.sequence_packing_scheduler = "dynacp"`` selects it in Megatron's own ``wrap_data_iterator``; without them
  (megatron-core 0.16.1) it returns False and changes nothing.

What dynacp reads from ``config``: ``max_seqlen_per_dp_cp_rank`` (tokens one rank holds: the plan's per-rank
capacity) and, optionally, ``dynacp_planner`` (a :class:`~dynacp.integration.config.Planner`, replacing the default
``Planner(strategy="dynacp")`` on a cluster of the pool's size with that capacity) and ``dynacp_groups`` (a
:class:`~dynacp.integration.config.ProcessGroups`, e.g. ``make_process_groups(cp_groups="prebuilt", ...)`` for
TransformerEngine; by default they are built from Megatron's DP x CP, TP and PP groups with ``cp_groups="pool"``,
creating no process group).
"""

from __future__ import annotations

import datetime
import enum
import functools
import logging
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

import dynacp
from dynacp.integration.config import CPGroupPool, Planner, ProcessGroups
from dynacp.integration.wrapper import wrap_data_iterator as dynacp_wrap_data_iterator

log = logging.getLogger("dynacp")

SCHEDULER_NAME = "dynacp"
"""The name dynacp registers under (``config.sequence_packing_scheduler = "dynacp"``)."""

#: Keys of a Megatron sample dict that dynacp re-routes (the others, e.g. ``max_seqlen``, are recomputed).
_KEPT = ("tokens", "labels", "loss_mask", "position_ids")

# One adapted item stream and one ProcessGroups per Megatron iterator / group triple, so that every global batch
# reaches the same dynacp wrapper (which keeps its async-planning state per iterator, see get_wrapper).
_STREAMS: dict[int, Iterator[dict]] = {}
_GROUPS: dict[tuple, ProcessGroups] = {}


def _squeezed(sample: dict) -> dict:
    """A Megatron sample without the default collate's leading batch dimension of 1, trimmed to its
    ``original_seq_len`` when it carries one (already-unpacked datasets pad to ``padded_seq_len``; dynacp pads
    itself)."""
    out = {}
    for k, v in sample.items():
        t = torch.as_tensor(v)
        out[k] = t[0] if t.dim() == 2 and t.shape[0] == 1 else t
    if "original_seq_len" in out and "cu_seqlens" not in out:
        n = int(out["original_seq_len"].reshape(-1)[0])
        out = {k: out[k][:n] for k in _KEPT if k in out}
    return {k: out[k] for k in (*_KEPT, "cu_seqlens") if k in out}


def megatron_items(data_iterator: Iterable) -> Iterator[dict]:
    """Megatron-LM main's data items as dynacp items: one item (a sample dict, or a list of sample dicts, which
    becomes one packed item with ``cu_seqlens``) per item, so ``num_microbatches`` items are one global batch."""
    for item in data_iterator:
        samples = [_squeezed(s) for s in (item if isinstance(item, (list, tuple)) else [item])]
        if len(samples) == 1:
            yield samples[0]
            continue
        if any("cu_seqlens" in s for s in samples):
            raise ValueError("a data item mixes packed samples (with cu_seqlens) into a list of samples; yield one "
                             "packed dict or a list of unpacked sample dicts")
        lengths = [int(s["tokens"].numel()) for s in samples]
        merged = {k: torch.cat([s[k] for s in samples]) for k in _KEPT if all(k in s for s in samples)}
        merged["cu_seqlens"] = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        yield merged


def _megatron_groups(pg_collection: Any) -> tuple:
    """``(dp_cp, dp, tp, pp)`` from a ``ProcessGroupCollection``, or from Megatron's ``parallel_state``."""
    if pg_collection is not None:
        return pg_collection.dp_cp, pg_collection.dp, pg_collection.tp, pg_collection.pp
    from megatron.core import parallel_state as ps

    return (ps.get_data_parallel_group(with_context_parallel=True), ps.get_data_parallel_group(),
            ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group())


def process_groups_from_megatron(dp_cp_group: Any, tp_group: Any, pp_group: Any,
                                 timeout: datetime.timedelta = datetime.timedelta(seconds=300)) -> ProcessGroups:
    """dynacp's :class:`~dynacp.integration.config.ProcessGroups` over Megatron's groups, ``cp_groups="pool"``
    (dynacp's ring attention on the DP x CP group: no process group is created). Cached per group triple."""
    key = (id(dp_cp_group), id(tp_group), id(pp_group))
    if key not in _GROUPS:
        pool = dist.get_process_group_ranks(dp_cp_group)
        tp_ranks, pp_ranks = dist.get_process_group_ranks(tp_group), dist.get_process_group_ranks(pp_group)
        _GROUPS[key] = ProcessGroups(
            dp_cp=dp_cp_group, pool_ranks=pool, cp_pool=CPGroupPool([pool], 0, timeout, "pool"),
            tp=tp_group if len(tp_ranks) > 1 else None, tp_src=tp_ranks[0],
            pp=pp_group if len(pp_ranks) > 1 else None, pp_src=pp_ranks[0], timeout=timeout)
    return _GROUPS[key]


def default_planner(max_seqlen_per_dp_cp_rank: int, pool_size: int, pp: int = 1, vpp: int = 1) -> Planner:
    """``Planner(strategy="dynacp")`` on a cluster of ``pool_size`` ranks holding ``max_seqlen_per_dp_cp_rank``
    tokens each (one node; pass ``config.dynacp_planner`` to describe the real cluster and cost model)."""
    cluster = dynacp.Cluster(num_ranks=pool_size, ranks_per_node=pool_size,
                             tokens_per_rank=int(max_seqlen_per_dp_cp_rank))
    return Planner(strategy="dynacp", cluster=cluster, pp=pp, vpp=vpp)


class DynacpPackingScheduler:
    """Megatron-LM main's packing-scheduler interface (``BasePackingScheduler``) on dynacp's plan.

    ``scheduler_map`` builds it as ``(max_seqlen_per_dp_cp_rank, cp_size, dp_size,
    microbatch_group_size_per_vp_stage)``; :meth:`run` is the whole step (read, plan, re-route, hand to TP peers and
    pipeline stages) and returns main's 4-tuple.

    Raises:
        ValueError: Megatron's static ``cp_size`` is not 1 (dynacp's rings are the context parallelism; set
            ``context_parallel_size=1``), or a capacity below 1 token.
    """

    def __init__(self, max_seqlen_per_dp_cp_rank: int, cp_size: int, dp_size: int,
                 microbatch_group_size_per_vp_stage: Optional[int] = None) -> None:
        if int(cp_size) != 1:
            raise ValueError(f"dynacp plans context parallelism per microbatch over the DP x CP pool; Megatron's "
                             f"static context_parallel_size must be 1, got cp_size={cp_size}")
        if max_seqlen_per_dp_cp_rank is None or int(max_seqlen_per_dp_cp_rank) < 1:
            raise ValueError(f"config.max_seqlen_per_dp_cp_rank (tokens one rank holds) must be >= 1, got "
                             f"{max_seqlen_per_dp_cp_rank!r}")
        self.max_seqlen_per_dp_cp_rank = int(max_seqlen_per_dp_cp_rank)
        self.cp_size, self.dp_size = int(cp_size), int(dp_size)
        self.microbatch_group_size_per_vp_stage = microbatch_group_size_per_vp_stage

    def get_required_sample_keys(self) -> list[str]:
        """Keys every sample must carry (``loss_mask`` defaults to ones, ``position_ids`` to ``arange``)."""
        return ["tokens", "labels"]

    def run(self, data_iterator: Any, num_microbatches: int, dp_group: Any, tp_group: Any, pp_group: Any,
            dp_cp_group: Any, dev: Any, config: Any) -> tuple:
        """One global batch: ``(iterator over this rank's microbatches, num_microbatches, seqlen_sum,
        seqlen_squared_sum)`` (sums over the real lengths, as floats). Every rank -- TP peers and pipeline stages
        included -- gets an iterator over dynacp microbatch dicts; read them with
        :func:`~dynacp.integration.megatron_core.batch.get_batch_on_this_rank_for_sequence_packing`."""
        if isinstance(data_iterator, (list, tuple)):
            raise ValueError("dynacp's wrap_data_iterator takes one data iterator per rank, not one per virtual "
                             "pipeline stage; plan for VPP with config.dynacp_planner = Planner(vpp=...)")
        groups = getattr(config, "dynacp_groups", None) or process_groups_from_megatron(dp_cp_group, tp_group,
                                                                                        pp_group)
        planner = getattr(config, "dynacp_planner", None) or default_planner(
            self.max_seqlen_per_dp_cp_rank, groups.pool_size, pp=dist.get_world_size(pp_group),
            vpp=getattr(config, "virtual_pipeline_model_parallel_size", None) or 1)
        stream = None
        if data_iterator is not None:
            stream = _STREAMS.setdefault(id(data_iterator), megatron_items(data_iterator))
        try:
            it, n, s1, s2 = dynacp_wrap_data_iterator(stream, planner=planner, groups=groups,
                                                      num_samples=int(num_microbatches), use_megatron=True)
        except StopIteration:
            _STREAMS.pop(id(data_iterator), None)
            raise
        return _rerun_iterator(it), int(n), float(s1), float(s2)


def last_global_batch(data_iterator: Any) -> Any:
    """The :class:`~dynacp.integration.wrapper.GlobalBatch` behind the latest :func:`wrap_data_iterator` call with
    ``data_iterator`` (plan, rings, timings, ``num_valid_tokens``), or ``None`` (no call yet, or no data iterator on
    this rank)."""
    from dynacp.integration.wrapper import get_wrapper

    stream = _STREAMS.get(id(data_iterator))
    wrapper = None if stream is None else get_wrapper(stream)
    return None if wrapper is None else getattr(wrapper, "last_batch", None)


@functools.lru_cache(maxsize=1)
def _microbatches_class() -> Optional[type]:
    try:
        from megatron.core.rerun_state_machine import RerunDataIterator
    except ImportError:
        return None

    class Microbatches(RerunDataIterator):
        """Megatron's ``RerunDataIterator``, iterable with ``for`` as well."""

        def __iter__(self) -> Any:
            return self

    return Microbatches


def _rerun_iterator(it: Iterator[dict]) -> Any:
    """Megatron's ``RerunDataIterator`` over the microbatches (what main returns; Megatron's rerun state machine
    expects it), or the plain iterator when megatron-core has none."""
    cls = _microbatches_class()
    return it if cls is None else cls(it)


def wrap_data_iterator(data_iterator: Any, config: Any, num_microbatches: int, pg_collection: Any = None) -> tuple:
    """Megatron-LM main's ``wrap_data_iterator``, dynacp's plan behind it: call once per global batch with the
    same iterator. Returns ``(data_iterator, num_microbatches, seqlen_sum, seqlen_squared_sum)``: an iterator over
    this rank's microbatches (their number may differ per rank), their count, and Σ s, Σ s² of the global batch's
    real lengths (floats). Groups come from ``pg_collection`` (``dp_cp``, ``dp``, ``tp``, ``pp``) or Megatron's
    ``parallel_state``; see the module docstring for what is read from ``config``. Raises ``StopIteration`` when the
    data is exhausted."""
    dp_cp, dp, tp, pp = _megatron_groups(pg_collection)
    dp_size = dist.get_world_size(dp)
    scheduler = DynacpPackingScheduler(config.max_seqlen_per_dp_cp_rank, dist.get_world_size(dp_cp) // dp_size,
                                       dp_size, getattr(config, "microbatch_group_size_per_vp_stage", None))
    return scheduler.run(data_iterator, num_microbatches, dp, tp, pp, dp_cp, None, config)


def register_packing_scheduler(data_schedule: Any = None, name: str = SCHEDULER_NAME) -> bool:
    """Register :class:`DynacpPackingScheduler` in Megatron-LM main's ``scheduler_map`` under ``name`` so that
    ``config.sequence_packing_scheduler = name`` selects it in Megatron's own ``wrap_data_iterator``.

    ``PackingSchedulerEnum`` is a closed ``enum.Enum``, so it is replaced in ``data_schedule`` by an enum of the same
    name with every existing member plus ``name.upper()``; ``scheduler_map`` gains the new members (old members keep
    their entries, so code holding the original enum still finds them). Idempotent.

    Args:
        data_schedule: the module to register in (default ``megatron.core.datasets.data_schedule``).
        name: the scheduler's name (``config.sequence_packing_scheduler``).

    Returns:
        True when registered; False when the module has no ``scheduler_map`` / ``PackingSchedulerEnum``
        (megatron-core 0.16.1: use :func:`wrap_data_iterator` directly), logged on the ``dynacp`` logger.
    """
    if data_schedule is None:
        from megatron.core.datasets import data_schedule
    old_enum = getattr(data_schedule, "PackingSchedulerEnum", None)
    table = getattr(data_schedule, "scheduler_map", None)
    if old_enum is None or table is None:
        log.info("dynacp: %s has no scheduler_map / PackingSchedulerEnum (Megatron-LM main's sequence packing); "
                 "not registered, call dynacp.integration.megatron_core.wrap_data_iterator directly",
                 getattr(data_schedule, "__name__", data_schedule))
        return False
    key = name.upper()
    members = {m.name: m.value for m in old_enum}
    if key not in members:
        members[key] = name
        new_enum = enum.Enum(old_enum.__name__, members, module=getattr(old_enum, "__module__", None))
        new_enum.__doc__ = old_enum.__doc__
        for m in old_enum:
            table[new_enum[m.name]] = table[m]
        data_schedule.PackingSchedulerEnum = new_enum
    current = data_schedule.PackingSchedulerEnum
    table[current[key]] = DynacpPackingScheduler
    return True
