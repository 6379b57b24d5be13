"""benchmarks/gpu_ring.py without a GPU: it refuses clearly (exit 2, naming what is missing), its packs are what
the docs say, and its docs writer replaces only the marked section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_ring.py"


def _module():
    return load_script("benchmarks/gpu_ring.py")


def test_packs_hold_the_documented_documents():
    packs = _module().packs(1.0)
    assert packs["8K docs"] == [8192] * 16 and packs["32K docs"] == [32768] * 4 and packs["128K docs"] == [131072]
    tail = packs["long-tailed"]
    assert sum(tail) == 131072 and max(tail) > 8 * sorted(tail)[len(tail) // 2]  # a long tail


def test_docs_writer_replaces_only_the_marked_section(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# x\nkeep\n<!-- gpu-ring:begin -->\nold\n<!-- gpu-ring:end -->\nafter\n")
    _module().write_docs(str(doc), "new table")
    assert doc.read_text() == "# x\nkeep\n<!-- gpu-ring:begin -->\nnew table\n<!-- gpu-ring:end -->\nafter\n"
    assert "<!-- gpu-ring:begin -->" in (ROOT / "docs" / "benchmarks.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: tests/gpu/run.sh runs the script")
def test_without_a_gpu_the_script_says_what_is_missing():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "SKIPPED" in r.stdout and "is_available() is False" in r.stdout, r.stdout + r.stderr


def test_the_check_logic_runs_on_the_cpu_block():
    """The GPU check's comparison code, with the CPU block function in place of the flash kernels."""
    from dynacp.torch import ring_loop

    mod = _module()
    lengths = [1, 70, 33, 0, 12]
    for cp, causal in ((1, [True] * 5), (3, [True, False, True, False, True])):
        ok, why = mod.check_case(cp, lengths, causal, torch.float32, 4, 2, 16, seed=cp, device="cpu",
                                 block=ring_loop.TorchBlock())
        assert ok, why
