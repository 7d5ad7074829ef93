#!/usr/bin/env sh
# Installs a build tree into a temporary prefix and uses it as a user would: the examples/find_package
# project through find_package(meganeura), the same program through pkg-config, the installed mgn, and the
# installed Python module. Usage: examples/check-install.sh BUILD_DIR WORK_DIR [python|no-python]
set -eu
BUILD=$(realpath "$1")
WORK=$(realpath -m "$2")
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
PREFIX="$WORK/prefix"
cmake --install "$BUILD" --prefix "$PREFIX" > "$WORK/install.log"
for f in bin/mgn lib/libmgn.a include/mgn/session.h lib/cmake/meganeura/meganeuraConfig.cmake \
         lib/pkgconfig/meganeura.pc; do
  [ -e "$PREFIX/$f" ] || { echo "not installed: $f"; exit 1; }
done
"$PREFIX/bin/mgn" --version

# CMake: find_package(meganeura) -> meganeura::mgn, with nothing from the source or build tree on the paths.
cmake -S "$SRC/examples/find_package" -B "$WORK/cmake-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" > "$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log"; exit 1; }
cmake --build "$WORK/cmake-build" > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
"$WORK/cmake-build/xor" "$WORK/cmake.safetensors"

# pkg-config (relocatable: the .pc finds its prefix from its own folder).
PC="env PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig pkg-config"
$PC --modversion meganeura
c++ -O1 -o "$WORK/xor-pc" "$SRC/examples/find_package/main.cpp" $($PC --cflags --libs meganeura)
"$WORK/xor-pc" "$WORK/pc.safetensors"

# The Python module from the prefix's site folder (built unless MGN_PYTHON=OFF).
[ "${3:-python}" = python ] || { echo "install check: ok (no Python module)"; exit 0; }
SITE=$(find "$PREFIX/lib" -type d -name meganeura -path "*-packages/*" | head -1)
[ -n "$SITE" ] || { echo "the Python module is not installed under $PREFIX/lib"; exit 1; }
PYTHONPATH=$(dirname "$SITE") /usr/bin/python3 -c "
import meganeura as mg, numpy as np
g = mg.Graph(); g.output('y', g.input('x', [3]) * 2.0)
y = mg.compile(g).run({'x': np.arange(3, dtype=np.float32)})['y']
assert list(y) == [0, 2, 4], y
print('python module from', mg.__file__)"
echo "install check: ok"
