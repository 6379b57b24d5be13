#!/usr/bin/env bash
# Single-GPU check of the CUDA/NCCL runtime (see docs/runtime.md). On a machine with one NVIDIA GPU:
#   tests/gpu/run.sh [build-dir]
# builds dynacp_gpu_check and the Python modules dynacp._core / dynacp._cuda (sm_90 by default; override with
# CUDA_ARCH=80 etc.), then runs
#   1. dynacp_gpu_check: an NCCL world-size-1 smoke test, CUDA kernels vs the CPU fp64 reference (fp32 and bf16), the
#      ring over simulated ranks on the one GPU and a forward/backward TFLOP/s comparison with a single-call baseline;
#   2. tests/gpu/torch_ring_check.py: the C++ ring executor (ring_attention(loop="cpp")) on CUDA tensors (an NCCL
#      group of size 1, then 3 processes sharing the GPU over gloo) vs the CPU path, fp32/bf16(/fp16), fwd and bwd;
#   3. benchmarks/gpu_ring.py --check --bench: the Python ring loop on FlashAttention kernels (the production path)
#      vs an fp64 reference for CP 1-4, then its TFLOP/s and efficiency table, written into docs/benchmarks.md
#      (GPU section; GPU_RING_SCALE=0.25 shrinks the packs; GPU_RING_DOCS=0 leaves the docs alone).
# Budget: < 5 minutes for steps 1-2; step 3 about 5 minutes at scale 1 on an H100/H200 (not yet measured). BENCH_SCALE=0.25 shrinks the benchmark sequences. NCCL comes from NCCL_ROOT, the CUDA
# toolkit or the nvidia-nccl-cu13 wheel (pip install nvidia-nccl-cu13). Step 2 needs python3 with pybind11 (to
# build) and torch with CUDA (to run); without them it is reported as SKIPPED and only step 1 decides the status.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . || true)}
ARCH=${ARCH:-90}
nvidia-smi -L || { echo "no NVIDIA GPU visible" >&2; exit 2; }
start=$(date +%s)

PYBIND_DIR=$(python3 -m pybind11 --cmakedir 2>/dev/null || true)
TARGETS=(dynacp_gpu_check)
if [ -n "$PYBIND_DIR" ]; then
  PY_ARGS=(-DDYNACP_BUILD_PYTHON=ON -Dpybind11_DIR="$PYBIND_DIR")
  TARGETS+=(_core _cuda)
else
  PY_ARGS=(-DDYNACP_BUILD_PYTHON=OFF)
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNACP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DDYNACP_BUILD_TESTS=OFF "${PY_ARGS[@]}"
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}"
echo "build: $(( $(date +%s) - start )) s"

status=0
timeout 120 "$BUILD/src/runtime/dynacp_gpu_check" "${BENCH_SCALE:-1.0}" || status=1

if [ -z "$PYBIND_DIR" ]; then
  echo "torch ring check SKIPPED: pybind11 not found (python3 -m pybind11), so dynacp._core/_cuda were not built"
elif ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "torch ring check SKIPPED: python3 has no torch with CUDA support ($(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))"
else
  DYNACP_EXT_DIR="$(cd "$BUILD/python" && pwd)" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 120 python3 tests/gpu/torch_ring_check.py || status=1
fi
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && [ -n "$PYBIND_DIR" ]; then
  DOCS_ARGS=()
  [ "${GPU_RING_DOCS:-1}" = 1 ] && DOCS_ARGS=(--write-docs docs/benchmarks.md)
  DYNACP_EXT_DIR="$(cd "$BUILD/python" && pwd)" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    timeout 600 python3 benchmarks/gpu_ring.py --check --bench --scale "${GPU_RING_SCALE:-1.0}" "${DOCS_ARGS[@]}" \
    || status=1
else
  echo "gpu_ring SKIPPED: needs torch with CUDA and pybind11 (to build dynacp._core)"
fi
echo "total: $(( $(date +%s) - start )) s"
exit $status
