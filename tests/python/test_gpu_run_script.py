"""tests/gpu/run.sh --dry-run: the GPU run's script end to end on CPU (torch blocks, gloo processes, no CUDA build)
under a temporary $OUT, producing the files the GPU run would bring back: run.log, results.json with its keys and
stages, the docs section (gpu_ring_section.md), which benchmarks/gpu_ring_report.py applies to a docs file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
STAGES = ["precheck", "build_core", "build_cuda", "flash_check", "p2p_check", "cpp_gpu_check", "torch_ring_check",
          "bench"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-out")
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, RUN_BUDGET_S="300")
    r = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "run.sh"), "--dry-run"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    return out, r


def test_dry_run_passes_and_writes_the_files(dry_run):
    out, r = dry_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    for name in ("run.log", "results.json", "gpu_ring_section.md", "stages.tsv", "precheck.json",
                 "gpu_ring_check.json", "gpu_ring_bench.json", "p2p_check.json"):
        assert (out / name).is_file(), name
    log = (out / "run.log").read_text()
    assert "=== stage flash_check: PASS" in log and "report: status PASS" in log, log[-3000:]


def test_results_json_has_the_keys_and_every_stage(dry_run):
    out, _ = dry_run
    res = json.loads((out / "results.json").read_text())
    assert list(res) == list(load_script("tests/gpu/report.py").RESULT_KEYS)
    assert res["mode"] == "dry-run" and res["status"] == "PASS"
    stages = {s["name"]: s for s in res["stages"]}
    assert list(stages) == STAGES
    for name in ("precheck", "build_core", "flash_check", "p2p_check", "bench"):
        assert stages[name]["status"] == "PASS", stages[name]
    for name in ("build_cuda", "cpp_gpu_check", "torch_ring_check"):
        assert stages[name]["status"] == "SKIP" and "dry run" in stages[name]["reason"]
    pre = {c["name"]: c["status"] for c in res["prechecks"]}
    assert pre["python_headers"] in ("PASS", "FAIL") and pre["torch"] == "PASS" and pre["torch_cuda"] == "SKIP"
    assert res["flash_schemas"][0].startswith("aten::_flash_attention_forward(")
    ring = res["gpu_ring"]
    assert ring["device"] == "cpu" and ring["checks"] and all(c["ok"] for c in ring["checks"])
    packs = {r["pack"] for r in ring["bench"]}
    assert packs == {"8K docs", "32K docs", "128K docs", "long-tailed"}
    assert {r["cp"] for r in ring["bench"] if "cp" in r} == {0, 1, 2, 3, 4, 8}
    assert res["p2p_check"]["ok"] and len(res["p2p_check"]["ranks"]) == 3


def test_docs_section_is_rendered_and_applies(dry_run, tmp_path):
    out, _ = dry_run
    section = (out / "gpu_ring_section.md").read_text()
    assert section.startswith("DRY RUN on CPU") and "| pack | pass | what |" in section
    assert "compute only" in section and "no NCCL" in section and "Targets (forward+backward): not evaluated" in section
    doc = tmp_path / "b.md"
    doc.write_text("a\n<!-- gpu-ring:begin -->\nold\n<!-- gpu-ring:end -->\nb\n")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_ring_report.py"), str(out / "results.json"),
                        "--write-docs", str(doc)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert doc.read_text() == f"a\n<!-- gpu-ring:begin -->\n{section.rstrip()}\n<!-- gpu-ring:end -->\nb\n"
