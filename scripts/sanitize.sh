#!/usr/bin/env bash
# The sanitizer job: an ASan + UBSan build (clang; any report aborts: -fno-sanitize-recover) of the library, the
# `mgn` tool, the fuzz targets and the test programs below, then those tests: the CPU tests whole, and the
# Vulkan tests that cover the runtime and whole sessions on lavapipe (with the validation layer and its
# synchronization validation on). What runs and why is in docs/reliability.md. Suppressions: third-party code
# only, each justified in scripts/sanitizer/lsan.supp.
# Usage: scripts/sanitize.sh            (build folder: $SANITIZE_BUILD_DIR, default build-asan)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${SANITIZE_BUILD_DIR:-build-asan}
# CPU executor, readers, planner, passes, tools (every test of these programs).
CPU_TESTS=(ir_test autodiff_test optim_test nn_test plan_test checkpoint_test tokenizer_test llama_test
           data_test environment_test tool_api_test train_test onnx_test reliability_test crash_safety_test)
# Lavapipe: the device layer (memory, streams, caches, validation), whole training sessions against the CPU,
# and device loss (the shared device dropped and destroyed: lifetimes ASan checks).
VULKAN_TESTS=(vulkan_runtime_test vulkan_session_test device_lost_test)
LAUNCHER=()
command -v ccache >/dev/null 2>&1 && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGN_FUZZ=ON -DMGN_VULKAN=ON \
  -DMGN_BUILD_TESTS=ON "${LAUNCHER[@]}" > /tmp/mgn-sanitize-configure.log 2>&1 ||
  { cat /tmp/mgn-sanitize-configure.log; exit 1; }
FUZZ=()
for f in fuzz/*_fuzz.cpp; do FUZZ+=("$(basename "$f" .cpp)"); done
cmake --build "$B" -j2 --target mgn_tool "${CPU_TESTS[@]}" "${VULKAN_TESTS[@]}" "${FUZZ[@]}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0
export LSAN_OPTIONS=suppressions=$PWD/scripts/sanitizer/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export MGN_VALIDATION=1 MGN_SYNC_VALIDATION=1
LOGS=$(mktemp -d /tmp/mgn-sanitize.XXXXXX)
run() {  # one test program, all its tests in one process; its log is printed when it fails
  local t=$1 start=$SECONDS
  if (cd "$B/tests" && "./$t" --gtest_brief=1 > "$LOGS/$t.log" 2>&1); then
    echo "sanitize: $t ok ($((SECONDS - start)) s)"
  else
    tail -60 "$LOGS/$t.log"
    echo "sanitize: $t FAILED (log: $LOGS/$t.log)"
    return 1
  fi
}
export -f run
export B LOGS
printf '%s\n' "${CPU_TESTS[@]}" "${VULKAN_TESTS[@]}" | xargs -P 2 -I{} bash -c 'run {}'
/usr/bin/python3 tests/cli_test.py "$B/mgn" "$PWD" "$B/cli_test" > "$LOGS/cli_test.log" 2>&1 ||
  { tail -30 "$LOGS/cli_test.log"; echo "sanitize: cli_test FAILED"; exit 1; }
echo "sanitize: cli_test ok"
echo "sanitize: ${#CPU_TESTS[@]} CPU and ${#VULKAN_TESTS[@]} Vulkan test programs and the CLI test clean under ASan + UBSan"
