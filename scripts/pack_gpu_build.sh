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
# NOTES: every test binary links the whole library statically (~55 MB each, mostly the same
# kernels): one xz stream with a dictionary larger than a binary stores the repeats once
# (13 MB for all of them instead of ~7 MB each; decompressing needs the dictionary's 512 MiB).
tar -ch "${files[@]}" | xz -T1 --lzma2=preset=3,dict=512MiB > "$dest"
echo "$dest: ${#files[@]} files, $(du -h "$dest" | cut -f1)"
