#!/usr/bin/env bash
# Stages what bench/h200.sh needs into .h200/ (stripped binaries, the oracle files) so that one `run` call
# can carry it with .gl and .fmdata (the carry limit is 64 MiB in all).
# Usage here: bench/stage-h200.sh BUILD_DIR   (a Release build with tests on)
set -euo pipefail
B=${1:-build-h200}
cd "$(dirname "$0")/.."
rm -rf .h200 && mkdir -p .h200/tests
cp "$B/mgn" .h200/
for t in vulkan_ops_test vulkan_session_test vulkan_kernels_test; do
  [ -x "$B/tests/$t" ] && cp "$B/tests/$t" .h200/tests/
done
strip .h200/mgn .h200/tests/* 2>/dev/null || true
[ -d "$B/oracle" ] && cp -r "$B/oracle" .h200/oracle
[ -d .fmdata ] || { mkdir -p .fmdata && cp /usr/share/datasets/fashion-mnist/*.gz .fmdata/; }
du -sh .h200 .gl .fmdata
