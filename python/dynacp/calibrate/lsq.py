"""Least squares on relative error with non-negative coefficients (numpy only; the calibration's one solver).

Minimises ``sum_i w_i ((X_i . coef - t_i) / t_i)^2`` subject to ``coef >= 0``, the same criterion as the C++
``fit_compute``: a negative coefficient is dropped (the most negative first) and the rest refitted, until every
coefficient left is non-negative. Deterministic: ``numpy.linalg.lstsq`` on the same input gives the same output.
"""

from __future__ import annotations

from typing import Optional

import numpy as np


def nonneg_relative_lsq(X: np.ndarray, t: np.ndarray, weights: Optional[np.ndarray] = None,
                        fixed_zero: Optional[list[int]] = None, offset: Optional[np.ndarray] = None) -> np.ndarray:
    """Coefficients ``coef >= 0`` minimising the (weighted) squared relative error of ``X @ coef`` against ``t``.

    Args:
        X: design matrix, one row per sample (seconds per unit of each term).
        t: measured seconds, all > 0.
        weights: optional per-sample weights (>= 0); default 1.
        fixed_zero: columns held at 0 (terms the data cannot identify).
        offset: known seconds added to every prediction (``X @ coef + offset``), default 0.
    """
    X = np.asarray(X, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    w = np.ones_like(t) if weights is None else np.sqrt(np.asarray(weights, dtype=np.float64))
    target = w * (1.0 if offset is None else (t - np.asarray(offset, dtype=np.float64)) / t)
    active = [j for j in range(X.shape[1]) if j not in set(fixed_zero or [])]
    coef = np.zeros(X.shape[1])
    while active:
        W = X[:, active] / t[:, None] * w[:, None]
        # scale columns so that terms of very different magnitude (s^2 vs 1) are solved accurately
        scale = np.linalg.norm(W, axis=0)
        scale[scale == 0] = 1.0
        sol, *_ = np.linalg.lstsq(W / scale, target, rcond=None)
        sol = sol / scale
        worst = int(np.argmin(sol))
        if sol[worst] >= 0:
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(worst)
    return coef


def relative_errors(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``(pred - t) / t`` elementwise."""
    t = np.asarray(t, dtype=np.float64)
    return (np.asarray(pred, dtype=np.float64) - t) / t


def isotonic_increasing(values: np.ndarray, weights: Optional[np.ndarray] = None) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (pool adjacent violators).

    Adjacent values that fall are replaced by their weighted mean until none falls; already non-decreasing input is
    returned unchanged (a copy). Deterministic, O(n)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    blocks: list[list[float]] = []  # [mean, weight, count]
    for x, wx in zip(v, w):
        blocks.append([float(x), float(wx), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks]) if blocks else v.copy()
