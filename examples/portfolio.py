"""dynacp's candidate portfolio from Python: which family won, threads, a time limit, tuning, rings across nodes.

    DYNACP_EXT_DIR=build/python PYTHONPATH=python python3 examples/portfolio.py

Every step time printed is predicted by the cost model (default preset); solve times are measured on this machine.
"""

from __future__ import annotations

import numpy as np

import dynacp
from dynacp import distributions


def main() -> None:
    rng = np.random.default_rng(0)
    lengths = distributions.sample("wikipedia", 512, rng)  # tokens per sequence
    cluster = dynacp.Cluster(num_ranks=64, ranks_per_node=8, tokens_per_rank=16384)

    # 1. The families, and which one built the plan (pp = 4, threads = every hardware thread by default).
    print("families:", ", ".join(dynacp.dynacp_families()))
    plan = dynacp.plan(lengths, cluster, pp=4, tight_bound=False)
    print(f"pp 4: step {plan.predicted.step_time:.4f} s (predicted), family {plan.family}, "
          f"solve {plan.solve_ms:.1f} ms (measured)")

    # 2. The same plan on one thread (bit-identical for any thread count), and a time limit that cuts the search.
    one = dynacp.plan(lengths, cluster, pp=4, threads=1, tight_bound=False)
    print(f"1 thread: same plan {one.digest() == plan.digest()}, solve {one.solve_ms:.1f} ms")
    quick = dynacp.plan(lengths, cluster, pp=4, time_limit=0.005, tight_bound=False)
    print(f"time_limit 5 ms: partial {quick.partial}, step {quick.predicted.step_time:.4f} s")

    # 3. Tuning: every constant is a DynacpTuning field; here the full plain walk and the old polish budget.
    full = dynacp.DynacpTuning(coarse_rules=0, walk_mus=2, reorder_budget=96)
    wide = dynacp.plan(lengths, cluster, pp=4, tuning=full, tight_bound=False)
    print(f"full plain walk: step {wide.predicted.step_time:.4f} s, solve {wide.solve_ms:.1f} ms")

    # 4. A pool whose inter-node link is faster than its intra-node one: the cross-node family puts rings across nodes.
    odd = dynacp.Cluster(num_ranks=16, ranks_per_node=4, tokens_per_rank=4096,
                         intra_node_bandwidth=5e9, inter_node_bandwidth=20e9)  # bytes/s per ring hop
    short = np.random.default_rng(0).integers(3000, 9000, 12)  # 12 sequences of 3,000-9,000 tokens: rings of 2+
    both = dynacp.plan(short, odd, tight_bound=False)
    without = dynacp.plan(short, odd, tight_bound=False, tuning=dynacp.DynacpTuning(skip_families=["cross-node"]))
    crossing = sum(len({r // odd.ranks_per_node for r in g.ranks}) > 1 for s in both.microbatches for g in s)
    print(f"inter-node faster: step {both.predicted.step_time:.4f} s with family {both.family} "
          f"({crossing} groups across nodes), {without.predicted.step_time:.4f} s without the cross-node family")


if __name__ == "__main__":
    main()
