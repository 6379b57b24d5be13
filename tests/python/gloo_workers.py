"""Spawned gloo process groups for multi-process tests: ``run_workers(fn, world)`` runs ``fn(rank, world, **kw)`` on
``world`` processes and returns their results, failing (and killing every child) past a hard deadline."""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from typing import Any, Callable, Iterator

import torch.distributed as dist
import torch.multiprocessing as mp

PG_TIMEOUT_S = 30        # each torch.distributed collective
DEADLINE_S = 180         # whole multi-process run (then every child is killed and the test fails)


@contextlib.contextmanager
def counting_new_groups() -> Iterator[list]:
    """Count the ``torch.distributed.new_group`` calls made inside the block: the yielded list gets one entry (the
    call's positional arguments) per call."""
    calls: list = []
    original = dist.new_group

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    dist.new_group = counting
    try:
        yield calls
    finally:
        dist.new_group = original


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable, kwargs: dict) -> None:
    result: dict[str, Any]
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        t0 = time.perf_counter()
        result = {"ok": True, "value": fn(rank, world, **kwargs)}
        result["seconds"] = time.perf_counter() - t0
    except BaseException as exc:  # report every failure to the parent, including the error type
        result = {"ok": False, "type": type(exc).__name__, "error": str(exc), "tb": traceback.format_exc()}
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def run_raw(fn: Callable, world: int = 4, deadline: float = DEADLINE_S, **kwargs: Any) -> list[dict]:
    """Run ``fn(rank, world, **kwargs)`` on ``world`` spawned processes; fail (and kill all) after ``deadline`` s.
    Returns each rank's result dict: ``ok``, then ``value`` and ``seconds``, or ``type``, ``error`` and ``tb``."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as out_dir:
        procs = [ctx.Process(target=_entry, args=(r, world, port, out_dir, fn, kwargs), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        assert not hung, f"ranks {hung} did not finish within {deadline}s (hang)"
        results = []
        for r in range(world):
            path = os.path.join(out_dir, f"{r}.pkl")
            assert os.path.exists(path), f"rank {r} exited with code {procs[r].exitcode} and no result"
            with open(path, "rb") as f:
                results.append(pickle.load(f))
    return results


def values(results: list[dict]) -> list[Any]:
    """Every rank's return value; fails the test with the first failing rank's error and traceback."""
    for r, res in enumerate(results):
        assert res["ok"], f"rank {r} failed: {res['type']}: {res['error']}\n{res['tb']}"
    return [res["value"] for res in results]


def run_workers(fn: Callable, world: int = 4, deadline: float = DEADLINE_S, **kwargs: Any) -> list:
    """``run_raw`` that requires every rank to succeed and returns their values."""
    return values(run_raw(fn, world, deadline, **kwargs))
