"""The data-iterator wrapper: gather lengths, plan, re-route samples, and yield zigzag CP-sliced THD microbatches.

:class:`DynamicCPDataIterator` (and its Megatron-style entry point :func:`wrap_data_iterator`) runs these stages per
global batch, each a module with one job; on the ranks that read data (TP rank 0 of a stage that has a data
iterator):

1. :mod:`~dynacp.integration.gather`: pull ``num_samples`` items from the data iterator (sample dicts of 1-D
   tensors, or packed dicts with ``cu_seqlens`` that are split into their sequences), check them, set empty samples
   aside (``Planner.empty_samples``), and all-gather each rank's *status* over the DP x CP pool: its lengths, or the
   error it hit. Any error makes every rank raise the same :class:`~dynacp.integration.status.RankFailedError`;
   global sequence ids are pool-rank-major;
2. :mod:`~dynacp.integration.planning`: plan (every rank runs the same deterministic solver on the same lengths, in
   a background thread one global batch ahead when ``Planner.async_planning``), then all-gather a second status
   with ``(config fingerprint, plan digest)``: a planning error fails every rank together, differing digests raise
   :class:`PlanMismatchError` on every rank;
3. :mod:`~dynacp.integration.reroute` (with :mod:`~dynacp.integration.slicing`): each sample's owner cuts the
   zigzag slice every member of its CP group needs and sends it point to point (``isend``/``irecv`` over the pool
   group, one message per rank pair that has rows to move), so only needed rows travel; the received rows become
   packed THD microbatches, assembled into a :class:`GlobalBatch` (:mod:`~dynacp.integration.batch`);
4. :mod:`~dynacp.integration.metadata`: pipeline stages all-gather their status (any stage's error is raised by
   every stage), then stage 0 broadcasts the packing metadata over the PP group; TP rank 0 broadcasts metadata and
   tensors to its TP peers (or the error, so they raise it too);
5. :func:`~dynacp.integration.slicing.attach_groups`: with ``cp_groups="lazy"`` every rank creates the CP groups of
   new rings, with ``"prebuilt"`` the rings are checked against the groups built at start-up, with ``"pool"``
   (dynacp's ring attention) no group is needed (:class:`~dynacp.integration.config.CPGroupPool`).

The online refit (``Planner.refit_every``) runs before step 1: :mod:`~dynacp.integration.refit`. Every wait has a
timeout (``Planner.timeout``; see :mod:`dynacp.integration.status`).

The iterator's stage methods (``_read_items``, ``_route``, ``_exchange_samples``, ``_attach_groups``) are the hooks a
subclass may wrap (the reliability tests and benchmarks/reroute_memory.py do).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Iterable, Iterator, Optional

import torch.distributed as dist

import dynacp
from dynacp.integration import gather, metadata, planning, reroute, slicing
from dynacp.integration.batch import GlobalBatch, assemble
from dynacp.integration.config import Planner, ProcessGroups
from dynacp.integration.gather import FIELDS, Gathered, LocalFailure, split_samples
from dynacp.integration.layout import padded_length
from dynacp.integration.planning import TimedPlan
from dynacp.integration.refit import Measure, OnlineRefit
from dynacp.integration.reroute import RerouteStats, Route
from dynacp.integration.slicing import WIDTH
from dynacp.integration.status import PlanMismatchError, Timed, failure_cause

__all__ = ["FIELDS", "WIDTH", "DynamicCPDataIterator", "GlobalBatch", "PlanMismatchError", "RerouteStats",
           "get_wrapper", "split_samples", "wrap_data_iterator"]


class DynamicCPDataIterator:
    """Class form of :func:`wrap_data_iterator`; keeps the async-planning state across global batches.

    Args:
        data_iterator: this rank's data iterator (``None`` on TP peers and on pipeline stages without data).
        planner: the planning configuration (equal on every rank).
        groups: the process groups (see :func:`~dynacp.integration.config.make_process_groups`).
        num_samples: items to pull from ``data_iterator`` per global batch (Megatron's ``num_microbatches``).
        use_megatron: build ``megatron.core`` ``PackedSeqParams`` (``None``: when importable).

    Iterating yields :class:`GlobalBatch` objects until the data iterator is exhausted. When a global batch fails
    (:class:`~dynacp.integration.status.RankFailedError`, :class:`PlanMismatchError`,
    :class:`~dynacp.integration.status.CommunicationError`), every rank raises; the wrapper is then closed and later
    calls raise the same error again without communicating.
    """

    def __init__(self, data_iterator: Optional[Iterable], *, planner: Planner, groups: ProcessGroups,
                 num_samples: int, use_megatron: Optional[bool] = None):
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.data_iterator = None if data_iterator is None else iter(data_iterator)
        if planner.ring_set is None and groups.cp_pool.ring_set is not None:  # plan on the pre-built groups
            planner = dataclasses.replace(planner, ring_set=groups.cp_pool.ring_set)
        self.planner = planner
        self.groups = groups
        self.num_samples = num_samples
        self.use_megatron = use_megatron
        self.reads_data = groups.tp_rank == 0 and self.data_iterator is not None
        if groups.pp_rank == 0 and groups.tp_rank == 0 and self.data_iterator is None:
            raise ValueError("pipeline stage 0, TP rank 0 must be given a data iterator")
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dynacp-plan")
        self._pending: Optional[Gathered] = None
        self._exhausted = False
        self._failed: Optional[BaseException] = None
        self._next_batch = 0
        self._pool = Timed(planner.timeout, "the DP x CP pool")
        # Rows per sequence as the planner counts them (Cluster.seq_pad_multiple): the plan's memory cap holds for the
        # microbatches built here only if both pad alike.
        self._pad = planner.cluster.seq_pad_multiple if planner.cluster is not None else 2
        padded_length(0, 1, self._pad)  # raises ValueError naming Cluster.seq_pad_multiple when zigzag cannot use it
        self.total_plan_wait_s = 0.0
        self.total_skipped_empty = 0
        """Empty samples skipped over all global batches so far (whole pool)."""
        self.steps = 0
        self._online = OnlineRefit(planner, groups, self._pool)
        if planner.refit_every > 0 and groups.pp is not None and dist.get_world_size(groups.pp) > 1:
            # every stage that reads data plans for itself; stages measuring different work would refit different
            # models and then disagree on the plan digest
            raise ValueError("Planner.refit_every > 0 needs pipeline parallelism off (pp = 1) in this version: the "
                             "stages would refit different models; set refit_every = 0 or use pp = 1")

    # -- public ------------------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[GlobalBatch]:
        return self

    def __next__(self) -> GlobalBatch:
        batch = self.next_global_batch()
        if batch is None:
            raise StopIteration
        return batch

    def close(self) -> None:
        """Stop the planning thread (pending plans are discarded)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def refits(self) -> list:
        """Every online refit so far (:class:`dynacp.calibrate.online.RefitResult`), the same on every rank."""
        return self._online.state.refits

    @property
    def step_log(self) -> list[tuple[int, float, float]]:
        """Per global batch this rank recorded: ``(batch, predicted s, measured s)`` summed over its microbatches,
        predicted by the model the batch was planned with."""
        return self._online.state.step_log

    def declared_shapes(self) -> list:
        """The shapes CUDA-graph mode may emit (``Planner.static_shapes``; :meth:`Planner.declared_shapes`): capture
        one graph per entry at start-up. Every microbatch this iterator yields has ``mb["shape"]`` among them."""
        return self.planner.declared_shapes()

    def record(self, microbatch: dict, seconds: float, batch: Optional[int] = None) -> None:
        """Record that this rank trained ``microbatch`` (forward + backward) in ``seconds``; ``batch`` defaults to the
        latest global batch. Used by the online refit (``Planner.refit_every``; with it off nothing is kept); cheap,
        no communication."""
        self._online.record(microbatch, seconds, self.steps - 1 if batch is None else batch)

    def measure(self, microbatch: dict) -> Measure:
        """``with wrapper.measure(mb): loss = model(mb); loss.backward()`` times the block (CUDA events when the
        microbatch's tokens are on a GPU, else perf_counter) and records it (see :meth:`record`)."""
        tokens = microbatch.get("tokens")
        return Measure(self, microbatch, bool(tokens is not None and tokens.is_cuda))

    def next_global_batch(self) -> Optional[GlobalBatch]:
        """Produce this rank's share of the next global batch (collective over the world); ``None`` when the data
        is exhausted (on every rank)."""
        if self._failed is not None:
            raise self._failed
        if self.planner.refit_every > 0:
            self._online.log_step(self.steps - 1, self.reads_data)
        t0 = time.perf_counter()
        failure: Optional[BaseException] = None
        batch = None
        try:
            batch = self._plan_and_route() if self.reads_data else None
        except Exception as exc:  # passed on to TP peers and later stages, then raised here
            failure = exc
        try:
            batch = metadata.share(batch, failure, self.groups, self.planner.timeout)
            if batch is None:
                return None
            self._attach_groups(batch)
        except Exception as exc:  # the failure decided above, the same on every rank (or a lost peer)
            self._failed = exc
            self.close()
            raise
        batch.reroute_s = time.perf_counter() - t0 - batch.plan_wait_s
        self.total_plan_wait_s += batch.plan_wait_s
        self.total_skipped_empty += batch.skipped_empty
        self.steps += 1
        return batch

    # -- the stages (hooks a subclass may wrap) ------------------------------------------------------------------------

    def _read_items(self) -> Optional[tuple[list[dict], int]]:
        """Stage 1, local part: this rank's samples and the count of empty ones left out (:func:`gather.read_items`)."""
        return gather.read_items(self.data_iterator, self.num_samples, self.planner.empty_samples)

    def _route(self, plan: dynacp.Plan, pending: Gathered) -> Route:
        """Stage 3, local part: cut the send buffers (:func:`reroute.cut`)."""
        return reroute.cut(plan, pending, self.groups.pool_index, self.groups.pool_size, self._pad,
                           self.planner.static_shapes)

    def _exchange_samples(self, route: Route) -> tuple[list[dict], RerouteStats]:
        """Stage 3, exchange: move the rows and build this rank's microbatches (:func:`reroute.exchange`)."""
        return reroute.exchange(route, self.groups.pool_index, self.groups.dp_cp, self._pool)

    def _attach_groups(self, batch: GlobalBatch) -> None:
        """Stage 5: make the rings runnable and attach the packed params (:func:`slicing.attach_groups`)."""
        slicing.attach_groups(batch.microbatches, batch.rings, self.groups, self.use_megatron)

    # -- the data-reading ranks' flow ------------------------------------------------------------------------------

    def _submit_next(self) -> Optional[Gathered]:
        """Refit when due, read and gather the next global batch and submit it for planning (collective over the
        pool); a failure anywhere in the pool comes back in ``Gathered.failure`` on every rank."""
        self._online.maybe_refit(self._next_batch)
        t0 = time.perf_counter()
        index = self._next_batch
        self._next_batch += 1
        status, samples, local_exc = gather.local_status(self._read_items)
        pending = gather.exchange_status(status, samples, index, self._pool, self.groups)
        if pending is None or pending.failure is not None:
            if pending is not None:
                pending.local_exc = local_exc
            return pending
        planning.submit(self._executor, self.planner, self.groups.pool_size, pending)
        pending.gather_s = time.perf_counter() - t0
        return pending

    def _plan_locally(self, pending: Gathered) -> tuple[Optional[TimedPlan], Optional[Route], float,
                                                        Optional[LocalFailure]]:
        """``(timed plan, route, seconds waited, failure)``: wait for the solver and cut the send buffers."""
        timed, wait, failure = planning.wait_for_plan(pending, self.planner)
        if failure is not None:
            return None, None, wait, failure
        try:
            return timed, self._route(timed.plan, pending), wait, None
        except Exception as exc:
            return timed, None, wait, LocalFailure("slicing samples", failure_cause(exc), exc)

    def _plan_and_route(self) -> Optional[GlobalBatch]:
        """Stages 1-3 on a data-reading rank: this rank's :class:`GlobalBatch`, or ``None`` when the data is
        exhausted; raises the failure every rank of the pool raises."""
        if self._exhausted:
            return None
        pending = self._pending or self._submit_next()
        self._pending = None
        if pending is None:
            self._exhausted = True
            return None
        if pending.failure is not None:
            raise pending.failure from pending.local_exc
        timed, micro, stats, wait = None, [], RerouteStats(), 0.0
        if pending.num_sequences:  # the same on every rank: all plan, or all see only empty samples
            timed, route, wait, local = self._plan_locally(pending)
            planning.check_plans(None if timed is None else timed.plan, local, pending.batch, self.planner,
                                 self._pool, self.groups)
            self._online.planned(pending.batch, int(timed.plan.digest()))
            micro, stats = self._exchange_samples(route)
        if self.planner.async_planning:
            self._pending = self._submit_next()  # next batch plans while this one trains
            if self._pending is None:
                self._exhausted = True
        return assemble(pending, timed, micro, stats, wait, self.groups)


_WRAPPERS: dict[int, DynamicCPDataIterator] = {}


def wrap_data_iterator(data_iterator: Optional[Iterable], *, planner: Planner, groups: ProcessGroups,
                       num_samples: int, use_megatron: Optional[bool] = None
                       ) -> tuple[Iterator[dict], int, int, int]:
    """Megatron-style entry point: call once per global batch with the same iterator.

    Returns ``(iterator over this rank's microbatches, num_microbatches, seqlen_sum, seqlen_squared_sum)``.
    The wrapper object behind it (for async planning and statistics) is kept per ``data_iterator`` and can be
    fetched with :func:`get_wrapper`. Raises ``StopIteration`` when the data is exhausted.
    """
    key = id(data_iterator) if data_iterator is not None else id(groups)
    w = _WRAPPERS.get(key)
    if w is None:
        w = _WRAPPERS[key] = DynamicCPDataIterator(data_iterator, planner=planner, groups=groups,
                                                   num_samples=num_samples, use_megatron=use_megatron)
    batch = w.next_global_batch()
    if batch is None:
        w.close()
        _WRAPPERS.pop(key, None)
        raise StopIteration
    w.last_batch = batch  # type: ignore[attr-defined]
    return iter(batch.microbatches), batch.num_microbatches, batch.seqlen_sum, batch.seqlen_squared_sum


def get_wrapper(data_iterator: Optional[Iterable], groups: Optional[ProcessGroups] = None
                ) -> Optional[DynamicCPDataIterator]:
    """The :class:`DynamicCPDataIterator` behind :func:`wrap_data_iterator` for this iterator (``last_batch`` holds the
    latest :class:`GlobalBatch`)."""
    return _WRAPPERS.get(id(data_iterator) if data_iterator is not None else id(groups))
