"""Stage 1 of the wrapper: read this rank's samples and all-gather every rank's status and lengths over the pool.

A data-reading rank pulls ``num_samples`` items from its data iterator, splits packed items into their sequences
(:func:`split_samples`), checks them and sets empty samples aside (``Planner.empty_samples``). It then all-gathers
its *status* over the DP x CP pool: its lengths (with Σ loss_mask, the field dtypes and the empty samples skipped),
``"done"`` when its iterator is exhausted, or the error it hit. Any error -- or ranks that disagree on running out
of data or on the field dtypes -- becomes one :class:`~dynacp.integration.status.RankFailedError` that every rank
raises alike.

Hands to the planning stage (:mod:`dynacp.integration.planning`): a :class:`Gathered` with this rank's samples and
every pool rank's lengths (global sequence ids are pool-rank-major), or the failure every rank raises.
"""

from __future__ import annotations

import collections
import concurrent.futures
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch

from dynacp.integration.config import ProcessGroups
from dynacp.integration.status import Failure, RankFailedError, Timed, failure_cause

#: Per-token fields every microbatch carries, in wire order (``sequence_ids`` is added by the wrapper).
FIELDS = ("tokens", "labels", "loss_mask", "position_ids")
_INTEGER_FIELDS = ("tokens", "labels", "position_ids")


@dataclass
class Gathered:
    """One global batch read and gathered (and, when ``failure`` is None, submitted for planning)."""

    batch: int
    """Index of this global batch (0-based, counted by the wrapper)."""
    samples: list[dict] = field(default_factory=list)
    """This rank's non-empty samples (per-sequence dicts of 1-D tensors), in read order."""
    lengths: list[list[int]] = field(default_factory=list)
    """Per pool rank: the lengths (tokens) of its samples."""
    valid: list[int] = field(default_factory=list)
    """Per pool rank: Σ loss_mask of its samples."""
    skipped: list[int] = field(default_factory=list)
    """Per pool rank: empty samples left out (count)."""
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    """The fields' dtypes (the same on every rank)."""
    future: Optional[concurrent.futures.Future] = None
    """The solver's future (:mod:`dynacp.integration.planning`); None when no rank has a sequence."""
    gather_s: float = 0.0
    """Seconds spent reading and gathering."""
    failure: Optional[BaseException] = None
    """The error every rank raises for this batch."""
    local_exc: Optional[BaseException] = None
    """This rank's own exception behind ``failure``, if any."""

    @property
    def num_sequences(self) -> int:
        return sum(len(ls) for ls in self.lengths)

    @property
    def flat_lengths(self) -> list[int]:
        """The length of every global sequence, by global id (pool-rank-major)."""
        return [n for ls in self.lengths for n in ls]


class LocalFailure(Exception):
    """This rank cannot take part in a global batch; reported in the next status exchange, raised by nobody."""

    def __init__(self, phase: str, cause: str, exc: Optional[BaseException] = None):
        super().__init__(cause)
        self.phase, self.cause, self.exc = phase, cause, exc


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


def common_dtypes(samples: list[dict]) -> Optional[dict[str, torch.dtype]]:
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


def read_items(data_iterator: Iterator, num_samples: int, empty_samples: str) -> Optional[tuple[list[dict], int]]:
    """This rank's samples of the next global batch and the number of empty ones left out; ``None`` when the
    iterator is exhausted. Raises :class:`LocalFailure` for anything this rank cannot train on."""
    samples: list[dict] = []
    skipped = 0
    for i in range(num_samples):
        try:
            item = next(data_iterator)
        except StopIteration:
            return None
        except Exception as exc:
            raise LocalFailure("data iterator", failure_cause(exc), exc) from exc
        try:
            parts = split_samples(item)
        except Exception as exc:
            raise LocalFailure("bad input", f"item {i} of the global batch: {failure_cause(exc)}", exc) from exc
        for j, s in enumerate(parts):
            if s["tokens"].numel() > 0:
                samples.append(s)
            elif empty_samples == "skip":
                skipped += 1
            else:
                raise LocalFailure("bad input", f"item {i}, sequence {j} of the global batch is empty (0 tokens) "
                                   "and Planner.empty_samples = 'error'")
    try:
        common_dtypes(samples)
    except ValueError as exc:
        raise LocalFailure("bad input", failure_cause(exc), exc) from exc
    return samples, skipped


def local_status(read: Callable[[], Optional[tuple[list[dict], int]]]
                 ) -> tuple[tuple, list[dict], Optional[BaseException]]:
    """``(status, samples, local exception)`` of calling ``read`` (:func:`read_items` or a hook around it); status is
    ``("ok", lengths, Σ loss_mask, dtypes, skipped)``, ``("done",)`` or ``("error", phase, cause)``."""
    try:
        got = read()
    except LocalFailure as f:
        return ("error", f.phase, f.cause), [], f.exc or f
    if got is None:
        return ("done",), [], None
    samples, skipped = got
    valid = int(sum(float(s["loss_mask"].sum()) for s in samples))
    return ("ok", [int(s["tokens"].numel()) for s in samples], valid, common_dtypes(samples), skipped), samples, None


def gathered_failures(gathered: list[tuple], pool_ranks: list[int]) -> list[Failure]:
    """Every rank's failure from the gathered statuses (the same list on every rank)."""
    out = [Failure(r, pool_ranks[r], s[1], s[2]) for r, s in enumerate(gathered) if s[0] == "error"]
    if out:
        return out
    done = [r for r, s in enumerate(gathered) if s[0] == "done"]
    if done and len(done) < len(gathered):
        return [Failure(r, pool_ranks[r], "data iterator", "StopIteration: ran out of data while other ranks did not")
                for r in done]
    typed = [(r, s[3]) for r, s in enumerate(gathered) if s[0] == "ok" and s[3] is not None]
    if typed:  # every rank must use the same field dtypes (floats travel as bit patterns)
        common = collections.Counter(tuple(d.items()) for _, d in typed).most_common(1)[0][0]
        ref = next(r for r, d in typed if tuple(d.items()) == common)
        out = [Failure(r, pool_ranks[r], "bad input", f"ValueError: field dtypes {_dtype_names(d)} differ from pool "
                       f"rank {ref}'s {_dtype_names(dict(common))}")
               for r, d in typed if tuple(d.items()) != common]
    return out


def exchange_status(status: tuple, samples: list[dict], batch: int, pool: Timed, groups: ProcessGroups
                    ) -> Optional[Gathered]:
    """All-gather ``status`` (from :func:`local_status`) over the pool (collective): the :class:`Gathered` batch,
    with ``failure`` set on every rank when any rank failed; ``None`` when every rank's data is exhausted."""
    gathered = pool.gather_objects(status, groups.dp_cp, f"the status and length all-gather of global batch {batch}")
    out = Gathered(batch=batch)
    failures = gathered_failures(gathered, groups.pool_ranks)
    if failures:
        out.failure = RankFailedError.from_failures(batch, failures, groups.pool_size)
        return out
    if all(s[0] == "done" for s in gathered):
        return None
    out.samples = samples
    out.lengths = [s[1] for s in gathered]
    out.valid = [s[2] for s in gathered]
    out.skipped = [s[4] for s in gathered]
    out.dtypes = next((s[3] for s in gathered if s[3] is not None), {k: torch.int64 for k in FIELDS})
    return out
