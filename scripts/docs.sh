#!/usr/bin/env bash
# Checks the API reference (docs/api/*.md): every public symbol of the C ABI, the
# C++ API and the Python package is documented in the sources, and the committed
# reference is what the sources generate now. Needs python3 only.
#
#   bash scripts/docs.sh           # check (what CI runs)
#   bash scripts/docs.sh --write   # regenerate docs/api after changing a header or docstring
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--write" ]; then
  exec python3 scripts/docs_api.py --out docs/api
fi
exec python3 scripts/docs_api.py --check docs/api
