"""Train a tiny GPT with dynacp plans on CPU over gloo.

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python \
        torchrun --nproc-per-node 4 examples/train_tiny_gpt.py --steps 10

Every global batch holds a long-tailed (log-normal) mix of sequence lengths; dynacp plans it onto the 4-rank DP x CP
pool with CP groups of any size (a small per-rank token capacity forces long sequences onto 2-4 ranks), re-routes
the samples, and the model runs zigzag ring attention from the runtime (``dynacp.torch.ring_attention``; the
all-gather oracle when the runtime's kernels are not built). Loss is normalised per token over the whole global batch.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import time

import numpy as np
import torch
import torch.distributed as dist

import dynacp
from dynacp.integration import (
    Planner,
    finalize_grads,
    get_wrapper,
    gpt_flops,
    make_process_groups,
    report_loss,
    ring_attention_available,
    wrap_data_iterator,
)
from dynacp.integration.tiny_gpt import TinyGPT, TinyGPTConfig, microbatch_loss


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="global batches to train")
    p.add_argument("--samples-per-rank", type=int, default=8, help="sequences each rank reads per global batch")
    p.add_argument("--capacity", type=int, default=256, help="tokens one rank holds per microbatch")
    p.add_argument("--strategy", default="dynacp", help=f"one of {dynacp.strategy_names()}")
    p.add_argument("--count-policy", default="variable", choices=["equal", "variable"])
    p.add_argument("--sync-planning", action="store_true", help="plan inside each step instead of one step ahead")
    p.add_argument("--attention", default="auto", choices=["auto", "ring", "allgather"])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any collective may take")
    return p.parse_args()


def long_tailed_samples(rank: int, args: argparse.Namespace, vocab: int, max_len: int):
    """Endless stream of this rank's samples: log-normal lengths (median ~40, long tail up to max_len); each sequence
    counts up by a per-sequence stride mod vocab, so the model can learn it."""
    rng = np.random.default_rng(args.seed * 1000 + rank)
    while True:
        n = int(np.clip(rng.lognormal(mean=3.7, sigma=1.0), 2, max_len))
        start, stride = int(rng.integers(vocab)), int(rng.integers(1, 5))
        x = (start + stride * torch.arange(n + 1)) % vocab
        yield {"tokens": x[:-1], "labels": x[1:]}


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = make_process_groups(timeout=datetime.timedelta(seconds=args.timeout), cp_groups="lazy")
    cfg = TinyGPTConfig(vocab=64, hidden=64, heads=4, layers=2, max_positions=world * args.capacity)
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    planner = Planner(
        strategy=args.strategy,
        cluster=dynacp.Cluster(num_ranks=groups.pool_size, ranks_per_node=groups.pool_size,
                               tokens_per_rank=args.capacity),
        count_policy=args.count_policy,
        timeout=args.timeout,
        async_planning=not args.sync_planning,
    )
    # the padded length of a sequence on the whole pool must fit: keep the longest below world * capacity - 2 * world
    data = long_tailed_samples(rank, args, cfg.vocab, max_len=world * args.capacity - 2 * world)
    attn_impl = args.attention
    if rank == 0:
        print(f"dynacp tiny GPT: {world} ranks, strategy={args.strategy}, count_policy={args.count_policy}, "
              f"attention={'ring' if attn_impl != 'allgather' and ring_attention_available() else 'allgather'}, "
              f"capacity {args.capacity} tokens/rank, async planning={planner.async_planning}", flush=True)
    for step in range(args.steps):
        t0 = time.perf_counter()
        it, num_mb, s1, s2 = wrap_data_iterator(data, planner=planner, groups=groups,
                                                num_samples=args.samples_per_rank)
        batch = get_wrapper(data).last_batch
        opt.zero_grad()
        loss_sum, count = 0.0, 0.0
        for mb in it:
            ls, c = microbatch_loss(model, mb, impl=attn_impl)
            ls.backward()
            loss_sum += float(ls.detach())
            count += float(c)
        finalize_grads(model.parameters(), groups, batch.num_valid_tokens)
        opt.step()
        loss = report_loss(loss_sum, count, groups)
        elapsed = time.perf_counter() - t0
        counts = [0] * world
        dist.all_gather_object(counts, num_mb, group=groups.dp_cp)
        if rank == 0:
            degrees = collections.Counter(len(r) for r in batch.rings)
            flops = gpt_flops(s1, s2, num_layers=cfg.layers, hidden=cfg.hidden, vocab=cfg.vocab)
            print(f"step {step:3d}  loss {loss:.4f}  tokens {s1:6d}  {s1 / elapsed:8.0f} tok/s  "
                  f"{flops / elapsed / 1e9:6.2f} GFLOP/s  plan wait {batch.plan_wait_s * 1e3:6.2f} ms "
                  f"(solve {batch.plan_solve_s * 1e3:.2f} ms)  microbatches/rank {counts}  "
                  f"CP degrees {dict(sorted(degrees.items()))}  predicted {batch.plan.predicted.step_time * 1e3:.1f} ms",
                  flush=True)
    w = get_wrapper(data)
    if rank == 0:
        print(f"total planning wait {w.total_plan_wait_s * 1e3:.1f} ms over {w.steps} steps", flush=True)
    w.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
