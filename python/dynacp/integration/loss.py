"""Per-token loss normalisation over the whole global batch, and FLOPs from real THD lengths.

Under dynamic CP every token lives on exactly one rank of the DP x CP pool, so:

* each rank returns its **local** masked loss sum and valid-token count (no CP all-reduce: that would count a CP
  group's tokens once per member, the bug verl hit);
* the count is summed **once** over the DP x CP pool (:func:`reduce_num_tokens`), or taken from the wrapper's
  ``GlobalBatch.num_valid_tokens`` which is the same number known before the step;
* gradients are summed over the pool and scaled by ``1 / count`` (:func:`finalize_grads`), never by
  ``1 / num_microbatches`` (ranks run different numbers of microbatches).
"""

from __future__ import annotations

from typing import Iterable, Optional, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dynacp.integration.config import ProcessGroups


def masked_token_loss(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Σ mask * CE, Σ mask)`` over local tokens: the loss sum to backpropagate and the local valid count."""
    mask = loss_mask.to(logits.dtype)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), reduction="none")
    return (ce * mask.reshape(-1)).sum(), mask.sum().detach()


def reduce_num_tokens(num_tokens: Union[int, float, torch.Tensor], groups: ProcessGroups) -> torch.Tensor:
    """Σ of the local valid-token counts over the DP x CP pool (one all-reduce; CP members are not duplicates)."""
    t = torch.as_tensor(num_tokens, dtype=torch.float64).clone().reshape(1)
    dist.all_reduce(t, group=groups.dp_cp)
    return t[0]


def finalize_grads(params: Iterable[torch.nn.Parameter], groups: ProcessGroups,
                   num_tokens: Union[int, float, torch.Tensor]) -> None:
    """Sum gradients over the DP x CP pool and scale them by ``1 / max(num_tokens, 1)``.

    Call after backpropagating every local loss *sum*. ``num_tokens`` is the global valid-token count
    (:func:`reduce_num_tokens` or ``GlobalBatch.num_valid_tokens``). Gradients are flattened into one buffer
    per dtype so there is a single all-reduce per dtype.
    """
    scale = 1.0 / max(float(num_tokens), 1.0)
    grads = [p.grad for p in params if p.grad is not None]
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for gs in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in gs])
        dist.all_reduce(flat, group=groups.dp_cp)
        flat.mul_(scale)
        off = 0
        for g in gs:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()


def report_loss(loss_sum: Union[float, torch.Tensor], num_tokens: Union[float, torch.Tensor],
                groups: ProcessGroups) -> float:
    """Global per-token loss for logging: Σ loss / Σ tokens over the pool (the same normalisation as backward)."""
    t = torch.tensor([float(loss_sum), float(num_tokens)], dtype=torch.float64)
    dist.all_reduce(t, group=groups.dp_cp)
    return float(t[0] / max(float(t[1]), 1.0))


def gpt_flops(seqlen_sum: int, seqlen_squared_sum: int, *, num_layers: int, hidden: int, vocab: int,
              ffn_hidden: Optional[int] = None, causal: bool = True, backward: bool = True) -> float:
    """Model FLOPs of one global batch of a GPT from real THD lengths (Σs for dense work, Σs² for attention).

    Per layer and token: QKV + output projections ``2 * 4h²``, MLP ``2 * 2 * h * ffn``; attention scores and values
    ``2 * 2 * h * s`` per token of a sequence of length ``s`` (halved for causal masks); LM head ``2 * h * vocab``.
    ``backward=True`` counts forward + backward as 3x forward.
    """
    ffn = 4 * hidden if ffn_hidden is None else ffn_hidden
    dense = seqlen_sum * (num_layers * (8 * hidden * hidden + 4 * hidden * ffn) + 2 * hidden * vocab)
    attn = num_layers * 4 * hidden * seqlen_squared_sum * (0.5 if causal else 1.0)
    return float(dense + attn) * (3.0 if backward else 1.0)
