#!/usr/bin/env bash
# The project's test command (README): builds the library (CUDA too when nvcc
# is present, so a broken kernel, or a new register spill, fails here), runs the C++ suites with ctest
# (GPU suites, label `gpu`, skip without a GPU), then the Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset default
# The build's log goes through check_spills.py: a register spill in a kernel
# that scripts/spill_allowlist.txt does not name fails the command.
cmake --build --preset default 2>&1 | tee build/build.log
python3 scripts/check_spills.py build/build.log
ctest --preset default --output-on-failure

if [ -f python/ci_test.sh ]; then
  bash python/ci_test.sh
fi
