"""CUDA-graph mode: choosing the static shapes a runtime captures ahead of time (:class:`dynacp.StaticShapes`).

The solver plans under the shapes (``dynacp.plan(..., static_shapes=...)``, docs/cost_model.md "Static shapes");
this module picks a default set of them.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from dynacp import _core

#: Fractions of the token capacity the default buckets sit at (the largest is the capacity itself).
DEFAULT_BUCKET_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1)


def default_static_shapes(cluster: Optional[_core.Cluster] = None, cost: Optional[_core.CostModel] = None,
                          buckets: int = 4, cp_sizes: Sequence[int] = (1, 2, 4, 8), max_microbatches: int = 8,
                          max_sequences: int = 0,
                          length_samples: Optional[Sequence[np.ndarray]] = None) -> _core.StaticShapes:
    """Static shapes with ``buckets`` token buckets: without samples at capacity x {1/8, 1/4, 1/2, 1} (the last
    ``buckets`` of those fractions; halving from the capacity beyond four), each rounded down to a multiple of
    ``Cluster.seq_pad_multiple`` rows per rank; with ``length_samples`` (sample batches of the user's lengths) the
    buckets that minimise the padded rows of dynacp's plans of the samples (planned under the capacity and
    ``cp_sizes``; :func:`choose_buckets`), the largest always the capacity. Deterministic.

    Args:
        cluster: the pool (default ``Cluster()``); its token capacity (``CostModel.token_capacity``, tokens per
            rank) is the largest bucket.
        cost: the cost model (default ``CostModel()``).
        buckets: number of token buckets (>= 1).
        cp_sizes: allowed CP degrees in ranks (ascending, including 1); sizes that do not divide the pool are dropped.
        max_microbatches: microbatch slots per rank per step (0 = unbounded).
        max_sequences: sequences per group (0 = unbounded).
        length_samples: sample batches (1-D integer arrays of sequence lengths in tokens); None = fixed fractions.

    Returns:
        A validated :class:`dynacp.StaticShapes`.
    """
    cluster = cluster or _core.Cluster()
    cost = cost or _core.CostModel()
    if buckets < 1:
        raise ValueError(f"default_static_shapes: buckets must be >= 1, got {buckets}")
    cap = int(cost.token_capacity(cluster))
    k = int(cluster.seq_pad_multiple)
    fractions = list(DEFAULT_BUCKET_FRACTIONS)
    while len(fractions) < buckets:
        fractions.insert(0, fractions[0] / 2)
    rows = sorted({max(k, int(cap * f) // k * k) for f in fractions[-buckets:]})
    sizes = [int(d) for d in cp_sizes if 1 <= int(d) <= cluster.num_ranks and cluster.num_ranks % int(d) == 0]
    if length_samples is not None:
        base = _core.StaticShapes(token_buckets=[cap // k * k], cp_sizes=sizes, max_microbatches=int(max_microbatches),
                                  max_sequences=int(max_sequences))
        rows = choose_buckets(_group_rows(length_samples, cluster, cost, base), buckets, cap // k * k, k)
    shapes = _core.StaticShapes(token_buckets=rows, cp_sizes=sizes, max_microbatches=int(max_microbatches),
                                max_sequences=int(max_sequences))
    shapes.validate(cluster, cost)
    return shapes


def _group_rows(length_samples: Sequence[np.ndarray], cluster: _core.Cluster, cost: _core.CostModel,
                base: _core.StaticShapes) -> list:
    """(rows per rank, degree) of every group of dynacp's plans of the samples under ``base`` (one bucket)."""
    from dynacp.api import plan

    k = int(cluster.seq_pad_multiple)
    out = []
    for lengths in length_samples:
        arr = np.asarray(lengths, dtype=np.int64)
        p = plan(arr, cluster, cost, threads=1, static_shapes=base)
        for slot in p.microbatches:
            for g in slot:
                d = len(g.ranks)
                out.append((int(sum(-(-int(arr[s]) // (k * d)) * k for s in g.sequences)), d))
    return out


def choose_buckets(groups: Sequence[tuple], buckets: int, cap: int, k: int) -> list:
    """At most ``buckets`` bucket sizes (rows per rank, multiples of ``k``, the largest ``cap``) that minimise the
    padded rows sum (bucket - rows) x degree over ``groups`` ((rows per rank, degree) pairs): an exact dynamic
    program over the distinct group sizes."""
    if not groups:
        return [cap]
    sizes = sorted({min(cap, -(-int(r) // k) * k) for r, _ in groups})
    weight = {v: 0 for v in sizes}
    for r, d in groups:
        weight[min(cap, -(-int(r) // k) * k)] += int(d)
    if sizes[-1] != cap:
        sizes.append(cap)
        weight[cap] = 0
    v = np.array(sizes, dtype=np.float64)
    w = np.array([weight[x] for x in sizes], dtype=np.float64)
    cw, cwv = np.concatenate([[0], np.cumsum(w)]), np.concatenate([[0], np.cumsum(w * v)])
    n = len(sizes)

    def pad(i: int, j: int) -> float:  # groups i..j (inclusive) padded to sizes[j]
        return float(v[j] * (cw[j + 1] - cw[i]) - (cwv[j + 1] - cwv[i]))

    inf = float("inf")
    best = [[inf] * n for _ in range(buckets + 1)]  # best[b][j]: groups 0..j with b buckets, the last at sizes[j]
    back = [[-1] * n for _ in range(buckets + 1)]
    for j in range(n):
        best[1][j] = pad(0, j)
    for b in range(2, buckets + 1):
        for j in range(n):
            for i in range(j):
                t = best[b - 1][i] + pad(i + 1, j)
                if t < best[b][j]:
                    best[b][j], back[b][j] = t, i
    b = min(range(1, buckets + 1), key=lambda x: (best[x][n - 1], x))
    out, j = [], n - 1
    while j >= 0 and b >= 1:
        out.append(sizes[j])
        j, b = back[b][j], b - 1
    return sorted(out)


__all__ = ["DEFAULT_BUCKET_FRACTIONS", "choose_buckets", "default_static_shapes"]
