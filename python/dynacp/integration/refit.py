"""The wrapper's online refit (``Planner.refit_every``; the fitting itself is :mod:`dynacp.calibrate.online`).

The training loop records how long each microbatch took (:meth:`OnlineRefit.record`, or the ``measure`` context
manager); before every ``refit_every``-th global batch is planned, :meth:`OnlineRefit.maybe_refit` gathers the
records over the pool, refits the cost model on pool rank 0 and broadcasts it with the digest of the last plan, so
that every rank plans the next batch with the same model. :meth:`OnlineRefit.log_step` logs predicted vs measured
time per global batch.

Feeds the planning stage (:mod:`dynacp.integration.planning`) its cost model; the iterator
(:mod:`dynacp.integration.wrapper`) calls it before gathering each batch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import dynacp
from dynacp.integration.config import Planner, ProcessGroups
from dynacp.integration.status import PlanMismatchError, Timed, failure_cause

logger = logging.getLogger("dynacp.integration")


@dataclass
class OnlineState:
    """The online refit's state on one rank."""

    pending: list = field(default_factory=list)
    """Records not yet sent to pool rank 0."""
    mine: list = field(default_factory=list)
    """This rank's records of the latest batches (for the step log)."""
    history: list = field(default_factory=list)
    """Pool rank 0: every rank's records, most recent last."""
    refits: list = field(default_factory=list)
    """Every refit so far (:class:`dynacp.calibrate.online.RefitResult`)."""
    step_log: list = field(default_factory=list)
    """``(batch, predicted s, measured s)`` per global batch this rank recorded."""
    cost_of: dict = field(default_factory=dict)
    """Global batch -> the cost model it was planned with."""
    last_digest: int = 0
    """Digest of the latest plan (pool rank 0 broadcasts its own with the refit; every rank checks it)."""


class Measure:
    """Context manager of :meth:`~dynacp.integration.wrapper.DynamicCPDataIterator.measure`: times the block and
    records it through ``wrapper.record``."""

    def __init__(self, wrapper: Any, microbatch: dict, cuda: bool):
        from dynacp.calibrate.online import Timer

        self.wrapper, self.microbatch, self.timer = wrapper, microbatch, Timer(cuda)

    def __enter__(self) -> Measure:
        self.timer.start()
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.timer.stop()
        if exc_type is None:
            self.wrapper.record(self.microbatch, self.timer.seconds())


class OnlineRefit:
    """The online refit of one wrapper: records, refits before batches, the step log.

    Args:
        planner: the wrapper's planner (its ``cost`` is replaced by every refit).
        groups: the process groups.
        pool: the timed collectives over the DP x CP pool.
    """

    def __init__(self, planner: Planner, groups: ProcessGroups, pool: Timed):
        self.planner, self.groups, self.pool = planner, groups, pool
        self.state = OnlineState()

    def record(self, microbatch: dict, seconds: float, batch: int) -> None:
        """Keep that this rank trained ``microbatch`` of global batch ``batch`` in ``seconds`` (nothing is kept when
        the refit is off)."""
        from dynacp.calibrate.online import GroupRecord

        if not (seconds > 0) or seconds != seconds or seconds == float("inf"):
            raise ValueError(f"record: seconds must be a positive finite number, got {seconds!r}")
        if self.planner.refit_every <= 0:
            return  # online refit off: nothing is kept
        cu = [int(x) for x in microbatch["cu_seqlens"]]
        rec = GroupRecord(int(batch), int(microbatch["slot"]), tuple(int(r) for r in microbatch["ring"]),
                          tuple(b - a for a, b in zip(cu[:-1], cu[1:])), float(seconds))
        self.state.pending.append(rec)
        self.state.mine.append(rec)

    def planned(self, batch: int, digest: int) -> None:
        """Note that global ``batch`` was planned (digest ``digest``) with the planner's current cost model."""
        self.state.last_digest = digest
        if self.planner.refit_every > 0:
            self.state.cost_of[batch] = self.planner.cost

    def log_step(self, batch: int, reads_data: bool) -> None:
        """Log this rank's predicted vs measured time of global ``batch`` (the latest; pool rank 0 at INFO)."""
        from dynacp.calibrate.online import predicted_seconds

        st = self.state
        recs = [r for r in st.mine if r.batch == batch]
        if not recs or not reads_data:
            return
        cost = st.cost_of.get(batch) or self.planner.cost or dynacp.CostModel()
        pred = float(predicted_seconds(cost, self.planner.resolved_cluster(self.groups.pool_size), recs).sum())
        meas = float(sum(r.seconds for r in recs))
        st.step_log.append((batch, pred, meas))
        st.mine = [r for r in st.mine if r.batch >= batch]
        st.cost_of = {b: c for b, c in st.cost_of.items() if b >= batch}
        if self.groups.pool_index == 0:
            logger.info("dynacp: global batch %d: predicted %.3f ms, measured %.3f ms over this rank's %d microbatches "
                        "(relative error %+.1f%%)", batch, 1e3 * pred, 1e3 * meas, len(recs),
                        100 * (pred - meas) / meas)

    def _refit_on_rank0(self, gathered: list, k: int) -> tuple:
        """Pool rank 0: refit on the gathered records; ``(model fields, last digest, result)`` or
        ``("error", cause, None)``."""
        from dynacp.calibrate.online import RefitOptions, refit

        st, g = self.state, self.groups
        try:
            st.history.extend(r for recs in gathered for r in recs)
            opts = self.planner.refit_options or RefitOptions()
            st.history = st.history[-4 * opts.window * g.pool_size:]
            cluster = self.planner.resolved_cluster(g.pool_size)
            new, result = refit(self.planner.cost or dynacp.CostModel(), cluster, st.history, opts, k)
            result.digest = st.last_digest
            return dict(new.to_dict()), st.last_digest, result
        except Exception as exc:  # every rank raises it, not only pool rank 0
            return "error", failure_cause(exc), None

    def maybe_refit(self, k: int) -> None:
        """Before submitting global batch k: when k is a multiple of ``Planner.refit_every``, gather the records,
        refit on pool rank 0 and broadcast the model with its last plan digest (collective over the pool)."""
        every, st, g = self.planner.refit_every, self.state, self.groups
        if every <= 0 or k == 0 or k % every:
            return
        gathered = self.pool.gather_objects(st.pending, g.dp_cp, f"the online-refit gather before global batch {k}")
        st.pending = []
        payload = self._refit_on_rank0(gathered, k) if g.pool_index == 0 else None
        fields, digest, result = self.pool.broadcast_object(payload, g.pool_ranks[0], g.dp_cp,
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
