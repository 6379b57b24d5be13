"""Calibrate the cost model on this machine and plan with it (docs/calibration.md).

    PYTHONPATH=python python3 examples/calibrate_cost.py [--max-tokens 512]

Profiles the tiny model on 2 gloo processes (CPU; NCCL when there are 2 GPUs), fits the cost model, writes
``calibrated.json`` and plans one long-tailed batch for 8 ranks with the default preset and with the fitted model:
both plans are then priced by the fitted model, i.e. by (a model of) this machine.
"""

from __future__ import annotations

import argparse

import numpy as np

import dynacp
from dynacp import calibrate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=512, help="longest profiled pack in tokens (default 512)")
    ap.add_argument("--out", default="calibrated.json", help="cost preset to write (default calibrated.json)")
    args = ap.parse_args()

    prof = calibrate.profile(world_size=2, max_tokens=args.max_tokens, repeats=3)
    result = calibrate.fit(prof, name="this-machine")
    print(result.format())
    calibrate.save_preset(args.out, result.cost, result.links, result.report_dict(), prof.meta)

    cost, links = calibrate.load_preset(args.out)
    cluster = calibrate.apply_links(dynacp.Cluster(num_ranks=8, ranks_per_node=2, tokens_per_rank=args.max_tokens),
                                    links)
    rng = np.random.default_rng(0)
    lengths = np.minimum(np.exp(rng.uniform(np.log(64), np.log(8 * args.max_tokens), 48)).astype(np.int64),
                         8 * args.max_tokens)
    for label, model in (("default preset", dynacp.CostModel()), ("fitted", cost)):
        plan = dynacp.plan(lengths, cluster, model)
        on_this_machine = dynacp.predict(plan, lengths, cluster, cost)
        print(f"planned with the {label:>14}: {on_this_machine.step_time * 1e3:8.1f} ms predicted on this machine "
              f"(lower bound {on_this_machine.lower_bound * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
