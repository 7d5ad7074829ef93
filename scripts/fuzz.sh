#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/*_fuzz.cpp: one per reader of a user's file) with clang, ASan and UBSan,
# and runs each for a bounded time from its committed seed corpus (fuzz/corpus/<target>/; the ONNX target's
# seeds are exported by PyTorch at run time). Any crash, leak, sanitizer report, uncaught exception or timeout
# fails, and libFuzzer leaves the input under $FUZZ_WORK/<target>/ (a regression test to add). New corpus
# entries go to the work folder; the committed seeds are never modified.
# Usage: scripts/fuzz.sh [SECONDS_EACH] [TARGET...]   (default 25 s each, every target: about 3 min in CI)
# FUZZ_RUNS=N also stops each target after N executions (the long local run: FUZZ_RUNS=1000000 and a generous
# SECONDS_EACH). FUZZ_BUILD_DIR: build folder (default build-fuzz). scripts/sanitize.sh builds the same targets in its
# folder with tests and Vulkan on; FUZZ_VULKAN=ON FUZZ_TESTS=ON FUZZ_BUILD_DIR=build-asan reuse that build.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-25}
shift || true
B=${FUZZ_BUILD_DIR:-build-fuzz}
WORK=${FUZZ_WORK:-$(mktemp -d /tmp/mgn-fuzz.XXXXXX)}
mkdir -p "$WORK"
LAUNCHER=()
command -v ccache >/dev/null 2>&1 && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGN_FUZZ=ON \
  -DMGN_VULKAN="${FUZZ_VULKAN:-OFF}" -DMGN_BUILD_TESTS="${FUZZ_TESTS:-OFF}" "${LAUNCHER[@]}" \
  > "$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log"; exit 1; }
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cpp; do TARGETS+=("$(basename "$f" .cpp)"); done
fi
cmake --build "$B" -j2 --target "${TARGETS[@]}"

summary=()
for t in "${TARGETS[@]}"; do
  seeds="fuzz/corpus/$t"
  if [ "$t" = onnx_fuzz ]; then
    seeds="$WORK/onnx_seeds"
    /usr/bin/python3 tests/ref/onnx_export.py "$WORK/onnx_export" > "$WORK/onnx_export.log" 2>&1 ||
      { cat "$WORK/onnx_export.log"; exit 1; }
    mkdir -p "$seeds" && cp "$WORK"/onnx_export/*.onnx "$seeds/"
  fi
  [ -d "$seeds" ] || { echo "fuzz: no seed corpus $seeds for $t (fuzz/make_corpus.py writes them)"; exit 1; }
  mkdir -p "$WORK/$t/new"
  log="$WORK/$t/log.txt"
  # -timeout: one input may take at most 10 s; -rss_limit_mb: a reader may not need more than 2 GiB.
  if ! "$B/$t" -max_total_time="$SECS" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$WORK/$t/" "$WORK/$t/new" "$seeds" > "$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $t FAILED; the input is in $WORK/$t/ (add it as a regression test)"
    exit 1
  fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || echo '?')
  ft=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || echo '?')
  summary+=("$(printf '%-26s %10s executions  cov %6s  ft %6s  %3s seeds  no crash' "$t" "$execs" "$cov" "$ft" \
    "$(ls "$seeds" | wc -l)")")
done
printf '%s\n' "fuzz: ${SECS} s per target, logs in $WORK" "${summary[@]}"
