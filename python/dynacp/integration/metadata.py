"""Stage 4 of the wrapper: share a global batch's metadata (or its failure) with pipeline stages and TP peers.

Only TP rank 0 of a stage with a data iterator reads data and plans. Pipeline stages first all-gather their
status (any stage's error is raised by every stage), then stage 0 broadcasts the packing metadata over the PP group
(per-microbatch metadata through the runtime codec, batch-level scalars and rings in one int64 side tensor); TP
rank 0 broadcasts metadata and tensors to its TP peers, or the error, so that they raise it too.

Receives the :class:`~dynacp.integration.batch.GlobalBatch` of the re-route stage (or the failure any earlier stage
raised); hands the batch every rank trains on back to the iterator (:mod:`dynacp.integration.wrapper`), which
attaches the CP groups (:func:`~dynacp.integration.slicing.attach_groups`).
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from dynacp.integration.batch import GlobalBatch
from dynacp.integration.config import ProcessGroups
from dynacp.integration.gather import FIELDS
from dynacp.integration.slicing import META_KEYS, from_i64, to_i64
from dynacp.integration.status import PlanMismatchError, Timed, decode_failure, encode_failure

_NO_TENSORS = dict.fromkeys((*FIELDS, "sequence_ids"))


def share(batch: Optional[GlobalBatch], failure: Optional[BaseException], groups: ProcessGroups,
          timeout: float) -> Optional[GlobalBatch]:
    """Pass the batch's metadata (or the failure) on to later pipeline stages and TP peers; raises the failure
    after passing it on: the first failing pipeline stage's when there is a PP group, else this rank's own or
    the one its TP rank 0 sent."""
    g = groups
    if g.pp is not None and g.tp_rank == 0:
        try:
            batch, staged = _pp_exchange(batch, failure, g, timeout)
            failure = staged or failure  # the first failing stage's error, the same on every stage
        except Exception as exc:  # a digest mismatch or a lost stage: TP peers must hear of it too
            failure, batch = failure or exc, None
    if g.tp is not None:
        try:
            batch = _tp_exchange(batch, failure, g, timeout)
        except Exception:
            if failure is None:
                raise
            # a TP peer is lost too; the failure being passed on is the error to raise
    if failure is not None:
        raise failure
    return batch


def _summary(batch: Optional[GlobalBatch]) -> Optional[dict]:
    """The picklable metadata of ``batch`` (no tensors) that TP rank 0 sends its peers."""
    if batch is None:
        return None
    return {"microbatches": [{k: mb[k] for k in META_KEYS} for mb in batch.microbatches],
            "seqlen_sum": batch.seqlen_sum, "seqlen_squared_sum": batch.seqlen_squared_sum,
            "num_valid_tokens": batch.num_valid_tokens, "digest": batch.digest, "rings": batch.rings,
            "plan_wait_s": batch.plan_wait_s, "plan_solve_s": batch.plan_solve_s,
            "skipped_empty_per_rank": batch.skipped_empty_per_rank}


def _from_summary(s: Optional[dict]) -> Optional[GlobalBatch]:
    if s is None:
        return None
    micro = [dict(m, **_NO_TENSORS) for m in s["microbatches"]]
    skipped = list(s["skipped_empty_per_rank"])
    return GlobalBatch(microbatches=micro, seqlen_sum=s["seqlen_sum"], seqlen_squared_sum=s["seqlen_squared_sum"],
                       num_valid_tokens=s["num_valid_tokens"], digest=s["digest"],
                       rings=[tuple(r) for r in s["rings"]], plan_wait_s=s["plan_wait_s"],
                       plan_solve_s=s["plan_solve_s"], skipped_empty=sum(skipped), skipped_empty_per_rank=skipped)


def _pp_exchange(batch: Optional[GlobalBatch], failure: Optional[BaseException], g: ProcessGroups, timeout: float
                 ) -> tuple[Optional[GlobalBatch], Optional[RuntimeError]]:
    """Pipeline stages first all-gather their status (TP rank 0 of each stage): when any stage failed, every
    stage gets the first failing stage's error back (second element) and nothing else moves. Otherwise stage 0
    ships the packing metadata of its microbatches over the PP group: per-microbatch metadata through the runtime
    codec (``dynacp.torch.broadcast_packing``, int64, checksummed), the batch-level scalars and the plan's rings in
    one int64 side tensor. Stages with their own data check the digest."""
    src = g.pp_rank == 0
    timed = Timed(timeout, "the pipeline group")
    statuses = timed.gather_objects(None if failure is None else encode_failure(failure), g.pp,
                                    "the pipeline status all-gather")
    first = next((s for s in statuses if s is not None), None)
    if first is not None:
        return None, decode_failure(*first)
    side = _broadcast_int64(_encode_side(batch) if src else None, g.pp_src, g.pp, timed,
                            "the pipeline metadata broadcast")
    if side[0] == 0:  # stage 0 ran out of data
        return None, None
    received = _pp_microbatch_meta(batch.microbatches if src else None, g, timed)
    if src:
        return batch, None
    decoded = _decode_side(side, received)
    if batch is None:
        return decoded, None
    if decoded.digest != batch.digest:
        raise PlanMismatchError(f"dynacp: pipeline stage {g.pp_rank} planned digest {batch.digest:#018x}, stage 0 "
                                f"{decoded.digest:#018x}")
    return batch, None


def _pp_microbatch_meta(mbs: Optional[list[dict]], g: ProcessGroups, timed: Timed) -> list:
    """Stage 0's per-microbatch packing metadata (``mbs`` is given on stage 0 only), on every stage."""
    codec = _codec()
    if codec is not None:
        meta = [{"cu_seqlens": np.asarray(m["cu_seqlens"], dtype=np.int64),
                 "cu_seqlens_padded": np.asarray(m["cu_seqlens_padded"], dtype=np.int64),
                 "max_seqlen": int(m["max_seqlen"]), "cp_size": len(m["ring"]),
                 "group_ranks": np.asarray(m["ring"], dtype=np.int64)} for m in mbs] if mbs is not None else None
        started = time.monotonic()
        try:
            return codec(meta, src=g.pp_src, group=g.pp, timeout=timed.timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            raise timed.error("the pipeline packing-metadata broadcast", started, exc) from exc
    # runtime codec not built: same content through a pickled broadcast
    obj = [{k: m[k] for k in ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")} | {
        "cp_size": len(m["ring"]), "group_ranks": list(m["ring"])} for m in mbs] if mbs is not None else None
    return timed.broadcast_object(obj, g.pp_src, g.pp, "the pipeline packing-metadata broadcast")


def _tp_exchange(batch: Optional[GlobalBatch], failure: Optional[BaseException], g: ProcessGroups, timeout: float
                 ) -> Optional[GlobalBatch]:
    """TP rank 0 broadcasts metadata (or its failure), then one stacked int64 tensor per microbatch, to its TP
    peers."""
    src = g.tp_rank == 0
    timed = Timed(timeout, "the tensor-parallel group")
    has_data = (src and failure is None and batch is not None and batch.microbatches
                and batch.microbatches[0]["tokens"] is not None)
    dtypes = {k: batch.microbatches[0][k].dtype for k in FIELDS} if has_data else None
    msg = (("failure", encode_failure(failure)) if failure is not None else ("ok", (_summary(batch), dtypes))
           ) if src else None
    kind, payload = timed.broadcast_object(msg, g.tp_src, g.tp, "the tensor-parallel metadata broadcast")
    if kind == "failure":
        if src:
            return None
        raise decode_failure(*payload)
    what = "the tensor-parallel microbatch broadcast"
    if src:
        for mb in batch.microbatches if has_data else []:
            block = torch.stack([to_i64(mb[k]) for k in FIELDS] + [mb["sequence_ids"]])
            timed.post(what, dist.broadcast, block, src=g.tp_src, group=g.tp)
        return batch
    summary, dtypes = payload
    out = _from_summary(summary)
    if out is not None and dtypes is not None:
        for mb in out.microbatches:
            block = torch.empty(len(FIELDS) + 1, mb["num_local_tokens"], dtype=torch.int64)
            timed.post(what, dist.broadcast, block, src=g.tp_src, group=g.tp)
            mb.update({k: from_i64(block[f].clone(), dtypes[k]) for f, k in enumerate(FIELDS)})
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
    """The :class:`GlobalBatch` (metadata only) of :func:`_encode_side`'s tensor and the codec's microbatches."""
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
                      "num_local_tokens": cup[-1] // len(ring), **_NO_TENSORS})
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
