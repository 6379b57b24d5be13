"""DP balancing: split per-item workloads into k parts minimising the heaviest part (C++ core)."""

from __future__ import annotations

from typing import List, Union

import numpy as np

from dynacp import _core

ArrayLike = Union[np.ndarray, list, tuple]

METHODS = ("kk", "greedy", "exact", "best")


def _as_weights(weights: ArrayLike) -> np.ndarray:
    arr = np.asarray(weights)
    if arr.ndim != 1:
        raise ValueError(f"weights must be a 1-D array, got shape {arr.shape}")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"weights must hold integers or floats, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.float64)


def balance(weights: ArrayLike, k: int, equal_count: bool = False, method: str = "best") -> List[List[int]]:
    """Split ``weights`` into ``k`` parts so that the heaviest part is as light as possible.

    Args:
        weights: one non-negative, finite workload per item (tokens, sum of squared lengths, predicted seconds...).
        k: number of parts (e.g. data-parallel ranks), ``k >= 1``.
        equal_count: every part gets ``n // k`` or ``n // k + 1`` items (exactly ``n % k`` parts get the larger
            count); items are never dropped. Requires ``n >= k``. With ``equal_count=False`` part sizes are free and
            parts may be empty when ``n < k``.
        method:
            ``"best"`` (default): run ``"kk"`` and ``"greedy"``, improve each by pairwise swaps (plus single-item
            moves when counts are free) until no swap/move with the heaviest part strictly lowers it, and keep the
            better. Never worse than ``"greedy"`` or ``"kk"`` on any instance.
            ``"kk"``: Karmarkar-Karp largest differencing (free counts) or its balanced variant BLDM (equal counts),
            O(n log n) time and O(n + k) memory (32,768 items into 512 parts in milliseconds). BLDM is weak with
            few items per part (64 parts x 8 items: max/mean 1.65 vs 1.25 for the greedy).
            ``"greedy"``: longest-processing-time first into the lightest part with count room.
            ``"exact"``: branch and bound on the max part sum, at most 16 items (exponential worst case).

    Returns:
        ``k`` lists of item indices; every index in ``range(n)`` appears exactly once. Indices are ascending within
        a part, and parts are ordered by their smallest index (empty parts last). The result is deterministic:
        ties between equal weights are broken by the lower index, and equal input gives equal output.

    Raises:
        ValueError: ``k < 1``, empty weights, negative / NaN / infinite weights, ``equal_count`` with fewer items
            than parts, ``"exact"`` with more than 16 items, or an unknown method.

    Example:
        >>> balance([3, 3, 2, 2, 2], 2)
        [[0, 1], [2, 3, 4]]
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ValueError(f"k must be an integer, got {k!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in METHODS)}, got {method!r}")
    return _core.balance(_as_weights(weights), int(k), bool(equal_count), method)


def balance_lower_bound(weights: ArrayLike, k: int, equal_count: bool = False) -> float:
    """Lower bound on the optimal heaviest part of :func:`balance`.

    ``max(total / k, largest, w[k-1] + w[k])`` (``w`` sorted descending, second term when ``n > k``); with
    ``equal_count`` also the largest item plus the ``n // k - 1`` smallest others.
    """
    return _core.balance_lower_bound(_as_weights(weights), int(k), bool(equal_count))


def part_loads(weights: ArrayLike, parts: List[List[int]]) -> np.ndarray:
    """Sum of weights per part (float64), in the order of ``parts``."""
    w = _as_weights(weights)
    return np.array([float(sum(w[i] for i in p)) for p in parts], dtype=np.float64)
