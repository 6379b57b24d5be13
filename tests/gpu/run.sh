#!/usr/bin/env bash
# The single-GPU run of dynacp's ring attention (docs/runtime.md, "On a GPU"), prepared for one H200 lent for 15
# minutes: Python 3.12 in a venv with torch 2.11, nvcc 13, no network, only files under $OUT come back.
#
# How to run it there (the whole run ends within RUN_BUDGET_S = 450 s of machine time; the machine's start is extra):
#   source <venv>/bin/activate        # or PYTHON=<venv>/bin/python; the interpreter with torch
#   bash tests/gpu/run.sh             # $OUT set by the device tool: every file lands there
#   GPU_RING_SCALE=0.5 bash tests/gpu/run.sh      # smaller benchmark packs (64K tokens) when time is short
# On CPU, the same script end to end (torch blocks, gloo, no CUDA build), as CI runs it:
#   bash tests/gpu/run.sh --dry-run   # _core from DYNACP_EXT_DIR, else an installed dynacp, else a CPU-only build
# Without $OUT the files go to build-gpu/out (build-gpu/out-dry for --dry-run). Nothing in the tree is edited; apply
# a GPU run's results to the docs where they came back:
#   python3 benchmarks/gpu_ring_report.py OUT/results.json --write-docs docs/benchmarks.md
#
# Files in $OUT: run.log (everything printed), results.json (machine-readable: prechecks, stages, correctness cases,
# benchmark rows; keys in tests/gpu/report.py), gpu_ring_section.md (the docs table), stages.tsv, precheck.json,
# gpu_ring_check.json, gpu_ring_bench.json, p2p_check.json and one stage-<name>.log per stage. results.json and the
# section are refreshed after every stage (and `python3 tests/gpu/report.py --out OUT --mode gpu` redoes them).
#
# Stages, each PASS / SKIP / FAIL with its reason and its own time limit; a failed stage never stops the later ones:
#   precheck          Python.h, pybind11, cmake, nvcc, torch version, torch CUDA, FlashAttention, nvidia-smi
#   build_core        dynacp._core (CMake, -DDYNACP_CUDA=ON on the GPU; skipped when DYNACP_EXT_DIR has one)
#   build_cuda        dynacp._cuda and dynacp_gpu_check, in the background while the Python checks run
#   flash_check       benchmarks/gpu_ring.py --check: the Python ring loop on FlashAttention vs fp64, CP 1-4
#   p2p_check         tests/gpu/ring_p2p_check.py: 3 processes over gloo, CUDA tensors host-staged, pool warm-up
#   cpp_gpu_check     dynacp_gpu_check: NCCL size-1 smoke test, reference CUDA kernels, simulated ranks
#   torch_ring_check  tests/gpu/torch_ring_check.py: the C++ ring executor on CUDA tensors
#   bench             benchmarks/gpu_ring.py --bench: TFLOP/s and efficiency (GPU_RING_SCALE, default 1.0)
#   report            results.json and gpu_ring_section.md
# Knobs: RUN_BUDGET_S (450), GPU_RING_SCALE (1.0), CPP_BENCH_SCALE (0.25), CUDA_ARCH (detected), BUILD_DIR
# (build-gpu), PYTHON (python3), JOBS (nproc), PYBIND11_DIR, DYNACP_EXT_DIR.
set -u -o pipefail
cd "$(dirname "$0")/../.."

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
MODE=$([ $DRY = 1 ] && echo dry-run || echo gpu)
OUT_DIR=${OUT:-$PWD/build-gpu/out$([ $DRY = 1 ] && echo -dry)}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PY=${PYTHON:-python3}
PY_EXE=$("$PY" -c 'import sys; print(sys.executable)' 2>/dev/null || command -v "$PY")  # the interpreter itself (not a shim)
BUILD=${BUILD_DIR:-build-gpu$([ $DRY = 1 ] && echo -dry)}
BUDGET=${RUN_BUDGET_S:-450}
BENCH_RESERVE=160   # seconds kept for the benchmark while the correctness stages run
REPORT_RESERVE=20   # seconds kept for the report
START=$(date +%s)
STARTED_UTC=$(date -u +"%Y-%m-%d %H:%M")
COMMAND="bash tests/gpu/run.sh${1:+ $1}"

elapsed() { echo $(( $(date +%s) - START )); }

report() {  # results.json and gpu_ring_section.md from what $OUT holds now
  "$PY" tests/gpu/report.py --out "$OUT_DIR" --mode "$MODE" --wall-s "$(elapsed)" --started-utc "$STARTED_UTC" \
    --command "$COMMAND" "$@"
}

record() {  # name status seconds limit reason; then the results files are refreshed
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$OUT_DIR/stages.tsv"
  echo "=== stage $1: $2 (${3} s of ${4} s) -- $5"
  report --quiet >/dev/null 2>&1 || true
}

# stage NAME LIMIT RESERVE CMD...: runs CMD under `timeout`, limited to LIMIT seconds and to what the budget leaves
# after RESERVE seconds; exit 0 = PASS, 2 = SKIP (its last line says why), 124/137 = FAIL (timed out), else FAIL.
stage() {
  local name=$1 limit=$2 reserve=$3
  shift 3
  local left=$(( BUDGET - $(elapsed) - reserve ))
  if [ "$left" -lt 10 ]; then
    record "$name" SKIP 0 "$limit" "no time left in the ${BUDGET} s budget"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== stage $name (limit ${limit} s, at $(elapsed) s) : $*"
  local t0 rc status reason log="$OUT_DIR/stage-$name.log"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - t0 ))
  case $rc in
    0) status=PASS; reason="ok" ;;
    2) status=SKIP; reason=$(grep -m1 -E "SKIPPED|SKIP:" "$log" || tail -n 1 "$log") ;;
    124|137) status=FAIL; reason="timed out after ${limit} s" ;;
    *) status=FAIL; reason="exit status $rc: $(grep -v '^\s*$' "$log" | tail -n 1)" ;;
  esac
  record "$name" "$status" "$took" "$limit" "$(echo "$reason" | tr '\t\n' '  ' | cut -c1-300)"
  return 0
}

skip() { record "$1" SKIP 0 0 "$2"; }

main() {
  echo "dynacp GPU run ($MODE), $(date -u), budget ${BUDGET} s, files in $OUT_DIR"
  echo "interpreter: $(command -v "$PY") ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
  local dry_flag=()
  [ $DRY = 1 ] && dry_flag=(--dry-run)
  stage precheck 60 0 "$PY" tests/gpu/precheck.py --out "$OUT_DIR" "${dry_flag[@]}"
  PY_INCLUDE="" PYBIND11_CMAKE_DIR="" CMAKE_GENERATOR="Ninja" HAVE_NVCC=0 HAVE_TORCH_CUDA=0 HAVE_FLASH=0
  CUDA_ARCH_DETECTED=""
  # shellcheck disable=SC1091
  [ -f "$OUT_DIR/precheck.env" ] && . "$OUT_DIR/precheck.env"
  local arch=${CUDA_ARCH:-${CUDA_ARCH_DETECTED:-90}} jobs=${JOBS:-$(nproc)}

  # -- build ----------------------------------------------------------------------------------------------------
  local ext="" core_why="" installed=""
  [ $DRY = 1 ] && installed=$("$PY" -c "import os, dynacp._core as c; print(os.path.dirname(c.__file__))" 2>/dev/null)
  if [ -n "${DYNACP_EXT_DIR:-}" ] && ls "$DYNACP_EXT_DIR"/_core*.so >/dev/null 2>&1; then
    ext=$(cd "$DYNACP_EXT_DIR" && pwd)
    record build_core PASS 0 0 "prebuilt: DYNACP_EXT_DIR=$ext"
  elif [ -n "$installed" ]; then  # dry run with dynacp installed (pip install .): its _core, the tree's Python
    ext=$installed
    record build_core PASS 0 0 "installed dynacp._core in $ext"
  elif [ -z "$PY_INCLUDE" ]; then
    core_why="no Python.h for $PY (see precheck python_headers)"
    skip build_core "$core_why"
  elif [ -z "$PYBIND11_CMAKE_DIR" ]; then
    core_why="pybind11 not found (see precheck pybind11)"
    skip build_core "$core_why"
  else
    local cuda_args=(-DDYNACP_CUDA=OFF)
    [ $DRY = 0 ] && [ "$HAVE_NVCC" = 1 ] && cuda_args=(-DDYNACP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch")
    stage build_core 300 "$BENCH_RESERVE" bash -c "cmake -S . -B '$BUILD' -G '$CMAKE_GENERATOR' -DCMAKE_BUILD_TYPE=Release \
      ${cuda_args[*]} -DDYNACP_BUILD_TESTS=OFF -DDYNACP_BUILD_BENCHMARKS=OFF -DDYNACP_BUILD_PYTHON=ON \
      -DPython_EXECUTABLE='$PY_EXE' -DPython_INCLUDE_DIR='$PY_INCLUDE' -Dpybind11_DIR='$PYBIND11_CMAKE_DIR' \
      && cmake --build '$BUILD' -j $jobs --target _core"
    if ls "$BUILD"/python/_core*.so >/dev/null 2>&1; then ext=$(cd "$BUILD/python" && pwd); else core_why="build_core failed"; fi
  fi
  local pyenv=(env "DYNACP_EXT_DIR=$ext" "PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}")

  # CUDA targets in the background (nvcc takes a core or two while the GPU runs the Python checks).
  local cuda_pid="" cuda_t0=0
  if [ $DRY = 1 ]; then
    skip build_cuda "dry run: no CUDA build"
  elif [ "$HAVE_NVCC" != 1 ]; then
    skip build_cuda "no nvcc (see precheck nvcc)"
  else
    local py_targets=() py_args=(-DDYNACP_BUILD_PYTHON=OFF)
    if [ -n "$ext" ] && [ "$ext" = "$(cd "$BUILD/python" 2>/dev/null && pwd)" ]; then
      py_targets=(_cuda); py_args=()
    fi
    cuda_t0=$(date +%s)
    echo "=== stage build_cuda (background): dynacp_gpu_check ${py_targets[*]}"
    ( [ -f "$BUILD/CMakeCache.txt" ] && [ ${#py_args[@]} = 0 ] || cmake -S . -B "$BUILD" -G "$CMAKE_GENERATOR" \
        -DCMAKE_BUILD_TYPE=Release -DDYNACP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DDYNACP_BUILD_TESTS=OFF \
        -DDYNACP_BUILD_BENCHMARKS=OFF "${py_args[@]}" -DPython_EXECUTABLE="$PY_EXE"
      cmake --build "$BUILD" -j "$jobs" --target dynacp_gpu_check "${py_targets[@]}" ) \
      > "$OUT_DIR/stage-build_cuda.log" 2>&1 &
    cuda_pid=$!
  fi

  # -- correctness ----------------------------------------------------------------------------------------------
  local ring_args=(--device cuda) bench_args=(--device cuda --scale "${GPU_RING_SCALE:-1.0}")
  if [ $DRY = 1 ]; then
    ring_args=(--device cpu)
    bench_args=(--device cpu --scale 0.00390625 --heads 4 --kv-heads 2 --dim 32 --warmup 0 --iters 1)
  fi
  if [ -z "$ext" ]; then
    skip flash_check "no dynacp._core: $core_why"
    skip p2p_check "no dynacp._core: $core_why"
  elif [ $DRY = 0 ] && [ "$HAVE_FLASH" != 1 ]; then
    skip flash_check "no torch CUDA / FlashAttention (see precheck torch_cuda, flash)"
    skip p2p_check "no torch CUDA / FlashAttention (see precheck torch_cuda, flash)"
  else
    stage flash_check 150 "$BENCH_RESERVE" "${pyenv[@]}" "$PY" benchmarks/gpu_ring.py --check "${ring_args[@]}" \
      --json "$OUT_DIR/gpu_ring_check.json"
    stage p2p_check 120 "$BENCH_RESERVE" "${pyenv[@]}" "$PY" tests/gpu/ring_p2p_check.py "${ring_args[@]}" \
      --json "$OUT_DIR/p2p_check.json" --limit 110
  fi

  if [ -n "$cuda_pid" ]; then  # wait for the background CUDA build, within its limit
    local limit=$(( BUDGET - $(elapsed) - BENCH_RESERVE ))
    [ "$limit" -gt 300 ] && limit=300
    while kill -0 "$cuda_pid" 2>/dev/null && [ $(( $(date +%s) - cuda_t0 )) -lt "$limit" ]; do sleep 2; done
    if kill -0 "$cuda_pid" 2>/dev/null; then
      kill "$cuda_pid" 2>/dev/null; wait "$cuda_pid" 2>/dev/null
      record build_cuda FAIL $(( $(date +%s) - cuda_t0 )) "$limit" "did not finish within the time left (${limit} s)"
    elif wait "$cuda_pid"; then
      record build_cuda PASS $(( $(date +%s) - cuda_t0 )) 300 "ok"
    else
      record build_cuda FAIL $(( $(date +%s) - cuda_t0 )) 300 "$(tail -n 1 "$OUT_DIR/stage-build_cuda.log")"
    fi
    cat "$OUT_DIR/stage-build_cuda.log"
  fi
  if [ $DRY = 1 ]; then
    skip cpp_gpu_check "dry run: no CUDA"
    skip torch_ring_check "dry run: no CUDA"
  else
    if [ -x "$BUILD/src/runtime/dynacp_gpu_check" ]; then
      stage cpp_gpu_check 90 "$BENCH_RESERVE" "$BUILD/src/runtime/dynacp_gpu_check" "${CPP_BENCH_SCALE:-0.25}"
    else
      skip cpp_gpu_check "dynacp_gpu_check was not built (see build_cuda)"
    fi
    if [ -n "$ext" ] && ls "$ext"/_cuda*.so >/dev/null 2>&1 && [ "$HAVE_TORCH_CUDA" = 1 ]; then
      stage torch_ring_check 90 "$BENCH_RESERVE" env BENCH_SCALE="${CPP_BENCH_SCALE:-0.25}" "${pyenv[@]}" \
        "$PY" tests/gpu/torch_ring_check.py
    else
      skip torch_ring_check "needs dynacp._core and dynacp._cuda built and torch with CUDA"
    fi
  fi

  # -- benchmark ------------------------------------------------------------------------------------------------
  if [ -z "$ext" ] || { [ $DRY = 0 ] && [ "$HAVE_FLASH" != 1 ]; }; then
    skip bench "needs dynacp._core and FlashAttention (see above)"
  else
    local left=$(( BUDGET - $(elapsed) - REPORT_RESERVE ))
    stage bench 400 "$REPORT_RESERVE" "${pyenv[@]}" "$PY" benchmarks/gpu_ring.py --bench "${bench_args[@]}" \
      --json "$OUT_DIR/gpu_ring_bench.json" --budget $(( left > 60 ? left - 45 : 15 ))
  fi
  report
  local rc=$?
  echo "total: $(elapsed) s; files in $OUT_DIR: $(ls "$OUT_DIR" | tr '\n' ' ')"
  return $rc
}

rm -f "$OUT_DIR/stages.tsv"
main "$@" 2>&1 | tee "$OUT_DIR/run.log"
exit "${PIPESTATUS[0]}"
