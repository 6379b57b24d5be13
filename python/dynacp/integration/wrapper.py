"""The data-iterator wrapper: gather lengths, plan, re-route samples, and yield zigzag CP-sliced THD microbatches.

Flow per global batch (on the ranks that read data: TP rank 0 of a stage that has a data iterator):

1. pull ``num_samples`` items from the data iterator (sample dicts of 1-D tensors, or packed dicts with
   ``cu_seqlens`` that are split into their sequences);
2. all-gather the lengths over the DP x CP pool; global sequence ids are pool-rank-major;
3. plan (every rank runs the same deterministic solver on the same lengths, in a background thread one global batch
   ahead when ``Planner.async_planning``), then all-gather ``(config fingerprint, plan digest)`` and raise
   :class:`PlanMismatchError` on every rank when they differ;
4. re-route: each sample's owner cuts the zigzag slice every member of its CP group needs and sends it point to
   point (``isend``/``irecv`` over the pool group; gloo and NCCL both support them), so only needed rows travel;
5. stage 0 broadcasts the packing metadata over the PP group; TP rank 0 broadcasts metadata and tensors to its TP
   peers; every rank creates the CP groups of new rings (:class:`~dynacp.integration.config.CPGroupPool`).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

import dynacp
from dynacp.integration.config import Planner, ProcessGroups
from dynacp.integration.layout import cumulative, padded_length, zigzag_rows
from dynacp.integration.packed import make_packed_seq_params

#: Per-token fields every microbatch carries, in wire order (``sequence_ids`` is added by the wrapper).
FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
_PAD = {"tokens": 0, "labels": 0, "loss_mask": 0, "position_ids": 0}


class PlanMismatchError(RuntimeError):
    """Ranks of the DP x CP pool hold different plans or different planner configurations."""


@dataclass
class GlobalBatch:
    """One global batch as this rank sees it."""

    microbatches: list[dict]
    """This rank's microbatches in run order (dicts with tokens/labels/loss_mask/position_ids/packed_seq_params...;
    tensor entries are ``None`` on pipeline stages without data)."""
    seqlen_sum: int
    """Σ s over the whole global batch (real lengths)."""
    seqlen_squared_sum: int
    """Σ s² over the whole global batch (real lengths)."""
    num_valid_tokens: int
    """Σ loss_mask over the whole global batch (what per-token normalisation divides by)."""
    digest: int
    """Plan digest (identical on every rank of the world)."""
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

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatches)


@dataclass
class _Pending:
    samples: list[dict]
    lengths: list[list[int]]  # per pool rank
    valid: list[int]          # per pool rank: Σ loss_mask
    dtypes: dict[str, torch.dtype]
    future: concurrent.futures.Future
    gather_s: float = 0.0


@dataclass
class _Timed:
    plan: Any
    seconds: float


# ----------------------------------------------------------------------------------------------------------------------
# sample handling


def split_samples(item: dict) -> list[dict]:
    """One data-iterator item as a list of per-sequence dicts of 1-D tensors.

    A dict with ``cu_seqlens`` is split at those offsets; ``loss_mask`` defaults to ones and ``position_ids`` to
    ``arange(len)``; ``labels`` is required.
    """
    if "tokens" not in item or "labels" not in item:
        raise KeyError(f"a sample needs 'tokens' and 'labels', got keys {sorted(item)}")
    flat = {k: torch.as_tensor(item[k]).reshape(-1) for k in FIELDS if k in item and item[k] is not None}
    n = flat["tokens"].numel()
    cu = item.get("cu_seqlens")
    bounds = [0, n] if cu is None else [int(x) for x in torch.as_tensor(cu).reshape(-1).tolist()]
    if bounds[0] != 0 or bounds[-1] > n or any(b > a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ValueError(f"bad cu_seqlens {bounds} for {n} tokens")
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s = {k: v[a:b] for k, v in flat.items()}
        if s["labels"].numel() != b - a:
            raise ValueError(f"labels has {s['labels'].numel()} tokens, tokens has {b - a}")
        s.setdefault("loss_mask", torch.ones(b - a, dtype=torch.float32))
        s.setdefault("position_ids", torch.arange(b - a, dtype=torch.long))
        out.append(s)
    return out


def _to_i64(t: torch.Tensor) -> torch.Tensor:
    """Bit-exact int64 view of a field (floats travel as float64 bit patterns)."""
    return t.to(torch.float64).view(torch.int64) if t.is_floating_point() else t.to(torch.int64)


def _from_i64(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(torch.float64).to(dtype) if dtype.is_floating_point else t.to(dtype)


def _slice_rows(sample: dict, seq_id: int, cp: int, rank: int) -> torch.Tensor:
    """The (len(FIELDS)+1, padded/cp) int64 block ring position ``rank`` of a ``cp`` group holds of one sequence."""
    n = sample["tokens"].numel()
    rows = zigzag_rows([0, n], cp, rank)
    real = rows >= 0
    safe = torch.where(real, rows, torch.zeros_like(rows))
    out = torch.empty(len(FIELDS) + 1, rows.numel(), dtype=torch.int64)
    for f, name in enumerate(FIELDS):
        col = _to_i64(sample[name])[safe] if n else torch.zeros(rows.numel(), dtype=torch.int64)
        pad = _to_i64(torch.tensor([_PAD[name]], dtype=sample[name].dtype))
        out[f] = torch.where(real, col, pad)
    out[len(FIELDS)] = torch.where(real, torch.full_like(rows, seq_id), torch.full_like(rows, -1))
    return out


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

    Iterating yields :class:`GlobalBatch` objects until the data iterator is exhausted.
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
        self.total_plan_wait_s = 0.0
        self.steps = 0

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

    def next_global_batch(self) -> Optional[GlobalBatch]:
        """Produce this rank's share of the next global batch (collective over the world); ``None`` when the data
        is exhausted (on every rank)."""
        t0 = time.perf_counter()
        batch = self._plan_and_route() if self.reads_data else None
        batch = self._share_metadata(batch)
        if batch is None:
            return None
        self.groups.cp_pool.ensure(batch.rings)
        for mb in batch.microbatches:
            ring = mb["ring"]
            if mb["cp_rank"] is None:
                mb["cp_rank"] = list(ring).index(self.groups.pool_index)
            mb["packed_seq_params"] = make_packed_seq_params(
                mb["cu_seqlens"], mb["cu_seqlens_padded"], mb["max_seqlen"], len(ring),
                self.groups.cp_pool.get(ring), use_megatron=self.use_megatron)
        batch.reroute_s = time.perf_counter() - t0 - batch.plan_wait_s
        self.total_plan_wait_s += batch.plan_wait_s
        self.steps += 1
        return batch

    # -- data-reading ranks ----------------------------------------------------------------------------------------

    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.planner.timeout)

    def _read_and_submit(self) -> Optional[_Pending]:
        """Pull this rank's items, gather lengths over the pool, and submit planning (collective over the pool)."""
        t0 = time.perf_counter()
        samples: list[dict] = []
        try:
            for _ in range(self.num_samples):
                samples.extend(split_samples(next(self.data_iterator)))
        except StopIteration:
            samples = None  # type: ignore[assignment]
        mine = None if samples is None else (
            [int(s["tokens"].numel()) for s in samples],
            int(sum(float(s["loss_mask"].sum()) for s in samples)),
            {k: samples[0][k].dtype for k in FIELDS} if samples else None)
        gathered: list = [None] * self.groups.pool_size
        dist.all_gather_object(gathered, mine, group=self.groups.dp_cp)
        if any(g is None for g in gathered):
            if not all(g is None for g in gathered):
                done = [i for i, g in enumerate(gathered) if g is None]
                raise RuntimeError(f"dynacp: pool ranks {done} ran out of data while others did not")
            return None
        lengths = [g[0] for g in gathered]
        dtypes = next((g[2] for g in gathered if g[2] is not None), {k: torch.int64 for k in FIELDS})
        flat = np.asarray([n for ls in lengths for n in ls], dtype=np.int64)
        future = self._executor.submit(self._solve, flat)
        if not self.planner.async_planning:
            future.result()  # surface errors and keep the timing in plan_solve_s
        return _Pending(samples, lengths, [g[1] for g in gathered], dtypes, future, time.perf_counter() - t0)

    def _solve(self, lengths: np.ndarray) -> _Timed:
        t0 = time.perf_counter()
        plan = self.planner.plan(lengths, self.groups.pool_size)
        return _Timed(plan, time.perf_counter() - t0)

    def _plan_and_route(self) -> Optional[GlobalBatch]:
        if self._exhausted:
            return None
        pending = self._pending or self._read_and_submit()
        self._pending = None
        if pending is None:
            self._exhausted = True
            return None
        t0 = time.perf_counter()
        timed: _Timed = pending.future.result(timeout=self.planner.timeout)
        wait = time.perf_counter() - t0 if self.planner.async_planning else timed.seconds
        plan = timed.plan
        if self.planner.check_plan:
            self._check_plan(plan)
        micro = self._reroute(plan, pending)
        if self.planner.async_planning:
            self._pending = self._read_and_submit()  # next batch plans while this one trains
            if self._pending is None:
                self._exhausted = True
        lens = [n for ls in pending.lengths for n in ls]
        return GlobalBatch(
            microbatches=micro, seqlen_sum=int(sum(lens)), seqlen_squared_sum=int(sum(n * n for n in lens)),
            num_valid_tokens=int(sum(pending.valid)), digest=int(plan.digest()),
            rings=[tuple(g.ranks) for slot in plan.microbatches for g in slot], plan=plan,
            plan_wait_s=wait, plan_solve_s=timed.seconds)

    def _check_plan(self, plan: dynacp.Plan) -> None:
        mine = (self.planner.fingerprint(), int(plan.digest()), self.planner.describe())
        everyone: list = [None] * self.groups.pool_size
        dist.all_gather_object(everyone, mine, group=self.groups.dp_cp)
        bad = [i for i, e in enumerate(everyone) if e[:2] != everyone[0][:2]]
        if bad:
            lines = [f"  pool rank {i}: config {e[0]} digest {e[1]:#018x} planner {e[2]}"
                     for i, e in enumerate(everyone) if i in bad or i == 0]
            raise PlanMismatchError(
                "dynacp: ranks of the DP x CP pool hold different plans (every rank must use an equal Planner and "
                "see the same lengths); differing from pool rank 0:\n" + "\n".join(lines))

    def _reroute(self, plan: dynacp.Plan, pending: _Pending) -> list[dict]:
        """Move every sequence's zigzag slices to the members of its CP group; build this rank's microbatches."""
        me, size = self.groups.pool_index, self.groups.pool_size
        owner, local = [], []
        for r, ls in enumerate(pending.lengths):
            owner += [r] * len(ls)
            local += list(range(len(ls)))
        lengths = [n for ls in pending.lengths for n in ls]
        send: dict[int, list[torch.Tensor]] = {d: [] for d in range(size)}
        recv_rows = [0] * size
        seen = [0] * len(lengths)
        for slot in plan.microbatches:
            for g in slot:
                cp = len(g.ranks)
                for s in g.sequences:
                    seen[s] += 1
                for i, dst in enumerate(g.ranks):
                    for s in g.sequences:
                        if owner[s] == me:
                            send[dst].append(_slice_rows(pending.samples[local[s]], s, cp, i))
                        if dst == me:
                            recv_rows[owner[s]] += padded_length(lengths[s], cp) // cp
        if any(c != 1 for c in seen):
            bad = [s for s, c in enumerate(seen) if c != 1][:10]
            raise ValueError(f"dynacp: plan does not schedule every sequence exactly once (e.g. ids {bad})")
        width = len(FIELDS) + 1
        bufs = {r: torch.empty(width, recv_rows[r], dtype=torch.int64) for r in range(size)}
        reqs = []
        for d in range(size):
            if d == me or not send[d]:
                continue
            reqs.append(dist.isend(torch.cat(send[d], dim=1).contiguous(), group=self.groups.dp_cp, group_dst=d))
        for r in range(size):
            if r != me and recv_rows[r]:
                reqs.append(dist.irecv(bufs[r], group=self.groups.dp_cp, group_src=r))
        if send[me]:
            bufs[me] = torch.cat(send[me], dim=1)
        for req in reqs:
            req.wait(self._timeout())
        # consume the receive buffers in the same deterministic order
        offset = [0] * size
        micro: list[dict] = []
        for k, slot in enumerate(plan.microbatches):
            for g in slot:
                if me not in g.ranks or not g.sequences:
                    continue
                cp, i = len(g.ranks), list(g.ranks).index(me)
                pieces = []
                for s in g.sequences:
                    n = padded_length(lengths[s], cp) // cp
                    r = owner[s]
                    pieces.append(bufs[r][:, offset[r]:offset[r] + n])
                    offset[r] += n
                block = torch.cat(pieces, dim=1)
                seq_lens = [lengths[s] for s in g.sequences]
                padded = [padded_length(n, cp) for n in seq_lens]
                mb = {name: _from_i64(block[f].clone(), pending.dtypes[name]) for f, name in enumerate(FIELDS)}
                mb.update(self._meta(k, tuple(g.ranks), i, list(g.sequences), seq_lens, padded))
                mb["sequence_ids"] = block[len(FIELDS)].clone()
                micro.append(mb)
        return micro

    @staticmethod
    def _meta(slot: int, ring: tuple[int, ...], cp_rank: int, seqs: list[int], seq_lens: list[int],
              padded: list[int]) -> dict:
        return {"slot": slot, "ring": ring, "cp_rank": cp_rank, "sequences": seqs,
                "cu_seqlens": cumulative(seq_lens), "cu_seqlens_padded": cumulative(padded),
                "max_seqlen": max(padded, default=0), "num_local_tokens": sum(padded) // len(ring)}

    # -- metadata sharing (PP stages, TP peers) ----------------------------------------------------------------------

    def _share_metadata(self, batch: Optional[GlobalBatch]) -> Optional[GlobalBatch]:
        g = self.groups
        if g.pp is not None and g.tp_rank == 0:
            batch = self._pp_exchange(batch)
        if g.tp is not None:
            batch = self._tp_exchange(batch)
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
                "plan_wait_s": batch.plan_wait_s, "plan_solve_s": batch.plan_solve_s}

    @staticmethod
    def _from_summary(s: Optional[dict]) -> Optional[GlobalBatch]:
        if s is None:
            return None
        micro = [dict(m, tokens=None, labels=None, loss_mask=None, position_ids=None, sequence_ids=None)
                 for m in s["microbatches"]]
        return GlobalBatch(microbatches=micro, seqlen_sum=s["seqlen_sum"], seqlen_squared_sum=s["seqlen_squared_sum"],
                           num_valid_tokens=s["num_valid_tokens"], digest=s["digest"],
                           rings=[tuple(r) for r in s["rings"]], plan_wait_s=s["plan_wait_s"],
                           plan_solve_s=s["plan_solve_s"])

    def _pp_exchange(self, batch: Optional[GlobalBatch]) -> Optional[GlobalBatch]:
        """Stage 0 (TP rank 0) ships the packing metadata of its microbatches over the PP group: per-microbatch
        metadata through the runtime codec (``dynacp.torch.broadcast_packing``, int64, checksummed), the batch-level
        scalars and the plan's rings in one int64 side tensor. Stages with their own data check the digest."""
        g = self.groups
        src = g.pp_rank == 0
        side = _encode_side(batch) if src else None
        side = _broadcast_int64(side, g.pp_src, g.pp, self.planner.timeout)
        if side[0] == 0:  # stage 0 ran out of data
            return None
        codec = _codec()
        mbs = batch.microbatches if src else None
        if codec is not None:
            meta = [{"cu_seqlens": np.asarray(m["cu_seqlens"], dtype=np.int64),
                     "cu_seqlens_padded": np.asarray(m["cu_seqlens_padded"], dtype=np.int64),
                     "max_seqlen": int(m["max_seqlen"]), "cp_size": len(m["ring"]),
                     "group_ranks": np.asarray(m["ring"], dtype=np.int64)} for m in mbs] if src else None
            received = codec(meta, src=g.pp_src, group=g.pp, timeout=self.planner.timeout)
        else:  # runtime codec not built: same content through a pickled broadcast
            obj = [[{k: m[k] for k in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")} | {
                "cp_size": len(m["ring"]), "group_ranks": list(m["ring"])} for m in mbs] if src else None]
            dist.broadcast_object_list(obj, src=g.pp_src, group=g.pp)
            received = obj[0]
        if src:
            return batch
        decoded = _decode_side(side, received)
        if batch is None:
            return decoded
        if decoded.digest != batch.digest:
            raise PlanMismatchError(f"dynacp: pipeline stage {g.pp_rank} planned digest {batch.digest:#018x}, stage 0 "
                                    f"{decoded.digest:#018x}")
        return batch

    def _tp_exchange(self, batch: Optional[GlobalBatch]) -> Optional[GlobalBatch]:
        """TP rank 0 broadcasts metadata, then one stacked int64 tensor per microbatch, to its TP peers."""
        g = self.groups
        src = g.tp_rank == 0
        has_data = src and batch is not None and batch.microbatches and batch.microbatches[0]["tokens"] is not None
        dtypes = {k: batch.microbatches[0][k].dtype for k in FIELDS} if has_data else None
        obj = [(self._summary(batch), dtypes) if src else None]
        dist.broadcast_object_list(obj, src=g.tp_src, group=g.tp)
        if src:
            for mb in batch.microbatches if has_data else []:
                block = torch.stack([_to_i64(mb[k]) for k in FIELDS] + [mb["sequence_ids"]])
                dist.broadcast(block, src=g.tp_src, group=g.tp)
            return batch
        summary, dtypes = obj[0]
        out = self._from_summary(summary)
        if out is not None and dtypes is not None:
            for mb in out.microbatches:
                block = torch.empty(len(FIELDS) + 1, mb["num_local_tokens"], dtype=torch.int64)
                dist.broadcast(block, src=g.tp_src, group=g.tp)
                mb.update({k: _from_i64(block[f].clone(), dtypes[k]) for f, k in enumerate(FIELDS)})
                mb["sequence_ids"] = block[len(FIELDS)].clone()
        return out


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
    """[has_batch, digest, seqlen_sum, seqlen_sq_sum, num_valid, n_mb, slots..., n_rings, (len, ranks...)...]."""
    if batch is None:
        return torch.zeros(1, dtype=torch.int64)
    vals = [1, _signed64(batch.digest), batch.seqlen_sum, batch.seqlen_squared_sum, batch.num_valid_tokens,
            len(batch.microbatches)] + [mb["slot"] for mb in batch.microbatches] + [len(batch.rings)]
    for ring in batch.rings:
        vals += [len(ring), *ring]
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
                       digest=v[1] % (1 << 64), rings=rings)


def _broadcast_int64(t: Optional[torch.Tensor], src: int, group: dist.ProcessGroup, timeout: float) -> torch.Tensor:
    """Broadcast a 1-D int64 tensor of unknown length (length first, then data), each step under ``timeout``."""
    n = torch.tensor([0 if t is None else t.numel()], dtype=torch.int64)
    for buf in (n,):
        dist.broadcast(buf, src=src, group=group, async_op=True).wait(datetime.timedelta(seconds=timeout))
    out = t if t is not None else torch.empty(int(n), dtype=torch.int64)
    dist.broadcast(out, src=src, group=group, async_op=True).wait(datetime.timedelta(seconds=timeout))
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
