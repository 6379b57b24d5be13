"""Configuration objects of the training-loop integration: what to plan (:class:`Planner`) and over which process
groups (:class:`ProcessGroups`). Both are passed in explicitly; nothing is read from global parallel state."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch.distributed as dist

import dynacp
from dynacp import log
from dynacp.integration import shapes
from dynacp.integration.status import Timed


@dataclass
class Planner:
    """How each global batch is planned. Every rank of the DP x CP pool must hold an equal Planner.

    Every rank plans the same gathered lengths with the same deterministic C++ solver, so all ranks hold the same
    plan without shipping it; the plan digest (and this config's fingerprint) is compared across the pool and a
    mismatch raises :class:`PlanMismatchError` on every rank.
    """

    strategy: str = "dynacp"
    """Scheduler strategy, a name from :func:`dynacp.strategy_names` (default ``"dynacp"``, the best; ``"fcp"``,
    ``"megatron"``, ``"bytescale"``, ``"packing"`` for comparison)."""
    cluster: Optional[dynacp.Cluster] = None
    """The DP x CP pool as the cost model sees it. ``num_ranks`` must equal the pool size; ``None`` builds
    ``Cluster(num_ranks=pool size, ranks_per_node=pool size)`` with default budgets."""
    cost: Optional[dynacp.CostModel] = None
    """Cost model (time and activation memory per token); ``None`` uses ``dynacp.CostModel()``."""
    pp: int = 1
    """Pipeline stages the plan is made for (the scheduler's ``pp``)."""
    vpp: int = 1
    """Virtual pipeline stages per stage (the scheduler's ``vpp``)."""
    count_policy: str = "variable"
    """``"equal"``: every rank runs the same number of microbatches; ``"variable"``: counts may differ per rank."""
    tight_bound: bool = False
    """Whether each plan's ``predicted.lower_bound`` includes the bound's cover term (pp > 1): the tightest and
    slowest part, up to about a second per global batch at 64 ranks, pp = 4. The loop never reads the bound, so it
    is off; the plan is the same either way (see :func:`dynacp.plan`)."""
    timeout: float = 300.0
    """Seconds any single wait of the wrapper may take before it raises
    :class:`~dynacp.integration.status.CommunicationError`: the status and length gathers, the plan check, every
    ``isend``/``irecv`` of the re-route, the TP and PP broadcasts, and the wait for the solver. (CP group creation
    runs under ``ProcessGroups.timeout``, the timeout the groups were created with.) A rank that raises while it is
    still alive is not waited for: its error reaches every rank in the next status exchange."""
    empty_samples: str = "skip"
    """What to do with a sample of 0 tokens (an empty document, or an empty segment of a packed item):
    ``"skip"`` (default) leaves it out of the global batch, counts it in ``GlobalBatch.skipped_empty`` and logs the
    count on the ``dynacp`` logger; ``"error"`` makes every rank raise
    :class:`~dynacp.integration.status.RankFailedError` naming the rank and the sample."""
    async_planning: bool = True
    """Plan global batch k+1 in a background thread while batch k trains (reads the next batch's samples one
    global batch ahead). ``False`` plans synchronously inside each call."""
    check_plan: bool = True
    """Compare the plan digest and config fingerprint across the pool every global batch. The all-gather that
    carries them runs either way: it is also the status exchange that makes a rank's planning error fail every
    rank together."""
    ring_set: Optional[Sequence[Sequence[int]]] = None
    """Plan with only these CP rings (pool indices, ring order), e.g.
    ``rings.select_ring_set(samples, cluster, cost)``: for attention that needs one process group per ring
    (TransformerEngine), with ``make_process_groups(cp_groups="prebuilt", ring_set=...)`` creating exactly these
    groups at start-up. The solver takes the constraint (``dynacp.plan(..., ring_set=...)``: dynacp searches among
    plans on the set; other strategies are projected onto it). ``None`` (default): no restriction, except that the
    wrapper uses the pool's pre-built set when ``cp_groups="prebuilt"``; what the constraint costs on the benchmark
    workloads is in docs/benchmarks.md."""
    static_shapes: Optional[Any] = None
    """CUDA-graph mode: a ``dynacp.StaticShapes`` (rows per rank ``token_buckets``, CP sizes ``cp_sizes``, at most
    ``max_microbatches`` microbatches per rank per step and ``max_sequences`` sequences per microbatch). The solver
    plans under it (``dynacp.plan(..., static_shapes=...)``) and the wrapper emits exactly those shapes: each
    microbatch padded to its bucket (pad rows carry ``loss_mask`` 0), ``cu_seqlens`` of ``max_sequences + 1``
    entries, its :class:`~dynacp.integration.shapes.MicrobatchShape` in ``microbatch["shape"]``;
    :meth:`declared_shapes` lists the graph bank. A plan outside the shapes (e.g. from ``plan_fn``) makes every
    rank raise. ``None`` (default): free shapes. See docs/static_shapes.md."""
    plan_fn: Optional[Callable[[np.ndarray], dynacp.Plan]] = None
    """Override: a deterministic function of the int64 lengths array returning a Plan (custom schedulers, tests).
    It must be deterministic and identical on every rank; the digest check still applies."""
    refit_every: int = 0
    """Refit the cost model online every this many global batches (0, the default: off). The training loop records
    each microbatch's forward + backward time (``DynamicCPDataIterator.measure`` / ``record``); pool rank 0 refits
    the compute terms robustly and broadcasts them with its plan digest, and every rank then plans with the same
    model (``Planner.cost`` is replaced). pp = 1 only in this version. See :mod:`dynacp.calibrate.online` and
    docs/calibration.md."""
    refit_options: Optional[Any] = None
    """:class:`dynacp.calibrate.online.RefitOptions` (window, outlier rejection, bounded change); ``None`` uses the
    defaults."""

    def __post_init__(self) -> None:
        if self.empty_samples not in ("skip", "error"):
            raise ValueError(f"Planner.empty_samples must be 'skip' or 'error', got {self.empty_samples!r}")
        if not self.timeout > 0:
            raise ValueError(f"Planner.timeout must be > 0 seconds, got {self.timeout}")
        if isinstance(self.refit_every, bool) or not isinstance(self.refit_every, int) or self.refit_every < 0:
            raise ValueError(f"Planner.refit_every must be an integer >= 0 (0 = off), got {self.refit_every!r}")

    def resolved_cluster(self, pool_size: int) -> dynacp.Cluster:
        """The cluster to plan with, checked against the pool size."""
        cluster = self.cluster or dynacp.Cluster(num_ranks=pool_size, ranks_per_node=pool_size)
        if cluster.num_ranks != pool_size:
            raise ValueError(f"Planner.cluster.num_ranks = {cluster.num_ranks} but the DP x CP pool has {pool_size} "
                             "ranks")
        return cluster

    def plan(self, lengths: np.ndarray, pool_size: int) -> dynacp.Plan:
        """Plan one global batch (releases the GIL inside the C++ solver)."""
        if self.plan_fn is not None:
            return self.plan_fn(lengths)
        extra = {} if self.static_shapes is None else {"static_shapes": self.static_shapes}
        return dynacp.plan(lengths, cluster=self.resolved_cluster(pool_size), cost=self.cost or dynacp.CostModel(),
                           strategy=self.strategy, pp=self.pp, vpp=self.vpp, count_policy=self.count_policy,
                           tight_bound=self.tight_bound, ring_set=self.ring_set, **extra)

    def declared_shapes(self) -> list:
        """Every :class:`~dynacp.integration.shapes.MicrobatchShape` CUDA-graph mode may emit (each CP size x each
        bucket: the graph bank a runtime captures at start-up); ``[]`` without ``static_shapes``."""
        return shapes.declared_shapes(self.static_shapes) if shapes.active(self.static_shapes) else []

    def fingerprint(self) -> str:
        """A short stable hash of everything that determines the plan (for the cross-rank check)."""
        d = {
            "strategy": self.strategy,
            "cluster": None if self.cluster is None else dict(self.cluster.to_dict()),
            "cost": None if self.cost is None else dict(self.cost.to_dict()),
            "pp": self.pp, "vpp": self.vpp, "count_policy": self.count_policy, "empty_samples": self.empty_samples,
            "plan_fn": None if self.plan_fn is None else getattr(self.plan_fn, "__qualname__", repr(self.plan_fn)),
            "ring_set": None if self.ring_set is None else [list(map(int, r)) for r in self.ring_set],
            "static_shapes": shapes.describe(self.static_shapes),
        }
        return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def describe(self) -> dict:
        """Plain-dict view for error messages and logs."""
        return {"strategy": self.strategy, "pp": self.pp, "vpp": self.vpp, "count_policy": self.count_policy,
                "empty_samples": self.empty_samples, "static_shapes": shapes.describe(self.static_shapes),
                "cluster": None if self.cluster is None else dict(self.cluster.to_dict()),
                "cost": None if self.cost is None else {k: v for k, v in dict(self.cost.to_dict()).items()
                                                         if k not in ("name", "source")}}


CP_GROUP_MODES = ("pool", "lazy", "prebuilt")


@dataclass(frozen=True)
class CPRing:
    """How one microbatch's CP ring communicates: ``group`` and the group ranks ``ranks`` of the ring members in
    ring order (``ranks[i]`` holds zigzag chunk i). With ``cp_groups="pool"`` the group is the DP x CP pool and the
    ranks are pool indices (dynacp's ring attention sends P2P between neighbours over it); otherwise it is the
    ring's own group and ``ranks`` is ``0..cp-1``. Pass it to ``dynacp.torch.ring_attention(group=..., ranks=...)``
    or :func:`~dynacp.integration.attention.cp_attention` (``cp_ring=``)."""

    group: Optional[dist.ProcessGroup]
    """The process group the ring's P2P runs on (``None`` for a ring of one rank)."""
    ranks: tuple[int, ...]
    """Group ranks of the ring members, in ring order."""
    index: int
    """This rank's position in the ring (its zigzag chunk index)."""


class CPGroupPool:
    """The CP groups of plan rings, for every DP x CP pool in the world. Three modes:

    * ``"pool"``: no group per ring. :meth:`ensure` creates nothing and :meth:`get` returns ``None``; dynacp's own
      ring attention runs on the pool group by pool rank (:class:`CPRing`). No process group after start-up.
    * ``"lazy"``: a ``torch.distributed.new_group`` per new ring, created when a plan first uses it, in the middle
      of training (with NCCL a collective over the world and a communicator with its own buffers per ring); only
      when asked for (the all-gather oracle, per-ring-group attention without a bounded set). The first group it
      creates logs a warning on the ``dynacp`` logger.
    * ``"prebuilt"``: the groups of ``ring_set`` (pool indices) are created in the constructor, at start-up;
      :meth:`ensure` raises ValueError for a ring outside the set (set ``Planner.ring_set`` to the same rings).

    ``new_group`` must be called by every rank of the world in the same order (group-local synchronisation hashes
    each rank's own group count and deadlocks when ranks create overlapping groups in different numbers), so both
    creating modes walk rings in one order and create each ring's group for every pool in ``all_pools``. Groups
    keep the ring order (``sort_ranks=False``): the group rank of a member is its ring position (zigzag chunk).
    ``created_after_startup`` counts the groups :meth:`ensure` created. The default mode is ``"pool"``.
    """

    def __init__(self, all_pools: Sequence[Sequence[int]], my_pool: int, timeout: datetime.timedelta,
                 mode: str = "pool", ring_set: Optional[Sequence[Sequence[int]]] = None):
        if mode not in CP_GROUP_MODES:
            raise ValueError(f"CPGroupPool mode must be one of {CP_GROUP_MODES}, got {mode!r}")
        if (mode == "prebuilt") != (ring_set is not None):
            raise ValueError("CPGroupPool: pass ring_set exactly when mode is 'prebuilt'")
        self.all_pools = [list(p) for p in all_pools]
        self.my_pool = my_pool
        self.timeout = timeout
        self.mode = mode
        self.created_after_startup = 0
        self._groups: dict[tuple[int, ...], Optional[dist.ProcessGroup]] = {}
        self.ring_set: Optional[list[tuple[int, ...]]] = (None if ring_set is None else
                                                          [tuple(int(r) for r in ring) for ring in ring_set])
        """The pre-built rings (``"prebuilt"``), else ``None``; the wrapper plans with them when
        ``Planner.ring_set`` is ``None``."""
        if ring_set is not None:
            self._create([tuple(int(r) for r in ring) for ring in ring_set])

    def _create(self, rings: Sequence[tuple[int, ...]]) -> int:
        made = 0
        for key in rings:
            if len(key) < 2 or key in self._groups:
                continue
            mine = None
            for p, pool in enumerate(self.all_pools):
                t0 = time.monotonic()
                try:
                    g = dist.new_group([pool[i] for i in key], timeout=self.timeout, sort_ranks=False)
                except RuntimeError as exc:  # a member died: the store wait for its address times out
                    timed = Timed(self.timeout.total_seconds(), "the world")
                    raise timed.error(f"creating the CP group of ring {list(key)} (global ranks "
                                      f"{[pool[i] for i in key]})", t0, exc) from exc
                if p == self.my_pool:
                    mine = g
            self._groups[key] = mine
            made += 1
        return made

    def ensure(self, rings: Sequence[Sequence[int]]) -> None:
        """Make sure every ring (pool indices, ring order) can run: ``"lazy"`` creates the groups of rings not seen
        before (collective over the world); ``"prebuilt"`` checks the rings are in the set; ``"pool"`` does
        nothing."""
        keys = [tuple(int(r) for r in ring) for ring in rings]
        if self.mode == "pool":
            return
        if self.mode == "prebuilt":
            missing = [list(k) for k in keys if len(k) > 1 and k not in self._groups]
            if missing:
                raise ValueError(f"CP rings {missing[:4]} are not in the pre-built ring set "
                                 f"({len(self._groups)} rings); set Planner.ring_set to the rings the pool was "
                                 "built with")
            return
        made = self._create(keys)
        if made and self.created_after_startup == 0:
            log.logger.warning("cp_groups='lazy' created %d CP process group(s) after start-up (with NCCL: a collective "
                               "over the world and a communicator with its own buffers each); use "
                               "cp_groups='pool' with dynacp's ring attention, or 'prebuilt' with a ring set", made)
        self.created_after_startup += made

    def get(self, ring: Sequence[int]) -> Optional[dist.ProcessGroup]:
        """The group of ``ring`` (pool indices) in this rank's pool; ``None`` for a ring of one rank and in
        ``"pool"`` mode."""
        key = tuple(int(r) for r in ring)
        if len(key) < 2 or self.mode == "pool":
            return None
        if key not in self._groups:
            raise KeyError(f"CP group {key} was not created; call ensure() with the plan's rings first")
        return self._groups[key]

    def ring(self, ring: Sequence[int], pool_group: dist.ProcessGroup, pool_index: int) -> CPRing:
        """How this rank runs ``ring`` (pool indices): see :class:`CPRing`."""
        key = tuple(int(r) for r in ring)
        index = key.index(pool_index)
        if len(key) < 2:
            return CPRing(None, (0,), 0)
        if self.mode == "pool":
            return CPRing(pool_group, key, index)
        return CPRing(self.get(key), tuple(range(len(key))), index)

    @property
    def num_groups(self) -> int:
        return len(self._groups)


@dataclass
class ProcessGroups:
    """The process groups the wrapper uses; build them once (e.g. with :func:`make_process_groups`) and pass them in.

    World rank layout is the caller's business; the wrapper only needs the groups and the pool rank mapping.
    """

    dp_cp: dist.ProcessGroup
    """This rank's DP x CP pool (all ranks that share data and run CP groups of any size together); its group rank
    is the pool index the scheduler plans with. Lengths are gathered and samples re-routed over it."""
    pool_ranks: list[int]
    """Global ranks of this rank's pool, by pool index."""
    cp_pool: CPGroupPool
    """The CP groups of plan rings: none (``"pool"``), lazily created or pre-built (see :class:`CPGroupPool`)."""
    tp: Optional[dist.ProcessGroup] = None
    """Tensor-parallel group; only its rank 0 reads data, the others receive microbatches by broadcast."""
    tp_src: int = 0
    """Global rank of TP rank 0 of this rank's TP group."""
    pp: Optional[dist.ProcessGroup] = None
    """Pipeline group (same pool index and TP rank, all stages); stage 0 broadcasts the packing metadata over it."""
    pp_src: int = 0
    """Global rank of pipeline stage 0 in this rank's PP group."""
    timeout: datetime.timedelta = field(default_factory=lambda: datetime.timedelta(seconds=300))
    """Timeout of the groups created by :func:`make_process_groups` and the CP pool."""

    @property
    def pool_size(self) -> int:
        return len(self.pool_ranks)

    @property
    def pool_index(self) -> int:
        return dist.get_rank(self.dp_cp)

    @property
    def tp_rank(self) -> int:
        return 0 if self.tp is None else dist.get_rank(self.tp)

    @property
    def pp_rank(self) -> int:
        return 0 if self.pp is None else dist.get_rank(self.pp)


def make_process_groups(tp_size: int = 1, pp_size: int = 1,
                        timeout: datetime.timedelta = datetime.timedelta(seconds=300), *, cp_groups: str = "pool",
                        ring_set: Optional[Sequence[Sequence[int]]] = None,
                        cluster: Optional[dynacp.Cluster] = None) -> ProcessGroups:
    """Build :class:`ProcessGroups` for world = PP x DP_CP x TP with TP fastest:
    ``rank = (pp_rank * dp_cp_size + pool_index) * tp_size + tp_rank``. Collective: every rank calls it.

    ``cp_groups`` (see :class:`CPGroupPool`): ``"pool"`` (default) for dynacp's own ring attention (no process group
    is ever created after this call); ``"prebuilt"`` for attention that needs a group per ring (TransformerEngine):
    the groups of ``ring_set`` (pool indices; e.g. :func:`~dynacp.integration.rings.select_ring_set`), by default
    :func:`~dynacp.integration.rings.power_of_two_set` of ``cluster`` (default: the pool as one node), all created
    here, and the wrapper plans on them; ``"lazy"`` only when asked: a group per ring created on first use, in the
    middle of training (warned about once).
    """
    world, me = dist.get_world_size(), dist.get_rank()
    if world % (tp_size * pp_size):
        raise ValueError(f"world size {world} is not divisible by tp * pp = {tp_size * pp_size}")
    dpcp = world // (tp_size * pp_size)

    def rank(p: int, d: int, t: int) -> int:
        return (p * dpcp + d) * tp_size + t

    my_p, rem = divmod(me, dpcp * tp_size)
    my_d, my_t = divmod(rem, tp_size)
    pools = [[rank(p, d, t) for d in range(dpcp)] for p in range(pp_size) for t in range(tp_size)]
    my_pool = my_p * tp_size + my_t
    dp_cp = tp = pp = None
    for i, ranks in enumerate(pools):  # new_group is collective over the world: same order everywhere
        g = dist.new_group(ranks, timeout=timeout)
        if i == my_pool:
            dp_cp = g
    for p in range(pp_size):
        for d in range(dpcp):
            g = dist.new_group([rank(p, d, t) for t in range(tp_size)], timeout=timeout)
            if (p, d) == (my_p, my_d):
                tp = g
    for d in range(dpcp):
        for t in range(tp_size):
            g = dist.new_group([rank(p, d, t) for p in range(pp_size)], timeout=timeout)
            if (d, t) == (my_d, my_t):
                pp = g
    assert dp_cp is not None
    if cp_groups == "pool":  # rings P2P over parts of the pool group: its first collective must involve every rank
        from dynacp.torch.ring_comm import warm_up_group

        warm_up_group(dp_cp, timeout=timeout.total_seconds())
    return ProcessGroups(
        dp_cp=dp_cp, pool_ranks=pools[my_pool],
        cp_pool=CPGroupPool(pools, my_pool, timeout, cp_groups, None if cp_groups != "prebuilt" else
                            ring_set if ring_set is not None else _default_ring_set(cluster, dpcp)),
        tp=tp if tp_size > 1 else None, tp_src=rank(my_p, my_d, 0),
        pp=pp if pp_size > 1 else None, pp_src=rank(0, my_d, my_t), timeout=timeout)


def _default_ring_set(cluster: Optional[dynacp.Cluster], pool_size: int) -> list:
    from dynacp.integration.rings import power_of_two_set

    cluster = cluster or dynacp.Cluster(num_ranks=pool_size, ranks_per_node=pool_size)
    if cluster.num_ranks != pool_size:
        raise ValueError(f"make_process_groups: cluster.num_ranks = {cluster.num_ranks} but the DP x CP pool has "
                         f"{pool_size} ranks")
    return power_of_two_set(cluster)


def replace(obj, **changes):
    """``dataclasses.replace`` re-exported for convenience (e.g. ``replace(planner, strategy="packing")``)."""
    return dataclasses.replace(obj, **changes)
