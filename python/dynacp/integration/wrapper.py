"""The data-iterator wrapper: gather lengths, plan, re-route samples, and yield zigzag CP-sliced THD microbatches.

Flow per global batch (on the ranks that read data: TP rank 0 of a stage that has a data iterator):

1. pull ``num_samples`` items from the data iterator (sample dicts of 1-D tensors, or packed dicts with
   ``cu_seqlens`` that are split into their sequences), check them, and set empty samples aside
   (``Planner.empty_samples``);
2. all-gather each rank's *status* over the DP x CP pool: its lengths, or the error it hit (data iterator, bad
   input). Any error makes every rank raise the same :class:`~dynacp.integration.status.RankFailedError`; global
   sequence ids are pool-rank-major;
3. plan (every rank runs the same deterministic solver on the same lengths, in a background thread one global batch
   ahead when ``Planner.async_planning``) and cut the send buffers, then all-gather a second status with
   ``(config fingerprint, plan digest)``: a planning error fails every rank together, differing digests raise
   :class:`PlanMismatchError` on every rank;
4. re-route: each sample's owner cuts the zigzag slice every member of its CP group needs and sends it point to
   point (``isend``/``irecv`` over the pool group, one message per rank pair that has rows to move), so only needed
   rows travel;
5. pipeline stages all-gather their status (any stage's error is raised by every stage), then stage 0 broadcasts
   the packing metadata over the PP group; TP rank 0 broadcasts metadata and tensors to its TP peers (or the error,
   so they raise it too); with ``cp_groups="lazy"`` every rank creates the CP groups of new rings, with
   ``"prebuilt"`` the rings are checked against the groups built at start-up, with ``"pool"`` (dynacp's ring
   attention) no group is needed (:class:`~dynacp.integration.config.CPGroupPool`).

Every wait has a timeout (``Planner.timeout``; see :mod:`dynacp.integration.status`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

import dynacp
from dynacp.integration.config import Planner, ProcessGroups
from dynacp.integration.layout import cumulative, padded_length, zigzag_rows
from dynacp.integration.packed import make_packed_seq_params, make_te_context_parallel
from dynacp.integration.status import (
    Failure,
    PlanMismatchError,
    RankFailedError,
    Timed,
    decode_failure,
    encode_failure,
    failure_cause,
)

logger = logging.getLogger("dynacp.integration")

#: Per-token fields every microbatch carries, in wire order (``sequence_ids`` is added by the wrapper).
FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
_PAD = {"tokens": 0, "labels": 0, "loss_mask": 0, "position_ids": 0}
#: int64 columns of one re-routed row: the fields, then the global sequence id (-1 for padding).
WIDTH = len(FIELDS) + 1
_INTEGER_FIELDS = ("tokens", "labels", "position_ids")

__all__ = ["FIELDS", "DynamicCPDataIterator", "GlobalBatch", "PlanMismatchError", "RerouteStats", "get_wrapper",
           "split_samples", "wrap_data_iterator"]


@dataclass
class RerouteStats:
    """What re-routing one global batch moved and held on this rank (all sizes in bytes).

    Every re-routed row is ``WIDTH`` int64 values (40 bytes): the four fields and the sequence id. A rank sends the
    rows it read that other ranks hold and receives the rows it holds that others read; nothing is sized by the
    number of ranks.
    """

    bytes_sent: int = 0
    """Bytes this rank sent to other ranks (``isend`` payloads)."""
    bytes_received: int = 0
    """Bytes this rank received from other ranks (``irecv`` payloads)."""
    local_bytes: int = 0
    """Bytes of rows this rank both read and holds (copied, never sent)."""
    messages_sent: int = 0
    """``isend`` calls: one per other rank that holds rows this rank read."""
    messages_received: int = 0
    """``irecv`` calls: one per other rank that read rows this rank holds."""
    peak_bytes: int = 0
    """Largest total of the re-route's own buffers alive at once: the send buffers and the receive buffer during the
    exchange (the receive buffer is one allocation of every row this rank holds). The input samples and the
    microbatch tensors handed out (``output_bytes``) are not counted, nor transient per-slice copies (at most one
    sequence slice's field)."""
    output_bytes: int = 0
    """Bytes of the microbatch tensors handed out (fields in their own dtypes plus int64 ``sequence_ids``)."""


@dataclass
class GlobalBatch:
    """One global batch as this rank sees it."""

    microbatches: list[dict]
    """This rank's microbatches in run order (dicts with tokens/labels/loss_mask/position_ids/packed_seq_params...;
    tensor entries are ``None`` on pipeline stages without data)."""
    seqlen_sum: int
    """Σ s over the whole global batch (real lengths; skipped empty samples count 0)."""
    seqlen_squared_sum: int
    """Σ s² over the whole global batch (real lengths; what attention FLOPs scale with)."""
    num_valid_tokens: int
    """Σ loss_mask over the whole global batch (what per-token normalisation divides by)."""
    digest: int
    """Plan digest (identical on every rank of the world; 0 when every sample of the batch was empty)."""
    rings: list[tuple[int, ...]]
    """Every CP ring of the plan (pool indices, ring order), in plan order."""
    plan: Optional[dynacp.Plan] = None
    """The plan (on ranks that planned; ``None`` on ranks that received metadata only)."""
    plan_wait_s: float = 0.0
    """Seconds this call blocked waiting for the plan (0 when async planning fully overlapped)."""
    plan_solve_s: float = 0.0
    """Seconds the solver ran (wall time in its thread)."""
    reroute_s: float = 0.0
    """Seconds spent gathering lengths, checking the plan and moving samples."""
    skipped_empty: int = 0
    """Samples of 0 tokens left out of this global batch over the whole pool (``Planner.empty_samples = "skip"``)."""
    skipped_empty_per_rank: list[int] = field(default_factory=list)
    """The same count per pool rank (by pool index)."""
    reroute: RerouteStats = field(default_factory=RerouteStats)
    """This rank's re-route traffic and buffer sizes (zeros on ranks that received metadata only)."""

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatches)


@dataclass
class _Pending:
    """One global batch read and gathered (and, when ``failure`` is None, submitted for planning)."""

    batch: int                # index of this global batch (0-based)
    samples: list[dict] = field(default_factory=list)
    lengths: list[list[int]] = field(default_factory=list)  # per pool rank
    valid: list[int] = field(default_factory=list)          # per pool rank: Σ loss_mask
    skipped: list[int] = field(default_factory=list)        # per pool rank: empty samples left out
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    future: Optional[concurrent.futures.Future] = None
    gather_s: float = 0.0
    failure: Optional[BaseException] = None  # the error every rank raises for this batch
    local_exc: Optional[BaseException] = None  # this rank's own exception behind it, if any

    @property
    def num_sequences(self) -> int:
        return sum(len(ls) for ls in self.lengths)


@dataclass
class _Timed:
    plan: Any
    seconds: float


class _LocalFailure(Exception):
    """This rank cannot take part in a global batch; reported in the next status exchange, raised by nobody."""

    def __init__(self, phase: str, cause: str, exc: Optional[BaseException] = None):
        super().__init__(cause)
        self.phase, self.cause, self.exc = phase, cause, exc


@dataclass
class _Route:
    """This rank's side of one re-route: filled send buffers, the receive buffer, and where each microbatch's rows
    will lie in it."""

    send: dict[int, torch.Tensor]             # other pool rank -> (rows, WIDTH) int64, in plan order
    recv: torch.Tensor                        # (held rows, WIDTH) int64, one region per source pool rank
    recv_at: dict[int, tuple[int, int]]       # source pool rank -> (first row, rows) of its region in recv
    blocks: list[tuple[int, tuple[int, ...], int, list[int], list[tuple[int, int]]]]
    """Per microbatch of this rank: (slot, ring, ring position, sequence ids, row ranges in recv)."""
    lengths: list[int]                        # real length of every global sequence
    dtypes: dict[str, torch.dtype]            # the fields' dtypes (the same on every rank)


# ----------------------------------------------------------------------------------------------------------------------
# sample handling


def split_samples(item: dict) -> list[dict]:
    """One data-iterator item as a list of per-sequence dicts of 1-D tensors.

    A dict with ``cu_seqlens`` is split at those offsets; ``loss_mask`` defaults to ones and ``position_ids`` to
    ``arange(len)``; ``labels`` is required. Raises ``KeyError`` for a missing field and ``ValueError`` for fields of
    different lengths, non-integer tokens/labels/position_ids, a non-finite loss mask or bad ``cu_seqlens``.
    """
    if "tokens" not in item or "labels" not in item:
        raise KeyError(f"a sample needs 'tokens' and 'labels', got keys {sorted(item)}")
    flat = {k: torch.as_tensor(item[k]).reshape(-1) for k in FIELDS if k in item and item[k] is not None}
    n = flat["tokens"].numel()
    for k, v in flat.items():
        if v.numel() != n:
            raise ValueError(f"'{k}' has {v.numel()} tokens but 'tokens' has {n}")
        if k in _INTEGER_FIELDS and (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool):
            raise ValueError(f"'{k}' must hold integers, got dtype {v.dtype}")
    if "loss_mask" in flat and flat["loss_mask"].is_floating_point() and not bool(torch.isfinite(flat["loss_mask"]).all()):
        raise ValueError("'loss_mask' holds non-finite values")
    cu = item.get("cu_seqlens")
    bounds = [0, n] if cu is None else [int(x) for x in torch.as_tensor(cu).reshape(-1).tolist()]
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] > n or any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(f"bad cu_seqlens {bounds} for {n} tokens")
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s = {k: v[a:b] for k, v in flat.items()}
        s.setdefault("loss_mask", torch.ones(b - a, dtype=torch.float32))
        s.setdefault("position_ids", torch.arange(b - a, dtype=torch.long))
        out.append(s)
    return out


def _common_dtypes(samples: list[dict]) -> Optional[dict[str, torch.dtype]]:
    """The fields' dtypes, the same for every sample of this rank (``ValueError`` naming the first that differs)."""
    if not samples:
        return None
    first = {k: samples[0][k].dtype for k in FIELDS}
    for i, s in enumerate(samples[1:], start=1):
        for k in FIELDS:
            if s[k].dtype != first[k]:
                raise ValueError(f"sample {i}'s '{k}' is {s[k].dtype} but sample 0's is {first[k]} (every sample "
                                 "must use the same dtypes)")
    return first


def _dtype_names(dtypes: dict[str, torch.dtype]) -> dict[str, str]:
    return {k: str(v).replace("torch.", "") for k, v in dtypes.items()}


def _to_i64(t: torch.Tensor) -> torch.Tensor:
    """Bit-exact int64 view of a field (floats travel as float64 bit patterns)."""
    return t.to(torch.float64).view(torch.int64) if t.is_floating_point() else t.to(torch.int64)


def _from_i64(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(torch.float64).to(dtype) if dtype.is_floating_point else t.to(dtype)


def _slice_rows(sample: dict, seq_id: int, cp: int, rank: int, out: torch.Tensor, pad: int = 2) -> None:
    """Write into ``out`` (``(padded/cp, WIDTH)`` int64) the rows ring position ``rank`` of a ``cp`` group holds of one
    sequence, padded to a multiple of ``pad * cp``: its fields, then ``seq_id`` (-1 on padding rows)."""
    n = sample["tokens"].numel()
    rows = zigzag_rows([0, n], cp, rank, [0, padded_length(n, cp, pad)])
    real = rows >= 0
    safe = torch.where(real, rows, torch.zeros_like(rows))
    for f, name in enumerate(FIELDS):
        col = _to_i64(sample[name])[safe] if n else torch.zeros(rows.numel(), dtype=torch.int64)
        fill = _to_i64(torch.tensor([_PAD[name]], dtype=sample[name].dtype))
        out[:, f] = torch.where(real, col, fill)
    out[:, len(FIELDS)] = torch.where(real, torch.full_like(rows, seq_id), torch.full_like(rows, -1))


# ----------------------------------------------------------------------------------------------------------------------
# the wrapper


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
        self.planner = planner
        self.groups = groups
        self.num_samples = num_samples
        self.use_megatron = use_megatron
        self.reads_data = groups.tp_rank == 0 and self.data_iterator is not None
        if groups.pp_rank == 0 and groups.tp_rank == 0 and self.data_iterator is None:
            raise ValueError("pipeline stage 0, TP rank 0 must be given a data iterator")
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dynacp-plan")
        self._pending: Optional[_Pending] = None
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
        self._online = _OnlineState()
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

    # -- online refit (Planner.refit_every; dynacp.calibrate.online) ---------------------------------------------------

    @property
    def refits(self) -> list:
        """Every online refit so far (:class:`dynacp.calibrate.online.RefitResult`), the same on every rank."""
        return self._online.refits

    @property
    def step_log(self) -> list[tuple[int, float, float]]:
        """Per global batch this rank recorded: ``(batch, predicted s, measured s)`` summed over its microbatches,
        predicted by the model the batch was planned with."""
        return self._online.step_log

    def record(self, microbatch: dict, seconds: float, batch: Optional[int] = None) -> None:
        """Record that this rank trained ``microbatch`` (forward + backward) in ``seconds``; ``batch`` defaults to the
        latest global batch. Used by the online refit (``Planner.refit_every``; with it off nothing is kept); cheap,
        no communication."""
        from dynacp.calibrate.online import GroupRecord

        if not (seconds > 0) or seconds != seconds or seconds == float("inf"):
            raise ValueError(f"record: seconds must be a positive finite number, got {seconds!r}")
        if self.planner.refit_every <= 0:
            return  # online refit off: nothing is kept
        cu = [int(x) for x in microbatch["cu_seqlens"]]
        rec = GroupRecord(self.steps - 1 if batch is None else int(batch), int(microbatch["slot"]),
                          tuple(int(r) for r in microbatch["ring"]), tuple(b - a for a, b in zip(cu[:-1], cu[1:])),
                          float(seconds))
        self._online.pending.append(rec)
        self._online.mine.append(rec)

    def measure(self, microbatch: dict) -> _Measure:
        """``with wrapper.measure(mb): loss = model(mb); loss.backward()`` times the block (CUDA events when the
        microbatch's tokens are on a GPU, else perf_counter) and records it (see :meth:`record`)."""
        tokens = microbatch.get("tokens")
        return _Measure(self, microbatch, bool(tokens is not None and tokens.is_cuda))

    def _log_step(self) -> None:
        """Log this rank's predicted vs measured time of the latest batch it recorded (pool rank 0 at INFO)."""
        from dynacp.calibrate.online import predicted_seconds

        st = self._online
        recs = [r for r in st.mine if r.batch == self.steps - 1]
        if not recs or not self.reads_data:
            return
        cost = st.cost_of.get(self.steps - 1) or self.planner.cost or dynacp.CostModel()
        pred = float(predicted_seconds(cost, self.planner.resolved_cluster(self.groups.pool_size), recs).sum())
        meas = float(sum(r.seconds for r in recs))
        st.step_log.append((self.steps - 1, pred, meas))
        st.mine = [r for r in st.mine if r.batch >= self.steps - 1]
        st.cost_of = {b: c for b, c in st.cost_of.items() if b >= self.steps - 1}
        if self.groups.pool_index == 0:
            logger.info("dynacp: global batch %d: predicted %.3f ms, measured %.3f ms over this rank's %d microbatches "
                        "(relative error %+.1f%%)", self.steps - 1, 1e3 * pred, 1e3 * meas, len(recs),
                        100 * (pred - meas) / meas)

    def _maybe_refit(self) -> None:
        """Before submitting global batch k: when k is a multiple of ``Planner.refit_every``, gather the records,
        refit on pool rank 0 and broadcast the model with its last plan digest (collective over the pool)."""
        from dynacp.calibrate.online import RefitOptions, refit

        every, k, st = self.planner.refit_every, self._next_batch, self._online
        if every <= 0 or k == 0 or k % every:
            return
        g = self.groups
        gathered = self._pool.gather_objects(st.pending, g.dp_cp, f"the online-refit gather before global batch {k}")
        st.pending = []
        payload: Any = None
        if g.pool_index == 0:
            try:
                st.history.extend(r for recs in gathered for r in recs)
                opts = self.planner.refit_options or RefitOptions()
                st.history = st.history[-4 * opts.window * g.pool_size:]
                cluster = self.planner.resolved_cluster(g.pool_size)
                new, result = refit(self.planner.cost or dynacp.CostModel(), cluster, st.history, opts, k)
                result.digest = st.last_digest
                payload = (dict(new.to_dict()), st.last_digest, result)
            except Exception as exc:  # every rank raises it, not only pool rank 0
                payload = ("error", failure_cause(exc), None)
        fields, digest, result = self._pool.broadcast_object(payload, g.pool_ranks[0], g.dp_cp,
                                                             f"the online-refit broadcast before global batch {k}")
        if fields == "error":
            raise RuntimeError(f"dynacp: the online refit before global batch {k} failed on pool rank 0: {digest}")
        if digest != st.last_digest:
            raise PlanMismatchError(f"dynacp: online refit before global batch {k}: pool rank 0's last plan digest "
                                    f"{digest:#018x} differs from this rank's {st.last_digest:#018x}")
        self.planner.cost = dynacp.CostModel(**fields)
        st.refits.append(result)
        if g.pool_index == 0:
            logger.info("dynacp: online refit before global batch %d on %d groups (%d rejected): %s; median error "
                        "%.1f%% -> %.1f%%", k, result.samples, result.rejected,
                        ", ".join(f"{n} = {v:.4e}" for n, v in result.coefficients.items()),
                        100 * result.error_before, 100 * result.error_after)

    def _submit_next(self) -> Optional[_Pending]:
        self._maybe_refit()
        return self._read_and_submit()

    def next_global_batch(self) -> Optional[GlobalBatch]:
        """Produce this rank's share of the next global batch (collective over the world); ``None`` when the data
        is exhausted (on every rank)."""
        if self._failed is not None:
            raise self._failed
        if self.planner.refit_every > 0:
            self._log_step()
        t0 = time.perf_counter()
        failure: Optional[BaseException] = None
        batch = None
        try:
            batch = self._plan_and_route() if self.reads_data else None
        except Exception as exc:  # passed on to TP peers and later stages, then raised here
            failure = exc
        try:
            batch = self._share_metadata(batch, failure)
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

    def _attach_groups(self, batch: GlobalBatch) -> None:
        """Make the rings runnable (``cp_groups="lazy"``: create the groups of new rings, collective over the world;
        ``"prebuilt"``: check them against the set; ``"pool"``: nothing) and attach each microbatch's packed params,
        its :class:`~dynacp.integration.config.CPRing` (``"cp_ring"``) and its TransformerEngine CP parameters
        (``"te"``, :class:`~dynacp.integration.packed.TEContextParallel`)."""
        g = self.groups
        g.cp_pool.ensure(batch.rings)
        for mb in batch.microbatches:
            ring = mb["ring"]
            if mb["cp_rank"] is None:
                mb["cp_rank"] = list(ring).index(g.pool_index)
            group = g.cp_pool.get(ring)
            mb["cp_ring"] = g.cp_pool.ring(ring, g.dp_cp, g.pool_index)
            mb["packed_seq_params"] = make_packed_seq_params(
                mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"], len(ring), group,
                use_megatron=self.use_megatron)
            mb["te"] = make_te_context_parallel(group, [g.pool_ranks[i] for i in ring], mb["cp_rank"],
                                                mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"])

    # -- data-reading ranks: read, status exchange, plan --------------------------------------------------------------

    def _read_items(self) -> Optional[tuple[list[dict], int]]:
        """This rank's samples of the next global batch and the number of empty ones left out; ``None`` when the
        iterator is exhausted. Raises :class:`_LocalFailure` for anything this rank cannot train on."""
        samples: list[dict] = []
        skipped = 0
        for i in range(self.num_samples):
            try:
                item = next(self.data_iterator)
            except StopIteration:
                return None
            except Exception as exc:
                raise _LocalFailure("data iterator", failure_cause(exc), exc) from exc
            try:
                parts = split_samples(item)
            except Exception as exc:
                raise _LocalFailure("bad input", f"item {i} of the global batch: {failure_cause(exc)}", exc) from exc
            for j, s in enumerate(parts):
                if s["tokens"].numel() > 0:
                    samples.append(s)
                elif self.planner.empty_samples == "skip":
                    skipped += 1
                else:
                    raise _LocalFailure("bad input", f"item {i}, sequence {j} of the global batch is empty (0 tokens) "
                                        "and Planner.empty_samples = 'error'")
        try:
            _common_dtypes(samples)
        except ValueError as exc:
            raise _LocalFailure("bad input", failure_cause(exc), exc) from exc
        return samples, skipped

    def _local_status(self) -> tuple[tuple, list[dict], Optional[BaseException]]:
        """``(status, samples, local exception)``; status is ``("ok", lengths, Σ loss_mask, dtypes, skipped)``,
        ``("done",)`` or ``("error", phase, cause)``."""
        try:
            read = self._read_items()
        except _LocalFailure as f:
            return ("error", f.phase, f.cause), [], f.exc or f
        if read is None:
            return ("done",), [], None
        samples, skipped = read
        valid = int(sum(float(s["loss_mask"].sum()) for s in samples))
        return ("ok", [int(s["tokens"].numel()) for s in samples], valid, _common_dtypes(samples), skipped), samples, None

    def _read_failures(self, gathered: list[tuple]) -> list[Failure]:
        """Every rank's failure from the gathered statuses (the same list on every rank)."""
        ranks = self.groups.pool_ranks
        out = [Failure(r, ranks[r], s[1], s[2]) for r, s in enumerate(gathered) if s[0] == "error"]
        if out:
            return out
        done = [r for r, s in enumerate(gathered) if s[0] == "done"]
        if done and len(done) < len(gathered):
            return [Failure(r, ranks[r], "data iterator", "StopIteration: ran out of data while other ranks did not")
                    for r in done]
        typed = [(r, s[3]) for r, s in enumerate(gathered) if s[0] == "ok" and s[3] is not None]
        if typed:  # every rank must use the same field dtypes (floats travel as bit patterns)
            common = collections.Counter(tuple(d.items()) for _, d in typed).most_common(1)[0][0]
            ref = next(r for r, d in typed if tuple(d.items()) == common)
            out = [Failure(r, ranks[r], "bad input", f"ValueError: field dtypes {_dtype_names(d)} differ from pool "
                           f"rank {ref}'s {_dtype_names(dict(common))}")
                   for r, d in typed if tuple(d.items()) != common]
        return out

    def _read_and_submit(self) -> Optional[_Pending]:
        """Pull this rank's items, exchange statuses and lengths over the pool, and submit planning (collective over
        the pool). A failure anywhere in the pool comes back in ``_Pending.failure`` on every rank."""
        t0 = time.perf_counter()
        pending = _Pending(batch=self._next_batch)
        self._next_batch += 1
        status, samples, pending.local_exc = self._local_status()
        gathered = self._pool.gather_objects(status, self.groups.dp_cp,
                                             f"the status and length all-gather of global batch {pending.batch}")
        failures = self._read_failures(gathered)
        if failures:
            pending.failure = RankFailedError.from_failures(pending.batch, failures, self.groups.pool_size)
            return pending
        if all(s[0] == "done" for s in gathered):
            return None
        pending.samples = samples
        pending.lengths = [s[1] for s in gathered]
        pending.valid = [s[2] for s in gathered]
        pending.skipped = [s[4] for s in gathered]
        pending.dtypes = next((s[3] for s in gathered if s[3] is not None), {k: torch.int64 for k in FIELDS})
        flat = np.asarray([n for ls in pending.lengths for n in ls], dtype=np.int64)
        pending.future = self._executor.submit(self._solve, flat) if flat.size else None
        if pending.future is not None and not self.planner.async_planning:
            # errors (and a solver slower than the timeout) are reported in the plan status exchange
            concurrent.futures.wait([pending.future], timeout=self.planner.timeout)
        pending.gather_s = time.perf_counter() - t0
        return pending

    def _solve(self, lengths: np.ndarray) -> _Timed:
        t0 = time.perf_counter()
        plan = self.planner.plan(lengths, self.groups.pool_size)
        return _Timed(plan, time.perf_counter() - t0)

    def _plan_locally(self, pending: _Pending) -> tuple[Optional[_Timed], Optional[_Route], float,
                                                        Optional[_LocalFailure]]:
        """``(timed plan, route, seconds waited, failure)``: wait for the solver and cut the send buffers."""
        t0 = time.perf_counter()
        try:
            timed = pending.future.result(timeout=self.planner.timeout)
        except concurrent.futures.TimeoutError as exc:
            cause = f"TimeoutError: the solver did not finish within Planner.timeout = {self.planner.timeout:g} s"
            return None, None, time.perf_counter() - t0, _LocalFailure("planning", cause, exc)
        except Exception as exc:
            return None, None, time.perf_counter() - t0, _LocalFailure("planning", failure_cause(exc), exc)
        wait = time.perf_counter() - t0 if self.planner.async_planning else timed.seconds
        try:
            return timed, self._route(timed.plan, pending), wait, None
        except Exception as exc:
            return timed, None, wait, _LocalFailure("slicing samples", failure_cause(exc), exc)

    def _plan_and_route(self) -> Optional[GlobalBatch]:
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
            self._exchange_plan_status(None if timed is None else timed.plan, local, pending.batch)
            self._online.last_digest = int(timed.plan.digest())
            if self.planner.refit_every > 0:
                self._online.cost_of[pending.batch] = self.planner.cost
            micro, stats = self._exchange_samples(route)
        if self.planner.async_planning:
            self._pending = self._submit_next()  # next batch plans while this one trains
            if self._pending is None:
                self._exhausted = True
        return self._global_batch(pending, timed, micro, stats, wait)

    def _global_batch(self, pending: _Pending, timed: Optional[_Timed], micro: list[dict], stats: RerouteStats,
                      wait: float) -> GlobalBatch:
        lens = [n for ls in pending.lengths for n in ls]
        plan = None if timed is None else timed.plan
        skipped = int(sum(pending.skipped))
        if skipped and self.groups.pool_index == 0 and self.groups.pp_rank == 0:
            logger.warning("dynacp: global batch %d: skipped %d empty sample(s) (per pool rank: %s; "
                           "Planner.empty_samples = 'skip')", pending.batch, skipped, pending.skipped)
        return GlobalBatch(
            microbatches=micro, seqlen_sum=int(sum(lens)), seqlen_squared_sum=int(sum(n * n for n in lens)),
            num_valid_tokens=int(sum(pending.valid)), digest=0 if plan is None else int(plan.digest()),
            rings=[] if plan is None else [tuple(g.ranks) for slot in plan.microbatches for g in slot], plan=plan,
            plan_wait_s=wait, plan_solve_s=0.0 if timed is None else timed.seconds, skipped_empty=skipped,
            skipped_empty_per_rank=list(pending.skipped), reroute=stats)

    def _exchange_plan_status(self, plan: Optional[dynacp.Plan], local: Optional[_LocalFailure], batch: int) -> None:
        """All-gather each rank's planning status and (fingerprint, digest): a failure anywhere raises
        :class:`RankFailedError`, differing plans :class:`PlanMismatchError`, on every rank alike."""
        if local is not None:
            mine: tuple = ("error", local.phase, local.cause)
        else:
            mine = ("ok", self.planner.fingerprint(), int(plan.digest()), self.planner.describe())
        everyone = self._pool.gather_objects(mine, self.groups.dp_cp, f"the plan check of global batch {batch}")
        ranks = self.groups.pool_ranks
        failures = [Failure(r, ranks[r], e[1], e[2]) for r, e in enumerate(everyone) if e[0] == "error"]
        if failures:
            err = RankFailedError.from_failures(batch, failures, self.groups.pool_size)
            raise err from (None if local is None else local.exc)
        if not self.planner.check_plan:
            return
        bad = [i for i, e in enumerate(everyone) if e[1:3] != everyone[0][1:3]]
        if bad:
            lines = [f"  pool rank {i}: config {e[1]} digest {e[2]:#018x} planner {e[3]}"
                     for i, e in enumerate(everyone) if i in bad or i == 0]
            raise PlanMismatchError(
                "dynacp: ranks of the DP x CP pool hold different plans (every rank must use an equal Planner and "
                "see the same lengths); differing from pool rank 0:\n" + "\n".join(lines))

    # -- re-route --------------------------------------------------------------------------------------------------

    def _route(self, plan: dynacp.Plan, pending: _Pending) -> _Route:
        """Cut this rank's send buffers and lay out its receive buffer (local work, before any exchange)."""
        me, size = self.groups.pool_index, self.groups.pool_size
        owner = [r for r, ls in enumerate(pending.lengths) for _ in ls]
        local = [i for ls in pending.lengths for i in range(len(ls))]
        lengths = [n for ls in pending.lengths for n in ls]
        seen = [0] * len(lengths)
        send_rows, recv_rows = [0] * size, [0] * size
        for slot in plan.microbatches:
            for g in slot:
                cp = len(g.ranks)
                for s in g.sequences:
                    seen[s] += 1
                    n = padded_length(lengths[s], cp, self._pad) // cp
                    for dst in g.ranks:
                        if owner[s] == me:
                            send_rows[dst] += n
                        if dst == me:
                            recv_rows[owner[s]] += n
        if any(c != 1 for c in seen):
            bad = [s for s, c in enumerate(seen) if c != 1][:10]
            raise ValueError(f"dynacp: plan does not schedule every sequence exactly once (e.g. ids {bad})")
        starts = cumulative(recv_rows)
        recv = torch.empty(starts[-1], WIDTH, dtype=torch.int64)
        recv_at = {r: (starts[r], recv_rows[r]) for r in range(size) if recv_rows[r]}
        send = {d: torch.empty(send_rows[d], WIDTH, dtype=torch.int64) for d in range(size) if d != me and send_rows[d]}
        if send_rows[me]:  # rows this rank keeps are cut straight into its receive buffer
            send[me] = recv[starts[me]:starts[me] + recv_rows[me]]
        put, take = [0] * size, list(starts[:-1])
        blocks = []
        for k, slot in enumerate(plan.microbatches):
            for g in slot:
                ring, cp = tuple(int(r) for r in g.ranks), len(g.ranks)
                pieces = []
                for s in g.sequences:
                    n = padded_length(lengths[s], cp, self._pad) // cp
                    for i, dst in enumerate(ring):
                        if owner[s] == me:
                            _slice_rows(pending.samples[local[s]], s, cp, i, send[dst][put[dst]:put[dst] + n],
                                        self._pad)
                            put[dst] += n
                    if me in ring:
                        pieces.append((take[owner[s]], take[owner[s]] + n))
                        take[owner[s]] += n
                if me in ring and g.sequences:
                    blocks.append((k, ring, ring.index(me), list(g.sequences), pieces))
        return _Route(send=send, recv=recv, recv_at=recv_at, blocks=blocks, lengths=lengths, dtypes=pending.dtypes)

    def _exchange_samples(self, route: _Route) -> tuple[list[dict], RerouteStats]:
        """Post every ``isend``/``irecv`` of the re-route at once, wait for each under the timeout, then build this
        rank's microbatches from the receive buffer."""
        me, group = self.groups.pool_index, self.groups.dp_cp
        stats = RerouteStats()
        reqs = []
        for d, buf in route.send.items():
            if d != me:
                reqs.append((f"sending rows to pool rank {d}", dist.isend(buf, group=group, group_dst=d)))
                stats.bytes_sent += buf.nbytes
                stats.messages_sent += 1
        for r, (a, n) in route.recv_at.items():
            if r != me:
                reqs.append((f"receiving rows from pool rank {r}", dist.irecv(route.recv[a:a + n], group=group,
                                                                               group_src=r)))
                stats.bytes_received += n * WIDTH * 8
                stats.messages_received += 1
            else:
                stats.local_bytes += n * WIDTH * 8
        stats.peak_bytes = route.recv.nbytes + sum(b.nbytes for d, b in route.send.items() if d != me)
        started = time.monotonic()
        for what, req in reqs:
            self._pool.wait(req, f"the re-route ({what})", started)
        route.send.clear()
        micro = [self._microbatch(route, *block) for block in route.blocks]
        stats.output_bytes = sum(mb[k].nbytes for mb in micro for k in (*FIELDS, "sequence_ids"))
        return micro, stats

    def _microbatch(self, route: _Route, slot: int, ring: tuple[int, ...], cp_rank: int, seqs: list[int],
                    pieces: list[tuple[int, int]]) -> dict:
        cp = len(ring)
        cols = [torch.cat([route.recv[a:b, f] for a, b in pieces]) for f in range(WIDTH)]
        mb = {name: _from_i64(cols[f], route.dtypes[name]) for f, name in enumerate(FIELDS)}
        seq_lens = [route.lengths[s] for s in seqs]
        mb.update(self._meta(slot, ring, cp_rank, seqs, seq_lens,
                             [padded_length(n, cp, self._pad) for n in seq_lens]))
        mb["sequence_ids"] = cols[len(FIELDS)]
        return mb

    @staticmethod
    def _meta(slot: int, ring: tuple[int, ...], cp_rank: int, seqs: list[int], seq_lens: list[int],
              padded: list[int]) -> dict:
        return {"slot": slot, "ring": ring, "cp_rank": cp_rank, "sequences": seqs,
                "cu_seqlens": cumulative(seq_lens), "cu_seqlens_padded": cumulative(padded),
                "max_seqlen": max(padded, default=0), "num_local_tokens": sum(padded) // len(ring)}

    # -- metadata sharing (PP stages, TP peers) ----------------------------------------------------------------------

    def _share_metadata(self, batch: Optional[GlobalBatch], failure: Optional[BaseException]) -> Optional[GlobalBatch]:
        """Pass the batch's metadata (or the failure) on to later pipeline stages and TP peers; raises the failure
        after passing it on: the first failing pipeline stage's when there is a PP group, else this rank's own or
        the one its TP rank 0 sent."""
        g = self.groups
        if g.pp is not None and g.tp_rank == 0:
            try:
                batch, staged = self._pp_exchange(batch, failure)
                failure = staged or failure  # the first failing stage's error, the same on every stage
            except Exception as exc:  # a digest mismatch or a lost stage: TP peers must hear of it too
                failure, batch = failure or exc, None
        if g.tp is not None:
            try:
                batch = self._tp_exchange(batch, failure)
            except Exception:
                if failure is None:
                    raise
                # a TP peer is lost too; the failure being passed on is the error to raise
        if failure is not None:
            raise failure
        return batch

    @staticmethod
    def _summary(batch: Optional[GlobalBatch]) -> Optional[dict]:
        if batch is None:
            return None
        keys = ("slot", "ring", "cp_rank", "sequences", "cu_seqlens", "cu_seqlens_padded", "max_seqlen",
                "num_local_tokens")
        return {"microbatches": [{k: mb[k] for k in keys} for mb in batch.microbatches],
                "seqlen_sum": batch.seqlen_sum, "seqlen_squared_sum": batch.seqlen_squared_sum,
                "num_valid_tokens": batch.num_valid_tokens, "digest": batch.digest, "rings": batch.rings,
                "plan_wait_s": batch.plan_wait_s, "plan_solve_s": batch.plan_solve_s,
                "skipped_empty_per_rank": batch.skipped_empty_per_rank}

    @staticmethod
    def _from_summary(s: Optional[dict]) -> Optional[GlobalBatch]:
        if s is None:
            return None
        micro = [dict(m, tokens=None, labels=None, loss_mask=None, position_ids=None, sequence_ids=None)
                 for m in s["microbatches"]]
        skipped = list(s["skipped_empty_per_rank"])
        return GlobalBatch(microbatches=micro, seqlen_sum=s["seqlen_sum"], seqlen_squared_sum=s["seqlen_squared_sum"],
                           num_valid_tokens=s["num_valid_tokens"], digest=s["digest"],
                           rings=[tuple(r) for r in s["rings"]], plan_wait_s=s["plan_wait_s"],
                           plan_solve_s=s["plan_solve_s"], skipped_empty=sum(skipped), skipped_empty_per_rank=skipped)

    def _pp_exchange(self, batch: Optional[GlobalBatch], failure: Optional[BaseException]
                     ) -> tuple[Optional[GlobalBatch], Optional[RuntimeError]]:
        """Pipeline stages first all-gather their status (TP rank 0 of each stage): when any stage failed, every
        stage gets the first failing stage's error back (second element) and nothing else moves. Otherwise stage 0
        ships the packing metadata of its microbatches over the PP group: per-microbatch metadata through the runtime
        codec (``dynacp.torch.broadcast_packing``, int64, checksummed), the batch-level scalars and the plan's rings in
        one int64 side tensor. Stages with their own data check the digest."""
        g = self.groups
        src = g.pp_rank == 0
        timed = Timed(self.planner.timeout, "the pipeline group")
        statuses = timed.gather_objects(None if failure is None else encode_failure(failure), g.pp,
                                        "the pipeline status all-gather")
        first = next((s for s in statuses if s is not None), None)
        if first is not None:
            return None, decode_failure(*first)
        side = _broadcast_int64(_encode_side(batch) if src else None, g.pp_src, g.pp, timed,
                                "the pipeline metadata broadcast")
        if side[0] == 0:  # stage 0 ran out of data
            return None, None
        mbs = batch.microbatches if src else None
        received = self._pp_microbatch_meta(mbs, src, timed)
        if src:
            return batch, None
        decoded = _decode_side(side, received)
        if batch is None:
            return decoded, None
        if decoded.digest != batch.digest:
            raise PlanMismatchError(f"dynacp: pipeline stage {g.pp_rank} planned digest {batch.digest:#018x}, stage 0 "
                                    f"{decoded.digest:#018x}")
        return batch, None

    def _pp_microbatch_meta(self, mbs: Optional[list[dict]], src: bool, timed: Timed) -> list:
        g = self.groups
        codec = _codec()
        if codec is not None:
            meta = [{"cu_seqlens": np.asarray(m["cu_seqlens"], dtype=np.int64),
                     "cu_seqlens_padded": np.asarray(m["cu_seqlens_padded"], dtype=np.int64),
                     "max_seqlen": int(m["max_seqlen"]), "cp_size": len(m["ring"]),
                     "group_ranks": np.asarray(m["ring"], dtype=np.int64)} for m in mbs] if src else None
            started = time.monotonic()
            try:
                return codec(meta, src=g.pp_src, group=g.pp, timeout=self.planner.timeout)
            except (RuntimeError, TimeoutError) as exc:
                raise timed.error("the pipeline packing-metadata broadcast", started, exc) from exc
        # runtime codec not built: same content through a pickled broadcast
        obj = [{k: m[k] for k in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")} | {
            "cp_size": len(m["ring"]), "group_ranks": list(m["ring"])} for m in mbs] if src else None
        return timed.broadcast_object(obj, g.pp_src, g.pp, "the pipeline packing-metadata broadcast")

    def _tp_exchange(self, batch: Optional[GlobalBatch], failure: Optional[BaseException]) -> Optional[GlobalBatch]:
        """TP rank 0 broadcasts metadata (or its failure), then one stacked int64 tensor per microbatch, to its TP
        peers."""
        g = self.groups
        src = g.tp_rank == 0
        timed = Timed(self.planner.timeout, "the tensor-parallel group")
        has_data = (src and failure is None and batch is not None and batch.microbatches
                    and batch.microbatches[0]["tokens"] is not None)
        dtypes = {k: batch.microbatches[0][k].dtype for k in FIELDS} if has_data else None
        msg = (("failure", encode_failure(failure)) if failure is not None else ("ok", (self._summary(batch), dtypes))
               ) if src else None
        kind, payload = timed.broadcast_object(msg, g.tp_src, g.tp, "the tensor-parallel metadata broadcast")
        if kind == "failure":
            if src:
                return None
            raise decode_failure(*payload)
        if src:
            for mb in batch.microbatches if has_data else []:
                block = torch.stack([_to_i64(mb[k]) for k in FIELDS] + [mb["sequence_ids"]])
                timed.post("the tensor-parallel microbatch broadcast", dist.broadcast, block, src=g.tp_src, group=g.tp)
            return batch
        summary, dtypes = payload
        out = self._from_summary(summary)
        if out is not None and dtypes is not None:
            for mb in out.microbatches:
                block = torch.empty(len(FIELDS) + 1, mb["num_local_tokens"], dtype=torch.int64)
                timed.post("the tensor-parallel microbatch broadcast", dist.broadcast, block, src=g.tp_src, group=g.tp)
                mb.update({k: _from_i64(block[f].clone(), dtypes[k]) for f, k in enumerate(FIELDS)})
                mb["sequence_ids"] = block[len(FIELDS)].clone()
        return out


@dataclass
class _OnlineState:
    """The online refit's state on one rank (see ``DynamicCPDataIterator._maybe_refit``)."""

    pending: list = field(default_factory=list)       # records not yet sent to pool rank 0
    mine: list = field(default_factory=list)          # this rank's records of the latest batches (step log)
    history: list = field(default_factory=list)       # pool rank 0: every rank's records, most recent last
    refits: list = field(default_factory=list)
    step_log: list = field(default_factory=list)
    cost_of: dict = field(default_factory=dict)       # global batch -> the model it was planned with
    last_digest: int = 0


class _Measure:
    """Context manager of :meth:`DynamicCPDataIterator.measure`."""

    def __init__(self, wrapper: DynamicCPDataIterator, microbatch: dict, cuda: bool):
        from dynacp.calibrate.online import Timer

        self.wrapper, self.microbatch, self.timer = wrapper, microbatch, Timer(cuda)

    def __enter__(self) -> _Measure:
        self.timer.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.timer.stop()
        if exc_type is None:
            self.wrapper.record(self.microbatch, self.timer.seconds())


def _codec():
    """``dynacp.torch.broadcast_packing`` when the runtime's codec is built, else ``None``."""
    try:
        from dynacp import _core
        from dynacp.torch import broadcast_packing
    except Exception:
        return None
    return broadcast_packing if hasattr(_core, "encode_packing") else None


def _signed64(x: int) -> int:
    return ((int(x) + (1 << 63)) % (1 << 64)) - (1 << 63)


def _encode_side(batch: Optional[GlobalBatch]) -> torch.Tensor:
    """[has_batch, digest, seqlen_sum, seqlen_sq_sum, num_valid, n_mb, slots..., n_rings, (len, ranks...)...,
    n_pool, skipped per pool rank...]."""
    if batch is None:
        return torch.zeros(1, dtype=torch.int64)
    vals = [1, _signed64(batch.digest), batch.seqlen_sum, batch.seqlen_squared_sum, batch.num_valid_tokens,
            len(batch.microbatches)] + [mb["slot"] for mb in batch.microbatches] + [len(batch.rings)]
    for ring in batch.rings:
        vals += [len(ring), *ring]
    vals += [len(batch.skipped_empty_per_rank), *batch.skipped_empty_per_rank]
    return torch.tensor(vals, dtype=torch.int64)


def _decode_side(side: torch.Tensor, meta: list) -> GlobalBatch:
    v = side.tolist()
    n_mb = v[5]
    slots, pos = v[6:6 + n_mb], 6 + n_mb
    rings = []
    for _ in range(v[pos]):
        n = v[pos + 1]
        rings.append(tuple(v[pos + 2:pos + 2 + n]))
        pos += 1 + n
    skipped = v[pos + 2:pos + 2 + v[pos + 1]]
    if len(meta) != n_mb:
        raise RuntimeError(f"dynacp: PP metadata has {len(meta)} microbatches, the side channel {n_mb}")
    micro = []
    for slot, m in zip(slots, meta):
        ring = tuple(int(r) for r in m["group_ranks"])
        cu, cup = [int(x) for x in m["cu_seqlens"]], [int(x) for x in m["cu_seqlens_padded"]]
        micro.append({"slot": slot, "ring": ring, "cp_rank": None, "sequences": None, "cu_seqlens": cu,
                      "cu_seqlens_padded": cup, "max_seqlen": int(m["max_seqlen"]),
                      "num_local_tokens": cup[-1] // len(ring), "tokens": None, "labels": None, "loss_mask": None,
                      "position_ids": None, "sequence_ids": None})
    return GlobalBatch(microbatches=micro, seqlen_sum=v[2], seqlen_squared_sum=v[3], num_valid_tokens=v[4],
                       digest=v[1] % (1 << 64), rings=rings, skipped_empty=sum(skipped),
                       skipped_empty_per_rank=skipped)


def _broadcast_int64(t: Optional[torch.Tensor], src: int, group: dist.ProcessGroup, timed: Timed,
                     what: str) -> torch.Tensor:
    """Broadcast a 1-D int64 tensor of unknown length (length first, then data), each wait under the timeout."""
    n = torch.tensor([0 if t is None else t.numel()], dtype=torch.int64)
    timed.post(what, dist.broadcast, n, src=src, group=group)
    out = t if t is not None else torch.empty(int(n), dtype=torch.int64)
    timed.post(what, dist.broadcast, out, src=src, group=group)
    return out


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
