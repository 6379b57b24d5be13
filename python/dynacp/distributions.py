"""Embedded sequence-length distributions for benchmarks, examples and tests.

Two are quantile tables of real public length files (the raw files are not shipped); three are synthetic recipes
calibrated to published statistics (see ``../shared/reference/academic_anchors.md`` §7). Every distribution is
capped at a context window: a longer document is split at the window by the data loader, as trainers do, so a
sample never exceeds ``context``.

>>> import numpy as np, dynacp.distributions as D
>>> D.sample("wikipedia", 4, np.random.default_rng(0)).dtype
dtype('int64')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import numpy as np


@dataclass(frozen=True)
class Distribution:
    """A named length distribution."""

    name: str
    """Registry key."""
    source: str
    """Where it comes from (data file and licence, or the statistics a recipe is calibrated to)."""
    context: int
    """Context window in tokens: samples are capped here (a longer document is split by the loader)."""
    draw: Callable[[int, np.random.Generator], np.ndarray]
    """Draws n lengths (int64, >= 1) with the given generator (before the context cap)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if n <= 0:
            raise ValueError(f"number of sequences must be >= 1, got {n}")
        x = np.asarray(self.draw(n, rng), dtype=np.int64)
        return np.clip(x, 1, self.context)


@cache
def _table(name: str) -> tuple:
    data = json.loads(resources.files("dynacp").joinpath("data", f"{name}.json").read_text())
    q = np.asarray(data["quantiles"], dtype=np.float64)
    return q[:, 0], np.log(np.maximum(q[:, 1], 1.0)), data["source"]


def _from_table(name: str) -> Callable[[int, np.random.Generator], np.ndarray]:
    def draw(n: int, rng: np.random.Generator) -> np.ndarray:
        p, logv, _ = _table(name)
        return np.rint(np.exp(np.interp(rng.random(n), p, logv))).astype(np.int64)

    return draw


def _long_context(tail_share: float, tail_min: int, tail_max: int) -> Callable[[int, np.random.Generator], np.ndarray]:
    """80 % log-uniform in [256, 4K], ``tail_share`` of samples log-uniform in [tail_min, tail_max], the rest
    log-uniform in [4K, 32K]."""

    def draw(n: int, rng: np.random.Generator) -> np.ndarray:
        u = rng.random(n)
        short = np.exp(rng.uniform(np.log(256), np.log(4096), n))
        mid = np.exp(rng.uniform(np.log(4096), np.log(32768), n))
        tail = np.exp(rng.uniform(np.log(tail_min), np.log(tail_max), n))
        out = np.where(u < 0.8, short, np.where(u < 1.0 - tail_share, mid, tail))
        return np.rint(out).astype(np.int64)

    return draw


def _sft(n: int, rng: np.random.Generator) -> np.ndarray:
    long = rng.random(n) < 0.001
    x = np.where(long, rng.lognormal(np.log(37_000), 0.3, n), rng.lognormal(np.log(1_000), 0.6, n))
    return np.rint(x).astype(np.int64)


DISTRIBUTIONS: Dict[str, Distribution] = {
    d.name: d
    for d in [
        Distribution("wikipedia", "", 131_072, _from_table("wikipedia")),
        Distribution("wlbllm", "", 131_072, _from_table("wlbllm")),
        Distribution(
            "longcontext",
            "synthetic production long-context mix after ByteScale §3.1: 80 % of samples <= 4K, 1 % >= 128K "
            "(log-uniform 128K-512K) carrying about 43 % of tokens, the rest 4K-32K",
            524_288,
            _long_context(0.01, 131_072, 524_288),
        ),
        Distribution(
            "github",
            "synthetic code-like mix after ByteScale §8.2: the long-context shape with a lighter tail "
            "(0.4 % of samples log-uniform 128K-256K, about 16 % of tokens)",
            262_144,
            _long_context(0.004, 131_072, 262_144),
        ),
        Distribution(
            "sft",
            "synthetic SFT mix after the Llama-3 long SFT statistics cited by Skrull: 99.9 % lognormal around "
            "1K, 0.1 % around 37K",
            131_072,
            _sft,
        ),
    ]
}


def names() -> List[str]:
    """Names of the embedded distributions (the first is the CLI default)."""
    return list(DISTRIBUTIONS)


def get(name: str) -> Distribution:
    """The distribution ``name``; raises ValueError listing the known names."""
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown length distribution {name!r}; known: {', '.join(DISTRIBUTIONS)}")
    d = DISTRIBUTIONS[name]
    if not d.source:  # table-backed: the source is stored with the table
        d = Distribution(d.name, _table(name)[2], d.context, d.draw)
    return d


def sample(name: str, n: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """Draws ``n`` lengths (int64) from the embedded distribution ``name``."""
    return get(name).sample(n, rng if rng is not None else np.random.default_rng())


def read_lengths(path: Union[str, Path]) -> np.ndarray:
    """Reads a length file: ``.npy`` (1-D integers) or text with one positive integer per line (blank lines skipped).

    Raises ValueError naming the file, line (from 1) and entry (from 0, the sequence id) of the first malformed one.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"length file {path} does not exist")
    if path.suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{path}: expected a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
        bad = np.flatnonzero(arr <= 0)
        if bad.size:
            raise ValueError(f"{path}: entry {bad[0]} is {arr[bad[0]]}; lengths must be >= 1")
        return arr.astype(np.int64)
    out = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            where = f"{path}:{lineno}: entry {len(out)}"  # line numbers count from 1, entries (sequence ids) from 0
            try:
                v = int(text)
            except ValueError:
                raise ValueError(f"{where}: {text!r} is not an integer length") from None
            if v <= 0:
                raise ValueError(f"{where}: length {v} must be >= 1")
            out.append(v)
    if not out:
        raise ValueError(f"{path}: no lengths found")
    return np.asarray(out, dtype=np.int64)


def summary(lengths: np.ndarray) -> Dict[str, float]:
    """Mean, median, p99, max, and the share of tokens and of sum s^2 from sequences >= 8K."""
    x = np.asarray(lengths, dtype=np.float64)
    long = x >= 8192
    return {
        "n": float(x.size),
        "mean": float(x.mean()),
        "p50": float(np.median(x)),
        "p99": float(np.quantile(x, 0.99)),
        "max": float(x.max()),
        "tokens_ge_8k": float(x[long].sum() / x.sum()),
        "sq_ge_8k": float((x[long] ** 2).sum() / (x**2).sum()),
    }
