"""Zigzag CP layout of packed (THD) microbatches: padding rule and per-rank row selection.

This is the integration's single home for zigzag slicing. It follows the runtime's rule
(``include/dynacp/runtime/layout.hpp``): a sequence of length ``L`` on a CP group of size ``cp`` is padded at its end to
``ceil(L / 2cp) * 2cp`` tokens (``L == 0`` stays empty), split into ``2cp`` equal chunks, and rank ``i`` of the group
(its position in the ring) holds chunks ``i`` and ``2cp - 1 - i``. Local rows of a rank are therefore
``cu_seqlens_padded / cp`` apart for every sequence, on every rank of the group.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch


def padded_length(length: int, cp: int, multiple: int = 2) -> int:
    """Tokens a sequence of ``length`` occupies in the padded layout of a CP group of size ``cp``: the next multiple of
    ``multiple * cp`` (``Cluster.seq_pad_multiple``; 2 for zigzag, ``lcm(2, tp)`` with sequence parallelism)."""
    if cp < 1:
        raise ValueError(f"cp must be >= 1, got {cp}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if multiple < 2 or multiple % 2:
        raise ValueError(f"the pad multiple must be even and >= 2 for zigzag sharding (Cluster.seq_pad_multiple), "
                         f"got {multiple}")
    m = multiple * cp
    return -(-length // m) * m


def cumulative(lengths: Sequence[int]) -> list[int]:
    """``[0, l0, l0 + l1, ...]``."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out


def zigzag_chunk_rows(padded_len: int, cp: int, rank: int) -> torch.Tensor:
    """Rows (0-based, within one padded sequence) that ring position ``rank`` of a ``cp`` group holds, in local order."""
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} out of range for cp {cp}")
    if padded_len % (2 * cp):
        raise ValueError(f"padded length {padded_len} is not a multiple of 2*cp = {2 * cp}")
    c = padded_len // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c)
    j = 2 * cp - 1 - rank
    second = torch.arange(j * c, (j + 1) * c)
    return torch.cat([first, second])


def zigzag_global_rows(cu_seqlens_padded: Sequence[int], cp: int, rank: int) -> torch.Tensor:
    """For each local row of ``rank``, its row in the padded packed (global) layout."""
    parts = []
    for b in range(len(cu_seqlens_padded) - 1):
        start, end = int(cu_seqlens_padded[b]), int(cu_seqlens_padded[b + 1])
        parts.append(zigzag_chunk_rows(end - start, cp, rank) + start)
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _python_zigzag_rows(cu_seqlens: Sequence[int], cp: int, rank: int,
                        cu_seqlens_padded: Optional[Sequence[int]] = None) -> torch.Tensor:
    parts = []
    for b in range(len(cu_seqlens) - 1):
        start, n = int(cu_seqlens[b]), int(cu_seqlens[b + 1]) - int(cu_seqlens[b])
        padded = padded_length(n, cp) if cu_seqlens_padded is None else \
            int(cu_seqlens_padded[b + 1]) - int(cu_seqlens_padded[b])
        rows = zigzag_chunk_rows(padded, cp, rank)
        parts.append(torch.where(rows < n, rows + start, torch.full_like(rows, -1)))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def zigzag_rows(cu_seqlens: Sequence[int], cp: int, rank: int,
                cu_seqlens_padded: Optional[Sequence[int]] = None) -> torch.Tensor:
    """For each local row of ring position ``rank``, the row of the real token it holds in the unpadded packed batch
    (``cu_seqlens``), or -1 for a padding row; ``cu_seqlens_padded`` gives the padded layout (default: each length
    padded to a multiple of ``2 * cp``). Delegates to the runtime's ``_core.zigzag_rows`` when the loaded extension
    has it (same rule), so integration and ring attention can never disagree on the layout."""
    try:
        from dynacp import _core
        fn = getattr(_core, "zigzag_rows", None)
    except Exception:  # pragma: no cover
        fn = None
    if fn is None:
        return _python_zigzag_rows(cu_seqlens, cp, rank, cu_seqlens_padded)
    import numpy as np
    padded = None if cu_seqlens_padded is None else np.asarray(list(cu_seqlens_padded), dtype=np.int64)
    return torch.from_numpy(np.asarray(fn(np.asarray(list(cu_seqlens), dtype=np.int64), cp, rank, padded),
                                       dtype=np.int64))
