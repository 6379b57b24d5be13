"""benchmarks/subsumed.py on a few small instances: one row per registered family, every instance's plan credited
to exactly one family, and a family's losses only where skipping it made that instance's plan slower."""

from __future__ import annotations

import re
import sys

from script_loader import load_script

import dynacp


def _module():
    return load_script("benchmarks/subsumed.py")


def test_every_family_has_a_row_and_every_plan_one_family(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["subsumed.py", "--count", "14", "--seed", "5"])
    assert _module().main() == 0
    out = capsys.readouterr().out
    used = int(re.match(r"(\d+) instances within", out).group(1))
    assert used > 0
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    families = dynacp.dynacp_families()
    assert [r[0].strip() for r in rows[: len(families)]] == families
    assert all(r[0].strip().endswith("(fallback)") for r in rows[len(families):])
    assert sum(int(r[1]) for r in rows) == used
    rows = rows[: len(families)]
    slower = [int(r[2]) for r in rows]
    loss = [float(r[3].strip().rstrip("%")) for r in rows]
    assert all(0 <= s <= used for s in slower)
    assert all((s == 0) == (x == 0.0) for s, x in zip(slower, loss))
