#!/usr/bin/env bash
# Builds the tree with the numerics trace on (every tensor a backend hands back is hashed, per process) and
# runs the whole test suite, leaving one trace file per process in OUT. Compare two such folders with
# scripts/numerics-compare.py: a change that must not move numerics shows no difference.
#   scripts/numerics-trace.sh OUT [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1")
BUILD=${2:-build-trace}
rm -rf "$OUT" && mkdir -p "$OUT"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGN_NUMERICS_TRACE="$OUT" >/dev/null
cmake --build "$BUILD" -j2
# Keep going on failures: the traces of the tests that ran are still compared.
ctest --test-dir "$BUILD" -j2 --timeout 1500 --output-on-failure || true
echo "numerics-trace: $(ls "$OUT" | wc -l) process traces in $OUT"
