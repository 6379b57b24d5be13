"""Last stage of tests/gpu/run.sh: gathers the run's files in OUT into results.json and renders the GPU section of
docs/benchmarks.md into gpu_ring_section.md (standard library only: it works whatever failed before it).

    python3 tests/gpu/report.py --out DIR --mode gpu|dry-run --wall-s SECONDS --command "..."

run.sh refreshes the two files after every stage, so a run cut off from outside still leaves them; rerun this on
the returned files to include the rows of a benchmark that was cut short (it reads gpu_ring_bench.json as is).

results.json keys: schema_version, mode, command, started_utc, wall_s, status (PASS / INCOMPLETE / FAIL), prechecks
(name, status, reason), stages (name, status, seconds, limit_s, reason), flash_schemas, gpu_ring (the results of
benchmarks/gpu_ring.py: checks, bench rows), p2p_check (tests/gpu/ring_p2p_check.py), files. Exit status 0 when
status is PASS.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULT_KEYS = ("schema_version", "mode", "command", "started_utc", "wall_s", "status", "prechecks", "stages",
               "flash_schemas", "gpu_ring", "p2p_check", "files")
"""The keys of results.json (tests/python/test_gpu_run_script.py checks them)."""
GPU_ONLY = ("build_cuda", "cpp_gpu_check", "torch_ring_check")
"""Stages a dry run skips by design."""


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_stages(path: Path) -> list[dict]:
    """stages.tsv: name, status, seconds, limit (s), reason -- one stage a line."""
    stages = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 5:
                stages.append({"name": parts[0], "status": parts[1], "seconds": float(parts[2]),
                               "limit_s": float(parts[3]), "reason": "\t".join(parts[4:])})
    return stages


def gpu_ring_results(out: Path):
    """benchmarks/gpu_ring.py's results of the run: the check stage's and the bench stage's files merged (either may
    be missing or cut short)."""
    parts = [p for p in (_json(out / "gpu_ring_check.json"), _json(out / "gpu_ring_bench.json")) if p]
    if not parts:
        return None
    merged = dict(parts[-1])
    merged["checks"] = [c for p in parts for c in p.get("checks", [])]
    merged["bench"] = [r for p in parts for r in p.get("bench", [])]
    merged["command"] = " ; ".join(p.get("command", "") for p in parts)
    return merged


def overall(mode: str, prechecks: list[dict], stages: list[dict]) -> str:
    """FAIL when a stage failed; INCOMPLETE when a stage the mode should run was skipped (or none ran); else PASS."""
    if any(s["status"] == "FAIL" for s in stages) or not stages:
        return "FAIL"
    skipped = [s for s in stages if s["status"] == "SKIP" and not (mode == "dry-run" and s["name"] in GPU_ONLY)]
    return "INCOMPLETE" if skipped else "PASS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the run's output directory")
    ap.add_argument("--mode", choices=("gpu", "dry-run"), required=True)
    ap.add_argument("--wall-s", type=float, default=0.0, help="seconds the run took so far")
    ap.add_argument("--started-utc", default="", help="when the run started (UTC)")
    ap.add_argument("--command", default="bash tests/gpu/run.sh", help="the command that ran")
    ap.add_argument("--quiet", action="store_true", help="no output (run.sh refreshes the files after each stage)")
    args = ap.parse_args()
    out = Path(args.out)
    pre = _json(out / "precheck.json") or {}
    stages = read_stages(out / "stages.tsv")
    results = {
        "schema_version": 1, "mode": args.mode, "command": args.command,
        "started_utc": args.started_utc or f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        "wall_s": args.wall_s, "status": overall(args.mode, pre.get("checks", []), stages),
        "prechecks": pre.get("checks", []), "stages": stages, "flash_schemas": pre.get("flash_schemas", []),
        "gpu_ring": gpu_ring_results(out), "p2p_check": _json(out / "p2p_check.json"),
    }
    if results["gpu_ring"] is not None:  # the section's header names the machine of the run
        results["gpu_ring"].setdefault("gpu", pre.get("gpu", "CPU"))
    results["files"] = sorted(p.name for p in out.iterdir() if p.is_file()) + ["results.json", "gpu_ring_section.md"]
    spec = importlib.util.spec_from_file_location("gpu_ring_report", ROOT / "benchmarks" / "gpu_ring_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "gpu_ring_section.md").write_text(report.render_section(results) + "\n")
    if not args.quiet:
        print(f"report: status {results['status']}; wrote {out / 'results.json'} and {out / 'gpu_ring_section.md'}")
    return 0 if results["status"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
