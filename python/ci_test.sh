#!/usr/bin/env bash
# Builds and installs the Python package (CPU backend only) into a fresh virtual
# environment and runs python/tests with pytest.
#
#   bash python/ci_test.sh            # from anywhere; needs python3 (>= 3.9) with venv + pip
#
# Environment:
#   FLASHATTN_CI_VENV   where the virtual environment goes (default: <repo>/build-pyci/venv)
#   FLASHATTN_CI_TORCH  1 (default): install PyTorch from PyPI and run the torch tests too;
#                       0: NumPy tests only (the torch tests then report as skipped)
#   FLASHATTN_CI_CUDA   OFF (default): build without the CUDA backend (fast); ON: with it;
#                       auto: let CMake decide (CUDA when nvcc is found)
# Extra arguments are passed to pytest.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLASHATTN_CI_VENV:-$repo/build-pyci/venv}"
want_torch="${FLASHATTN_CI_TORCH:-1}"
cuda="${FLASHATTN_CI_CUDA:-OFF}"
python="${PYTHON:-python3}"

echo "== flashattn python CI: repo $repo, venv $venv, torch=$want_torch, cuda=$cuda"
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "python venv/ensurepip missing; installing python3-venv" >&2
  if command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
  fi
fi
"$python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet numpy pytest matplotlib

if [ "$want_torch" = "1" ]; then
  # The plain PyPI wheel (no CPU-only index is reachable); it runs on machines without a GPU.
  "$py" -m pip install --quiet "torch>=2.4"
fi

# The package: scikit-build-core runs CMake on the repository (tests/tools off).
unset FLASHATTN_LIBRARY
if [ "$cuda" = "auto" ]; then
  "$py" -m pip install --quiet "$repo"
else
  FLASHATTN_CUDA="$cuda" "$py" -m pip install --quiet "$repo"
fi
"$py" - <<'EOF'
import flashattn
print("flashattn", flashattn.__version__, "library", flashattn.library_path())
print("cuda backend:", flashattn.backend_available("cuda") or flashattn.backend_unavailable_reason("cuda"))
try:
    import torch
    print("torch", torch.__version__)
except ImportError:
    print("torch not installed: torch tests will be skipped")
EOF

# Run from outside the source tree so the installed package is what gets imported.
cd "$venv"
exec "$py" -m pytest -p no:cacheprovider -ra "$repo/python/tests" "$@"
