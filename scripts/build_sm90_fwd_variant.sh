#!/usr/bin/env bash
# A variant of a CUDA build's libflashattn.so with the sm90 forward objects
# recompiled under extra FLASHATTN_SM90_* defines (src/cuda/sm90/fwd/tuning.h),
# for bench/sm90_fwd_ab.py:
#
#   bash scripts/build_sm90_fwd_variant.sh build build-old "-DFLASHATTN_SM90_TIGHT_GROUPS=0"
#
# A fourth argument names another kernel folder to recompile instead, e.g.
# src/cuda/sm80/fwd with "-DFLASHATTN_SM80_LAZY_RESCALE_256=0" (sm80/fwd/tuning.h).
#
# The objects are compiled with the build's own nvcc command lines and linked
# with its link line, directly: a copied CMake build directory re-runs CMake on
# the first ninja call and rebuilds those objects with the default flags, so
# the "variant" silently becomes the default build (session 5 lost two A/B runs
# that way; bench/sm90_fwd_check.py shows such a mix-up as outputs that should
# differ and do not, or the reverse).
set -euo pipefail
build="$(cd "${1:?usage: build_sm90_fwd_variant.sh BUILD OUT_DIR DEFINES}" && pwd)"
out="${2:?usage: build_sm90_fwd_variant.sh BUILD OUT_DIR DEFINES}"
defs="${3:?usage: build_sm90_fwd_variant.sh BUILD OUT_DIR DEFINES [KERNEL_DIR]}"
kernel_dir="${4:-src/cuda/sm90/fwd}"
rm -rf "$out"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cp -a "$build/CMakeFiles" "$out/"
link=$(cd "$build" && ninja -t commands flashattn | tail -1)
pids=()
for obj in $(cd "$build" && ls CMakeFiles/flashattn_objects.dir/$kernel_dir/fwd_hdim*.cu.o); do
  cmd=$(cd "$build" && ninja -t commands "$obj" | tail -1)
  (cd "$out" && eval "${cmd/nvcc /nvcc $defs }") &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
(cd "$out" && eval "$link")
echo "$out/libflashattn.so: $(md5sum < "$out/libflashattn.so" | cut -c1-12) ($defs)"
