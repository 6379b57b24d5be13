"""Issue 20's synthetic-hardware acceptance test: calibrate on hardware whose time is NOT dynacp's model form.

A hidden "true" time function (:class:`Hardware`) prices a group of documents on a ring of d ranks with effects the
cost model does not have: attention efficiency that falls for short per-rank blocks (``sqrt(x / (x + x0))`` of the
rate at x tokens per rank), only part (60 %) of the exchange hidden behind attention, a per-hop latency that grows
with the ring size, and a fixed extra cost per extra node a ring spans. It is "profiled" with +-3 % uniform noise
(a ``group`` and a ``p2p`` table on rings of 2-64 ranks, what ``dynacp calibrate profile`` measures), calibrated
through the public API with its defaults (``dynacp.calibrate.fit(profile)``: form auto picks extended, the hop
tables come from the p2p table's ring sizes, the per-node cost from the groups; and ``apply_links``), checked on 800
held-out groups (:func:`held_out_groups`: relative error median <= 3 %, max <= 10 %), planned with ``dynacp`` on
long-tailed batches at 64 ranks (8 per node, 16,384 and 32,768 tokens per rank; pp 1 and 4), and every plan is
priced with the TRUE function (the same group timeline / 1F1B simulator the planner uses, fed with true group times;
a self-check prices the plan with its own model that way and must reproduce ``plan.predicted.step_time``, and the
calibrated model's step time must be within 1 % of the true one).

The hardware's own lower bound (:func:`hardware_bound`, valid for any plan that fits the memory) is the largest of

* ``single``: the longest sequence alone on its best ring (a scan over degrees of the true time; a group is never
  faster than its slowest member alone, and every microbatch crosses all pipeline stages forward and back);
* ``average``: a step S needs every group to take at most S (a group is never faster than any member alone, and a
  microbatch crosses all stages), so a sequence s runs on a degree d >= dmin(s) with ``T(s, d) <= S`` and costs at
  least ``d u(s, d)`` rank-seconds, where ``u(s, d)`` is what one member of a ring of d ranks certainly adds: its
  attention A_s, linear work and document cost, and ``e_s = max(0.4 C_s, C_s - 0.6 (A_s + H_s))`` of its exchange
  C_s (its bytes over the faster link), H_s the most attention the other members of its ring can have (one
  sequence of the ``d cap - s`` tokens of memory left: attention is superadditive in length). Valid because a
  group's exposed exchange is ``C - 0.6 min(A, C) = max(0.4 C, C - 0.6 A)`` with C >= sum C_s and A = sum A_s, and
  ``sum e_s`` is below it: if every member takes its first branch, ``sum 0.4 C_s <= 0.4 C``; if some member k takes
  the second, ``sum e_s - (C - 0.6 A) <= 0.6 (A_L - H_k) - 0.6 C_L <= 0`` (L: the members on the first branch,
  whose attention ``A_L <= H_k``). A long sequence that fills its ring's memory hides little of its exchange. With
  ``W(S) = sum_s min {d u(s, d) : d >= dmin(s), T(s, d) <= S}`` the ranks need
  ``S >= A(S) = (W(S) / P + c + (pp - 1) (c + doc)) / pp`` (pp = 1: ``W(S) / P + c``; pp > 1: the 1F1B fill of pp - 1
  microbatches of at least ``c + doc``). A(S) falls as S grows, so the least such S (bisection) bounds the step:
  long sequences that do not fit within S on their least degree must take more ranks, and pay for them;
* ``critical`` (pp > 1): dynacp's critical-sequence argument (docs/cost_model.md) with true times: the longest
  sequence s* on d ranks takes ``t >= T(s*, d)``; a rank of its ring running other work X besides it finishes after
  ``t + max(0, X - E_d) / (3 pp)``, where ``E_d = 0.6 max(0, C(s*, d) - A(s*, d))`` bounds what members grouped
  with s* can hide (adding a member with attention dA and exchange dC lowers ``T - work`` by at most
  ``0.6 min(dA, C - A + dC) - 0.6 dC``); the other ranks share the rest of the work ``W'``, and some rank holds at least
  its mean: ``min_d min_X max(t + max(0, X - E_d) / (3 pp), F((W' - d X) / (P - d)))`` with F the 1F1B fill above;
* ``shared``: the k longest sequences (k = 2..4) either meet - two on one rank, whose 1F1B chain is at least
  ``pair_floor`` of their best times, or in one group, at least its best time - or run on pairwise disjoint rings,
  each on at least the least degree that finishes within the step, those degrees fit in P, and the rest of the work
  (``W(S)`` of the others) fits beside them: a plain rank runs at most ``pp S - c - (pp - 1) (c + doc)`` of it, a rank
  of giant i's ring at most ``3 pp (S - T_i(d)) + E_d`` (pp = 1: ``S - T_i(d) + E_d``; the critical argument), each
  giant's degree chosen for the most room (a relaxation); the term is ``min(meet, least S that fits)``;
* ``giants``: the k longest sequences (k = 2..6) when their least degrees need more than P ranks side by side. Split
  them into blocks of sequences whose rings share ranks (the connected parts of "rings intersect"); blocks hold
  disjoint ranks. In a block of R ranks every ring has at most R ranks, and every member i meets another member m:
  in two groups on one rank (their 1F1B chain, at least ``pair_floor(T_i(d_i), best_m(R))`` with ``best_m(R)`` m's
  best time on at most R ranks) or in one group (at least ``T({i, m}, d_i)``: adding members never makes a group
  faster); so d_i is at least the least degree where one of those is <= S. Members that cannot meet within S at all
  have disjoint rings: the block needs R >= the largest sum of their least degrees. The term is the least S for
  which some partition of the k into blocks fits in P ranks (bisection; a partition that fits at S fits above it).
  It is what prices two giants that must share ranks with the rest placed around them;
* ``minorant``: dynacp's own lower bound (all its terms) for a cost model that is below the true time for every
  group (:meth:`Hardware.minorant`: the same linear, group and document costs, attention at full efficiency, the
  hop latency as hop tables, exact since it is linear in the ring size, the same bandwidths, the node cost as
  ``node_overhead`` on the least nodes a ring spans, and 60 % of the exchange hidden; T is increasing in the
  attention and in the exchange, so each change only lowers it): any plan's true step time is at least its step
  time under that model (group timeline and simulator are monotone in the group times), which is at least that
  model's bound.

Run with ``-s`` to see the table (numbers in docs/benchmarks.md):

    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest -q -s tests/python/test_synthetic_hardware.py
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest

import dynacp
from dynacp import _core, calibrate, distributions
from dynacp.calibrate.fileformat import Profile

P, RPN = 64, 8
"""Ranks and ranks per node of the planned pool."""
CAPS = (16384, 32768)
"""Tokens per rank of the planned pool: both settings are asserted (``Hardware.cap``)."""
KV = 8 * 128 * 2 * 2 * 32 * 3
"""Bytes per token per ring hop of the whole step (the default model's value; the profile's meta states it)."""


@dataclass(frozen=True)
class Hardware:
    """The hidden true time of one group's whole training step (seconds), causal masks (eta 1/2)."""

    attn: float = 1.6e-9
    """s per token^2 of full-mask attention at full efficiency."""
    half_block: float = 512.0
    """x0 (tokens per rank): attention runs at sqrt(x / (x + x0)) of its full rate on blocks of x tokens per rank."""
    linear: float = 2.5e-5
    """s per token of linear work, split over the ring."""
    group: float = 4e-3
    """s per group (launches, synchronisation)."""
    doc: float = 1.5e-4
    """s per document of the group."""
    hidden: float = 0.6
    """Share of min(attention, exchange) hidden behind attention."""
    latency: float = 15e-6
    """s per hop in a 2-rank ring; grows by latency_growth per extra rank."""
    latency_growth: float = 0.05
    intra_bw: float = 150e9
    """B/s of one hop inside a node."""
    inter_bw: float = 25e9
    """B/s of one hop across nodes."""
    node_cost: float = 2e-3
    """s per extra node a ring spans."""
    cap: int = 32768
    """Tokens per rank (the memory of one rank; the pool's ``tokens_per_rank``)."""

    def attention(self, lengths: np.ndarray, d: int) -> np.ndarray:
        s = np.asarray(lengths, dtype=np.float64)
        x = s / d
        return 0.5 * self.attn * s * s / d / np.sqrt(x / (x + self.half_block))

    def hop_latency(self, d: int) -> float:
        return self.latency * (1 + self.latency_growth * (d - 2))

    def comm(self, tokens: float, d: int, nodes: int) -> float:
        if d == 1:
            return 0.0
        bw = self.inter_bw if nodes > 1 else self.intra_bw
        return (d - 1) * (self.hop_latency(d) + tokens / d * KV / bw) + self.node_cost * (nodes - 1)

    def time(self, lengths, d: int, nodes: int) -> float:
        """True seconds of a group of ``lengths`` on a ring of ``d`` ranks spanning ``nodes`` nodes."""
        s = np.asarray(lengths, dtype=np.float64)
        attn = float(self.attention(s, d).sum())
        comm = self.comm(float(s.sum()), d, nodes)
        compute = attn + self.linear * s.sum() / d + self.group + self.doc * s.size
        return float(compute + comm - self.hidden * min(attn, comm))

    def member(self, s: int, d: int) -> float:
        """u(s, d): seconds one member of length s certainly adds to a ring of d ranks (module docstring,
        ``average``): its attention A, linear work and document cost, and of its exchange C (bytes only, on the
        faster link) at least ``max(0.4 C, C - 0.6 (A + H))``, H the most attention the ring's other members can
        bring (one sequence filling the memory left, ``d cap - s`` tokens: attention is superadditive in length)."""
        attn = float(self.attention([s], d)[0])
        if d == 1:
            return attn + self.linear * s + self.doc
        exchange = (d - 1) / d * s * KV / (self.intra_bw if d <= RPN else self.inter_bw)
        room = d * self.cap - s
        others = float(self.attention([room], d)[0]) if room > 0 else 0.0
        exposed = max((1 - self.hidden) * exchange, exchange - self.hidden * (attn + others))
        return attn + self.linear * s / d + self.doc + exposed

    def minorant(self) -> tuple[_core.CostModel, _core.Cluster]:
        """A dynacp model (and links) whose time is below :meth:`time` for every group (module docstring): the
        true function but for attention at full efficiency; the hop latency (linear in the ring size) as hop
        tables, the node cost as ``node_overhead`` on the least nodes a ring spans, 60 % of the exchange hidden."""
        top = self.hop_latency(P)
        cost = dynacp.CostModel(name="minorant", attn_coef=self.attn, linear_coef=self.linear,
                                group_overhead=self.group, doc_overhead=self.doc, kv_bytes_per_token=KV,
                                comm_overlap=self.hidden, node_overhead=self.node_cost,
                                intra_node_hops=[[2, self.latency, self.intra_bw], [P, top, self.intra_bw]],
                                inter_node_hops=[[2, self.latency, self.inter_bw], [P, top, self.inter_bw]])
        cluster = dynacp.Cluster(num_ranks=P, ranks_per_node=RPN, tokens_per_rank=self.cap,
                                 intra_node_latency=self.latency, inter_node_latency=self.latency,
                                 intra_node_bandwidth=self.intra_bw, inter_node_bandwidth=self.inter_bw)
        return cost, cluster


def nodes_of(ranks) -> int:
    return len({r // RPN for r in ranks})


def profile_of(hw: Hardware, noise: float = 0.03, seed: int = 0) -> Profile:
    """What a profiler would measure on ``hw``: whole-group times (1 and 4 documents, every degree 1-64, compact and
    node-spanning rings) and ring hops, each time times a uniform factor in [1 - noise, 1 + noise]."""
    rng = np.random.default_rng(seed)

    def measured(t: float) -> float:
        return t * float(rng.uniform(1 - noise, 1 + noise))

    groups = []
    for d in (1, 2, 4, 8, 16, 32, 64):
        for nodes in sorted({max(1, d // RPN), 2 if 1 < d <= RPN else max(1, d // RPN)}):
            for k in range(6, 19):
                for n in (1, 4):
                    lengths = [2 ** k] * n
                    if n * 2 ** k > hw.cap * d * 0.9:
                        continue
                    groups.append({"lengths": lengths, "degree": d, "mask": "causal", "crosses_nodes": nodes > 1,
                                   "seconds": measured(hw.time(lengths, d, nodes)), "spread": noise})
    hops = []
    for size, crosses in ((2, False), (4, False), (8, False), (16, True), (32, True), (64, True)):
        for b in np.geomspace(1e4, 1e8, 5):
            t = hw.hop_latency(size) + b / (hw.inter_bw if crosses else hw.intra_bw)
            hops.append({"group_size": size, "crosses_nodes": crosses, "bytes": float(b), "seconds": measured(t),
                         "spread": noise})
    meta = {"device": "synthetic hardware", "dtype": "bfloat16", "layers": 1, "step_factor": 1,
            "kv_bytes_per_token": float(KV)}
    return Profile(meta=meta, tables={"group": groups, "p2p": hops}, source="<synthetic profile>")


def group_times(plan, lengths, time_of) -> tuple[list, list]:
    groups = [g for slot in plan.microbatches for g in slot]
    return groups, [time_of([int(lengths[i]) for i in g.sequences], g.degree, g.ranks) for g in groups]


def step_time(plan, lengths, pp: int, time_of) -> float:
    """The plan's step time with group times from ``time_of(lengths, d, ranks)``: the group timeline (pp = 1) or the
    1F1B simulator (pp > 1), as dynacp prices plans."""
    groups, times = group_times(plan, lengths, time_of)
    if pp == 1:
        free = np.zeros(P)
        for g, t in zip(groups, times):
            start = max(free[r] for r in g.ranks)
            for r in g.ranks:
                free[r] = start + t
        return float(free.max())
    order: list[list[int]] = [[] for _ in range(P)]
    for i, g in enumerate(groups):
        for r in g.ranks:
            order[r].append(i)
    res = _core.simulate_pipeline(order, [list(g.ranks) for g in groups], [t / (3 * pp) for t in times],
                                  [2 * t / (3 * pp) for t in times], pp=pp)
    return float(res.step_time)


def hardware_bound(hw: Hardware, lengths: np.ndarray, pp: int) -> float:
    """The true hardware's lower bound on any plan's step time (module docstring)."""
    cost, cluster = hw.minorant()
    s = np.asarray(lengths, dtype=np.int64)
    dmin = np.array([cost.min_degree(int(x), cluster) for x in s])
    degrees = np.arange(1, P + 1)
    alone = np.array([[hw.time([int(x)], int(d), math.ceil(d / RPN)) for d in degrees] for x in s])  # T(s, d)
    share = np.array([[d * hw.member(int(x), int(d)) for d in degrees] for x in s])  # d u(s, d)
    feasible = degrees[None, :] >= dmin[:, None]
    single = float(np.max(np.min(np.where(feasible, alone, np.inf), axis=1)))

    def average(S: float) -> float:  # the least step the rank-time allows when no group may take longer than S
        work = np.min(np.where(feasible & (alone <= S), share, np.inf), axis=1).sum()
        return (work / P + hw.group + (pp - 1) * (hw.group + hw.doc)) / pp

    lo, hi = single, max(single, average(np.inf))
    while average(hi) > hi:  # average(S) falls as S grows: the least S with average(S) <= S is the bound
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        (hi, lo) = (mid, lo) if average(mid) <= mid else (hi, mid)
    minorant = dynacp.lower_bound(lengths, cluster, cost, pp=pp)
    critical = critical_term(hw, s, alone, share, feasible, pp) if pp > 1 else 0.0
    return max(single, lo, minorant, critical, shared_term(hw, s, alone, share, feasible, pp),
               *(giants_term(hw, s, alone, feasible, pp, k) for k in range(2, 7)))


def pair_floor(a: float, b: float, pp: int) -> float:
    """Two microbatches of times a then b on one pipeline of pp 1F1B stages: the first's round trip then the second's
    backward on stage 0, or the first's stage-0 forward then the second's round trip (forward t / 3, backward 2 t / 3
    over pp stages); the better order. pp = 1: a + b."""
    if pp == 1:
        return a + b
    floor = lambda x, y: max(x + 2 * y / (3 * pp), x / (3 * pp) + y)  # noqa: E731
    return min(floor(a, b), floor(b, a))


def shared_term(hw: Hardware, s: np.ndarray, alone: np.ndarray, share: np.ndarray, feasible: np.ndarray,
                pp: int) -> float:
    """The k longest sequences (k = 2..4) either meet - two of them on one rank (pair_floor of their best times) or in
    one group (its best time) - or run on pairwise disjoint rings, and then the rest of the work must fit beside them
    (module docstring, ``shared``)."""
    top = np.argsort(-s, kind="stable")[:4]
    best = np.min(np.where(feasible, alone, np.inf), axis=1)
    degrees = np.arange(1, P + 1)
    exposed = np.array([[hw.hidden * max(0.0, hw.comm(float(s[i]), int(d), math.ceil(d / RPN))
                                         - float(hw.attention([int(s[i])], int(d))[0])) for d in degrees]
                        for i in top])  # E_d of each giant
    out, meet = 0.0, math.inf
    for k in range(2, top.size + 1):
        j = int(top[k - 1])
        for i in map(int, top[:k - 1]):
            meet = min(meet, pair_floor(float(best[i]), float(best[j]), pp))
            pair = [int(s[i]), int(s[j])]
            meet = min(meet, min(hw.time(pair, d, math.ceil(d / RPN)) for d in range(1, P + 1)
                                 if 2 * hw.cap * d >= sum(pair)))
        rest = np.ones(s.size, dtype=bool)
        rest[top[:k]] = False

        def fits(S: float, k: int = k, rest: np.ndarray = rest) -> bool:
            ok = feasible[top[:k]] & (alone[top[:k]] <= S)
            if not ok.any(axis=1).all() or int(np.argmax(ok, axis=1).sum()) + k > P:
                return False
            cap = pp * S - hw.group - (pp - 1) * (hw.group + hw.doc)  # other work a plain rank can run within S
            spare = (S - alone[top[:k]]) * (3 * pp if pp > 1 else 1) + exposed[:k]  # ... a giant's rank
            gain = np.max(np.where(ok, degrees * (np.minimum(spare, cap) - cap), -np.inf), axis=1).sum()
            other = np.min(np.where(feasible[rest] & (alone[rest] <= S), share[rest], np.inf), axis=1).sum()
            return bool(P * cap + gain >= other)

        lo, hi = float(best[top[:k]].max()), meet
        if not fits(hi):
            out = max(out, meet)
            continue
        for _ in range(50):  # fits grows with S: the least S that fits lies above lo
            mid = 0.5 * (lo + hi)
            (lo, hi) = (lo, mid) if fits(mid) else (mid, hi)
        out = max(out, lo)
    return out


def partitions(items: list[int]) -> list[list[list[int]]]:
    """Every partition of ``items`` into non-empty blocks (Bell(6) = 203 for six)."""
    if not items:
        return [[]]
    head, out = items[0], []
    for rest in partitions(items[1:]):
        out.append([[head]] + rest)
        for i in range(len(rest)):
            out.append(rest[:i] + [[head] + rest[i]] + rest[i + 1:])
    return out


def pair_floor_array(a: np.ndarray, b: np.ndarray, pp: int) -> np.ndarray:
    """:func:`pair_floor` elementwise."""
    if pp == 1:
        return a + b
    return np.minimum(np.maximum(a + 2 * b / (3 * pp), a / (3 * pp) + b), np.maximum(b + 2 * a / (3 * pp), b / (3 * pp) + a))


def giants_term(hw: Hardware, s: np.ndarray, alone: np.ndarray, feasible: np.ndarray, pp: int, k: int = 6) -> float:
    """The k longest sequences, in blocks whose rings share ranks (module docstring, ``giants``): the least S for
    which some partition of them into such blocks fits in P ranks; 0 when their least degrees fit side by side."""
    top = [int(i) for i in np.argsort(-s, kind="stable")[:k]]
    if sum(int(np.argmax(feasible[i])) + 1 for i in top) <= P:
        return 0.0
    degrees = np.arange(1, P + 1)
    below = degrees[:, None] <= degrees[None, :]  # [d, R]: a ring of d ranks inside a block of R ranks
    times = np.where(feasible, alone, np.inf)
    upto = np.minimum.accumulate(times, axis=1)  # [i, R]: the best time of i on at most R ranks
    # cost[i, m][d, R]: the least time a rank pays when i (on d ranks) meets m in a block of R ranks: in two groups
    # on one rank (their 1F1B chain, m at its best within R) or in one group of d ranks (inf beyond its memory)
    cost = {}
    for i in top:
        for m in top:
            if m != i:
                two = np.array([hw.time([int(s[i]), int(s[m])], int(d), math.ceil(d / RPN))
                                if hw.cap * d >= s[i] + s[m] else np.inf for d in degrees])
                c = np.minimum(pair_floor_array(times[i][:, None], upto[m][None, :], pp), two[:, None])
                cost[i, m] = np.where(below, c, np.inf)
    parts = partitions(top)

    def ranks(block: tuple[int, ...], S: float) -> float:  # the least ranks a block can occupy within S
        if len(block) == 1:
            ok = feasible[block[0]] & (alone[block[0]] <= S)
            return float(degrees[np.argmax(ok)]) if ok.any() else math.inf
        meets = {(i, m): cost[i, m] <= S for i in block for m in block if m != i}
        need = {}
        for i in block:  # [R]: the least degree of i that meets some other member within S
            ok = np.logical_or.reduce([meets[i, m] for m in block if m != i])
            need[i] = np.where(ok.any(axis=0), degrees[np.argmax(ok, axis=0)], np.inf)
        apart = {(i, m): ~meets[i, m].any(axis=0) & ~meets[m, i].any(axis=0) for (i, m) in meets}
        held = np.zeros(P)  # [R]: the most ranks members that cannot meet (disjoint rings) hold side by side
        for r in range(1, len(block) + 1):
            for sub in itertools.combinations(block, r):
                free = np.logical_and.reduce([apart[i, m] for i in sub for m in sub if i < m] or [np.ones(P, bool)])
                held = np.maximum(held, np.where(free, sum(need[i] for i in sub), 0.0))
        ok = held <= degrees
        return float(degrees[np.argmax(ok)]) if ok.any() else math.inf

    def fits(S: float) -> bool:
        need = {tuple(b): ranks(tuple(b), S) for part in parts for b in part}
        return any(sum(need[tuple(b)] for b in part) <= P for part in parts)

    lo = float(np.min(times[top], axis=1).max())
    hi = 2.0 * lo
    while not fits(hi):
        lo, hi = hi, 2.0 * hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        (lo, hi) = (lo, mid) if fits(mid) else (mid, hi)
    return lo


def critical_term(hw: Hardware, s: np.ndarray, alone: np.ndarray, share: np.ndarray, feasible: np.ndarray,
                  pp: int) -> float:
    """pp > 1: the longest sequence s* on d ranks (module docstring, ``critical``)."""
    star = int(np.argmax(s))
    rest_work = float(np.delete(np.min(np.where(feasible, share, np.inf), axis=1), star).sum())

    def G(W: float) -> float:  # a rank of W rank-seconds of microbatches (at least one): the 1F1B fill and drain
        return (max(W, 0.0) + hw.group + (pp - 1) * (hw.group + hw.doc)) / pp

    best = math.inf
    for d in range(1, P + 1):
        if not feasible[star, d - 1] or alone[star, d - 1] >= best:
            continue
        t = float(alone[star, d - 1])
        attn = float(hw.attention([int(s[star])], d)[0])
        hidden = hw.hidden * max(0.0, hw.comm(float(s[star]), d, math.ceil(d / RPN)) - attn)  # E_d
        host = lambda X, t=t, E=hidden: t + max(0.0, X - E) / (3 * pp)  # noqa: E731
        if d == P:
            best = min(best, host(rest_work / P))
            continue
        other = lambda X, d=d: G((rest_work - d * X) / (P - d))  # noqa: E731
        lo, hi = 0.0, rest_work / d
        if other(lo) <= host(lo):
            best = min(best, host(lo))
            continue
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            (lo, hi) = (mid, hi) if host(mid) < other(mid) else (lo, mid)
        best = min(best, max(host(lo), other(hi)))
    return best


def batches() -> list[tuple[str, np.ndarray]]:
    """Long-tailed batches of 512 sequences (two per distribution; the longest up to ~350K tokens)."""
    rng = np.random.default_rng(7)
    out = []
    for name in ("longcontext", "github", "wlbllm"):
        for b in range(2):
            out.append((f"{name}/{b}", distributions.sample(name, 512, rng)))
    return out


def test_partitions_and_the_giants_term_on_a_hand_priced_case():
    """Bell numbers; and on longcontext batch 0 at 16,384 tokens per rank (pp 1) the five longest sequences need 72
    ranks at their least degrees: the giants term equals the best placement by hand - the three longest on 18, 17
    and 15 ranks of their own, the other two one after the other on the 14 ranks left."""
    assert [len(partitions(list(range(n)))) for n in range(1, 7)] == [1, 2, 5, 15, 52, 203]
    hw = Hardware(cap=16384)
    cost, cluster = hw.minorant()
    s = np.asarray(batches()[0][1], dtype=np.int64)
    degrees = np.arange(1, P + 1)
    alone = np.array([[hw.time([int(x)], int(d), math.ceil(d / RPN)) for d in degrees] for x in s])
    feasible = degrees[None, :] >= np.array([cost.min_degree(int(x), cluster) for x in s])[:, None]
    top = np.sort(s)[::-1][:5]
    assert [cost.min_degree(int(x), cluster) for x in top] == [18, 17, 15, 13, 9]
    by_hand = max(hw.time([int(top[3])], 14, 2) + hw.time([int(top[4])], 14, 2),
                  *(hw.time([int(x)], d, math.ceil(d / RPN)) for x, d in zip(top[:3], (18, 17, 15))))
    assert giants_term(hw, s, alone, feasible, 1, k=5) == pytest.approx(by_hand, rel=1e-6)
    assert giants_term(hw, s, alone, feasible, 1, k=4) == 0.0  # 63 ranks: side by side


def test_true_function_is_above_its_minorant():
    """The minorant model really is below the true time (spot checks on random groups, every degree, both links)."""
    hw = Hardware()
    cost, cluster = hw.minorant()
    rng = np.random.default_rng(1)
    for _ in range(300):
        d = int(rng.integers(1, P + 1))
        lengths = rng.integers(1, 2 * hw.cap, int(rng.integers(1, 6))) * d // 2 + 1
        for nodes in {math.ceil(d / RPN), min(P // RPN, math.ceil(d / RPN) + 1)}:
            model = cost.time(lengths.tolist(), d, cluster, crosses_nodes=nodes > 1)
            assert model <= hw.time(lengths, d, nodes) * (1 + 1e-12)
        a, b = (int(x) for x in rng.integers(1, hw.cap * d, 2))  # attention is superadditive (Hardware.member)
        assert float(hw.attention([a], d)[0] + hw.attention([b], d)[0]) <= float(hw.attention([a + b], d)[0])


@pytest.fixture(scope="module", params=CAPS, ids=lambda cap: f"{cap}-tokens-per-rank")
def calibrated(request) -> tuple[Hardware, _core.CostModel, _core.Cluster]:
    """The documented workflow with the defaults: ``calibrate.fit(profile)`` (form auto) and ``apply_links``."""
    hw = Hardware(cap=request.param)
    result = calibrate.fit(profile_of(hw), name="synthetic")
    assert result.form == "extended" and "form auto -> extended" in result.form_reason  # enough points
    cluster = dynacp.Cluster(num_ranks=P, ranks_per_node=RPN, tokens_per_rank=hw.cap)
    calibrate.apply_links(cluster, result.links)
    group = next(t for t in result.terms if t.term == "group")
    print(f"\nsynthetic hardware ({hw.cap} tokens per rank) fit: whole-group rms {100 * group.rms:.1f} %, max "
          f"{100 * group.max:.1f} %")
    return hw, result.cost, cluster


def held_out_groups(hw: Hardware, n: int = 800, seed: int = 11) -> list[tuple[list[int], int, int]]:
    """(lengths, degree, nodes) of ``n`` groups the profile did not measure: every degree 1-64 (most not powers of
    two), 1-8 documents of random proportions (the profile has 1 or 4 equal powers of two), total tokens log-uniform
    from 64 per document to 95 % of the ring's memory; compact rings (``ceil(d / 8)`` nodes), a quarter of the rings
    of 2-8 ranks placed across a node boundary (2 nodes)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        d = int(rng.integers(1, P + 1))
        docs = int(rng.integers(1, 9))
        total = float(np.exp(rng.uniform(np.log(64 * docs), np.log(0.95 * hw.cap * d))))
        lengths = np.maximum(1, np.floor(total * rng.dirichlet(np.ones(docs)))).astype(int).tolist()
        nodes = 2 if 1 < d <= RPN and rng.random() < 0.25 else math.ceil(d / RPN)
        out.append((lengths, d, nodes))
    return out


def test_held_out_group_error(calibrated):
    """The calibrated model's relative error on held-out groups (:func:`held_out_groups`), against the true time:
    median <= 3 %, max <= 10 % (issue 37)."""
    hw, cost, cluster = calibrated
    err = np.array([cost.time(ls, d, cluster, crosses_nodes=nodes > 1) / hw.time(ls, d, nodes) - 1
                    for ls, d, nodes in held_out_groups(hw)])
    print(f"\ncap {hw.cap}: held-out group error median {100 * np.median(np.abs(err)):.2f} %, max "
          f"{100 * np.max(np.abs(err)):.2f} % over {err.size} groups")
    assert np.median(np.abs(err)) <= 0.03
    assert np.max(np.abs(err)) <= 0.10


ALL_GAPS: list[float] = []
"""Every calibrated plan's gap to the hardware bound, over the settings run so far (the issue's mean is over all)."""


@pytest.mark.parametrize("pp", [1, 4])
def test_calibrated_plans_are_near_the_hardware_bound(calibrated, pp):
    hw, cost_cal, cluster_cal = calibrated
    true_time = lambda lengths, d, ranks: hw.time(lengths, d, nodes_of(ranks))  # noqa: E731
    default = (dynacp.CostModel(), dynacp.Cluster(num_ranks=P, ranks_per_node=RPN, tokens_per_rank=hw.cap))
    gaps: dict[str, list[float]] = {"calibrated": [], "default": []}
    priced: list[float] = []
    for name, lengths in batches():
        bound = hardware_bound(hw, lengths, pp)
        for label, (cost, cluster) in (("calibrated", (cost_cal, cluster_cal)), ("default", default)):
            plan = dynacp.plan(lengths, cluster, cost, pp=pp, tight_bound=False)
            own = step_time(plan, lengths, pp, lambda ls, d, ranks, c=cost, cl=cluster: c.time(
                ls, d, cl, crosses_nodes=nodes_of(ranks) > 1))
            assert own == pytest.approx(plan.predicted.step_time, rel=1e-9)  # priced as dynacp prices plans
            true = step_time(plan, lengths, pp, true_time)
            assert true >= bound * (1 - 1e-9), (name, label)  # the bound holds
            gaps[label].append(true / bound - 1)
            if label == "calibrated":  # the calibrated model prices its own plans as the hardware runs them
                priced.append(abs(plan.predicted.step_time / true - 1))
            print(f"cap {hw.cap} pp {pp} {name:<14} {label:<10} true step {true:8.3f} s, hardware bound {bound:8.3f} s, "
                  f"gap {100 * (true / bound - 1):5.1f} %")
    summary = {k: (100 * float(np.mean(v)), 100 * float(np.max(v))) for k, v in gaps.items()}
    print(f"cap {hw.cap} pp {pp}: mean / max gap to the hardware bound: calibrated {summary['calibrated'][0]:.1f} % / "
          f"{summary['calibrated'][1]:.1f} %, default model {summary['default'][0]:.1f} % / "
          f"{summary['default'][1]:.1f} %")
    print(f"cap {hw.cap} pp {pp}: calibrated model's step time vs the true one: max error {100 * max(priced):.2f} %")
    assert max(priced) <= 0.01
    assert np.mean(gaps["calibrated"]) <= 0.04  # measured 3.1 % at most per setting
    assert np.max(gaps["calibrated"]) <= 0.06   # issue 37: every plan within 1.06 of the bound (measured 5.7 %)
    ALL_GAPS.extend(gaps["calibrated"])
    if len(ALL_GAPS) == len(CAPS) * 2 * len(batches()):  # issue 37: 1.03 mean over all 24 plans (measured 2.2 %)
        assert np.mean(ALL_GAPS) <= 0.03
