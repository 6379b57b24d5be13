#!/usr/bin/env python3
"""The GPU section of docs/benchmarks.md from a run's results (standard library only, so it works wherever the run's
files land, with or without torch or a built dynacp).

    python3 benchmarks/gpu_ring_report.py OUT/results.json                          # print the section
    python3 benchmarks/gpu_ring_report.py OUT/results.json --write-docs docs/benchmarks.md   # apply a GPU run

``results`` is tests/gpu/run.sh's results.json (prechecks, stages, and the ``gpu_ring`` results of
benchmarks/gpu_ring.py) or benchmarks/gpu_ring.py's own ``--json`` file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

COMPUTE_ONLY = ("(c) rows: compute only -- every rank of the split runs as a thread of one process on the one GPU "
                "(one CUDA stream), kv hops are device copies, no NCCL, no overlap of communication and compute.")


def targets(rows: list[dict]) -> list[str]:
    """The issue's efficiency targets against the measured forward+backward rows: >= 90 % at CP 1, >= 80 % per rank
    at CP 2-8 for packs of documents >= 32K tokens."""
    out = []
    done = [r for r in rows if "skipped" not in r and r["pass"] == "fwd+bwd"]
    cp1 = [r for r in done if r["cp"] == 1]
    long = [r for r in done if r["cp"] >= 2 and r["pack"] in ("32K docs", "128K docs")]
    for what, sel, need in (("CP 1, every pack", cp1, 0.9), ("CP 2-8, 32K and 128K documents", long, 0.8)):
        if not sel:
            out.append(f"{what}: not measured")
            continue
        worst = min(sel, key=lambda r: r["efficiency"])
        verdict = "met" if worst["efficiency"] >= need else "NOT met"
        out.append(f"{what} (>= {100 * need:.0f} %): {verdict}; lowest {100 * worst['efficiency']:.0f} % "
                   f"({worst['pack']}, {worst['what']})")
    return out


def _stage_lines(results: dict) -> list[str]:
    lines = ["| stage | status | seconds | limit (s) | note |", "|---|---|---:|---:|---|"]
    for s in results.get("prechecks", []):
        lines.append(f"| precheck: {s['name']} | {s['status']} | | | {s['reason']} |")
    for s in results.get("stages", []):
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {s['limit_s']:.0f} | {s['reason']} |")
    return lines


def render_section(results: dict) -> str:
    """The text between the gpu-ring markers of docs/benchmarks.md, from a results dict: this script's own (``--json``)
    or tests/gpu/run.sh's results.json (its ``gpu_ring`` entry, plus the prechecks and stages)."""
    ring = results.get("gpu_ring", results) or {}
    dry = results.get("mode") == "dry-run" or ring.get("device") == "cpu"
    when = ring.get("utc", results.get("started_utc", "?"))
    head = (f"{'DRY RUN on CPU (TorchBlock, fp32; plumbing only, not GPU results)' if dry else 'Measured'} on "
            f"{ring.get('gpu', '?')}, torch {ring.get('torch', '?')}, {when} UTC, with `{results.get('command') or ring.get('command', '?')}`.")
    parts = [head]
    if results.get("stages") or results.get("prechecks"):
        status = results.get("status", "?")
        parts.append(f"Run status: {status}, {results.get('wall_s', 0):.0f} s of machine time.\n\n"
                     + "\n".join(_stage_lines(results)))
    checks = ring.get("checks", [])
    if checks:
        bad = [c for c in checks if not c["ok"]]
        parts.append(f"Correctness (`--check`, fp64 reference, FlashAttention's 2x rule): {len(checks) - len(bad)} of "
                     f"{len(checks)} cases pass" + ("." if not bad else "; failing: " + "; ".join(
                         f"cp {c['cp']} {c['mask']} {c['dtype']} {c['detail']}" for c in bad) + "."))
    p2p = results.get("p2p_check")
    if p2p:
        cases = [c for r in p2p.get("ranks", []) for c in r["cases"]]
        passed = sum(c["ok"] for c in cases)
        parts.append(f"Across processes (`tests/gpu/ring_p2p_check.py`: 3 processes over gloo, {p2p['device']} "
                     f"tensors{', host-staged' if p2p['device'] == 'cuda' else ''}; a ring over the whole group, "
                     f"then rings over parts of it): {passed} of {len(cases)} rank-rings pass"
                     + ("." if p2p.get("ok") else " (FAILED, see the run log)."))
    rows = ring.get("bench", [])
    if rows:
        table = [f"Benchmark ({ring.get('shape', '?')}; median of {ring.get('iters', '?')}):", "",
                 "| pack | pass | what | time (ms) | TFLOP/s | efficiency vs (a) |", "|---|---|---|---:|---:|---:|"]
        for r in rows:
            if "skipped" in r:
                table.append(f"| {r['pack']} | {r['pass']} | not run ({r['skipped']}) | | | |")
            else:
                table.append(f"| {r['pack']} | {r['pass']} | {r['what']} | {1e3 * r['seconds']:.2f} | "
                             f"{r['tflops']:.{2 if dry else 0}f} | {100 * r['efficiency']:.0f} % |")
        parts.append("\n".join(table))
        parts.append(COMPUTE_ONLY)
        parts.append("Targets (forward+backward): " + ("not evaluated (CPU dry run)." if dry else
                                                        "; ".join(targets(rows)) + "."))
    return "\n\n".join(parts)


def write_docs(path: str, text: str) -> None:
    """Replace the text between the gpu-ring markers of docs/benchmarks.md."""
    doc = open(path).read()
    begin, end = "<!-- gpu-ring:begin -->", "<!-- gpu-ring:end -->"
    if begin not in doc or end not in doc:
        raise ValueError(f"{path} has no {begin} ... {end} section to replace")
    doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{text}\n{end}", doc, flags=re.S)
    open(path, "w").write(doc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results.json of tests/gpu/run.sh (or gpu_ring.py --json)")
    ap.add_argument("--write-docs", metavar="FILE", help="replace FILE's gpu-ring section with the rendered text")
    args = ap.parse_args(argv)
    with open(args.results) as f:
        text = render_section(json.load(f))
    if args.write_docs:
        write_docs(args.write_docs, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
