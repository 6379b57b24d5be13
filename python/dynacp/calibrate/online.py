"""Online refit of the cost model during training (``Planner(refit_every=N)``; docs/calibration.md).

Every rank records each microbatch it trains with its measured forward + backward time
(:meth:`~dynacp.integration.wrapper.DynamicCPDataIterator.measure` times it with CUDA events on GPU, perf_counter on
CPU; or pass seconds to ``record``). Every ``refit_every`` global batches, when the next plan is submitted, the pool
all-gathers the records, pool rank 0 refits the compute terms (a, b, c) of the cost model on the recorded group
times (an extended-form model keeps its extended terms and ``comm_overlap`` as they are: a, b, c are fitted beside
them; docs/cost_model.md) (the slowest member of each ring counts) and broadcasts the new coefficients together with its last plan
digest; every rank checks the digest and plans from then on with the received model, bit for bit the same.

The refit is robust and bounded, and deterministic given the same records:

* only the latest ``window`` groups are used (sorted by global batch, slot and ring);
* after a first fit, groups whose relative residual lies more than ``outlier_mads`` scaled median absolute
  deviations from the median residual are dropped and the fit repeated (a slow step, a page fault, a straggler);
* each coefficient moves at most by the factor ``1 + max_change`` per refit (a coefficient at 0 may become
  anything the fit gives);
* with fewer than ``min_samples`` groups (or fewer than 3 distinct group shapes) nothing changes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from dynacp.calibrate.fit import DOC_FIELDS, _fit_abc, _Groups, extended_columns
from dynacp.calibrate.links import extra_nodes, hop_arrays
from dynacp.calibrate.lsq import relative_errors

logger = logging.getLogger("dynacp")

COEFS = ("attn_coef", "linear_coef", "group_overhead")
"""The coefficients the online refit changes (the exchange and memory terms stay as configured)."""


@dataclass
class RefitOptions:
    """How the online refit behaves (``Planner.refit_options``)."""

    window: int = 512
    """Most recent groups used by a refit."""
    min_samples: int = 8
    """Fewest groups a refit needs; with fewer the model is kept."""
    outlier_mads: float = 3.0
    """Groups whose residual lies further than this many scaled MADs from the median residual are rejected."""
    max_change: float = 1.0
    """Each coefficient changes at most by the factor (1 + max_change) per refit (1.0: halved or doubled)."""

    def __post_init__(self) -> None:
        if self.window < 3 or self.min_samples < 3:
            raise ValueError(f"RefitOptions.window and min_samples must be >= 3, got {self.window}, "
                             f"{self.min_samples}")
        if not self.max_change > 0 or not self.outlier_mads > 0:
            raise ValueError(f"RefitOptions.max_change and outlier_mads must be > 0, got {self.max_change}, "
                             f"{self.outlier_mads}")


@dataclass(frozen=True)
class GroupRecord:
    """One microbatch a rank trained: its ring, its sequences' lengths and the measured seconds (forward +
    backward)."""

    batch: int
    slot: int
    ring: tuple[int, ...]
    lengths: tuple[int, ...]
    seconds: float


@dataclass
class RefitResult:
    """What one refit did (``DynamicCPDataIterator.refits``)."""

    batch: int
    """The global batch whose plan was the first made with the new model."""
    coefficients: dict[str, float]
    samples: int
    rejected: int
    error_before: float
    """Median relative error of the old model on the groups used."""
    error_after: float
    """Median relative error of the new (bounded) model on them."""
    digest: int
    """Pool rank 0's last plan digest, broadcast with the coefficients."""
    changed: bool = True
    notes: list[str] = field(default_factory=list)


def merge_records(records: Sequence[GroupRecord]) -> list[GroupRecord]:
    """One record per (batch, slot, ring): the slowest member's time (a ring runs as fast as its slowest rank),
    sorted."""
    best: dict[tuple, GroupRecord] = {}
    for r in records:
        key = (r.batch, r.slot, r.ring)
        if key not in best or r.seconds > best[key].seconds:
            best[key] = r
    return [best[k] for k in sorted(best)]


def _groups(records: Sequence[GroupRecord], cost: Any, cluster: Any) -> tuple[_Groups, np.ndarray]:
    rows = [{"lengths": list(r.lengths), "degree": len(r.ring), "mask": "causal",
             "crosses_nodes": _crosses(r.ring, cluster.ranks_per_node), "seconds": r.seconds} for r in records]
    g = _Groups.of(rows, cost)
    if cost.extended:  # the extended terms stay as they are; a, b, c are refitted beside them
        g.overlap = float(cost.comm_overlap)
        g.extra = extended_columns([r["lengths"] for r in rows], g.d, np.full(g.d.size, float(cost.causal_factor))) @ \
            np.array([getattr(cost, k) for k in DOC_FIELDS])
    lat, bw = hop_arrays(cost, cluster, g.d, g.cross)
    comm = g.comm(cost.kv_bytes_per_token, lat, bw)
    if cost.node_overhead:  # c_node is part of the exchange and stays as it is, like the other extended terms
        comm = comm + cost.node_overhead * extra_nodes(cluster, g.d, g.cross)
    return g, comm


def _crosses(ring: Sequence[int], ranks_per_node: int) -> bool:
    return len({r // ranks_per_node for r in ring}) > 1


def _predict(g: _Groups, comm: np.ndarray, abc: np.ndarray) -> np.ndarray:
    return g.predict(np.asarray(abc, dtype=np.float64), comm)


def refit(cost: Any, cluster: Any, records: Sequence[GroupRecord], options: RefitOptions,
          batch: int = -1) -> tuple[Any, RefitResult]:
    """A new CostModel from ``cost`` and the recorded groups (robust, bounded; see the module docstring)."""
    from dynacp import _core

    recs = merge_records(records)[-options.window:]
    old = np.array([getattr(cost, k) for k in COEFS])
    keep = RefitResult(batch, dict(zip(COEFS, old.tolist())), len(recs), 0, float("nan"), float("nan"), 0, False)
    if len(recs) < options.min_samples or len({(len(r.ring), sum(r.lengths)) for r in recs}) < 3:
        keep.notes.append(f"{len(recs)} groups recorded, too few shapes to refit (min_samples "
                          f"{options.min_samples}, 3 distinct shapes)")
        return cost, keep
    g, comm = _groups(recs, cost, cluster)
    abc = _fit_abc(g, comm)[0]
    res = relative_errors(_predict(g, comm, abc), g.t)
    med = np.median(res)
    mad = 1.4826 * np.median(np.abs(res - med))
    inlier = np.abs(res - med) <= options.outlier_mads * max(mad, 1e-3)
    if inlier.sum() >= options.min_samples and not inlier.all():
        sub = _Groups(g.S2[inlier], g.S[inlier], g.d[inlier], g.cross[inlier], g.t[inlier], g.longest[inlier],
                      overlap=g.overlap, extra=None if g.extra is None else g.extra[inlier])
        abc = _fit_abc(sub, comm[inlier])[0]
    hi = 1.0 + options.max_change
    bounded = np.where(old > 0, np.clip(abc, old / hi, old * hi), abc)
    new = _core.CostModel(**dict(cost.to_dict()))
    for k, v in zip(COEFS, bounded):
        setattr(new, k, float(v))
    before = float(np.median(np.abs(relative_errors(_predict(g, comm, old), g.t))))
    after = float(np.median(np.abs(relative_errors(_predict(g, comm, bounded), g.t))))
    return new, RefitResult(batch, dict(zip(COEFS, bounded.tolist())), len(recs), int((~inlier).sum()), before,
                            after, 0, True)


def predicted_seconds(cost: Any, cluster: Any, records: Sequence[GroupRecord]) -> np.ndarray:
    """The model's time of each recorded group (compact placement decides nothing: the ring's own ranks do)."""
    if not records:
        return np.zeros(0)
    g, comm = _groups(records, cost, cluster)
    return _predict(g, comm, np.array([getattr(cost, k) for k in COEFS]))


class Timer:
    """Measures one microbatch: CUDA events on the current stream when ``cuda`` (no host sync until ``seconds``),
    else ``time.perf_counter``."""

    def __init__(self, cuda: bool):
        import time

        self.cuda = cuda
        self._perf = time.perf_counter
        self._t0 = self._t1 = 0.0
        self._events: Optional[tuple[Any, Any]] = None

    def start(self) -> None:
        if self.cuda:
            import torch

            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        else:
            self._t0 = self._perf()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        else:
            self._t1 = self._perf()

    def seconds(self) -> float:
        if self._events is not None:
            self._events[1].synchronize()
            return float(self._events[0].elapsed_time(self._events[1])) * 1e-3
        return self._t1 - self._t0
