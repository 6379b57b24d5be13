#!/usr/bin/env python3
"""Re-route traffic and memory of the training-loop wrapper, per rank per global batch (CPU, gloo, spawned ranks).

Each global batch holds ``--samples`` sequences of long-tailed lengths (log-normal, median ~1,500 tokens, clipped to
[16, 16,000]), read evenly by the ranks; ``dynacp`` plans them with a capacity of 8,192 tokens per rank and
microbatch, so long sequences run on CP groups of 2 or more ranks. For every rank and global batch this prints what
``GlobalBatch.reroute`` counts (bytes sent and received, messages, the wrapper's accounted peak) and what the
process's resident memory measured: the rise of the peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``)
over the RSS at the start of the re-route, from cutting the send buffers to the last microbatch built (after one
warm-up global batch, whose first-use allocations of torch and Python are not the re-route's); the
microbatches handed out are included there, the input samples are not. glibc is told to serve every allocation over
64 KiB by mmap (``MALLOC_MMAP_THRESHOLD_``), so freed buffers leave the RSS and the peak is the buffers' own.

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 benchmarks/reroute_memory.py --ranks 2 4 8
    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 benchmarks/reroute_memory.py --ranks 2 4 8 \
        --samples 16 --per-rank
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import socket
import statistics
import tempfile

import numpy as np


def _kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1)) * 1024


def _worker(rank: int, world: int, port: int, out: str, samples: int, steps: int, seed: int) -> None:
    import torch
    import torch.distributed as dist

    import dynacp
    from dynacp.integration import DynamicCPDataIterator, Planner, make_process_groups

    class Measured(DynamicCPDataIterator):
        """Resets the peak RSS when the send buffers are cut, reads it when the microbatches are built."""

        def _route(self, plan, pending):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rss0 = _kib("VmRSS")
            return super()._route(plan, pending)

        def _exchange_samples(self, route):
            out = super()._exchange_samples(route)
            self.rss_peak = _kib("VmHWM") - self.rss0
            return out

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    groups = make_process_groups(timeout=datetime.timedelta(seconds=120), cp_groups="lazy")
    rng = np.random.default_rng(seed * 1000 + rank)
    per = samples // world

    def stream():
        while True:
            n = int(np.clip(rng.lognormal(np.log(1500), 1.0), 16, 16000))
            x = torch.randint(0, 32000, (n + 1,))
            yield {"tokens": x[:-1], "labels": x[1:]}

    planner = Planner(strategy="dynacp", cluster=dynacp.Cluster(num_ranks=world, ranks_per_node=world,
                                                                activation_budget=8192.0),
                      cost=dynacp.CostModel(mem_per_token=1.0), async_planning=False, timeout=120)
    w = Measured(stream(), planner=planner, groups=groups, num_samples=per)
    rows = []
    for step in range(steps + 1):
        b = w.next_global_batch()
        if step == 0:  # warm-up: first-use allocations of torch and Python (up to a few MiB), not the re-route's
            continue
        r = b.reroute
        held = sum(mb["num_local_tokens"] for mb in b.microbatches)
        rows.append((b.seqlen_sum, held, r.bytes_sent, r.bytes_received, r.messages_sent, r.messages_received,
                     r.peak_bytes, r.output_bytes, w.rss_peak, max(len(g) for g in b.rings)))
    with open(os.path.join(out, f"{rank}.txt"), "w") as f:
        f.write(repr(rows))
    dist.destroy_process_group()


def run(world: int, samples: int, steps: int, seed: int) -> list[list[tuple]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        procs = [mp.get_context("spawn").Process(target=_worker, args=(r, world, port, out, samples, steps, seed))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(600)
            if p.exitcode != 0:
                raise SystemExit(f"a rank exited with {p.exitcode}")
        return [eval(open(os.path.join(out, f"{r}.txt")).read()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8], help="pool sizes to run")
    ap.add_argument("--samples", type=int, default=64, help="sequences per global batch (whole pool)")
    ap.add_argument("--per-rank", action="store_true", help="--samples counts sequences per rank instead (the load "
                    "per rank stays the same as the pool grows)")
    ap.add_argument("--steps", type=int, default=5, help="global batches measured per run (after one warm-up batch)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # inherited by the spawned ranks
    mib = 1 << 20
    what = "per rank" if args.per_rank else "per global batch"
    print(f"{args.samples} sequences {what}, {args.steps} global batches, every value per rank and batch\n")
    print("| ranks | tokens/batch (mean) | rows held (mean / max) | sent MiB (mean / max) | received MiB (mean / max) "
          "| messages out+in (max) | accounted peak MiB (max) | accounted peak + output MiB (max) | measured RSS rise MiB "
          "(mean / max) | measured / (rows held x 40 B) (max) | largest CP degree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for world in args.ranks:
        samples = args.samples * world if args.per_rank else args.samples
        res = [row for rank_rows in run(world, samples, args.steps, args.seed) for row in rank_rows]
        tokens = statistics.mean(r[0] for r in res)
        held = [r[1] for r in res]
        sent, recv = [r[2] / mib for r in res], [r[3] / mib for r in res]
        ratio = max(r[8] / max(r[1] * 40, 1) for r in res)
        print(f"| {world} | {tokens:,.0f} | {statistics.mean(held):,.0f} / {max(held):,} | "
              f"{statistics.mean(sent):.2f} / {max(sent):.2f} | {statistics.mean(recv):.2f} / {max(recv):.2f} | "
              f"{max(r[4] + r[5] for r in res)} | {max(r[6] for r in res) / mib:.2f} | "
              f"{max(r[6] + r[7] for r in res) / mib:.2f} | "
              f"{statistics.mean(r[8] for r in res) / mib:.2f} / {max(r[8] for r in res) / mib:.2f} | {ratio:.2f} | "
              f"{max(r[9] for r in res)} |", flush=True)


if __name__ == "__main__":
    main()
