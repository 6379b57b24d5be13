#!/usr/bin/env python3
"""CUDA-graph mode in one page: declare static shapes, plan a global batch under them, and see the graph bank and
the shape each microbatch gets (docs/static_shapes.md).

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 examples/cuda_graph_shapes.py

Plans one 512-sequence batch of the ``github`` distribution on 64 ranks (8 per node, 16,384 tokens per rank) twice:
freely, and under ``dynacp.default_static_shapes`` (4 token buckets, power-of-two CP sizes 1-64 -- github holds
sequences longer than 8 ranks x 16,384 tokens --, at most 8 microbatches per
rank, at most 64 sequences per microbatch). Step times are predicted by the cost model.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

import dynacp
from dynacp import distributions
from dynacp.integration import Planner
from dynacp.integration.layout import padded_length
from dynacp.integration.shapes import MicrobatchShape, group_padded


def main() -> None:
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8, tokens_per_rank=16384)
    cost = dynacp.CostModel()
    shapes = dynacp.default_static_shapes(cluster, cost, buckets=4, cp_sizes=(1, 2, 4, 8, 16, 32, 64),
                                          max_microbatches=8, max_sequences=64)
    bank = Planner(static_shapes=shapes).declared_shapes()
    print(f"graph bank: {len(bank)} shapes, buckets {list(shapes.token_buckets)} rows per rank, cp "
          f"{list(shapes.cp_sizes)}, cu_seqlens of {shapes.max_sequences + 1} entries")
    lengths = distributions.get("github").sample(512, np.random.default_rng(0))
    free = dynacp.plan(lengths, cluster=cluster, cost=cost, tight_bound=False)
    plan = dynacp.plan(lengths, cluster=cluster, cost=cost, tight_bound=False, static_shapes=shapes)
    pad = cluster.seq_pad_multiple
    used: Counter = Counter()
    for slot in plan.microbatches:
        for g in slot:
            cp = len(g.ranks)
            rows = sum(group_padded([int(lengths[s]) for s in g.sequences], cp, pad, shapes)) // cp
            used[MicrobatchShape(cp, rows, shapes.max_sequences + 1)] += cp
            real = sum(padded_length(int(lengths[s]), cp, pad) for s in g.sequences) // cp
            assert real <= rows and rows in shapes.token_buckets
    assert set(used) <= set(bank)
    print(f"predicted step time (cost model): free {free.predicted.step_time:.3f} s, CUDA-graph mode "
          f"{plan.predicted.step_time:.3f} s ({100 * (plan.predicted.step_time / free.predicted.step_time - 1):+.1f} %),"
          f" padding {plan.predicted.padding_fraction:.1%} of the rows held")
    for shape, n in sorted(used.items()):
        print(f"  cp {shape.cp_size}, {shape.rows:>5} rows per rank: {n} rank-microbatches")


if __name__ == "__main__":
    main()
