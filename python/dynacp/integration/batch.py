"""What the wrapper yields per global batch: :class:`GlobalBatch`, assembled from what the stages produced.

:func:`assemble` puts together, on a data-reading rank, the gathered lengths (:mod:`dynacp.integration.gather`),
the plan and its timing (:mod:`dynacp.integration.planning`) and this rank's re-routed microbatches with their
traffic (:mod:`dynacp.integration.reroute`). Ranks that read no data receive the same batch's metadata instead
(:mod:`dynacp.integration.metadata`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import dynacp
from dynacp.integration.config import ProcessGroups
from dynacp.integration.gather import Gathered
from dynacp.integration.planning import TimedPlan
from dynacp.integration.reroute import RerouteStats

logger = logging.getLogger("dynacp.integration")


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


def assemble(pending: Gathered, timed: Optional[TimedPlan], micro: list[dict], stats: RerouteStats, wait: float,
             groups: ProcessGroups) -> GlobalBatch:
    """The :class:`GlobalBatch` of a data-reading rank (``timed`` is None when every sample was empty); pool rank 0
    of stage 0 logs the empty samples skipped."""
    lens = pending.flat_lengths
    plan = None if timed is None else timed.plan
    skipped = int(sum(pending.skipped))
    if skipped and groups.pool_index == 0 and groups.pp_rank == 0:
        logger.warning("dynacp: global batch %d: skipped %d empty sample(s) (per pool rank: %s; "
                       "Planner.empty_samples = 'skip')", pending.batch, skipped, pending.skipped)
    return GlobalBatch(
        microbatches=micro, seqlen_sum=int(sum(lens)), seqlen_squared_sum=int(sum(n * n for n in lens)),
        num_valid_tokens=int(sum(pending.valid)), digest=0 if plan is None else int(plan.digest()),
        rings=[] if plan is None else [tuple(g.ranks) for slot in plan.microbatches for g in slot], plan=plan,
        plan_wait_s=wait, plan_solve_s=0.0 if timed is None else timed.seconds, skipped_empty=skipped,
        skipped_empty_per_rank=list(pending.skipped), reroute=stats)
