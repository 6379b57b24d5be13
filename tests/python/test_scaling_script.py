"""benchmarks/scaling.py on a small pool: one row per (size, strategy), each naming the plan that dynacp.plan returns
for the same batch (its digest and predicted step time), and the JSON file holding the same rows."""

from __future__ import annotations

import json
import sys

import numpy as np
from script_loader import load_script

import dynacp
from dynacp import distributions


def _module():
    return load_script("benchmarks/scaling.py")


def test_rows_name_the_plans_dynacp_returns(tmp_path, monkeypatch, capsys):
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--sizes", "40", "90", "--ranks", "16", "--strategies", "packing",
                                      "dynacp", "--seed", "3", "--json", str(out)])
    assert _module().main() == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    rows = json.loads(out.read_text())
    assert len(table) == 1 + 4 and [(r["sequences"], r["strategy"]) for r in rows] == [
        (40, "packing"), (40, "dynacp"), (90, "packing"), (90, "dynacp")]
    cluster = dynacp.Cluster(num_ranks=16, ranks_per_node=8, tokens_per_rank=16384)
    for r in rows:
        lengths = distributions.get("wikipedia").sample(r["sequences"], np.random.default_rng(3))
        p = dynacp.plan(lengths, cluster, dynacp.CostModel(), r["strategy"])
        assert r["digest"] == f"{p.digest():016x}" and r["step_s"] == p.predicted.step_time
        assert r["step_s"] >= r["lower_bound_s"] > 0 and r["wall_s"] > 0 and r["solve_ms"] >= 0
        assert r["digest"] in next(line for line in table if f"| {r['sequences']:,} | {r['strategy']} |" in line)
