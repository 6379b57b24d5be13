"""A tiny GPT in plain PyTorch over packed THD tokens, with attention injected (for the example and the tests).

Everything but attention is per token, so a zigzag CP slice of a microbatch runs through the model unchanged;
the injected ``attention(q, k, v)`` callable sees this rank's rows and does the cross-token (and cross-rank) work.
:func:`microbatch_loss` runs one of the wrapper's microbatches through it with CP attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from dynacp.integration.attention import cp_attention
from dynacp.integration.loss import masked_token_loss

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TinyGPTConfig:
    """Model shape."""

    vocab: int = 97
    """Vocabulary size."""
    hidden: int = 32
    """Model width."""
    heads: int = 4
    """Attention heads (hidden must be divisible)."""
    layers: int = 2
    """Transformer blocks."""
    max_positions: int = 4096
    """Learned position embeddings (position_ids must stay below)."""


class Block(nn.Module):
    def __init__(self, cfg: TinyGPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.fc1 = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.fc2 = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, attention: Attention) -> torch.Tensor:
        t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(t, 3, self.heads, h // self.heads).unbind(1)
        x = x + self.proj(attention(q, k, v).reshape(t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Decoder-only transformer: ``forward(tokens (T,), position_ids (T,), attention) -> logits (T, vocab)``."""

    def __init__(self, cfg: TinyGPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention: Attention) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(position_ids)
        for b in self.blocks:
            x = b(x, attention)
        return self.head(self.ln_f(x))


def microbatch_loss(model: TinyGPT, mb: dict, **attention: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward one of the wrapper's microbatches (``GlobalBatch.microbatches`` entry) through ``model`` with
    :func:`~dynacp.integration.attention.cp_attention` on its ``packed_seq_params`` (``attention``: its keyword
    arguments, e.g. ``impl=``, ``cp_ring=``): ``(Σ masked token loss, Σ loss_mask)`` of this rank's rows."""
    p = mb["packed_seq_params"]
    logits = model(mb["tokens"], mb["position_ids"], lambda q, k, v: cp_attention(q, k, v, p, **attention))
    return masked_token_loss(logits, mb["labels"], mb["loss_mask"])
