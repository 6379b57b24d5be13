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

# Megatron-Core's released hybrid-CP scheduler (the `megatron-core` peer, the Megatron adapter and its tests) and
# verl's sequence-length balancing (the reference of dynacp.integration.verl's tests). --no-deps keeps torch as
# pinned above: megatron-core needs only torch, numpy and packaging>=24.2; the tests load verl's
# verl/utils/seqlen_balancing.py by path, which needs only torch, so none of verl's own dependencies (ray,
# transformers, ...) are installed.
$PY -m pip install -q "packaging>=24.2"
$PY -m pip install -q --no-deps "megatron-core==0.16.1" "verl==0.9.1"

# NCCL headers and library for the CUDA runtime's NCCL backend, when a CUDA compiler is present (compile-only here).
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  $PY -c "import nvidia.nccl" 2>/dev/null || $PY -m pip install -q nvidia-nccl-cu13
fi

# Build and install dynacp itself (incremental: the CMake build tree persists under build/).
$PY -m pip install -q --no-build-isolation ${DYNACP_PIP_ARGS:-} .
