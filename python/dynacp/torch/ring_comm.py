"""Communication of the Python ring loop (see docs/runtime.md): ring-neighbour P2P over one process group
(:class:`PoolP2P`), the group warm-up before the first P2P (:func:`warm_up_group`), host staging of device buffers
over gloo (:func:`needs_host_staging`) and the in-process ring whose members are threads (:class:`LocalHub`,
:class:`LocalComm`, :func:`run_local_ring`).

Every hop is posted with ``dist.batch_isend_irecv`` and waited for only when its buffer is needed; on NCCL
``Work.wait()`` makes the current stream wait (no host sync), on gloo it waits with the ring's timeout.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

log = logging.getLogger("dynacp")

Recorder = Callable[[str, int], None]
"""``recorder(event, index)``: called with ("post_kv", hop), ("post_dkv", hop), ("wait_kv", hop), ("wait_dkv", hop);
("stage_kv", hop) / ("stage_dkv", hop) when a hop goes through host memory; ("warm_up", group size) when the ring
set-up ran the group's warm-up collective."""

_WARM_GROUPS: weakref.WeakSet = weakref.WeakSet()
"""Process groups that have had their warm-up collective in this process (the one cache of this module: a fact
about a live torch object, dropped with it)."""


def backend_name(group) -> str:
    """The backend of ``group`` as a lower-case string ("gloo", "nccl", ...)."""
    return str(dist.get_backend(group)).lower()


def needs_host_staging(device: torch.device, group) -> bool:
    """Whether ring buffers on ``device`` go through host copies: device (non-CPU) tensors over a gloo group (gloo's
    P2P moves CPU tensors). NCCL (or any backend other than gloo) gets the device buffers themselves."""
    return device.type != "cpu" and backend_name(group) == "gloo"


def _eagerly_initialised(group) -> bool:
    """Whether torch created the group's NCCL communicator at group creation (``init_process_group(device_id=...)``
    binds a device and initialises eagerly; groups made afterwards inherit it)."""
    return getattr(group, "bound_device_id", None) is not None


def warm_up_group(group=None, device: Optional[torch.device] = None, timeout: float = 60.0,
                  recorder: Optional[Recorder] = None) -> int:
    """One collective (a sum of ones) on ``group``, once per group object in this process; returns the group size
    the collective counted (0 when the group was already warmed up and nothing ran).

    torch documents that the first ``batch_isend_irecv`` on an NCCL group must involve every rank of the group
    (the communicator is created lazily, by all ranks together); later ones may involve any subset. The ring's
    P2P involves only a ring's members, so every rank of the group must call this together once before the first
    ring on a part of the group, e.g. where the DP x CP pool group is built. A ring that spans the whole group runs
    it by itself (every rank of the group is a ring member). ``device``: where the collective's tensor lives on a
    non-gloo backend (default the current CUDA device). Raises TimeoutError after ``timeout`` seconds."""
    group = group if group is not None else dist.group.WORLD
    if group in _WARM_GROUPS:
        return 0
    size = dist.get_world_size(group)
    if backend_name(group) == "gloo":
        dev = torch.device("cpu")
    else:
        dev = device if device is not None and device.type != "cpu" else torch.device("cuda", torch.cuda.current_device())
    ones = torch.ones(1, dtype=torch.int64, device=dev)
    work = dist.all_reduce(ones, group=group, async_op=True)
    me = dist.get_rank()
    others = [r for r in dist.get_process_group_ranks(group) if r != me]
    who = ("peer " if len(others) == 1 else "peers ") + ", ".join(map(str, others))
    message = (f"global rank {me}: the warm-up all_reduce on the ring's process group ({size} ranks) did not "
               f"complete within {timeout:g} s ({who} did not join; every rank of a group must make its first "
               "ring_attention call on it together, or call dynacp.torch.ring_loop.warm_up_group(group) on every "
               "rank once after creating the group)")
    try:
        ok = work.wait(timeout=timedelta(seconds=timeout))
    except RuntimeError as e:
        raise TimeoutError(f"{message}: {e}") from e
    if ok is False:
        raise TimeoutError(message)
    counted = int(ones.item())
    if counted != size:
        raise RuntimeError(f"global rank {me}: the warm-up all_reduce on a group of {size} ranks counted {counted}")
    _WARM_GROUPS.add(group)
    if recorder:
        recorder("warm_up", counted)
    return counted


def ensure_warm(group, ring_ranks: Sequence[int], device: torch.device, timeout: float,
                 recorder: Optional[Recorder]) -> None:
    """The ring set-up's part of :func:`warm_up_group`: a ring over the whole group warms the group up itself; a
    ring over part of a group that was never warmed up is fine on gloo (nothing is initialised lazily) and on an
    eagerly initialised NCCL group, and an error naming the fix otherwise (the first P2P would hang)."""
    if group in _WARM_GROUPS:
        return
    size = dist.get_world_size(group)
    if len(set(ring_ranks)) == size:
        warm_up_group(group, device, timeout, recorder)
        return
    if backend_name(group) == "gloo" or _eagerly_initialised(group):
        return
    raise RuntimeError(
        f"dynacp ring attention: the first P2P on this {backend_name(group)} group ({size} ranks) would involve "
        f"only the ring's {len(ring_ranks)} ranks, which torch leaves undefined (the communicator is created by the "
        "first collective, with every rank). Call dynacp.torch.ring_loop.warm_up_group(group) on every rank of the "
        "group once after creating it (e.g. where the DP x CP pool group is built), or initialise torch.distributed "
        "eagerly with init_process_group(..., device_id=torch.device('cuda', local_rank)).")


class _Hop:
    """One posted hop (a send to the next and a receive from the previous ring member), waited against one deadline
    on gloo (``timeout`` seconds from the wait); ``timeout=None`` (NCCL) waits stream-ordered, without a host sync.
    With host staging, ``landing`` is the (device buffer, host buffer) pair the received bytes are copied from."""

    def __init__(self, works, what: str, timeout: Optional[float], rank: int, peers: tuple[int, int],
                 landing: Optional[tuple[torch.Tensor, torch.Tensor]] = None, keep: Optional[torch.Tensor] = None):
        self.works, self.what, self.timeout, self.rank, self.peers = works, what, timeout, rank, peers
        self.landing, self.keep = landing, keep  # keep: the host copy of the send in flight

    def wait(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for work in self.works:
            try:
                if deadline is None:
                    ok = work.wait()
                else:
                    ok = work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 1e-3)))
            except RuntimeError as e:
                raise TimeoutError(self._message() + f": {e}") from e
            if ok is False:
                raise TimeoutError(self._message())
        if self.landing is not None:
            self.landing[0].copy_(self.landing[1])
        self.keep = None

    def _message(self) -> str:
        return (f"ring member {self.rank}: {self.what} (send to peer {self.peers[0]}, receive from peer "
                f"{self.peers[1]}; global ranks) did not complete within {self.timeout:g} s (a neighbour did not "
                "answer; every ring member must run the same ring with the same cu_seqlens)")


class PoolP2P:
    """Ring-neighbour P2P over one process group (the pool): ``ranks`` are the group ranks of the ring, in ring
    order. No group per ring: peers are translated to global ranks and messages carry per-kind tags.

    Device tensors over gloo travel through host copies (:func:`needs_host_staging`). The first ring on a group runs
    the group's warm-up collective when needed (see :func:`warm_up_group`)."""

    def __init__(self, group, ranks: Sequence[int], timeout: float, recorder: Optional[Recorder] = None,
                 device: Optional[torch.device] = None):
        device = device if device is not None else torch.device("cpu")  # where the ring's tensors live
        self.group = group
        me = dist.get_rank(group)
        if me not in ranks:
            raise ValueError(f"group rank {me} is not a member of the ring {list(ranks)}")
        self.index, self.size = list(ranks).index(me), len(ranks)
        self.next = dist.get_global_rank(group, ranks[(self.index + 1) % self.size])
        self.prev = dist.get_global_rank(group, ranks[(self.index - 1) % self.size])
        gloo = backend_name(group) == "gloo"
        self.timeout = timeout if gloo else None  # NCCL: stream-ordered wait, the group's watchdog catches hangs
        self.recorder = recorder
        self.stage = needs_host_staging(device, group)
        ensure_warm(group, ranks, device, timeout, recorder)

    def post(self, send: torch.Tensor, recv: torch.Tensor, kind: str, hop: int) -> _Hop:
        tag = 2 * hop + (0 if kind == "kv" else 1)
        landing, keep = None, None
        if self.stage:  # the host copy of the send waits for the device; received bytes land at the wait
            keep = send.to("cpu", copy=True)
            landing = (recv, torch.empty(recv.shape, dtype=recv.dtype))
            send, recv = keep, landing[1]
            if self.recorder:
                self.recorder(f"stage_{kind}", hop)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        works = dist.batch_isend_irecv(ops)
        if self.recorder:
            self.recorder(f"post_{kind}", hop)
        return _Hop(works, f"{kind} hop {hop}", self.timeout, self.index, (self.next, self.prev), landing, keep)

    def wait(self, hop: _Hop, kind: str, index: int) -> None:
        hop.wait()
        if self.recorder:
            self.recorder(f"wait_{kind}", index)


class LocalHub:
    """Mailboxes of an in-process ring whose members are threads of one process (one device): a hop is a device
    copy. Used to run every member of a CP ring on one GPU (benchmarks/gpu_ring.py, tests/gpu) and in CPU tests."""

    def __init__(self, size: int, timeout: float = 60.0):
        self.size, self.timeout = size, timeout
        self._boxes: dict = {}
        self._cv = threading.Condition()

    def deliver(self, dst: int, key: tuple, tensor: torch.Tensor) -> None:
        with self._cv:  # FIFO per (destination, kind, hop): a forward's and a backward's hop 1 may both wait
            self._boxes.setdefault((dst, key), collections.deque()).append(tensor)
            self._cv.notify_all()

    def take(self, dst: int, key: tuple) -> torch.Tensor:
        with self._cv:
            if not self._cv.wait_for(lambda: bool(self._boxes.get((dst, key))), timeout=self.timeout):
                raise TimeoutError(f"local ring member {dst}: {key[0]} hop {key[1]} did not arrive within "
                                   f"{self.timeout:g} s")
            return self._boxes[(dst, key)].popleft()


class _LocalHop:
    def __init__(self, hub: LocalHub, index: int, key: tuple, recv: torch.Tensor):
        self.hub, self.index, self.key, self.recv = hub, index, key, recv

    def wait(self) -> None:
        self.recv.copy_(self.hub.take(self.index, self.key))


class LocalComm:
    """The :class:`PoolP2P` interface for member ``index`` of an in-process ring (see :class:`LocalHub`)."""

    def __init__(self, hub: LocalHub, index: int, recorder: Optional[Recorder] = None):
        self.hub, self.index, self.size, self.recorder = hub, index, hub.size, recorder

    def post(self, send: torch.Tensor, recv: torch.Tensor, kind: str, hop: int) -> _LocalHop:
        self.hub.deliver((self.index + 1) % self.size, (kind, hop), send.clone())
        if self.recorder:
            self.recorder(f"post_{kind}", hop)
        return _LocalHop(self.hub, self.index, (kind, hop), recv)

    def wait(self, hop: _LocalHop, kind: str, index: int) -> None:
        hop.wait()
        if self.recorder:
            self.recorder(f"wait_{kind}", index)


def run_local_ring(size: int, fn: Callable[[LocalComm], object], timeout: float = 60.0) -> list:
    """Run ``fn(comm)`` for every member of an in-process ring of ``size`` threads; returns the results by member
    and re-raises the first member's exception."""
    hub = LocalHub(size, timeout)
    results: list = [None] * size
    errors: list = []

    def member(i: int) -> None:
        try:
            results[i] = fn(LocalComm(hub, i))
        except BaseException as e:  # handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
