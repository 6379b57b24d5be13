"""CUDA-graph mode: choosing the static shapes a runtime captures ahead of time (:class:`dynacp.StaticShapes`).

The solver plans under the shapes (``dynacp.plan(..., static_shapes=...)``, docs/cost_model.md "Static shapes");
this module picks a default set of them.
"""

from __future__ import annotations

from typing import Optional, Sequence

from dynacp import _core

#: Fractions of the token capacity the default buckets sit at (the largest is the capacity itself).
DEFAULT_BUCKET_FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1)


def default_static_shapes(cluster: Optional[_core.Cluster] = None, cost: Optional[_core.CostModel] = None,
                          buckets: int = 4, cp_sizes: Sequence[int] = (1, 2, 4, 8), max_microbatches: int = 8,
                          max_sequences: int = 0) -> _core.StaticShapes:
    """Static shapes with ``buckets`` token buckets at capacity x {1/8, 1/4, 1/2, 1} (the last ``buckets`` of those
    fractions; halving from the capacity beyond four), each rounded down to a multiple of
    ``Cluster.seq_pad_multiple`` rows per rank.

    Args:
        cluster: the pool (default ``Cluster()``); its token capacity (``CostModel.token_capacity``, tokens per
            rank) is the largest bucket.
        cost: the cost model (default ``CostModel()``).
        buckets: number of token buckets (>= 1).
        cp_sizes: allowed CP degrees in ranks (ascending, including 1); sizes that do not divide the pool are dropped.
        max_microbatches: microbatch slots per rank per step (0 = unbounded).
        max_sequences: sequences per group (0 = unbounded).

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
    shapes = _core.StaticShapes(token_buckets=rows, cp_sizes=sizes, max_microbatches=int(max_microbatches),
                                max_sequences=int(max_sequences))
    shapes.validate(cluster, cost)
    return shapes


__all__ = ["DEFAULT_BUCKET_FRACTIONS", "default_static_shapes"]
