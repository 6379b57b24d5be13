"""Train a real Megatron-Core GPTModel (RoPE, GQA, 2 layers) through dynacp on CPU over gloo.

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python \
        torchrun --nproc-per-node 4 examples/megatron_gpt.py --steps 3

The model is ``megatron.core``'s own ``GPTModel`` built from ``get_gpt_layer_local_spec()`` with dynacp's attention
put in by ``gpt_layer_spec`` (Megatron's SelfAttention and rotary embedding, dynacp's ring as the core attention).
Every global batch holds a long-tailed mix of sequence lengths; ``wrap_data_iterator`` -- Megatron-LM main's
signature -- plans it onto the 4-rank DP x CP pool with rings of any size (a small per-rank token capacity forces
long sequences onto 2-4 ranks) and re-routes the samples. Loss and gradients take Megatron's own per-token path:
``calculate_per_token_loss=True``, ``loss_func`` returning ``(loss_sum, num_tokens, report)``, Megatron's
``DistributedDataParallel`` and ``finalize_model_grads``. On the CPU ``cpu_shim()`` answers Megatron's
``torch.cuda.current_device()`` calls, and ``forward_backward_per_token`` runs the steps of Megatron's
``forward_backward_no_pipelining`` (which cannot run without CUDA); on GPUs use Megatron's schedule instead.
"""

from __future__ import annotations

import argparse
import collections
import datetime
from typing import Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist

import dynacp
from dynacp.integration import Planner
from dynacp.integration.megatron_core import (
    cpu_shim,
    forward_backward_per_token,
    forward_step,
    global_loss,
    gpt_layer_spec,
    last_global_batch,
    wrap_data_iterator,
)


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="global batches to train")
    p.add_argument("--samples-per-rank", type=int, default=4, help="sequences each rank reads per global batch")
    p.add_argument("--capacity", type=int, default=24, help="tokens one rank holds per microbatch")
    p.add_argument("--position-embedding", default="rope", choices=["rope", "learned_absolute", "none"])
    p.add_argument("--strategy", default="dynacp", help=f"one of {dynacp.strategy_names()}")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds any collective may take")
    return p.parse_args(argv)


def build_model(position_embedding_type: str, vocab: int, max_positions: int, spec=None, seed: int = 0):
    """A 2-layer GPTModel (hidden 32, 4 query heads, 2 key/value groups: GQA; fp32; no dropout), initialised on the
    CPU from ``seed``; ``spec`` defaults to dynacp's layer spec over Megatron's local one."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
        params_dtype=torch.float32, use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
        calculate_per_token_loss=True,  # Megatron's per-token loss path: what dynacp's variable counts need
    )
    torch.manual_seed(seed)
    return GPTModel(config, spec if spec is not None else gpt_layer_spec(get_gpt_layer_local_spec()),
                    vocab_size=vocab, max_sequence_length=max_positions,
                    position_embedding_type=position_embedding_type)


def long_tailed_samples(rank: int, seed: int, vocab: int, max_len: int) -> Iterator[dict]:
    """This rank's endless sample stream: log-normal lengths (median ~20 tokens), each sequence counting up by a
    per-sequence stride mod ``vocab`` so the model can learn it."""
    rng = np.random.default_rng(seed * 1000 + rank)
    while True:
        n = int(np.clip(rng.lognormal(mean=3.0, sigma=0.8), 2, max_len))
        start, stride = int(rng.integers(vocab)), int(rng.integers(1, 5))
        x = (start + stride * torch.arange(n + 1)) % vocab
        yield {"tokens": x[:-1], "labels": x[1:]}


def main(argv: Optional[list] = None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    with cpu_shim():  # CPU only: Megatron's torch.cuda.current_device() calls answer "cpu"
        from megatron.core import parallel_state
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        parallel_state.initialize_model_parallel()  # TP = PP = 1 and Megatron's static CP = 1: dynacp's rings are CP
        vocab, max_len = 64, world * args.capacity - 2 * world  # the longest sequence, padded, fits the whole pool
        model = build_model(args.position_embedding, vocab, world * args.capacity, seed=args.seed)
        ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        config = model.config
        config.max_seqlen_per_dp_cp_rank = args.capacity  # what Megatron-LM main's wrap_data_iterator reads
        config.dynacp_planner = Planner(strategy=args.strategy, timeout=args.timeout, cluster=dynacp.Cluster(
            num_ranks=world, ranks_per_node=world, tokens_per_rank=args.capacity))
        data = long_tailed_samples(rank, args.seed, vocab, max_len)
        pool = parallel_state.get_data_parallel_group(with_context_parallel=True)
        if rank == 0:
            print(f"dynacp x Megatron-Core GPTModel: {world} ranks, {args.position_embedding} positions, GQA 4/2 "
                  f"heads, capacity {args.capacity} tokens/rank, strategy {args.strategy}", flush=True)
        for step in range(args.steps):
            it, num_mb, seqlen_sum, _ = wrap_data_iterator(data, config, args.samples_per_rank)
            ddp.zero_grad_buffer()
            opt.zero_grad()
            reports = forward_backward_per_token(forward_step, it, ddp, num_mb)  # DDP + finalize_model_grads
            for p in model.parameters():
                p.grad = p.main_grad  # Megatron's DDP accumulates into main_grad
            opt.step()
            loss = global_loss(reports, pool)
            counts = [0] * world
            dist.all_gather_object(counts, num_mb, group=pool)
            if rank == 0:
                rings = collections.Counter(len(r) for r in last_global_batch(data).rings)
                print(f"step {step}  loss {loss:.4f}  tokens {int(seqlen_sum)}  microbatches/rank {counts}  "
                      f"ring sizes {dict(sorted(rings.items()))}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
