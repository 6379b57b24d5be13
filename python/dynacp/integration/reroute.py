"""Stage 3 of the wrapper: re-route samples so that every rank holds the CP slices its microbatches need.

Each sample's owner (the rank that read it) cuts the zigzag slice every member of its CP group needs
(:func:`cut`, through :func:`~dynacp.integration.slicing.slice_rows`) and sends it point to point
(:func:`exchange`: ``isend``/``irecv`` over the pool group, one message per rank pair that has rows to move), so
only needed rows travel; rows a rank both reads and holds are cut straight into its receive buffer.

Receives the plan from the planning stage (:mod:`dynacp.integration.planning`) and the samples from the gather
stage; hands this rank's microbatches (:func:`~dynacp.integration.slicing.build_microbatch`) and their
:class:`RerouteStats` to the iterator, which shares the metadata (:mod:`dynacp.integration.metadata`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

import dynacp
from dynacp.integration.gather import FIELDS, Gathered
from dynacp.integration.layout import cumulative
from dynacp.integration.shapes import check_plan, group_padded
from dynacp.integration.slicing import WIDTH, build_microbatch, slice_rows
from dynacp.integration.status import Timed

#: One microbatch of this rank in a route: (padded length of each sequence, slot, ring, ring position, sequence ids,
#: row ranges in the receive buffer).
Block = tuple[list[int], int, tuple[int, ...], int, list[int], list[tuple[int, int]]]


@dataclass
class RerouteStats:
    """What re-routing one global batch moved and held on this rank (all sizes in bytes).

    Every re-routed row is ``WIDTH`` int64 values (40 bytes): the four fields and the sequence id. A rank sends the
    rows it read that other ranks hold and receives the rows it holds that others read; nothing is sized by the
    number of ranks.
    """

    bytes_sent: int = 0
    """Bytes this rank sent to other ranks (``isend`` payloads)."""
    bytes_received: int = 0
    """Bytes this rank received from other ranks (``irecv`` payloads)."""
    local_bytes: int = 0
    """Bytes of rows this rank both read and holds (copied, never sent)."""
    messages_sent: int = 0
    """``isend`` calls: one per other rank that holds rows this rank read."""
    messages_received: int = 0
    """``irecv`` calls: one per other rank that read rows this rank holds."""
    peak_bytes: int = 0
    """Largest total of the re-route's own buffers alive at once: the send buffers and the receive buffer during the
    exchange (the receive buffer is one allocation of every row this rank holds). The input samples and the
    microbatch tensors handed out (``output_bytes``) are not counted, nor transient per-slice copies (at most one
    sequence slice's field)."""
    output_bytes: int = 0
    """Bytes of the microbatch tensors handed out (fields in their own dtypes plus int64 ``sequence_ids``)."""


@dataclass
class Route:
    """This rank's side of one re-route: filled send buffers, the receive buffer, and where each microbatch's rows
    will lie in it."""

    send: dict[int, torch.Tensor]
    """Other pool rank -> (rows, WIDTH) int64, in plan order (this rank's own entry is a view of ``recv``)."""
    recv: torch.Tensor
    """(held rows, WIDTH) int64, one region per source pool rank."""
    recv_at: dict[int, tuple[int, int]]
    """Source pool rank -> (first row, rows) of its region in ``recv``."""
    blocks: list[Block]
    """Per microbatch of this rank: (padded lengths, slot, ring, ring position, sequence ids, row ranges in recv)."""
    lengths: list[int]
    """Real length of every global sequence."""
    dtypes: dict[str, torch.dtype]
    """The fields' dtypes (the same on every rank)."""
    pad: int
    """Rows per sequence are padded to a multiple of ``pad * cp`` (``Cluster.seq_pad_multiple``)."""
    static_shapes: Optional[Any] = None
    """CUDA-graph mode's ``dynacp.StaticShapes`` (each group padded to its bucket), else ``None``."""


def _row_counts(plan: dynacp.Plan, owner: list[int], lengths: list[int], me: int, size: int,
                padded: dict[tuple[int, int], list[int]]) -> tuple[list[int], list[int]]:
    """Rows this rank sends to / receives from each pool rank (``padded``: per (slot, group) the padded length of
    each sequence); ``ValueError`` unless the plan schedules every sequence exactly once."""
    seen = [0] * len(lengths)
    send_rows, recv_rows = [0] * size, [0] * size
    for k, slot in enumerate(plan.microbatches):
        for j, g in enumerate(slot):
            cp = len(g.ranks)
            for s, p in zip(g.sequences, padded[k, j]):
                seen[s] += 1
                n = p // cp
                for dst in g.ranks:
                    if owner[s] == me:
                        send_rows[dst] += n
                    if dst == me:
                        recv_rows[owner[s]] += n
    if any(c != 1 for c in seen):
        bad = [s for s, c in enumerate(seen) if c != 1][:10]
        raise ValueError(f"dynacp: plan does not schedule every sequence exactly once (e.g. ids {bad})")
    return send_rows, recv_rows


def cut(plan: dynacp.Plan, pending: Gathered, me: int, size: int, pad: int,
        static_shapes: Optional[Any] = None) -> Route:
    """Cut this rank's (pool index ``me`` of ``size``) send buffers and lay out its receive buffer (local work,
    before any exchange). In CUDA-graph mode (``static_shapes``) the plan is checked against the shapes first and
    every group is padded to its bucket."""
    check_plan(plan, static_shapes, size)
    owner = [r for r, ls in enumerate(pending.lengths) for _ in ls]
    local = [i for ls in pending.lengths for i in range(len(ls))]
    lengths = pending.flat_lengths
    padded = {(k, j): group_padded([lengths[s] for s in g.sequences], len(g.ranks), pad, static_shapes)
              for k, slot in enumerate(plan.microbatches) for j, g in enumerate(slot)}
    send_rows, recv_rows = _row_counts(plan, owner, lengths, me, size, padded)
    starts = cumulative(recv_rows)
    recv = torch.empty(starts[-1], WIDTH, dtype=torch.int64)
    recv_at = {r: (starts[r], recv_rows[r]) for r in range(size) if recv_rows[r]}
    send = {d: torch.empty(send_rows[d], WIDTH, dtype=torch.int64) for d in range(size) if d != me and send_rows[d]}
    if send_rows[me]:  # rows this rank keeps are cut straight into its receive buffer
        send[me] = recv[starts[me]:starts[me] + recv_rows[me]]
    put, take = [0] * size, list(starts[:-1])
    blocks = []
    for k, slot in enumerate(plan.microbatches):
        for j, g in enumerate(slot):
            ring, cp = tuple(int(r) for r in g.ranks), len(g.ranks)
            pieces = []
            for s, p in zip(g.sequences, padded[k, j]):
                n = p // cp
                for i, dst in enumerate(ring):
                    if owner[s] == me:
                        slice_rows(pending.samples[local[s]], s, cp, i, send[dst][put[dst]:put[dst] + n], pad, p)
                        put[dst] += n
                if me in ring:
                    pieces.append((take[owner[s]], take[owner[s]] + n))
                    take[owner[s]] += n
            if me in ring and g.sequences:
                blocks.append((padded[k, j], k, ring, ring.index(me), list(g.sequences), pieces))
    return Route(send=send, recv=recv, recv_at=recv_at, blocks=blocks, lengths=lengths, dtypes=pending.dtypes,
                 pad=pad, static_shapes=static_shapes)


def exchange(route: Route, me: int, group: dist.ProcessGroup, pool: Timed) -> tuple[list[dict], RerouteStats]:
    """Post every ``isend``/``irecv`` of the re-route at once, wait for each under the timeout, then build this
    rank's microbatches from the receive buffer."""
    stats = RerouteStats()
    reqs = []
    for d, buf in route.send.items():
        if d != me:
            reqs.append((f"sending rows to pool rank {d}", dist.isend(buf, group=group, group_dst=d)))
            stats.bytes_sent += buf.nbytes
            stats.messages_sent += 1
    for r, (a, n) in route.recv_at.items():
        if r != me:
            reqs.append((f"receiving rows from pool rank {r}", dist.irecv(route.recv[a:a + n], group=group,
                                                                           group_src=r)))
            stats.bytes_received += n * WIDTH * 8
            stats.messages_received += 1
        else:
            stats.local_bytes += n * WIDTH * 8
    stats.peak_bytes = route.recv.nbytes + sum(b.nbytes for d, b in route.send.items() if d != me)
    started = time.monotonic()
    for what, req in reqs:
        pool.wait(req, f"the re-route ({what})", started)
    route.send.clear()
    micro = [build_microbatch(route.recv, route.dtypes, route.lengths, *block[:1], route.static_shapes, *block[1:])
             for block in route.blocks]
    stats.output_bytes = sum(mb[k].nbytes for mb in micro for k in (*FIELDS, "sequence_ids"))
    return micro, stats
