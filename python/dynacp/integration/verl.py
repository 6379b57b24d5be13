"""verl's sequence-length balancing, backed by dynacp's balancer.

Drop-in replacements for ``verl.utils.seqlen_balancing.get_seqlen_balanced_partitions`` and
``rearrange_micro_batches`` (verl 0.9.1): same arguments, same return values, same contract -- by default the numbers
given are what is balanced (for ``rearrange_micro_batches``, verl's per-sequence workload ``24576 s + s^2``, as verl
does). ``balance_by="cost"`` balances dynacp's cost-model time per sequence instead (attention grows with s^2, linear
work with s; docs/cost_model.md). The partitioning is :func:`dynacp.balance` (Karmarkar-Karp and LPT, each improved
by swaps and moves, the better kept; C++). verl is not imported. Switching a verl trainer is one import::

    from dynacp.integration.verl import get_seqlen_balanced_partitions, rearrange_micro_batches

Differences from verl: bad input raises ``ValueError`` naming it (verl asserts); everything else -- index lists sorted
inside each partition, no empty partition, the micro-batch count search under ``max_token_len``, the DP all-reduces,
the heaviest-in-the-middle order of micro-batches -- follows verl's documented contract (docs/integration.md).
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from dynacp import _core
from dynacp.balance import balance

log = logging.getLogger("dynacp")

BALANCE_BY = ("given", "cost")


def verl_workload(seqlens: np.ndarray) -> np.ndarray:
    """verl's workload proxy for one sequence of ``s`` tokens: ``24576 s + s^2`` (a 7B dense model's FLOPs up to a
    constant; what verl's ``rearrange_micro_batches`` balances)."""
    s = np.asarray(seqlens, dtype=np.float64)
    return 24576.0 * s + s * s


def cost_workload(seqlens: Sequence[int], cost: Optional[_core.CostModel] = None) -> np.ndarray:
    """Seconds one sequence of ``s`` tokens takes alone on one rank under ``cost`` (default ``CostModel()``), without
    the per-group overhead (paid once per micro-batch, not per sequence): causal attention ~ s^2 plus linear ~ s."""
    cost = cost or _core.CostModel()
    one = _core.Cluster(num_ranks=1, ranks_per_node=1)
    c = cost.group_overhead
    memo: dict = {}
    out = np.empty(len(seqlens), dtype=np.float64)
    for i, s in enumerate(seqlens):
        s = int(s)
        if s not in memo:
            memo[s] = cost.time([s], 1, one) - c if s > 0 else 0.0
        out[i] = memo[s]
    return out


def _weights(values: Sequence[float], balance_by: str, cost: Optional[_core.CostModel]) -> np.ndarray:
    if balance_by not in BALANCE_BY:
        raise ValueError(f"balance_by must be one of {BALANCE_BY}, got {balance_by!r}")
    return np.asarray(values, dtype=np.float64) if balance_by == "given" else cost_workload(values, cost)


def _no_empty_part(parts: List[List[int]], w: np.ndarray) -> List[List[int]]:
    """Give every empty part the lightest item of a part holding several (only zero weights can leave one empty when
    there are at least as many items as parts); this never raises the heaviest part."""
    for p in parts:
        if not p:
            donor = max((q for q in parts if len(q) > 1), key=lambda q: (len(q), -min(w[i] for i in q)))
            item = min(donor, key=lambda i: (w[i], i))
            donor.remove(item)
            p.append(item)
    return parts


def get_seqlen_balanced_partitions(seqlen_list: Sequence[float], k_partitions: int, equal_size: bool, *,
                                   balance_by: str = "given", cost: Optional[_core.CostModel] = None) -> List[List[int]]:
    """Split item indices into ``k_partitions`` parts whose sums of ``seqlen_list`` are balanced (verl's contract).

    Args:
        seqlen_list: one non-negative number per item; what is balanced (verl: sequence lengths or workloads).
        k_partitions: number of parts, ``1 <= k_partitions <= len(seqlen_list)``.
        equal_size: every part gets ``len(seqlen_list) / k_partitions`` items (must divide evenly).
        balance_by: ``"given"`` (default) balances the numbers as given; ``"cost"`` reads them as sequence lengths in
            tokens and balances dynacp's cost-model time of each sequence (:func:`cost_workload`).
        cost: the cost model for ``balance_by="cost"`` (default ``CostModel()``).

    Returns:
        ``k_partitions`` lists of indices, each sorted ascending and non-empty; every index appears exactly once.
        The heaviest part is what dynacp's ``balance(method="best")`` minimises.

    Raises:
        ValueError: fewer items than parts, ``equal_size`` with a count that does not divide, negative or non-finite
            numbers, or an unknown ``balance_by``.
    """
    n = len(seqlen_list)
    if isinstance(k_partitions, bool) or int(k_partitions) != k_partitions or k_partitions < 1:
        raise ValueError(f"k_partitions must be a positive integer, got {k_partitions!r}")
    k = int(k_partitions)
    if n < k:
        raise ValueError(f"number of items ({n}) < k_partitions ({k}): every partition must get at least one item")
    if equal_size and n % k:
        raise ValueError(f"equal_size needs the number of items ({n}) to be a multiple of k_partitions ({k})")
    w = _weights(seqlen_list, balance_by, cost)
    parts = [list(p) for p in balance(w, k, equal_count=bool(equal_size), method="best")]
    return [sorted(p) for p in _no_empty_part(parts, w)]


def _seq_lens(batch: Any) -> Tuple[Any, int]:
    """Effective lengths (tensor) and the padded width, as verl reads them: nested ``input_ids`` give their row
    lengths, else the ``attention_mask`` row sums and its width."""
    input_ids = batch["input_ids"] if "input_ids" in batch.keys() else None
    if input_ids is not None and getattr(input_ids, "is_nested", False):
        lens = input_ids.offsets().diff()
        return lens, int(lens.max())
    mask = batch["attention_mask"]
    return mask.sum(dim=1), int(mask.shape[-1])


def _select_rows(batch: Any, idx: List[int]) -> Any:
    """Rows ``idx`` of every field of ``batch`` (a dict of tensors, or a TensorDict); nested tensors are rebuilt."""
    import torch

    index = torch.tensor(idx, dtype=torch.long)
    if not isinstance(batch, dict):
        return batch[index]  # TensorDict and friends index their batch dimension
    out = {}
    for key, v in batch.items():
        if isinstance(v, torch.Tensor) and v.is_nested:
            rows = v.unbind()
            out[key] = torch.nested.as_nested_tensor([rows[i] for i in idx], layout=v.layout)
        elif isinstance(v, torch.Tensor):
            out[key] = v.index_select(0, index.to(v.device))
        else:
            out[key] = [v[i] for i in idx]
    return out


def _all_reduce(values: List[int], op: Any, group: Any, device: Any) -> List[int]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.long, device=device)
    dist.all_reduce(t, op=op, group=group)
    return [int(x) for x in t.cpu().tolist()]


def rearrange_micro_batches(batch: Any, max_token_len: int, dp_group: Any = None,
                            num_batches_divided_by: Optional[int] = None, same_micro_num_in_dp: bool = True,
                            min_num_micro_batch: Optional[int] = None, use_dynamic_bsz_balance: bool = True,
                            force_group_size: int = 1, *, balance_by: str = "given",
                            cost: Optional[_core.CostModel] = None) -> Tuple[List[Any], List[List[int]]]:
    """Split a batch into micro-batches of at most ``max_token_len`` real tokens with balanced workloads (verl's
    contract and arguments).

    The count starts at ``min(groups, ceil(total tokens / max_token_len))``, at least ``min_num_micro_batch``, the
    maximum over ``dp_group`` when ``same_micro_num_in_dp`` (all-reduce), rounded up to a multiple of
    ``num_batches_divided_by``; groups of ``force_group_size`` consecutive samples stay together; the groups'
    workloads are balanced into that many micro-batches, and the count grows (by ``num_batches_divided_by`` or 1,
    agreed over ``dp_group``) until every micro-batch holds at most ``max_token_len`` tokens. With
    ``use_dynamic_bsz_balance`` the micro-batches are ordered heaviest in the middle, lighter towards both ends.

    Args:
        batch: a dict of tensors or a TensorDict with ``attention_mask`` (B x S) or nested ``input_ids``.
        max_token_len: most real tokens per micro-batch.
        balance_by: ``"given"`` (default) balances verl's workload ``24576 s + s^2`` (:func:`verl_workload`), as verl
            does; ``"cost"`` balances dynacp's cost-model time per sequence (:func:`cost_workload`).
        cost: the cost model for ``balance_by="cost"``.
        (the other arguments are verl's.)

    Returns:
        ``(micro_batches, indices)``: the micro-batches (same type as ``batch``) and, per micro-batch, the original
        row indices it holds.

    Raises:
        ValueError: ``max_token_len`` below the padded width, a batch size not divisible by ``force_group_size``, a
            group longer than ``max_token_len``, or a limit that no count up to the number of groups can meet.
    """
    import torch.distributed as dist

    lens_t, width = _seq_lens(batch)
    if max_token_len < width:
        raise ValueError(f"max_token_len ({max_token_len}) must be >= the sequence length ({width})")
    lens = np.asarray(lens_t.cpu().tolist(), dtype=np.int64)
    if force_group_size < 1 or lens.size % force_group_size:
        raise ValueError(f"batch size {lens.size} must be divisible by force_group_size {force_group_size}")
    groups = lens.size // force_group_size
    if balance_by not in BALANCE_BY:
        raise ValueError(f"balance_by must be one of {BALANCE_BY}, got {balance_by!r}")
    work = verl_workload(lens) if balance_by == "given" else cost_workload(lens, cost)
    group_work = work.reshape(groups, force_group_size).sum(axis=1)
    group_tokens = lens.reshape(groups, force_group_size).sum(axis=1)
    count = min(groups, -(-int(lens.sum()) // max_token_len))
    if min_num_micro_batch is not None:
        count = max(int(min_num_micro_batch), count)
    sync = dist.is_available() and dist.is_initialized() and same_micro_num_in_dp and dp_group is not None
    device = lens_t.device
    longest, least_groups = int(group_tokens.max()), groups
    if sync:
        count = _all_reduce([count], dist.ReduceOp.MAX, dp_group, device)[0]
        longest, neg = _all_reduce([longest, -groups], dist.ReduceOp.MAX, dp_group, device)
        least_groups = -neg
    if num_batches_divided_by:
        count = -(-count // num_batches_divided_by) * num_batches_divided_by
    if longest > max_token_len:
        raise ValueError(f"a group of {force_group_size} sample(s) holds {longest} tokens, more than max_token_len "
                         f"({max_token_len}); it cannot be split")
    parts = _parts_within_limit(group_work, group_tokens, count, max_token_len, num_batches_divided_by or 1,
                                least_groups, (dp_group, device) if sync else None)
    if use_dynamic_bsz_balance:
        parts.sort(key=lambda p: (float(group_work[p].sum()), p[0]), reverse=True)
        parts = parts[::2][::-1] + parts[1::2]
    indices = [[g * force_group_size + j for g in p for j in range(force_group_size)] for p in parts]
    return [_select_rows(batch, idx) for idx in indices], indices


def _parts_within_limit(work: np.ndarray, tokens: np.ndarray, count: int, limit: int, step: int, least_groups: int,
                        sync: Optional[Tuple[Any, Any]]) -> List[List[int]]:
    """Balanced parts of the groups, the count raised by ``step`` until every part holds at most ``limit`` tokens
    (agreed over the DP group when ``sync`` is ``(group, device)``)."""
    import torch.distributed as dist

    while True:
        if count > least_groups:
            raise ValueError(f"cannot keep every micro-batch within max_token_len ({limit} tokens) with the same count "
                             f"on every DP rank: {count} micro-batches are needed but a rank has only {least_groups} "
                             "groups")
        parts = get_seqlen_balanced_partitions(work, count, equal_size=False)
        ok = all(int(tokens[p].sum()) <= limit for p in parts)
        if sync is not None:
            ok = bool(_all_reduce([int(ok)], dist.ReduceOp.MIN, sync[0], sync[1])[0])
        if ok:
            return parts
        count += step
