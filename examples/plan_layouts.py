"""Pick a parallel layout for seed 003's 35B MoE on 40 GPUs, then see what a length distribution changes.

    DYNACP_EXT_DIR=build/python PYTHONPATH=python python3 examples/plan_layouts.py
"""

from __future__ import annotations

import dynacp.planner as planner

BATCH = {"global_batch": 80, "seq_length": 49152, "micro_batch": 1}
OPTIONS = {"recompute": "full", "chunked_ce": True, "grad_dtype": "bf16"}


def main() -> None:
    # 1. The seed's own search space: ETP = 1, EP | DP, no CP. The planner lands on TP1/PP1/EP8/DP40.
    seed = planner.configs("seed-35b-moe", "seed-40xh20", BATCH, OPTIONS, etp="1", ep_divides_dp=True, cp_sizes=(1,))
    print(seed.format(top=5))
    print()

    # 2. The real model (40 layers, 256 experts, 16 heads) with MoE parallel folding and CP: why EP 5 and TP 5 fail.
    real = planner.configs("qwen3.5-35b-a3b", "seed-40xh20", BATCH, OPTIONS)
    for dims in ({"tp": 1, "pp": 1, "cp": 1, "ep": 5}, {"tp": 5, "pp": 1, "cp": 1, "ep": 8, "etp": 1}):
        for row in real.find(**dims):
            print(f"{row.layout.label(True)}: {row.reason}")
    print()

    # 3. Selective instead of full recompute: Megatron's --recompute-modules by name (here the norm outputs and the
    #    routed experts' activation outputs), which keep more memory and spend less time than a full recompute.
    selective = {**OPTIONS, "recompute": "selective",
                 **planner.recompute_module_options(["layernorm", "moe_act"])}
    sel = planner.configs("qwen3.5-35b-a3b", "seed-40xh20", BATCH, selective)
    for name, table in (("full", real), ("selective + layernorm + moe_act", sel)):
        best = table.best
        if best is None:
            print(f"{name}: no layout fits")
            continue
        print(f"{name}: {best.layout.label(True)}, activations {best.memory.activations / 1e9:.1f} GB, "
              f"step {best.time.step:.2f} s")
    print()

    # 4. Variable lengths: the scheduler's static packing vs dynamic CP on sampled global batches.
    try:
        dist = planner.configs("qwen3.5-35b-a3b", "seed-40xh20", BATCH, OPTIONS, lengths="wikipedia",
                               sample_batches=2, predict_top=8, progress=True)
    except ValueError as e:  # no embedded distributions in this build
        print(f"skipping the distribution example: {e}")
        return
    print(dist.format(top=8))


if __name__ == "__main__":
    main()
