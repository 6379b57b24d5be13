"""Stage 2 of the wrapper: plan the gathered lengths, and check that every rank of the pool holds the same plan.

Every rank of the pool runs the same deterministic solver on the same lengths (:func:`submit`; in a background
thread one global batch ahead when ``Planner.async_planning``). :func:`wait_for_plan` waits for it under
``Planner.timeout``; then :func:`check_plans` all-gathers a second status, ``(config fingerprint, plan digest)``:
a planning (or slicing) error on any rank fails every rank together, differing digests raise
:class:`~dynacp.integration.status.PlanMismatchError` on every rank.

Receives a :class:`~dynacp.integration.gather.Gathered` batch from the gather stage; hands its plan to the
re-route stage (:mod:`dynacp.integration.reroute`).
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

import dynacp
from dynacp.integration.config import Planner, ProcessGroups
from dynacp.integration.gather import Gathered, LocalFailure
from dynacp.integration.status import Failure, PlanMismatchError, RankFailedError, Timed, failure_cause


@dataclass
class TimedPlan:
    """A plan and the seconds the solver took for it (wall time in its thread)."""

    plan: dynacp.Plan
    seconds: float


def solve(planner: Planner, lengths: np.ndarray, pool_size: int) -> TimedPlan:
    """Run the solver (in the planning thread)."""
    t0 = time.perf_counter()
    plan = planner.plan(lengths, pool_size)
    return TimedPlan(plan, time.perf_counter() - t0)


def submit(executor: concurrent.futures.Executor, planner: Planner, pool_size: int, pending: Gathered) -> None:
    """Start planning ``pending`` on ``executor`` (sets ``pending.future``; none when no rank has a sequence).
    Without async planning, wait for it here (errors, and a solver slower than the timeout, are reported in the
    plan status exchange)."""
    flat = np.asarray(pending.flat_lengths, dtype=np.int64)
    pending.future = executor.submit(solve, planner, flat, pool_size) if flat.size else None
    if pending.future is not None and not planner.async_planning:
        concurrent.futures.wait([pending.future], timeout=planner.timeout)


def wait_for_plan(pending: Gathered, planner: Planner) -> tuple[Optional[TimedPlan], float, Optional[LocalFailure]]:
    """``(timed plan, seconds this call counts as waiting, failure)``: wait for the solver under the timeout. With
    async planning the wait is the time blocked here; without it, the solver's whole run."""
    t0 = time.perf_counter()
    try:
        timed = pending.future.result(timeout=planner.timeout)
    except concurrent.futures.TimeoutError as exc:
        cause = f"TimeoutError: the solver did not finish within Planner.timeout = {planner.timeout:g} s"
        return None, time.perf_counter() - t0, LocalFailure("planning", cause, exc)
    except Exception as exc:
        return None, time.perf_counter() - t0, LocalFailure("planning", failure_cause(exc), exc)
    return timed, (time.perf_counter() - t0 if planner.async_planning else timed.seconds), None


def check_plans(plan: Optional[dynacp.Plan], local: Optional[LocalFailure], batch: int, planner: Planner,
                pool: Timed, groups: ProcessGroups) -> None:
    """All-gather each rank's planning status and (fingerprint, digest) over the pool (collective): a failure
    anywhere raises :class:`RankFailedError`, differing plans :class:`PlanMismatchError`, on every rank alike."""
    if local is not None:
        mine: tuple = ("error", local.phase, local.cause)
    else:
        mine = ("ok", planner.fingerprint(), int(plan.digest()), planner.describe())
    everyone = pool.gather_objects(mine, groups.dp_cp, f"the plan check of global batch {batch}")
    ranks = groups.pool_ranks
    failures = [Failure(r, ranks[r], e[1], e[2]) for r, e in enumerate(everyone) if e[0] == "error"]
    if failures:
        err = RankFailedError.from_failures(batch, failures, groups.pool_size)
        raise err from (None if local is None else local.exc)
    if not planner.check_plan:
        return
    bad = [i for i, e in enumerate(everyone) if e[1:3] != everyone[0][1:3]]
    if bad:
        lines = [f"  pool rank {i}: config {e[1]} digest {e[2]:#018x} planner {e[3]}"
                 for i, e in enumerate(everyone) if i in bad or i == 0]
        raise PlanMismatchError(
            "dynacp: ranks of the DP x CP pool hold different plans (every rank must use an equal Planner and "
            "see the same lengths); differing from pool rank 0:\n" + "\n".join(lines))
