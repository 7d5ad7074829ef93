#!/usr/bin/env bash
# Builds the ONNX importer's libFuzzer target with clang (ASan + UBSan, no Vulkan) and runs it for a bounded
# time over a seed corpus of real exports (tests/ref/onnx_export.py). Any crash, leak or sanitizer report
# fails. Usage: scripts/fuzz.sh [SECONDS]   (default 60)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
B=${FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGN_FUZZ=ON -DMGN_VULKAN=OFF \
  -DMGN_BUILD_TESTS=OFF > /tmp/mgn-fuzz-configure.log 2>&1 || { cat /tmp/mgn-fuzz-configure.log; exit 1; }
cmake --build "$B" -j2 --target onnx_fuzz
CORPUS=$(mktemp -d)
/usr/bin/python3 tests/ref/onnx_export.py "$CORPUS/export" > "$CORPUS/export.log" 2>&1 || { cat "$CORPUS/export.log"; exit 1; }
mkdir -p "$CORPUS/seeds" && cp "$CORPUS"/export/*.onnx "$CORPUS/seeds/"
"$B/onnx_fuzz" -max_total_time="$SECS" -rss_limit_mb=2048 -print_final_stats=1 "$CORPUS/seeds" 2>&1 | tail -15
echo "fuzz: ${SECS}s over $(ls "$CORPUS/seeds" | wc -l) seeds, no crash"
