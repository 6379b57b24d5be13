#!/usr/bin/env bash
# Single-GPU check of the CUDA/NCCL runtime (see docs/runtime.md). On a machine with one NVIDIA GPU:
#   tests/gpu/run.sh [build-dir]
# builds dynacp_gpu_check (sm_90 by default; override with CUDA_ARCH=80 etc.), then runs an NCCL world-size-1 smoke
# test, CUDA kernels vs the CPU fp64 reference (fp32 and bf16), the ring over simulated ranks on the one GPU and a
# forward/backward TFLOP/s comparison with a single-call attention baseline. Budget: < 5 minutes.
# BENCH_SCALE=0.25 shrinks the benchmark sequences. NCCL comes from NCCL_ROOT, the CUDA toolkit or the
# nvidia-nccl-cu13 wheel (pip install nvidia-nccl-cu13).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . || true)}
ARCH=${ARCH:-90}
nvidia-smi -L || { echo "no NVIDIA GPU visible" >&2; exit 2; }
start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNACP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DDYNACP_BUILD_PYTHON=OFF -DDYNACP_BUILD_TESTS=OFF
cmake --build "$BUILD" -j "$(nproc)" --target dynacp_gpu_check
echo "build: $(( $(date +%s) - start )) s"
timeout 240 "$BUILD/src/runtime/dynacp_gpu_check" "${BENCH_SCALE:-1.0}"
echo "total: $(( $(date +%s) - start )) s"
