"""Zigzag ring attention on CPU with gloo: 3 processes, one CP group of size 3.

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 examples/ring_attention_demo.py

Each process shards a packed batch (mixed lengths, one shorter than 2*cp), runs dynacp.torch.ring_attention forward
and backward, and rank 0 compares the gathered output and the gradients with plain single-process attention.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dynacp.torch import ring_attention, zigzag_gather, zigzag_shard

LENGTHS = [5, 40, 17, 1]
HEADS, KV_HEADS, DIM, CP = 4, 2, 16, 3


def reference(q, k, v, cu):
    outs = []
    for s, e in zip(cu[:-1], cu[1:]):
        g = q.shape[1] // k.shape[1]
        qs, ks, vs = q[s:e], k[s:e].repeat_interleave(g, 1), v[s:e].repeat_interleave(g, 1)
        scores = torch.einsum("ihd,jhd->hij", qs, ks) / DIM**0.5
        scores = scores.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs))
    return torch.cat(outs)


def main(rank: int, port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=CP,
                            timeout=timedelta(seconds=60))
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    gen = torch.Generator().manual_seed(0)  # same global batch on every rank
    q = torch.randn(cu[-1], HEADS, DIM, generator=gen, requires_grad=True)
    k = torch.randn(cu[-1], KV_HEADS, DIM, generator=gen, requires_grad=True)
    v = torch.randn(cu[-1], KV_HEADS, DIM, generator=gen, requires_grad=True)

    local = [zigzag_shard(x, cu, CP, rank) for x in (q, k, v)]
    out = ring_attention(*local, cu, group=None, causal=True, timeout=30.0)
    out.square().sum().backward()  # gradients of this rank's rows land in q.grad, k.grad, v.grad
    grads = [x.grad for x in (q, k, v)]
    for g in grads:
        dist.all_reduce(g)
    full = zigzag_gather(out.detach(), cu)

    if rank == 0:
        qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = reference(qr, kr, vr, cu)
        ref.square().sum().backward()
        print(f"cp={CP} lengths={LENGTHS} local rows per rank={out.shape[0]}")
        print(f"max |out - ref| = {(full.double() - ref).abs().max():.2e}")
        for name, g, r in zip("qkv", grads, (qr.grad, kr.grad, vr.grad)):
            print(f"max |d{name} - ref| = {(g.double() - r).abs().max():.2e}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(main, args=(free_port,), nprocs=CP)
