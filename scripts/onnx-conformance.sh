#!/usr/bin/env bash
# Runs the ONNX backend test suite (libonnx-testdata) on the CPU executor and rewrites the committed
# results: docs/onnx-conformance.md (per case) and tests/onnx_conformance/pass.txt (the cases CI keeps
# passing). Usage: scripts/onnx-conformance.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
"$BUILD/mgn" onnx-conformance /usr/share/libonnx-testdata/data --backend cpu --quiet \
  --report docs/onnx-conformance.md --write-pass-list tests/onnx_conformance/pass.txt
