#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs from a CUDA build (GPU test binaries,
# the CLI, the shared library) into one .tar.xz to carry to the GPU machine.
#
#   bash scripts/pack_gpu_build.sh <build dir> <out.tar.xz>
set -euo pipefail
build="${1:?usage: pack_gpu_build.sh BUILD_DIR OUT.tar.xz}"
dest="${2:?usage: pack_gpu_build.sh BUILD_DIR OUT.tar.xz}"
dest="$(cd "$(dirname "$dest")" && pwd)/$(basename "$dest")"
cd "$build"
files=(libflashattn.so tools/flashattn)
for t in tests/test_*; do
  [ -x "$t" ] && files+=("$t")
done
tar -chJf "$dest" "${files[@]}"
echo "$dest: ${#files[@]} files, $(du -h "$dest" | cut -f1)"
