#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh), builds with the C++ tests on, then runs CTest and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
DYNACP_PIP_ARGS="-C cmake.define.DYNACP_BUILD_TESTS=ON -C cmake.define.DYNACP_BUILD_BENCHMARKS=ON" bash scripts/setup.sh
build=$(ls -d build/cp*/ | head -n 1)
ctest --test-dir "$build" --output-on-failure -j2
python3 -m pytest -q tests/python
