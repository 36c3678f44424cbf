#!/usr/bin/env bash
# The project's test command (README): builds the library (CUDA too when nvcc
# is present, so a broken kernel fails here), runs the C++ suites with ctest
# (GPU suites, label `gpu`, skip without a GPU), then the Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset default
cmake --build --preset default
ctest --preset default --output-on-failure

if [ -f python/ci_test.sh ]; then
  bash python/ci_test.sh
fi
