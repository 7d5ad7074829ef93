#!/usr/bin/env bash
# The main job: build (Release), install (mgn on PATH, the library, headers, CMake and pkg-config files, the
# Python module; prefix MEGANEURA_PREFIX, default /usr/local), then train the Fashion-MNIST model on the default
# device, save a checkpoint, reload it into a fresh inference session and report test accuracy. Extra
# arguments go to `mgn train-fashion-mnist`. Outputs land in the current folder: fashion_mnist_cnn.safetensors
# (checkpoint) and fashion_mnist_cnn.metrics.jsonl (scripts/plot-training.py draws it).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$SRC/build-release}
PREFIX=${MEGANEURA_PREFIX:-/usr/local}
mkdir -p "$BUILD"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMGN_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j2
SUDO=""
[ -w "$PREFIX" ] || [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO cmake --install "$BUILD" > "$BUILD/install.log" || { cat "$BUILD/install.log"; exit 1; }
echo "installed: $PREFIX/bin/mgn, $PREFIX/lib/libmgn.a, $PREFIX/include/mgn, the Python module meganeura" >&2
exec "$PREFIX/bin/mgn" train-fashion-mnist "$@"
