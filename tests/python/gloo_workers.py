"""Spawned gloo process groups for multi-process tests: ``run_workers(fn, world)`` runs ``fn(rank, world, **kw)`` on
``world`` processes and returns their results, failing (and killing every child) past a hard deadline."""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import torch.distributed as dist
import torch.multiprocessing as mp

PG_TIMEOUT_S = 30  # each torch.distributed collective


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable, kwargs: dict) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
        result: dict = {"ok": True, "value": fn(rank, world, **kwargs)}
    except BaseException as exc:  # report every failure to the parent
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()}
    with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)
    if dist.is_initialized():
        dist.destroy_process_group()


def run_workers(fn: Callable, world: int = 4, deadline: float = 120.0, **kwargs: Any) -> list:
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
        assert not hung, f"ranks {hung} did not finish within {deadline}s"
        results = []
        for r in range(world):
            with open(os.path.join(out_dir, f"{r}.pkl"), "rb") as f:
                res = pickle.load(f)
            assert res["ok"], f"rank {r} failed: {res['error']}\n{res['tb']}"
            results.append(res["value"])
    return results
