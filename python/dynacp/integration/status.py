"""Failing together: the errors every rank raises, and collectives whose every wait has a timeout.

A rank that cannot take part in a global batch (its data iterator raised, a sample is malformed, its planner failed)
does not raise on its own: it reports an error status in the wrapper's next all-gather over the DP x CP pool, and
then *every* rank, the failing one included, raises the same :class:`RankFailedError` built from the gathered
statuses, so the message is identical everywhere and names the rank(s) and the cause. A rank that dies or stops
answering makes the others raise :class:`CommunicationError` once the collective they are waiting in fails: at once
when the peer's connection closes (a killed process), after the timeout otherwise.

Every helper here posts its collective with ``async_op=True`` and waits with an explicit timeout (gloo applies it
to collectives, to ``isend``/``irecv`` waits and, through ``new_group(timeout=...)``, to group creation).
"""

from __future__ import annotations

import datetime
import pickle
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Failure:
    """One rank's failure, as every rank learns it from the status exchange."""

    pool_rank: int
    """The failing rank's index in the DP x CP pool."""
    global_rank: int
    """Its rank in the default (world) group."""
    phase: str
    """What it was doing: ``"data iterator"``, ``"bad input"``, ``"planning"`` or ``"slicing samples"``."""
    cause: str
    """``"<ExceptionType>: <message>"`` of the local exception."""

    def describe(self) -> str:
        return f"pool rank {self.pool_rank} (global rank {self.global_rank}), {self.phase}: {self.cause}"


class RankFailedError(RuntimeError):
    """One or more ranks of the DP x CP pool could not take part in a global batch (an exception from its data
    iterator, a malformed sample, a planning error). Every rank of the pool, its TP peers and the pipeline stages
    that receive its metadata raise this error with the same message."""

    def __init__(self, message: str, batch: int = -1, failures: Sequence[Failure] = ()):
        super().__init__(message)
        self.batch = batch
        """Index of the global batch that failed (0-based, counted by this wrapper)."""
        self.failures = list(failures)
        """The failing ranks, by pool rank."""

    @classmethod
    def from_failures(cls, batch: int, failures: Sequence[Failure], pool_size: int) -> RankFailedError:
        failures = sorted(failures, key=lambda f: f.pool_rank)
        lines = "\n".join("  " + f.describe() for f in failures)
        return cls(f"dynacp: global batch {batch} failed on {len(failures)} of {pool_size} ranks of the DP x CP pool "
                   f"(every rank raises this error):\n{lines}", batch, failures)


class PlanMismatchError(RuntimeError):
    """Ranks of the DP x CP pool hold different plans or different planner configurations."""


class CommunicationError(RuntimeError):
    """A collective of the wrapper failed or timed out: a rank of the group died, stopped answering, or did not
    call the same collective (e.g. it stopped calling the wrapper)."""


def failure_cause(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` (first 500 characters), the cause a :class:`Failure` reports."""
    text = str(exc)
    if len(text) > 500:
        text = text[:500] + "..."
    return f"{type(exc).__name__}: {text}"


class Timed:
    """Runs the wrapper's collectives under one timeout and turns their errors into :class:`CommunicationError`.

    Args:
        timeout_s: seconds any single wait may take.
        where: the group's name in messages (e.g. ``"the DP x CP pool"``).
    """

    def __init__(self, timeout_s: float, where: str):
        self.timeout_s = float(timeout_s)
        self.where = where

    def wait(self, work: Any, what: str, started: Optional[float] = None) -> None:
        """Wait for ``work`` (an async collective or p2p request) at most ``timeout_s`` seconds."""
        started = time.monotonic() if started is None else started
        try:
            done = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            raise self.error(what, started, exc) from exc
        if done is False:  # a backend that reports a timeout instead of raising
            raise self.error(what, started, TimeoutError(f"not complete after {self.timeout_s:g} s"))

    def error(self, what: str, started: float, exc: BaseException) -> CommunicationError:
        waited = time.monotonic() - started
        return CommunicationError(
            f"dynacp: {what} over {self.where} failed after {waited:.1f} s (timeout {self.timeout_s:g} s): a rank "
            f"of the group died, stopped answering, or did not make the same call; check the other ranks' logs. "
            f"Cause: {failure_cause(exc)}")

    def post(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, async_op=True, **kwargs)`` (a torch.distributed collective or p2p call) and wait on it."""
        t0 = time.monotonic()
        try:
            work = fn(*args, async_op=True, **kwargs)
        except RuntimeError as exc:
            raise self.error(what, t0, exc) from exc
        self.wait(work, what, t0)

    def gather_objects(self, obj: Any, group: dist.ProcessGroup, what: str) -> list:
        """All-gather a picklable object over ``group`` (sizes, then padded bytes; two timed all-gathers)."""
        data = pickle.dumps(obj)
        n = dist.get_world_size(group)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
        self.post(what, dist.all_gather, sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
        width = max(int(s) for s in sizes)
        mine = torch.zeros(width, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs = [torch.empty(width, dtype=torch.uint8) for _ in range(n)]
        self.post(what, dist.all_gather, outs, mine, group=group)
        return [pickle.loads(o[:int(s)].numpy().tobytes()) for o, s in zip(outs, sizes)]

    def broadcast_object(self, obj: Any, src: int, group: dist.ProcessGroup, what: str) -> Any:
        """Broadcast a picklable object from global rank ``src`` (its size, then its bytes; two timed broadcasts)."""
        is_src = dist.get_rank() == src
        data = pickle.dumps(obj) if is_src else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self.post(what, dist.broadcast, size, src=src, group=group)
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if is_src else torch.empty(int(size),
                                                                                            dtype=torch.uint8)
        self.post(what, dist.broadcast, buf, src=src, group=group)
        return obj if is_src else pickle.loads(buf.numpy().tobytes())


# -- passing a failure on to ranks that do not read data (TP peers, pipeline stages) ----------------------------------

_KINDS = ("RankFailedError", "PlanMismatchError", "CommunicationError")


def encode_failure(exc: BaseException) -> tuple:
    """A picklable form of an error a data-reading rank passes on to its TP peers and the other pipeline stages:
    ``(kind, message, batch, failures)``."""
    kind = type(exc).__name__
    if kind in _KINDS:
        return kind, str(exc), getattr(exc, "batch", -1), list(getattr(exc, "failures", []))
    return ("RankFailedError", f"dynacp: the data-reading rank {dist.get_rank()} failed: {failure_cause(exc)}", -1,
            [])


def decode_failure(kind: str, message: str, batch: int = -1, failures: Sequence[Failure] = ()) -> RuntimeError:
    """The error a receiving rank raises for ``encode_failure``'s output (same type, message and failures)."""
    if kind == "PlanMismatchError":
        return PlanMismatchError(message)
    if kind == "CommunicationError":
        return CommunicationError(message)
    return RankFailedError(message, batch, failures)
