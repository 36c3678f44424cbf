#!/usr/bin/env bash
# Sanitizer and fuzzing job (issue 27), called from .ci/run after the main tests.
# CPU-only builds with clang:
#   1. AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover): the
#      C++ suites (ctest label cpu) and short, seeded runs of the libFuzzer
#      targets in tests/fuzz (the .npy reader; the C ABI's argument validation);
#   2. ThreadSanitizer: the threaded CPU-backend tests.
# Time: 480 s for all three steps from clean build dirs (8.0 min wall: builds
# ~4 min, ASan suites ~2.5 min, TSan ~1 min, fuzz 2 x 30 s), measured on the
# 2-core development machine shared with other jobs; CI's whole budget is 90 min.
#
#   bash scripts/sanitize.sh                 # everything
#   FUZZ_SECONDS=600 bash scripts/sanitize.sh fuzz   # longer fuzz runs only (docs/hardening.md)
# Steps: asan, tsan, fuzz (default: all three). Build dirs: build-asan, build-tsan.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz_seconds="${FUZZ_SECONDS:-30}"
jobs="${SANITIZE_JOBS:-2}"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan tsan fuzz)
start=$SECONDS

if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-dev
  fi
fi

common=(-G Ninja -DFLASHATTN_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)

configure_asan() {
  cmake -S . -B build-asan "${common[@]}" -DFLASHATTN_FUZZ=ON \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  cmake --build build-asan -j "$jobs" --target flashattn_tests flashattn_cli_tests flashattn_cli fuzz_npy fuzz_validate
}

run_asan() {
  configure_asan
  # The C++ suites run as two processes (ctest's process per test cost minutes
  # of sanitizer start-up); the install/consumer test is left out: it builds
  # outside projects without the sanitizer runtime.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  build-asan/tests/flashattn_tests --gtest_brief=1
  build-asan/tests/flashattn_cli_tests --gtest_brief=1
}

run_tsan() {
  cmake -S . -B build-tsan "${common[@]}" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  cmake --build build-tsan -j "$jobs" --target flashattn_tests
  # Multi-threaded runs of both passes, varlen and GQA included, and the
  # thread-start failure path.
  TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/flashattn_tests \
    --gtest_filter='*CpuForward*d64*:*CpuBackward*varlen*:*CpuBackward*h8x1*:CpuBackwardDeterminism.*:Hardening.ThreadStartFailureDegrades:*NanSemantics*f32*'
}

run_fuzz() {
  [ -x build-asan/tests/fuzz/fuzz_npy ] || configure_asan
  for target in npy validate; do
    corpus="build-asan/fuzz-corpus/$target"
    mkdir -p "$corpus"
    seeds=()
    [ -d "tests/fuzz/seeds/$target" ] && seeds=("tests/fuzz/seeds/$target")
    echo "== fuzz_$target: ${fuzz_seconds}s, seed 1"
    ASAN_OPTIONS=detect_leaks=1 build-asan/tests/fuzz/fuzz_$target -seed=1 -max_total_time="$fuzz_seconds" \
      -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 -artifact_prefix=build-asan/fuzz-$target- \
      "$corpus" "${seeds[@]}" 2>&1 | tail -n 12
  done
}

for step in "${steps[@]}"; do
  case "$step" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    fuzz) run_fuzz ;;
    *) echo "unknown step '$step' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done
echo "== sanitize.sh: ${steps[*]} passed in $((SECONDS - start)) s"
