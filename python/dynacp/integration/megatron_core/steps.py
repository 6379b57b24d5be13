"""Megatron's per-token loss path for dynacp microbatches: ``loss_func`` and ``forward_step`` with Megatron's
conventions, and, for the CPU where Megatron's schedules cannot run, the same forward/backward steps.

With ``TransformerConfig(calculate_per_token_loss=True)`` Megatron's schedules backpropagate each microbatch's loss
*sum* (no division by the number of microbatches, which differs per rank under dynacp), add up the token counts
``loss_func`` returns, and hand the total to ``finalize_model_grads``, which sums it over the DP x CP group and scales
the gradients Megatron's ``DistributedDataParallel`` summed over that group by its inverse: the gradient of the whole
global batch's per-token mean. Megatron's static ``context_parallel_size`` stays 1 (dynacp's rings are the CP), so
that group is the whole DP x CP pool dynacp plans over, and no loss is all-reduced over a CP group (every token lives
on exactly one rank).
"""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Callable, Iterator, List, Optional, Union

import torch
import torch.distributed as dist

from dynacp.integration.config import ProcessGroups
from dynacp.integration.loss import report_loss
from dynacp.integration.megatron_core.batch import megatron_inputs


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple:
    """Megatron-LM's GPT ``loss_func`` convention for ``calculate_per_token_loss=True``: ``(loss_sum, num_tokens,
    {"lm loss": [loss_sum, num_tokens]})`` over this rank's rows of the microbatch -- ``output_tensor`` the
    per-token losses ``GPTModel`` returns when given labels, ``loss_mask`` 0 / 1 per row (padding rows are 0)."""
    losses = output_tensor.reshape(-1).float()
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.detach().reshape(1), num_tokens.reshape(1).float()])}


def forward_step(data_iterator: Iterator[dict], model: torch.nn.Module) -> tuple:
    """Megatron's ``forward_step_func`` for a dynacp microbatch iterator: runs ``model`` (a ``GPTModel``, DDP-wrapped
    or not) on the next microbatch (:func:`~dynacp.integration.megatron_core.batch.megatron_inputs`) with its labels
    and returns ``(per-token losses, partial(loss_func, loss_mask))``."""
    x = megatron_inputs(next(data_iterator))
    out = model(x["input_ids"], x["position_ids"], None, labels=x["labels"], loss_mask=x["loss_mask"],
                packed_seq_params=x["packed_seq_params"], padding_mask=x["padding_mask"])
    return out, partial(loss_func, x["loss_mask"])


def forward_backward_per_token(forward_step_func: Callable, data_iterator: Iterator[dict], model: torch.nn.Module,
                               num_microbatches: int,
                               finalize_model_grads_func: Optional[Callable] = None) -> List[dict]:
    """The training steps of Megatron's ``forward_backward_no_pipelining`` with ``calculate_per_token_loss=True``,
    for machines where that schedule cannot run (it creates its token counter with ``device="cuda"``): for each of
    this rank's ``num_microbatches`` microbatches, ``forward_step_func(data_iterator, model)``, the loss function it
    returns, backward of the loss *sum* (gradient sync deferred by the DDP wrapper's ``no_sync`` until the last
    microbatch, as Megatron does); then ``finalize_model_grads_func([model], total_num_tokens)`` (default Megatron's
    ``finalize_model_grads``: gradients reduced over the DP x CP group and scaled by ``1 / Σ num_tokens`` of the
    whole global batch). Returns the loss functions' report dicts, in order. On GPUs use Megatron's own schedule
    (``get_forward_backward_func()``) with :func:`forward_step`; the steps are the same."""
    if finalize_model_grads_func is None:
        from megatron.core.distributed import finalize_model_grads as finalize_model_grads_func
    total = torch.zeros([], dtype=torch.int)
    reports = []
    no_sync = getattr(model, "no_sync", contextlib.nullcontext)
    for i in range(num_microbatches):
        with no_sync() if i < num_microbatches - 1 else contextlib.nullcontext():
            output, loss_fn = forward_step_func(data_iterator, model)
            loss, num_tokens, report = loss_fn(output)
            loss.backward()
        total += num_tokens.to(total.device)
        reports.append(report)
    finalize_model_grads_func([model], num_tokens=total)
    return reports


def global_loss(reports: List[dict], groups: Union[ProcessGroups, dist.ProcessGroup]) -> float:
    """The global batch's per-token loss from every rank's ``loss_func`` reports: Σ loss / Σ tokens over the DP x CP
    pool (``groups``: dynacp's ProcessGroups or the DP x CP process group itself;
    :func:`~dynacp.integration.loss.report_loss`), the normalisation the gradient used."""
    total = sum((r["lm loss"].detach().to(torch.float64).cpu() for r in reports), torch.zeros(2, dtype=torch.float64))
    pool = groups if isinstance(groups, ProcessGroups) else ProcessGroups(dp_cp=groups, pool_ranks=[], cp_pool=None)
    return report_loss(total[0], total[1], pool)


__all__ = ["forward_backward_per_token", "forward_step", "global_loss", "loss_func"]
