"""Import of the distca H100 profiles (hao-ai-lab/distca ``distca/profiling/data/``, kept in
``shared/data/profiles/``) as a dynacp :class:`~dynacp.calibrate.fileformat.Profile`.

* ``compute-attn-H100.csv`` (``L, cp, tp, duration_per_doc``; ms per document per rank, one layer, forward) ->
  ``attention`` rows (one tensor-parallel degree, ``tp``; causal);
* ``compute-profile-mlp-only.csv`` (``model_id, ctx_len, layer_mlp_time``; ms per layer, forward) -> ``linear``
  rows of one model;
* ``nccl_perf.csv`` (nccl-tests: ``op, ngpu, size_bytes, t_us_out``) -> ``p2p`` rows from the ring all-gathers: an
  all-gather of ``size_bytes`` over n GPUs is n - 1 ring hops of ``size_bytes / n`` each, so one hop takes
  ``t / (n - 1)`` (intra-node).

The files time a forward pass of one layer; the profile's ``step_factor`` (default 3: backward ~ 2 x forward) and
``layers`` (default 32) scale them to the whole step the cost model describes. Bad input (a missing column, a
negative or NaN time) raises ValueError naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Optional, Union

from dynacp.calibrate.fileformat import Profile, check_row

ATTN_FILE = "h100_compute-attn-H100.csv"
MLP_FILE = "h100_compute-profile-mlp-only.csv"
NCCL_FILE = "h100_nccl_perf.csv"


def read_csv(path: Union[str, Path], columns: tuple[str, ...]) -> list[tuple[int, dict[str, float | str]]]:
    """``(line number, row)`` of a CSV file with a header; numeric cells as floats. ValueError naming the file and
    line for a missing column, an empty cell, a non-number, NaN, infinity or a negative number."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"profile CSV file {p} does not exist")
    with p.open(newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{p}: line 1 (header): missing column(s) {missing}; the header has {header}")
        out = []
        for i, row in enumerate(reader, start=2):
            vals: dict[str, float | str] = {}
            for c in columns:
                cell = (row.get(c) or "").strip()
                try:
                    x = float(cell)
                except ValueError:
                    vals[c] = cell  # text columns (op, model_id); numeric ones are checked by their users
                    continue
                if not math.isfinite(x) or x < 0:
                    raise ValueError(f"{p}: line {i}, column '{c}': {cell!r} must be a finite number >= 0")
                vals[c] = x
            out.append((i, vals))
    return out


def _num(v: float | str, path: Path, line: int, col: str) -> float:
    if isinstance(v, str):
        raise ValueError(f"{path}: line {line}, column '{col}': {v!r} is not a number")
    if v <= 0:
        raise ValueError(f"{path}: line {line}, column '{col}': {v!r} must be > 0")
    return v


def import_attention(path: Union[str, Path], tp: int = 1) -> list[dict]:
    """``attention`` rows of a distca ``compute-attn`` CSV for one tensor-parallel degree (seconds per layer)."""
    p = Path(path)
    rows = []
    for line, r in read_csv(p, ("L", "cp", "tp", "duration_per_doc")):
        if _num(r["tp"], p, line, "tp") != tp:
            continue
        row = {"lengths": [int(_num(r["L"], p, line, "L"))], "degree": int(_num(r["cp"], p, line, "cp")),
               "mask": "causal", "seconds": _num(r["duration_per_doc"], p, line, "duration_per_doc") * 1e-3,
               "spread": 0.0}
        rows.append(check_row("attention", row, f"{p} line {line}", 0))
    if not rows:
        raise ValueError(f"{p}: no rows with tp = {tp}")
    return rows


def import_linear(path: Union[str, Path], model_id: Optional[str] = None) -> list[dict]:
    """``linear`` rows of a distca ``compute-profile-mlp-only`` CSV for one model (default: the first)."""
    p = Path(path)
    data = read_csv(p, ("model_id", "ctx_len", "layer_mlp_time"))
    model_id = model_id or (str(data[0][1]["model_id"]) if data else None)
    rows = [check_row("linear", {"tokens": int(_num(r["ctx_len"], p, line, "ctx_len")),
                                 "seconds": _num(r["layer_mlp_time"], p, line, "layer_mlp_time") * 1e-3,
                                 "spread": 0.0}, f"{p} line {line}", 0)
            for line, r in data if r["model_id"] == model_id]
    if not rows:
        raise ValueError(f"{p}: no rows of model_id {model_id!r}")
    return rows


def import_nccl(path: Union[str, Path], op: str = "all_gather") -> list[dict]:
    """``p2p`` rows (one ring hop each) from the ring all-gathers of an nccl-tests CSV."""
    p = Path(path)
    rows = []
    for line, r in read_csv(p, ("op", "ngpu", "size_bytes", "t_us_out")):
        if r["op"] != op:
            continue
        n = int(_num(r["ngpu"], p, line, "ngpu"))
        if n < 2:
            continue
        rows.append(check_row("p2p", {"group_size": n, "crosses_nodes": 0,
                                      "bytes": _num(r["size_bytes"], p, line, "size_bytes") / n,
                                      "seconds": _num(r["t_us_out"], p, line, "t_us_out") * 1e-6 / (n - 1),
                                      "spread": 0.0}, f"{p} line {line}", 0))
    return rows


def import_distca(directory: Union[str, Path], *, tp: int = 1, layers: int = 32, step_factor: float = 3.0,
                  mlp_model: Optional[str] = None, kv_bytes_per_token: Optional[float] = None) -> Profile:
    """A :class:`Profile` of the distca files in ``directory`` (attention required; MLP and NCCL when present).

    Args:
        directory: the folder holding the ``h100_*.csv`` files (``shared/data/profiles``).
        tp: the tensor-parallel degree whose attention rows to use.
        layers: layers of the step the preset describes (times are per layer).
        step_factor: whole step / forward pass (3: backward ~ 2 x forward).
        mlp_model: ``model_id`` of the MLP rows (default: the file's first model).
        kv_bytes_per_token: bytes per token per ring hop of the whole step, recorded in the profile's meta.
    """
    d = Path(directory)
    prof = Profile(meta={"device": "NVIDIA H100 (distca profiles)", "dtype": "bfloat16", "source": str(d),
                         "layers": layers, "step_factor": step_factor, "tp": tp}, source=str(d))
    prof.tables["attention"] = import_attention(d / ATTN_FILE, tp)
    if (d / MLP_FILE).is_file():
        prof.tables["linear"] = import_linear(d / MLP_FILE, mlp_model)
    if (d / NCCL_FILE).is_file():
        prof.tables["p2p"] = import_nccl(d / NCCL_FILE)
    if kv_bytes_per_token is not None:
        prof.meta["kv_bytes_per_token"] = float(kv_bytes_per_token)
    return prof
