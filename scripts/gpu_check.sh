#!/usr/bin/env bash
# GPU checking for a build made elsewhere (the GPU machine has no compile time to
# spare), in as few device calls as possible. Logs go to $OUT (or ./gpu-logs).
#
#   bash scripts/gpu_check.sh <dir or .tar.xz with tests/, tools/flashattn, libflashattn.so> [parts]
#
# parts (default "tests sanitize"): any of
#   tests     every GPU test binary; the sm80 suites again with FLASHATTN_DISABLE_SM90=1
#   sanitize  compute-sanitizer memcheck / racecheck / synccheck on small subsets
#   python    python/tests with pytest against this build's library (the torch ops on the GPU:
#             SDPA float64 comparisons, autograd, torch.compile, opcheck)
#   cli       `flashattn bench --protocol --backward` (the CLI's own fp64-checked sweep)
#   bench     bench/bench_attention.py, the protocol (docs/performance.md) against torch FA2 and cuDNN in the
#             same process: forward (Hopper path), forward --sm80, backward (+ deterministic);
#             results files land in $OUT/results (docs/performance.md says how to read them)
set -uo pipefail
src="${1:?usage: gpu_check.sh BUILD_DIR|BUILD.tar.xz [parts]}"
parts="${2:-tests sanitize}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-gpu-logs}"
mkdir -p "$out"
if [ -f "$src" ]; then
  dir=$(mktemp -d)
  tar -xJf "$src" -C "$dir"
  src="$dir"
fi
src="$(cd "$src" && pwd)"
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
status=0

summary() { grep -E "^\[  (PASSED|FAILED|SKIPPED) |ERROR SUMMARY|RACECHECK SUMMARY" "$1" | tr '\n' ' '; }

# run_logged NAME CMD...: runs CMD with its output in $out/NAME.log, prints one line.
run_logged() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc ($((SECONDS - t0)) s) $(summary "$out/$name.log")"
  [ $rc -eq 0 ] || status=1
}

if has tests; then
  for t in "$src"/tests/test_*; do
    [ -x "$t" ] || continue
    run_logged "$(basename "$t")" "$t" --gtest_brief=1
  done
  # On an H100 the default dispatch takes the sm90 kernels; run the sm80 ones too.
  for t in test_cuda_forward test_cuda_backward test_cuda_nan_semantics; do
    [ -x "$src/tests/$t" ] || continue
    FLASHATTN_DISABLE_SM90=1 run_logged "${t}_sm80" "$src/tests/$t" --gtest_brief=1
  done
  # The KV cache's NaN/Inf cases with the Hopper route off: the decode kernel takes seqlen_q >= 64 too.
  [ -x "$src/tests/test_cuda_kvcache" ] && FLASHATTN_DISABLE_SM90=1 run_logged test_cuda_kvcache_nan_sm80 \
    "$src/tests/test_cuda_kvcache" --gtest_filter='*CudaKvCacheNan*' --gtest_brief=1
fi

if has sanitize; then
  # The sanitizer runs are mostly host-bound: run them side by side, then report.
  jobs_started=()
  start_bg() {  # start_bg NAME CMD...: like run_logged, in the background
    local name=$1; shift
    ( "$@" > "$out/$name.log" 2>&1; echo $? > "$out/$name.rc" ) &
    jobs_started+=("$name")
  }
  sm80_subset='*MatchesFloat64Reference/bf16_b1_sq113_sk203_h2x2_d64_s*'
  for tool in memcheck racecheck; do
    for t in test_cuda_forward test_cuda_backward; do
      [ -x "$src/tests/$t" ] || continue
      FLASHATTN_DISABLE_SM90=1 start_bg "san_${tool}_${t}_sm80" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "$src/tests/$t" --gtest_filter="$sm80_subset" --gtest_brief=1
    done
  done
  # Bad input, variable-length metadata, NaN/Inf planting and the KV cache
  # (bad page indices included): memcheck over whole suites, so no
  # out-of-bounds access hides behind a clean error code.
  for t in test_cuda_hardening test_cuda_nan_semantics; do
    [ -x "$src/tests/$t" ] &&
      FLASHATTN_SM90_TEST_SMALL=1 start_bg "san_memcheck_$t" compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$src/tests/$t" --gtest_brief=1
  done
  # The NaN suite's sm80 kernels and their fixes (the d128 forward's flat one).
  [ -x "$src/tests/test_cuda_nan_semantics" ] &&
    FLASHATTN_DISABLE_SM90=1 start_bg san_memcheck_test_cuda_nan_semantics_sm80 compute-sanitizer --tool memcheck \
      --error-exitcode 9 "$src/tests/test_cuda_nan_semantics" --gtest_brief=1
  # Dropout on the Hopper kernels (the keep bits' shuffles, the packed P masks).
  [ -x "$src/tests/test_sm90_dropout" ] &&
    FLASHATTN_SM90_TEST_SMALL=1 start_bg san_memcheck_test_sm90_dropout compute-sanitizer --tool memcheck \
      --error-exitcode 9 "$src/tests/test_sm90_dropout" --gtest_filter='Suite/*' --gtest_brief=1
  # Block masks on the Hopper kernels: steps listed in part (per-pair bits), varlen steps cut
  # by the kernel, dropout, the deterministic dQ order.
  for tool in memcheck synccheck; do
    [ -x "$src/tests/test_sm90_dropout" ] &&
      start_bg "san_${tool}_sm90_block_mask" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$src/tests/test_sm90_dropout" --gtest_filter='Sm90BlockMaskVarlen.*' --gtest_brief=1
  done
  # The eager index errors, the graph replays (with and without a workspace), pages outside the
  # pool, d 64, NaN. Parameterized suites are named Instance/Suite: hence */Suite.*.
  [ -x "$src/tests/test_cuda_kvcache" ] &&
    start_bg san_memcheck_test_cuda_kvcache compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$src/tests/test_cuda_kvcache" --gtest_filter='CudaKvCacheErrors.*:*/CudaKvCacheGraph.*:*/CudaKvCacheBadPage.*:*d64*:*CudaKvCacheNan*' --gtest_brief=1
  for tool in memcheck racecheck synccheck; do
    [ -x "$src/tests/test_sm90_forward" ] &&
      FLASHATTN_SM90_TEST_SMALL=1 start_bg "san_${tool}_test_sm90_forward" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "$src/tests/test_sm90_forward" --gtest_filter='*MatchesFloat64Reference*' --gtest_brief=1
    [ -x "$src/tests/test_sm90_backward" ] &&
      FLASHATTN_SM90_TEST_SMALL=1 start_bg "san_${tool}_test_sm90_backward" compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "$src/tests/test_sm90_backward" --gtest_filter='Suite/Sm90Backward.*' --gtest_brief=1
  done
  wait
  # NOTES: racecheck does not model mbarrier ordering. The sm90 backward's
  # producer writes lse/D rows with ordinary stores that the consumers read after
  # the stage's mbarrier wait, so racecheck reports them as hazards (false
  # positives, see tests/gpu/test_sm90_backward.cpp); that run is informational
  # and does not set the exit status.
  for name in "${jobs_started[@]}"; do
    rc=$(cat "$out/$name.rc" 2>/dev/null || echo missing)
    note=""
    [ "$name" = san_racecheck_test_sm90_backward ] && note=" (informational)"
    echo "$name: exit $rc$note $(summary "$out/$name.log")"
    [ "$rc" = 0 ] || [ -n "$note" ] || status=1
  done
fi

if has python; then
  FLASHATTN_LIBRARY="$src/libflashattn.so" PYTHONPATH="$repo/python" run_logged pytest \
    "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$repo/python/tests"
  tail -3 "$out/pytest.log"
fi

if has cli; then
  run_logged bench_cli "$src/tools/flashattn" bench --protocol --backward --repeats 20
fi

if has bench; then
  mkdir -p "$out/results"
  export FLASHATTN_LIBRARY="$src/libflashattn.so" PYTHONPATH="$repo/python" PYTHONUNBUFFERED=1
  py="${PYTHON:-python3}"
  run_logged bench_forward "$py" "$repo/bench/bench_attention.py" --impls ours,fa2,cudnn \
    --out "$out/results/forward.md"
  run_logged bench_forward_sm80 "$py" "$repo/bench/bench_attention.py" --sm80 --impls ours,fa2,cudnn \
    --out "$out/results/forward-sm80.md"
  run_logged bench_backward "$py" "$repo/bench/bench_attention.py" --backward \
    --impls ours,ours-det,fa2,cudnn --out "$out/results/backward.md"
fi
exit $status
