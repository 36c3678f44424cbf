#!/usr/bin/env bash
# The Python suite against the installed wheel: see scripts/wheel_test.sh (same
# environment variables: FLASHATTN_CI_CUDA, FLASHATTN_CI_TORCH, FLASHATTN_CI_VENV;
# extra arguments go to pytest). scripts/test.sh calls this file.
set -euo pipefail
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/scripts/wheel_test.sh" "$@"
