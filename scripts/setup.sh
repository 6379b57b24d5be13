#!/usr/bin/env bash
# Installs everything dynacp needs on a fresh Debian machine (run as root), then builds and installs the package.
# Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(build-essential cmake ninja-build pkg-config
          libgtest-dev libgmock-dev libbenchmark-dev libeigen3-dev libspdlog-dev clang-format)
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
$PY -m pip install -q --upgrade pip
$PY -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.13" "numpy>=1.26" pytest matplotlib tqdm ruff "torch==2.13.0"

# NCCL headers and library for the CUDA runtime's NCCL backend, when a CUDA compiler is present (compile-only here).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  $PY -c "import nvidia.nccl" 2>/dev/null || $PY -m pip install -q nvidia-nccl-cu13
fi

# Build and install dynacp itself (incremental: the CMake build tree persists under build/).
$PY -m pip install -q --no-build-isolation ${DYNACP_PIP_ARGS:-} .
