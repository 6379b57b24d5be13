"""A model form that can express real attention kernels -- PROTOTYPE, NOT READ BY THE C++ COST MODEL OR SOLVER.

Superseded by the C++ model's extended form (docs/cost_model.md, "Extended form"; ``fit(..., form="extended")``),
whose terms aggregate over a group; this per-document table stays as an experiment.

The C++ ``CostModel`` prices one document of s tokens on d ranks as ``eta*a*s^2/d + b*s/d + c``. On the real H100
attention measurements (distca ``compute-attn-H100.csv``) that form is off by up to 41 % (leave-one-out), because
short documents are latency-bound and ring attention on d ranks does not divide all of the work by d. This module
fits and cross-validates the proposed replacement (docs/calibration.md, "Proposed model form"):

    t(s, d) = p(s, d) * r(s, d)
    p(s, d) = a * s^2 / (2 d) + b1 * s + b2 * s / d + c_d            (c_d: one launch/sync floor per ring degree)
    r(s, d) = exp(log-ratio table of measured / p at the measured (s, d), read by monotone piecewise-linear
                  interpolation in (log s, log d); constant beyond the table, so p alone sets the growth outside)

Fitted by non-negative least squares on relative error (:func:`fit_parametric`), the table made monotone in s per
degree (pool-adjacent-violators on the measured times) so that t never falls as a document grows.
:func:`cross_validate` gives leave-one-out relative errors of this form and of the current one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from dynacp.calibrate.lsq import nonneg_relative_lsq


@dataclass
class ProposedModel:
    """A fitted :mod:`proposed <dynacp.calibrate.proposed>` form (times in seconds per document per rank)."""

    a: float
    """s^2/(2d) coefficient (s/token^2)."""
    b1: float
    """s coefficient, not divided by d (s/token): the part of ring attention every rank pays in full."""
    b2: float
    """s/d coefficient (s/token)."""
    floor: dict[int, float]
    """c_d per measured degree (s)."""
    table: dict[tuple[int, int], float] = field(default_factory=dict)
    """(s, d) -> log(measured / parametric) after the monotone fix."""

    def parametric(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        s = np.asarray(s, dtype=np.float64)
        d = np.asarray(d, dtype=np.float64)
        degs = np.array(sorted(self.floor))
        c = np.interp(np.log(d), np.log(degs), [self.floor[int(x)] for x in degs])
        return self.a * s * s / (2 * d) + self.b1 * s + self.b2 * s / d + c

    def log_ratio(self, s: float, d: float) -> float:
        """Mean of the two 1-D readings of the table: along s at each degree then across degrees, and along d at
        each length then across lengths (piecewise linear in log s / log d, constant outside)."""
        if not self.table:
            return 0.0
        degs = sorted({k[1] for k in self.table})
        lens = sorted({k[0] for k in self.table})

        def along(keys: list[tuple[int, int]], coord: int, x: float) -> Optional[float]:
            if not keys:
                return None
            keys = sorted(keys, key=lambda k: k[coord])
            return float(np.interp(np.log(x), [np.log(k[coord]) for k in keys], [self.table[k] for k in keys]))

        def across(points: list[tuple[float, Optional[float]]], x: float) -> Optional[float]:
            pts = [(np.log(p), v) for p, v in points if v is not None]
            return float(np.interp(np.log(x), [p for p, _ in pts], [v for _, v in pts])) if pts else None

        a = across([(dd, along([k for k in self.table if k[1] == dd], 0, s)) for dd in degs], d)
        b = across([(ss, along([k for k in self.table if k[0] == ss], 1, d)) for ss in lens], s)
        vals = [v for v in (a, b) if v is not None]
        return float(np.mean(vals)) if vals else 0.0

    def raw_time(self, s: float, d: float) -> float:
        """p(s, d) * r(s, d) before the monotone envelope."""
        return float(self.parametric(np.array([s]), np.array([d]))[0]) * float(np.exp(self.log_ratio(s, d)))

    def time(self, s: float, d: float) -> float:
        """t(s, d) in seconds: :meth:`raw_time` under its monotone envelope in s. Inside the table's length range,
        the running maximum of raw_time at 8 nodes per octave, interpolated linearly in (log s, log t) (a
        piecewise-linear reading of a non-decreasing sequence, so non-decreasing); below the range raw_time itself
        (p grows, r is constant there); above it raw_time, at least the envelope's last value."""
        lens = sorted({k[0] for k in self.table})
        if not lens or s <= lens[0]:
            return self.raw_time(s, d)
        nodes, vals = self._envelope(float(d), float(lens[0]), float(lens[-1]))
        if s >= lens[-1]:
            return max(self.raw_time(s, d), float(vals[-1]))
        return float(np.exp(np.interp(np.log(s), np.log(nodes), np.log(vals))))

    def _envelope(self, d: float, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        cache = self.__dict__.setdefault("_env_cache", {})
        if d not in cache:
            k = int(np.ceil(8 * np.log2(hi / lo)))
            nodes = np.minimum(lo * 2.0 ** (np.arange(k + 1) / 8), hi)
            cache[d] = (nodes, np.maximum.accumulate([self.raw_time(x, d) for x in nodes]))
        return cache[d]


def _features(s: np.ndarray, d: np.ndarray, degrees: Sequence[int]) -> np.ndarray:
    return np.c_[(s * s / (2 * d), s, s / d) + tuple((d == k).astype(float) for k in degrees)]


def fit_parametric(s: np.ndarray, d: np.ndarray, t: np.ndarray) -> ProposedModel:
    """The parametric part p(s, d) by non-negative relative least squares."""
    degrees = sorted({int(x) for x in d})
    coef = nonneg_relative_lsq(_features(s, d, degrees), t)
    return ProposedModel(float(coef[0]), float(coef[1]), float(coef[2]),
                         {k: float(c) for k, c in zip(degrees, coef[3:])})


def _monotone(values: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, n2 = blocks.pop()
            v1, n1 = blocks.pop()
            blocks.append([(v1 * n1 + v2 * n2) / (n1 + n2), n1 + n2])
    return np.concatenate([[v] * int(n) for v, n in blocks])


def fit_proposed(s: np.ndarray, d: np.ndarray, t: np.ndarray, table: bool = True) -> ProposedModel:
    """Fit the proposed form on documents of lengths ``s`` on ``d`` ranks taking ``t`` seconds."""
    s, d, t = (np.asarray(x, dtype=np.float64) for x in (s, d, t))
    model = fit_parametric(s, d, t)
    if not table:
        return model
    for deg in sorted({int(x) for x in d}):
        sel = np.flatnonzero(d == deg)
        sel = sel[np.argsort(s[sel])]
        mono = np.exp(_monotone(np.log(t[sel])))
        p = model.parametric(s[sel], d[sel])
        for i, tm, pm in zip(sel, mono, p):
            model.table[(int(s[i]), deg)] = float(np.log(tm / pm))
    return model


def fit_current(s: np.ndarray, d: np.ndarray, t: np.ndarray, eta: float = 0.5) -> np.ndarray:
    """The C++ form's (a, b, c) for single causal documents: t = eta*a*s^2/d + b*s/d + c."""
    X = np.c_[eta * s * s / d, s / d, np.ones_like(s)]
    return nonneg_relative_lsq(X, t)


@dataclass
class CrossValidation:
    """Leave-one-out relative errors (fractions) of one form."""

    form: str
    errors: np.ndarray

    @property
    def median(self) -> float:
        return float(np.median(np.abs(self.errors)))

    @property
    def max(self) -> float:
        return float(np.max(np.abs(self.errors)))


def cross_validate(s: Sequence[float], d: Sequence[float], t: Sequence[float]) -> dict[str, CrossValidation]:
    """Leave-one-out cross-validation (each point predicted by a fit on all the others) of the current form
    (``current``), the proposed parametric part alone (``parametric``) and the proposed form (``proposed``)."""
    s, d, t = (np.asarray(x, dtype=np.float64) for x in (s, d, t))
    errs: dict[str, list[float]] = {"current": [], "parametric": [], "proposed": []}
    for i in range(t.size):
        m = np.arange(t.size) != i
        a, b, c = fit_current(s[m], d[m], t[m])
        errs["current"].append((0.5 * a * s[i] ** 2 / d[i] + b * s[i] / d[i] + c - t[i]) / t[i])
        model = fit_proposed(s[m], d[m], t[m])
        p = float(model.parametric(s[i:i + 1], d[i:i + 1])[0])
        errs["parametric"].append((p - t[i]) / t[i])
        errs["proposed"].append((model.time(s[i], d[i]) - t[i]) / t[i])
    return {k: CrossValidation(k, np.array(v)) for k, v in errs.items()}
