#!/usr/bin/env bash
# The main job: build (Release), train the Fashion-MNIST model on the default device, save a checkpoint,
# reload it into a fresh inference session and report test accuracy. Extra arguments go to the trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-release}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMGN_BUILD_TESTS=OFF
cmake --build "$BUILD" -j2 --target mgn_tool
exec "$BUILD/mgn" train-fashion-mnist "$@"
