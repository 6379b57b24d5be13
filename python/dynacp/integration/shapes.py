"""CUDA-graph mode of the wrapper: every microbatch has one of a few declared shapes.

With ``Planner(static_shapes=dynacp.StaticShapes(...))`` the solver plans under the shapes and the wrapper emits
exactly them, so a runtime can capture one graph per shape ahead of time (:func:`declared_shapes`, the graph bank)
and replay it every step:

* **rows per rank** (tokens each rank of the ring holds) are one of ``token_buckets``: a microbatch whose
  sequences take fewer padded rows is padded up to the smallest bucket that holds them (the solver's
  ``bucket_of``). The extra rows form one padding-only sequence after the real ones (real length 0 in
  ``cu_seqlens``, its rows in ``cu_seqlens_padded``), built on each rank without moving over the network, so every
  real sequence keeps its balanced zigzag layout; only when the microbatch already has ``max_sequences``
  sequences do they extend the last sequence's end padding (the padding the zigzag layout already uses,
  :func:`~dynacp.integration.layout.padded_length`). Either way they carry ``loss_mask`` 0, label 0,
  ``sequence_ids`` -1, and no real token attends to them: loss and gradients are unchanged;
* **CP size** is one of ``cp_sizes``;
* **cu_seqlens** (and ``cu_seqlens_padded``) have exactly ``max_sequences + 1`` entries: the tail repeats the last
  offset (empty sequences), and ``max_seqlen`` is the fixed bound ``bucket rows x cp``;
* each rank runs at most ``max_microbatches`` microbatches per step.

:func:`check_plan` rejects a plan that breaks the shapes (a custom ``Planner.plan_fn``, or a solver bug) with a
``ValueError`` naming the group; the wrapper raises it on every rank as a slicing failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from dynacp.integration.layout import padded_length


@dataclass(frozen=True, order=True)
class MicrobatchShape:
    """The shape of one emitted microbatch: what a captured CUDA graph is specialised to."""

    cp_size: int
    """Ranks of the microbatch's CP ring (one of ``StaticShapes.cp_sizes`` in CUDA-graph mode)."""
    rows: int
    """Tokens (rows) each rank of the ring holds, padding included (one of ``StaticShapes.token_buckets``)."""
    cu_seqlens_len: int
    """Entries of ``cu_seqlens`` and ``cu_seqlens_padded`` (``StaticShapes.max_sequences + 1``)."""


def active(static_shapes: Optional[Any]) -> bool:
    """Whether ``static_shapes`` turns CUDA-graph mode on (``None`` and an empty ``dynacp.StaticShapes()`` do not)."""
    if static_shapes is None:
        return False
    enabled = getattr(static_shapes, "enabled", None)
    return bool(enabled()) if callable(enabled) else True


def _limit(value: Any) -> Optional[int]:
    """A StaticShapes bound (``max_microbatches``, ``max_sequences``): ``None`` for 0 (unbounded)."""
    return int(value) or None


def declared_shapes(static_shapes: Any) -> list[MicrobatchShape]:
    """Every shape CUDA-graph mode may emit: each CP size x each bucket, sorted (the graph bank to capture).
    ``ValueError`` when the shapes are off or leave ``max_sequences`` unbounded (0): a captured graph needs
    ``cu_seqlens`` of a fixed length."""
    if not active(static_shapes) or _limit(static_shapes.max_sequences) is None or not static_shapes.token_buckets:
        raise ValueError("dynacp: a CUDA-graph bank needs StaticShapes with token_buckets and max_sequences > 0 "
                         f"(got {describe(static_shapes)})")
    n = int(static_shapes.max_sequences) + 1
    return sorted(MicrobatchShape(int(cp), int(b), n) for cp in static_shapes.cp_sizes
                  for b in static_shapes.token_buckets)


def shape_of(microbatch: dict) -> MicrobatchShape:
    """The shape of an emitted microbatch dict (from its metadata, so it holds on every pipeline stage)."""
    return MicrobatchShape(len(microbatch["ring"]), int(microbatch["num_local_tokens"]),
                           len(microbatch["cu_seqlens"]))


def describe(static_shapes: Optional[Any]) -> Optional[dict]:
    """Plain-dict view of the shapes (for the config fingerprint and error messages)."""
    if not active(static_shapes):
        return None
    return {"token_buckets": [int(b) for b in static_shapes.token_buckets],
            "cp_sizes": [int(c) for c in static_shapes.cp_sizes],
            "max_microbatches": int(static_shapes.max_microbatches),
            "max_sequences": int(static_shapes.max_sequences)}


def group_padded(seq_lens: Sequence[int], cp: int, pad: int, static_shapes: Optional[Any]) -> list[int]:
    """Padded length of each sequence of one CP group of ``cp`` ranks (in group order), each to a multiple of
    ``pad * cp``. In CUDA-graph mode the rows up to the group's bucket follow as one more entry, a padding-only
    sequence (real length 0), when ``cu_seqlens`` has room for it (fewer than ``max_sequences`` sequences);
    otherwise they extend the last sequence's padding. The one place the wrapper decides how many rows a sequence
    occupies."""
    padded = [padded_length(int(n), cp, pad) for n in seq_lens]
    if not active(static_shapes) or not padded:
        return padded
    rows = sum(padded) // cp
    bucket = int(static_shapes.bucket_of(rows))
    if bucket < rows or bucket % pad:
        raise ValueError(f"dynacp: StaticShapes bucket {bucket} rows for a microbatch of {rows} rows per rank on "
                         f"{cp} ranks: buckets must hold the rows and be multiples of Cluster.seq_pad_multiple = "
                         f"{pad}")
    if bucket == rows:
        return padded
    room = _limit(static_shapes.max_sequences) is None or len(padded) < int(static_shapes.max_sequences)
    if room:
        return padded + [(bucket - rows) * cp]
    padded[-1] += (bucket - rows) * cp
    return padded


def fixed_length(cu: list[int], static_shapes: Optional[Any]) -> list[int]:
    """``cu`` (cumulative offsets) extended to ``max_sequences + 1`` entries with empty tail sequences (unchanged when
    the shapes are off or ``max_sequences`` is 0, unbounded)."""
    if not active(static_shapes) or _limit(static_shapes.max_sequences) is None:
        return cu
    n = int(static_shapes.max_sequences) + 1
    if len(cu) > n:
        raise ValueError(f"dynacp: a microbatch of {len(cu) - 1} sequences exceeds StaticShapes.max_sequences = "
                         f"{n - 1}")
    return cu + [cu[-1]] * (n - len(cu))


def check_plan(plan: Any, static_shapes: Optional[Any], pool_size: int) -> None:
    """Raise ``ValueError`` naming the first group of ``plan`` outside the shapes: a CP size not in ``cp_sizes``,
    more than ``max_sequences`` sequences, or a rank with more than ``max_microbatches`` microbatches (rows are
    checked when each group is padded, :func:`group_padded`; a bound of 0 or an empty list is unbounded)."""
    if not active(static_shapes):
        return
    sizes = {int(c) for c in static_shapes.cp_sizes} or {len(g.ranks) for slot in plan.microbatches for g in slot}
    max_seqs = _limit(static_shapes.max_sequences) or max((len(g.sequences) for slot in plan.microbatches
                                                           for g in slot), default=0)
    max_mb = _limit(static_shapes.max_microbatches) or len(plan.microbatches)
    per_rank = [0] * pool_size
    for k, slot in enumerate(plan.microbatches):
        for g in slot:
            where = f"slot {k}, ring {list(g.ranks)}"
            if len(g.ranks) not in sizes:
                raise ValueError(f"dynacp: plan {where}: CP size {len(g.ranks)} is not in StaticShapes.cp_sizes "
                                 f"{sorted(sizes)}")
            if len(g.sequences) > max_seqs:
                raise ValueError(f"dynacp: plan {where}: {len(g.sequences)} sequences > StaticShapes.max_sequences "
                                 f"= {max_seqs}")
            for r in g.ranks:
                per_rank[int(r)] += 1 if len(g.sequences) else 0
    worst = max(range(pool_size), key=lambda r: (per_rank[r], -r))
    if per_rank[worst] > max_mb:
        raise ValueError(f"dynacp: plan gives pool rank {worst} {per_rank[worst]} microbatches > "
                         f"StaticShapes.max_microbatches = {max_mb}")
