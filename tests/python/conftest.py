"""Shared fixtures. Tests may read ../shared/data (skipped when absent); the package never does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dynacp

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


@pytest.fixture
def shared_data() -> Path:
    path = SHARED / "data"
    if not path.exists():
        pytest.skip(f"shared data not found at {path}")
    return path


def small_cluster(ranks: int = 16, per_node: int = 8, tokens_per_rank: int = 4096) -> tuple:
    cost = dynacp.CostModel()
    cluster = dynacp.Cluster(
        num_ranks=ranks, ranks_per_node=per_node, activation_budget=tokens_per_rank * cost.mem_per_token
    )
    return cluster, cost


def random_lengths(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    return np.clip(rng.lognormal(6.5, 1.4, n).astype(np.int64), 1, cap)
