"""Prechecks of tests/gpu/run.sh: what the run can build and use, each reported PASS / SKIP / FAIL with its reason.
Never raises and always exits 0 (the run goes on and each later stage skips what it cannot do).

    python3 tests/gpu/precheck.py --out DIR [--dry-run]

Writes DIR/precheck.json (the list of checks, plus the installed FlashAttention op schemas) and DIR/precheck.env
(shell assignments run.sh sources: PY_INCLUDE, PYBIND11_CMAKE_DIR, CMAKE_GENERATOR, HAVE_NVCC, HAVE_TORCH_CUDA,
HAVE_FLASH, CUDA_ARCH_DETECTED). Standard library only, apart from importing torch (reported when it fails).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

TARGET_TORCH = "2.11"
"""The torch minor version of the GPU machine the run is prepared for (a different one is noted, not failed)."""


def _run(cmd: list[str], timeout: float = 20.0) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return 127, str(e)


def python_headers() -> tuple[str, str, str]:
    """(status, reason, include dir): Python.h of this interpreter, where CMake's FindPython would look or beside."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sysconfig.get_paths().get("include", ""), sysconfig.get_config_var("INCLUDEPY") or "",
                  os.path.join(sys.base_prefix, "include", f"python{ver}"), f"/usr/include/python{ver}",
                  f"/usr/local/include/python{ver}"]
    for d in dict.fromkeys(c for c in candidates if c):
        if os.path.isfile(os.path.join(d, "Python.h")):
            return "PASS", f"{d}/Python.h", d
    return ("FAIL", f"no Python.h for python {ver} ({sys.executable}; looked in {', '.join(dict.fromkeys(candidates))}): "
            f"dynacp._core cannot be built, so the Python stages skip; install the headers (apt-get install "
            f"python{ver}-dev) or set DYNACP_EXT_DIR to a prebuilt _core for this interpreter", "")


def pybind11_dir() -> tuple[str, str, str]:
    """(status, reason, CMake dir of pybind11): this interpreter's package, PYBIND11_DIR, or a system install."""
    found = []
    try:
        import pybind11  # noqa: PLC0415

        found.append(pybind11.get_cmake_dir())
    except ImportError:
        pass
    found += [os.environ.get("PYBIND11_DIR", ""), "/usr/lib/cmake/pybind11", "/usr/share/cmake/pybind11",
              "/usr/local/lib/cmake/pybind11", "/usr/lib/python3/dist-packages/pybind11/share/cmake/pybind11"]
    for d in found:
        if d and os.path.isfile(os.path.join(d, "pybind11Config.cmake")):
            return "PASS", d, d
    return ("FAIL", f"pybind11 not found for {sys.executable} (pip install pybind11, or PYBIND11_DIR=<dir with "
            "pybind11Config.cmake>): dynacp._core cannot be built", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for precheck.json and precheck.env")
    ap.add_argument("--dry-run", action="store_true", help="CPU dry run: the GPU checks are skipped")
    args = ap.parse_args()
    checks, env, extra = [], {}, {}

    def add(name: str, status: str, reason: str) -> None:
        checks.append({"name": name, "status": status, "reason": reason})
        print(f"PRECHECK {name}: {status} -- {reason}", flush=True)

    venv = sys.prefix != sys.base_prefix
    add("python", "PASS", f"{sys.version.split()[0]} at {sys.executable}" + (" (a venv)" if venv else ""))
    try:
        import numpy  # noqa: PLC0415

        add("numpy", "PASS", f"numpy {numpy.__version__}")
    except Exception as e:
        add("numpy", "FAIL", f"import numpy failed ({e}): dynacp needs numpy, so every Python stage fails")
    status, reason, inc = python_headers()
    add("python_headers", status, reason)
    env["PY_INCLUDE"] = inc
    status, reason, pyb = pybind11_dir()
    add("pybind11", status, reason)
    env["PYBIND11_CMAKE_DIR"] = pyb
    cmake = shutil.which("cmake")
    rc, text = _run([cmake, "--version"]) if cmake else (127, "")
    add("cmake", "PASS" if rc == 0 else "FAIL", text.splitlines()[0] if rc == 0 else "cmake not on PATH")
    env["CMAKE_GENERATOR"] = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    add("generator", "PASS", env["CMAKE_GENERATOR"] + ("" if shutil.which("ninja") else " (ninja not on PATH)"))
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else "")
    env["HAVE_NVCC"] = "0"
    if args.dry_run:
        add("nvcc", "SKIP", "dry run: no CUDA build")
    elif nvcc:
        rc, text = _run([nvcc, "--version"])
        env["HAVE_NVCC"] = "1" if rc == 0 else "0"
        add("nvcc", "PASS" if rc == 0 else "FAIL", text.splitlines()[-1] if text else nvcc)
        extra["nvcc"] = nvcc
    else:
        add("nvcc", "FAIL", "nvcc not on PATH nor in /usr/local/cuda/bin: the CUDA stages skip")
    env["HAVE_TORCH_CUDA"] = env["HAVE_FLASH"] = "0"
    env["CUDA_ARCH_DETECTED"] = ""
    try:
        import torch  # noqa: PLC0415
    except Exception as e:  # any import failure is reported, never raised
        add("torch", "FAIL", f"import torch failed: {e}")
        torch = None
    if torch is not None:
        minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
        note = "" if minor == TARGET_TORCH or args.dry_run else f" (the GPU machine is expected to have {TARGET_TORCH})"
        add("torch", "PASS", f"torch {torch.__version__}, CUDA build {torch.version.cuda}{note}")
        extra["torch"] = torch.__version__
        try:
            extra["flash_schemas"] = [str(torch.ops.aten._flash_attention_forward.default._schema),
                                      str(torch.ops.aten._flash_attention_backward.default._schema)]
        except Exception as e:
            extra["flash_schemas"] = [f"unavailable: {e}"]
        if args.dry_run:
            add("torch_cuda", "SKIP", "dry run")
            add("flash", "SKIP", "dry run")
        elif torch.cuda.is_available():
            major, minor_cc = torch.cuda.get_device_capability(0)
            name = torch.cuda.get_device_name(0)
            free, total = torch.cuda.mem_get_info(0)
            env["HAVE_TORCH_CUDA"], env["CUDA_ARCH_DETECTED"] = "1", f"{major}{minor_cc}"
            extra["gpu"] = name
            add("torch_cuda", "PASS", f"{name}, compute capability {major}.{minor_cc}, "
                f"{free / 2**30:.0f} of {total / 2**30:.0f} GiB free")
            flash = torch.backends.cuda.is_flash_attention_available() and major >= 8
            env["HAVE_FLASH"] = "1" if flash else "0"
            add("flash", "PASS" if flash else "FAIL",
                "FlashAttention kernels available" if flash else
                f"no FlashAttention kernels (torch build or compute capability {major}.{minor_cc} < 8.0)")
        else:
            add("torch_cuda", "FAIL", "torch.cuda.is_available() is False (CPU-only torch or no driver)")
            add("flash", "SKIP", "no CUDA")
    if not args.dry_run:
        rc, text = _run(["nvidia-smi", "-L"])
        add("nvidia_smi", "PASS" if rc == 0 else "FAIL", text.splitlines()[0] if rc == 0 and text else
            f"nvidia-smi failed ({text[:200]})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "precheck.json").write_text(json.dumps({"checks": checks, **extra}, indent=1))
    (out / "precheck.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a precheck never stops the run
        print(f"PRECHECK precheck: FAIL -- {type(e).__name__}: {e}", flush=True)
        sys.exit(0)
