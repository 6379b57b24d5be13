#!/usr/bin/env python3
"""Regenerates the quantile tables in python/dynacp/data/ from the public length files in ../shared/data/lengths.

Usage: python3 scripts/make_distributions.py [--shared ../shared]
The package ships only these tables (2,001 quantiles each), never the raw files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

GRID = np.concatenate([np.linspace(0.0, 0.99, 991), np.linspace(0.99, 1.0, 1011)[1:]])

SOURCES = {
    "wikipedia": (
        "lengths/wikipedia_flexsp.txt",
        "FlexSP (ASPLOS'25) tokenised Wikipedia document lengths, 1,000,000 documents "
        "(PKU-DAIR/Hetu-Galvatron, branch flexsp, galvatron/datasets/wikipedia.txt, Apache-2.0)",
    ),
    "wlbllm": (
        "lengths/wlbllm_style_distca.json",
        "stylised WLB-LLM distribution, 99,519 lengths (hao-ai-lab/distca dist_wlbllm.json, Apache-2.0); "
        "a stress pattern, not ground truth",
    ),
}


def load(path: Path) -> np.ndarray:
    if path.suffix == ".json":
        return np.asarray(json.loads(path.read_text()), dtype=np.int64)
    return np.loadtxt(path, dtype=np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared"))
    args = ap.parse_args()
    out_dir = Path(__file__).resolve().parents[1] / "python" / "dynacp" / "data"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (rel, source) in SOURCES.items():
        x = load(Path(args.shared) / "data" / rel)
        q = np.quantile(x, GRID, method="linear")
        table = {
            "name": name,
            "source": source,
            "n": int(x.size),
            "mean": float(x.mean()),
            "quantiles": [[float(p), float(v)] for p, v in zip(GRID, q)],
        }
        (out_dir / f"{name}.json").write_text(json.dumps(table, separators=(",", ":")))
        print(f"{name}: n={x.size} mean={x.mean():.1f} p50={np.median(x):.0f} max={x.max()}")


if __name__ == "__main__":
    main()
