#!/usr/bin/env bash
# One device call's worth of GPU checking, for a build made elsewhere (the GPU
# machine has no compiler time to spare): every GPU test binary, compute-sanitizer
# memcheck/racecheck on a subset, and `flashattn bench` (the main job) on the
# anchors' protocol, forward and backward. Logs go to $OUT (or ./gpu-logs).
#
#   bash scripts/gpu_check.sh <dir with tests/ and tools/flashattn, or a .tar.xz of them>
# GPU_CHECK_SANITIZE=0 skips the sanitizers, GPU_CHECK_CLI_BENCH=0 the CLI benchmark.
set -uo pipefail
src="${1:?usage: gpu_check.sh BUILD_DIR|BUILD.tar.xz}"
out="${OUT:-gpu-logs}"
mkdir -p "$out"
if [ -f "$src" ]; then
  dir=$(mktemp -d)
  tar -xJf "$src" -C "$dir"
  src="$dir"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
status=0
for t in "$src"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" --gtest_brief=1 > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc, $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || status=1
done
for tool in $([ "${GPU_CHECK_SANITIZE:-1}" = 1 ] && echo memcheck racecheck); do
  for t in test_cuda_forward test_cuda_backward; do
    [ -x "$src/tests/$t" ] || continue
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$src/tests/$t" \
      --gtest_filter='*MatchesFloat64Reference/bf16_b1_sq113_sk203_h2x2_d64_s*' --gtest_brief=1 \
      > "$out/sanitizer_${tool}_$t.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool $t: exit $rc, $(grep -E 'ERROR SUMMARY' "$out/sanitizer_${tool}_$t.log" | tail -1)"
    [ $rc -eq 0 ] || status=1
  done
done
if [ "${GPU_CHECK_CLI_BENCH:-1}" = 1 ]; then
  "$src/tools/flashattn" bench --protocol --backward --repeats 20 > "$out/bench_cli.txt" 2> "$out/bench_cli.err"
  rc=$?
  echo "flashattn bench --protocol --backward: exit $rc"
  cat "$out/bench_cli.txt"
  [ $rc -eq 0 ] || status=1
fi
exit $status
