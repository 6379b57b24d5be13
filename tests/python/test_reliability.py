"""Reliability of the training-loop integration (issue 21): ranks fail together, a killed rank is noticed within the
timeout, empty samples are skipped and counted, the re-route's traffic and buffers are measured.

CPU, gloo, 4 spawned processes per run, each run under a hard deadline (a hang fails the test). Run:
    DYNACP_EXT_DIR=$PWD/build/python PYTHONPATH=$PWD/python python3 -m pytest -q tests/python/test_reliability.py
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import signal
import tempfile
import time
import traceback
from typing import Any, Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_workers import _free_port
from test_integration import (
    BATCHES,
    _build_model,
    _rel_err,
    make_global_batch,
    make_planner,
    rank_share,
)

from dynacp.integration import (
    DynamicCPDataIterator,
    Failure,
    Planner,
    RankFailedError,
    cp_attention,
    finalize_grads,
    make_process_groups,
    masked_token_loss,
    reference_attention,
    split_samples,
)

FAIL_WITHIN_S = 10.0     # every rank raises within this many seconds of the step's start (issue 21)
SLOW_TIMEOUT_S = 30      # timeouts of the fail-together runs: longer than FAIL_WITHIN_S, so waiting them out fails
KILL_TIMEOUT_S = 4       # timeouts of the killed-rank runs
RTOL = 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# harness: results are written before a rank lingers or dies; the parent waits for the result files, not for exits


def _entry(rank: int, world: int, port: int, out_dir: str, pg_timeout: float, fn: Callable, kwargs: dict) -> None:
    result: dict[str, Any] = {"rank": rank}
    linger = 0.0
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout))
        value = fn(rank, world, out_dir, **kwargs)
        linger = value.pop("linger", 0.0) if isinstance(value, dict) else 0.0
        result.update(ok=True, value=value)
    except BaseException as exc:
        result.update(ok=False, type=type(exc).__name__, error=str(exc), tb=traceback.format_exc(),
                      raised_at=time.time(), linger=linger)
    with open(os.path.join(out_dir, f"{rank}.tmp"), "wb") as f:
        pickle.dump(result, f)
    os.replace(os.path.join(out_dir, f"{rank}.tmp"), os.path.join(out_dir, f"{rank}.pkl"))
    time.sleep(linger)  # a failing rank that stays alive (its sockets stay open)
    os._exit(0)  # no destroy_process_group: peers may be dead


def run_ranks(fn: Callable, world: int = 4, deadline: float = 60.0, pg_timeout: float = SLOW_TIMEOUT_S,
              expect: tuple[int, ...] = (), **kwargs) -> dict[int, dict]:
    """Run ``fn(rank, world, out_dir, **kwargs)`` on ``world`` spawned processes; wait for the result of every rank in
    ``expect`` (default: all) at most ``deadline`` s, then kill every process. A missing result fails the test."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    expect = expect or tuple(range(world))
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [ctx.Process(target=_entry, args=(r, world, port, out_dir, pg_timeout, fn, kwargs), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline
        paths = {r: os.path.join(out_dir, f"{r}.pkl") for r in expect}
        while time.monotonic() < end and not all(os.path.exists(p) for p in paths.values()):
            time.sleep(0.1)
        missing = [r for r, p in paths.items() if not os.path.exists(p)]
        results = {}
        for r, path in paths.items():
            if os.path.exists(path):
                with open(path, "rb") as f:
                    results[r] = pickle.load(f)
        extra = {r: os.path.join(out_dir, f"kill-{r}") for r in range(world)}
        for r, path in extra.items():
            if os.path.exists(path):
                with open(path) as f:
                    results.setdefault("killed_at", {})[r] = float(f.read())
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
    assert not missing, f"ranks {missing} gave no result within {deadline} s (hang)"
    return results


def _planner(kind: str, timeout: float, **overrides) -> Planner:
    """test_integration's planner (CP degrees 1-4 on 4 ranks) with ``timeout`` seconds."""
    return dataclasses.replace(make_planner(kind, **overrides), timeout=timeout)


# ---------------------------------------------------------------------------------------------------------------------
# failing together


class _BadStream:
    """Rank ``bad_rank``'s data go wrong at item ``at`` (0-based over the stream): ``kind`` ``"bad_sample"`` yields
    labels one token short, ``"iterator"`` raises from ``next``, ``"empty"`` yields an empty sample."""

    def __init__(self, samples: list[dict], kind: str, at: int, bad: bool):
        self.samples, self.kind, self.at, self.bad, self.i = samples, kind, at, bad, 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        i = self.i
        self.i += 1
        if i >= len(self.samples):
            raise StopIteration
        s = dict(self.samples[i])
        if self.bad and i == self.at:
            if self.kind == "iterator":
                raise OSError("shard 7 is unreadable")
            if self.kind == "bad_sample":
                s["labels"] = s["labels"][:-1]
            if self.kind == "empty":
                s = {k: v[:0] for k, v in s.items()}
        return s


def _exploding_plan(lengths):
    raise ValueError("solver exploded")


#: (kind, bad global rank, bad step, async planning, cause in the message); tp = pp = 1 runs them all in one spawn
SCENARIOS = [
    ("bad_sample", 2, 1, True, "bad input: item 1 of the global batch: ValueError: 'labels' has 35 tokens but "
                               "'tokens' has 36"),
    ("iterator", 1, 0, False, "data iterator: OSError: shard 7 is unreadable"),
    ("empty", 3, 0, True, "bad input: item 1, sequence 0 of the global batch is empty (0 tokens) and "
                          "Planner.empty_samples = 'error'"),
    ("planning", 0, 1, False, "planning: ValueError: solver exploded"),
]


def _fail_scenario(rank: int, groups, stages_read: bool, kind: str, bad_rank: int, bad_step: int,
                   async_planning: bool) -> dict:
    pool, per = groups.pool_size, 3
    reads = groups.tp_rank == 0 and (groups.pp_rank == 0 or stages_read)
    samples = [s for step in range(2) for s in rank_share(make_global_batch(BATCHES[step], seed=step),
                                                          groups.pool_index, pool)[:per]]
    bad = rank == bad_rank and kind != "planning"
    stream = _BadStream(samples, kind, at=bad_step * per + 1, bad=bad) if reads else None
    planner = _planner("equal", SLOW_TIMEOUT_S, async_planning=async_planning,
                       empty_samples="error" if kind == "empty" else "skip")
    if pool != 4:
        planner = Planner(strategy="fcp", timeout=SLOW_TIMEOUT_S, async_planning=async_planning)
    w = DynamicCPDataIterator(stream, planner=planner, groups=groups, num_samples=per)
    done = []
    for step in range(2):
        if kind == "planning" and rank == bad_rank and step == bad_step:
            planner.plan_fn = _exploding_plan  # synchronous planning: batch `bad_step` is planned with it
        started = time.time()
        try:
            batch = w.next_global_batch()
        except RankFailedError as exc:
            again = None
            try:
                w.next_global_batch()
            except RankFailedError as exc2:
                again = str(exc2)
            return {"done": done, "step": step, "started": started, "raised_at": time.time(), "error": str(exc),
                    "failures": exc.failures, "again": again}
        done.append(batch.num_microbatches)
    return {"done": done, "step": None}


def _fail_worker(rank: int, world: int, out_dir: str, scenarios: list, tp: int, pp: int,
                 stages_read: bool = False) -> dict:
    """Every scenario in turn on the same processes: the failing rank carries on (alive) to the next one."""
    groups = make_process_groups(tp_size=tp, pp_size=pp, timeout=datetime.timedelta(seconds=SLOW_TIMEOUT_S),
                                 cp_groups="lazy")
    return {"scenarios": [_fail_scenario(rank, groups, stages_read, *sc[:4]) for sc in scenarios]}


def _check_failed_together(results: dict, scenarios: list, tp: int, pp: int) -> None:
    for i, (kind, bad_rank, bad_step, _async, cause) in enumerate(scenarios):
        values = []
        for r in range(4):
            res = results[r]
            assert res["ok"], f"rank {r}: {res.get('type')}: {res.get('error')}\n{res.get('tb')}"
            v = res["value"]["scenarios"][i]
            assert v["step"] == bad_step, f"{kind}: rank {r} raised at step {v['step']}, expected {bad_step}"
            assert len(v["done"]) == bad_step, f"{kind}: the steps before the bad one trained on every rank"
            took = v["raised_at"] - v["started"]
            assert took < FAIL_WITHIN_S, f"{kind}: rank {r} took {took:.1f} s"
            print(f"[{kind}, tp={tp}, pp={pp}] rank {r} raised {took:.3f} s after the step started")
            assert v["again"] == v["error"], f"{kind}: a failed wrapper raises the same error again"
            values.append(v)
        assert len({v["error"] for v in values}) == 1, [v["error"] for v in values]
        msg = values[0]["error"]
        pool_rank = (bad_rank // tp) % (4 // (tp * pp))
        assert f"pool rank {pool_rank} (global rank {bad_rank}), {cause}" in msg, msg
        assert f"global batch {bad_step} failed on 1 of" in msg, msg
        assert [f.global_rank for f in values[bad_rank]["failures"]] == [bad_rank]


def test_one_rank_fails_every_rank_raises_the_same_error():
    """Bad data, an exception from the data iterator, an empty sample under ``empty_samples="error"`` and a solver
    error, each on one rank that stays alive (it goes on to the next scenario): all 4 ranks raise the same
    RankFailedError naming the rank and the cause within 10 s, though every timeout is 30 s (sync and async
    planning; a failure in a batch read ahead is raised when that batch is asked for)."""
    results = run_ranks(_fail_worker, deadline=120, scenarios=SCENARIOS, tp=1, pp=1)
    _check_failed_together(results, SCENARIOS, tp=1, pp=1)


def test_failure_reaches_tp_peers_and_later_pipeline_stages():
    """tp = pp = 2: the data-reading rank's bad sample makes its TP peer, the stage without data and that stage's
    TP peer raise the same error, within 10 s."""
    scenarios = [("bad_sample", 0, 1, True, "bad input: item 1 of the global batch: ValueError: 'labels' has")]
    results = run_ranks(_fail_worker, deadline=90, scenarios=scenarios, tp=2, pp=2)
    _check_failed_together(results, scenarios, tp=2, pp=2)


def test_failure_of_a_later_stage_reaches_stage_0():
    """tp = 1, pp = 2, both stages read the same data and plan: stage 1's iterator error (global rank 2, pool rank
    0 of stage 1's pool) makes stage 0's pool raise the same error too, within 10 s."""
    scenarios = [("iterator", 2, 1, True, "data iterator: OSError: shard 7 is unreadable")]
    results = run_ranks(_fail_worker, deadline=90, scenarios=scenarios, tp=1, pp=2, stages_read=True)
    _check_failed_together(results, scenarios, tp=1, pp=2)


def test_failure_message_lists_every_failing_rank():
    err = RankFailedError.from_failures(3, [Failure(2, 6, "planning", "ValueError: b"),
                                            Failure(0, 4, "bad input", "KeyError: a")], pool_size=4)
    assert str(err) == ("dynacp: global batch 3 failed on 2 of 4 ranks of the DP x CP pool (every rank raises this "
                        "error):\n  pool rank 0 (global rank 4), bad input: KeyError: a\n"
                        "  pool rank 2 (global rank 6), planning: ValueError: b")
    assert [f.pool_rank for f in err.failures] == [0, 2] and err.batch == 3


def test_split_samples_rejects_malformed_samples():
    ok = {"tokens": torch.arange(4), "labels": torch.arange(4)}
    for bad, text in [
        ({"loss_mask": torch.ones(3)}, "'loss_mask' has 3 tokens but 'tokens' has 4"),
        ({"position_ids": torch.arange(5)}, "'position_ids' has 5 tokens"),
        ({"labels": torch.ones(4)}, "'labels' must hold integers, got dtype torch.float32"),
        ({"loss_mask": torch.tensor([1.0, float("nan"), 1.0, 1.0])}, "non-finite"),
        ({"cu_seqlens": torch.tensor([0, 3, 2, 4])}, "bad cu_seqlens"),
    ]:
        with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
            split_samples(ok | bad)
    assert [s["tokens"].numel() for s in split_samples(ok | {"cu_seqlens": [0, 2, 2, 4]})] == [2, 0, 2]


def test_planner_checks_its_policies():
    with pytest.raises(ValueError, match="empty_samples must be 'skip' or 'error', got 'drop'"):
        Planner(empty_samples="drop")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Planner(timeout=0)
    assert Planner().empty_samples == "skip"
    assert Planner().fingerprint() != Planner(empty_samples="error").fingerprint()


# ---------------------------------------------------------------------------------------------------------------------
# a rank that dies


class _KillingIterator(DynamicCPDataIterator):
    """Kills (or stops) its own process at a chosen point of global batch 1 (``"groups"``: before creating the CP
    groups of global batch 0, the first ones)."""

    kill_at = ""
    out_dir = ""
    sig = signal.SIGKILL

    def _die(self, point: str) -> None:
        if self.kill_at == point and self.steps == (0 if point == "groups" else 1):
            with open(os.path.join(self.out_dir, f"kill-{dist.get_rank()}"), "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), self.sig)

    def _read_items(self):
        self._die("reading")
        return super()._read_items()

    def _exchange_samples(self, route):
        self._die("re-route")
        return super()._exchange_samples(route)

    def _attach_groups(self, batch):
        self._die("groups")
        return super()._attach_groups(batch)


def _kill_worker(rank: int, world: int, out_dir: str, victim: int, point: str, sig: int) -> dict:
    groups = make_process_groups(timeout=datetime.timedelta(seconds=KILL_TIMEOUT_S), cp_groups="lazy")
    samples = [s for step in range(2) for s in rank_share(make_global_batch(BATCHES[step], seed=step), rank, world)]
    planner = _planner("variable", KILL_TIMEOUT_S, async_planning=False)
    cls = type("K", (_KillingIterator,), {"kill_at": point if rank == victim else "", "out_dir": out_dir,
                                         "sig": sig})
    w = cls(iter(samples), planner=planner, groups=groups, num_samples=3)
    while w.next_global_batch() is not None:  # two global batches, then the end of the data (a status exchange)
        pass
    return {"steps": w.steps}


@pytest.mark.parametrize("point,sig", [("reading", signal.SIGKILL), ("re-route", signal.SIGKILL),
                                       ("re-route", signal.SIGSTOP), ("groups", signal.SIGSTOP)],
                         ids=["kill-reading", "kill-reroute", "stop-reroute", "stop-groups"])
def test_killed_rank_makes_the_others_raise_within_the_timeout(point, sig):
    """Rank 3 is SIGKILLed in global batch 1 (while reading its data, or between the plan check and the sample
    exchange): ranks 0-2 raise CommunicationError within the 4 s timeout (plus 2 s of scheduling slack); gloo sees
    the closed connection at once. SIGSTOP (a rank that hangs with its connections open) shows the timeouts
    themselves: the others raise after 4 s, not before, in the p2p waits of the re-route or in creating CP groups
    (``new_group(timeout=...)``; those raise on the ranks that reach it, the others in their next exchange)."""
    results = run_ranks(_kill_worker, deadline=60, expect=(0, 1, 2), victim=3,
                        point=point, sig=int(sig))
    killed_at = results["killed_at"][3]
    for r in range(3):
        res = results[r]
        assert not res["ok"], f"rank {r} finished although rank 3 died"
        assert res["type"] == "CommunicationError", f"rank {r}: {res['type']}: {res['error']}\n{res['tb']}"
        assert res["error"].startswith("dynacp: ") and "died" in res["error"], res["error"]
        waited = res["raised_at"] - killed_at
        assert waited < KILL_TIMEOUT_S + 2.0, f"rank {r} raised {waited:.1f} s after the kill"
        if sig == signal.SIGSTOP:
            assert waited > KILL_TIMEOUT_S - 0.5, f"rank {r} raised {waited:.1f} s after the stop, before the timeout"
        print(f"[{signal.Signals(sig).name} while {point}] rank {r} raised {waited:.2f} s after the kill: {res['error'][:160]}")


# ---------------------------------------------------------------------------------------------------------------------
# empty samples


# 16 items, 4 per rank: three are empty (rank 0: one, rank 3: two) and rank 2 packs two of its sequences into one
# item with an empty segment between them
EMPTY_LENGTHS = [60, 45, 0, 30, 20, 12, 8, 7, 5, 3, 33, 17, 0, 9, 0, 11]


def _empty_items(rank: int) -> list[dict]:
    samples = make_global_batch(EMPTY_LENGTHS, seed=5)
    mine = samples[rank * 4:(rank + 1) * 4]
    if rank == 2:  # items 10 and 11 packed into one item, with an empty segment between them
        a, b = mine[2], mine[3]
        packed = {k: torch.cat([a[k], b[k]]) for k in a}
        packed["cu_seqlens"] = torch.tensor([0, a["tokens"].numel(), a["tokens"].numel(), packed["tokens"].numel()])
        mine = mine[:2] + [packed, mine[0] | {}]  # 4 items again: the last repeats item 8
    return mine


def _global_empty_batch() -> list[dict]:
    """The non-empty sequences in pool-rank-major read order (what the wrapper trains on)."""
    out = []
    for r in range(4):
        for item in _empty_items(r):
            out += [s for s in split_samples(item) if s["tokens"].numel()]
    return out


def _empty_worker(rank: int, world: int, out_dir: str) -> dict:
    groups = make_process_groups(timeout=datetime.timedelta(seconds=SLOW_TIMEOUT_S), cp_groups="lazy")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("dynacp.integration").addHandler(Keep())  # the wrapper's records (not the core's warnings)
    planner = _planner("variable", SLOW_TIMEOUT_S)
    w = DynamicCPDataIterator(iter(_empty_items(rank)), planner=planner, groups=groups, num_samples=4)
    batch = w.next_global_batch()
    model = _build_model()
    for mb in batch.microbatches:
        p = mb["packed_seq_params"]
        logits = model(mb["tokens"], mb["position_ids"], lambda q, k, v, p=p: cp_attention(q, k, v, p))
        masked_token_loss(logits, mb["labels"], mb["loss_mask"])[0].backward()
    finalize_grads(model.parameters(), groups, batch.num_valid_tokens)
    return {"grads": {n: q.grad.clone() for n, q in model.named_parameters()}, "skipped": batch.skipped_empty,
            "per_rank": batch.skipped_empty_per_rank, "total": w.total_skipped_empty, "logs": records,
            "seqlen_sum": batch.seqlen_sum, "degrees": sorted({len(r) for r in batch.rings}),
            "reroute": dataclasses.asdict(batch.reroute), "held": sum(mb["num_local_tokens"] for mb in batch.microbatches),
            "field_bytes": sum(mb[k].nbytes for mb in batch.microbatches
                               for k in ("tokens", "labels", "loss_mask", "position_ids", "sequence_ids"))}


def _reference_grads(batch: list[dict]) -> dict[str, torch.Tensor]:
    model = _build_model()
    cu = [0]
    for b in batch:
        cu.append(cu[-1] + b["tokens"].numel())
    cat = {k: torch.cat([b[k] for b in batch]) for k in ("tokens", "labels", "loss_mask", "position_ids")}
    logits = model(cat["tokens"], cat["position_ids"], lambda q, k, v: reference_attention(q, k, v, cu))
    loss_sum, count = masked_token_loss(logits, cat["labels"], cat["loss_mask"])
    (loss_sum / count).backward()
    return {n: q.grad.clone() for n, q in model.named_parameters()}


def _check_reroute_stats(values: list[dict]) -> None:
    """GlobalBatch.reroute adds up: what is sent is received, a rank's held rows are its received and kept rows (40
    bytes each), the peak is the receive buffer plus the send buffers, at most one message per peer each way."""
    stats = [v["reroute"] for v in values]
    assert sum(s["bytes_sent"] for s in stats) == sum(s["bytes_received"] for s in stats) > 0
    assert sum(s["messages_sent"] for s in stats) == sum(s["messages_received"] for s in stats)
    for v, s in zip(values, stats):
        assert s["bytes_received"] + s["local_bytes"] == v["held"] * 40
        assert s["peak_bytes"] == v["held"] * 40 + s["bytes_sent"]
        assert s["messages_sent"] <= 3 and s["messages_received"] <= 3
        assert s["output_bytes"] == v["field_bytes"]


def test_empty_samples_are_skipped_counted_and_the_gradient_is_unchanged():
    """Four empty samples (one an empty segment of a packed item) on three ranks: no rank fails, every rank reports
    4 skipped ([1, 0, 1, 2] by pool rank), pool rank 0 logs it, and the gradient equals the single-process
    reference over the non-empty sequences (fp32, 1e-5 relative). The re-route's counters add up."""
    results = run_ranks(_empty_worker, deadline=90)
    ref_batch = _global_empty_batch()
    ref = _reference_grads(ref_batch)
    for r in range(4):
        res = results[r]
        assert res["ok"], f"rank {r}: {res.get('type')}: {res.get('error')}\n{res.get('tb')}"
        v = res["value"]
        assert v["per_rank"] == [1, 0, 1, 2] and v["skipped"] == 4 and v["total"] == 4
        assert v["seqlen_sum"] == sum(s["tokens"].numel() for s in ref_batch)
        assert len(v["degrees"]) > 1, f"several CP degrees exercised: {v['degrees']}"
        for name, g in ref.items():
            err = _rel_err(v["grads"][name], g)
            assert err < RTOL, f"rank {r} grad {name}: rel err {err:.2e}"
    _check_reroute_stats([results[r]["value"] for r in range(4)])
    logs = results[0]["value"]["logs"]
    assert any("skipped 4 empty sample(s) (per pool rank: [1, 0, 1, 2]" in m for m in logs), logs
    assert not results[1]["value"]["logs"], "only pool rank 0 logs the count"


def _all_empty_worker(rank: int, world: int, out_dir: str) -> dict:
    groups = make_process_groups(timeout=datetime.timedelta(seconds=SLOW_TIMEOUT_S), cp_groups="lazy")
    item = {"tokens": torch.zeros(0, dtype=torch.long), "labels": torch.zeros(0, dtype=torch.long)}
    w = DynamicCPDataIterator(iter([item, item]), planner=_planner("variable", SLOW_TIMEOUT_S),
                              groups=groups, num_samples=2)
    batch = w.next_global_batch()
    return {"mbs": batch.num_microbatches, "skipped": batch.skipped_empty, "next": w.next_global_batch()}


def test_a_batch_of_only_empty_samples_gives_every_rank_no_microbatches():
    results = run_ranks(_all_empty_worker, world=2, deadline=60)
    for r in range(2):
        assert results[r]["ok"], results[r].get("tb")
        assert results[r]["value"] == {"mbs": 0, "skipped": 4, "next": None}

