#!/usr/bin/env bash
# Configures, builds (-j2) and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD" -j2
ctest --test-dir "$BUILD" --output-on-failure -j2 --timeout 1500
