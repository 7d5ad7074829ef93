#!/usr/bin/env bash
# Fetches llama.cpp's Vulkan build as a benchmark peer and builds llama-bench against it:
#   scripts/fetch-llama-cpp.sh DIR
#
# Third-party code, MIT-licensed (llama.cpp and ggml by the ggml authors; node-llama-cpp by Gilad S.), used
# only as a benchmark peer and as an independent reference in one test; nothing of it is committed here or
# linked into meganeura. Downloads from the npm registry, at the pinned version below, with `npm pack`
# (which checks each tarball against the registry's integrity hash; this script also checks the sha512
# pinned here):
#   @node-llama-cpp/linux-x64-vulkan  prebuilt shared libraries: libllama, libllama-common, libggml-base,
#                                     libggml-vulkan (ggml-vulkan with its shaders, cooperative-matrix ones
#                                     included) and the libggml-cpu-* variants (glibc >= 2.34,
#                                     GLIBCXX >= 3.4.30: Debian 12 and Ubuntu 22.04/24.04 run them)
#   node-llama-cpp                    its llama.cpp source bundle (llama/gitRelease.bundle, a git bundle of
#                                     the release it was built from): the headers and tools/llama-bench
# ggml itself is not built (Debian 12's glslang is too old for ggml-vulkan's shaders): only llama-bench and
# our scripts/llama-cpp-logits.cpp are compiled, against the prebuilt libraries, with rpath $ORIGIN.
#
# DIR (git-ignored wherever it is: build/, tests/ref/llama_cpp/, .h200/) then holds, flat:
#   llama-bench, llama-cpp-logits, the .so files, LICENSE-llama.cpp, VERSION (package and llama.cpp release)
# ggml loads its backends (libggml-vulkan.so, the best libggml-cpu-*.so) from the executable's folder.
# Vulkan ignores CPU-type devices (lavapipe) unless GGML_VK_VISIBLE_DEVICES=0 is set.
#
# Offline: LLAMA_CPP_TARBALLS=FOLDER takes the two .tgz files from FOLDER instead of the registry (the
# sha512 check still applies). Needs npm (unless offline), python3 (the hash), git and g++ (C++17).
set -euo pipefail
VERSION=3.22.1
SHA_MAIN="sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=="
SHA_VULKAN="sha512-bBxqU+JOcBu1nb5Qj2zcMci+JByT1E8EajHvYodyNfVIPkEhXh+/HMwR1/BT7xP08YK0hks+kM8fglER0P8JEg=="
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR=$1
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -x "$DIR/llama-bench" ] && [ -x "$DIR/llama-cpp-logits" ] && grep -qx "node-llama-cpp $VERSION" "$DIR/VERSION" 2>/dev/null &&
   [ "$DIR/llama-cpp-logits" -nt "$HERE/llama-cpp-logits.cpp" ]; then
  echo "fetch-llama-cpp: $DIR is up to date (node-llama-cpp $VERSION)"
  exit 0
fi
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

main_tgz=node-llama-cpp-$VERSION.tgz
vulkan_tgz=node-llama-cpp-linux-x64-vulkan-$VERSION.tgz
if [ -n "${LLAMA_CPP_TARBALLS:-}" ]; then
  cp "$LLAMA_CPP_TARBALLS/$main_tgz" "$LLAMA_CPP_TARBALLS/$vulkan_tgz" "$WORK/"
else
  (cd "$WORK" && npm pack --ignore-scripts --silent "node-llama-cpp@$VERSION" \
      "@node-llama-cpp/linux-x64-vulkan@$VERSION" >/dev/null)
fi
check() {
  local got
  got="sha512-$(python3 -c 'import base64, hashlib, sys; print(base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$WORK/$1")"
  [ "$got" = "$2" ] || { echo "fetch-llama-cpp: $1: sha512 mismatch (got $got, pinned $2)" >&2; exit 1; }
}
check "$main_tgz" "$SHA_MAIN"
check "$vulkan_tgz" "$SHA_VULKAN"
mkdir -p "$WORK/main" "$WORK/vulkan"
tar xzf "$WORK/$main_tgz" -C "$WORK/main"
tar xzf "$WORK/$vulkan_tgz" -C "$WORK/vulkan"
git clone -q "$WORK/main/package/llama/gitRelease.bundle" "$WORK/src" 2>/dev/null
SRC=$WORK/src
BINS=$WORK/vulkan/package/bins/linux-x64-vulkan
rel=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$WORK/main/package/llama/llama.cpp.info.json")
# The libraries' names carry the release (libllama.vulkan.<release>.so): find them rather than guess.
llama_lib=$(cd "$BINS" && ls libllama.*.so | head -1)
ggml_lib=$(cd "$BINS" && ls libggml.*.so | head -1)
rm -f "$DIR"/*.so "$DIR/llama-bench" "$DIR/llama-cpp-logits"
cp "$BINS"/*.so "$DIR/"
cp "$SRC/LICENSE" "$DIR/LICENSE-llama.cpp"
CXX=${CXX:-g++}
FLAGS=(-std=c++17 -O2 -DNDEBUG -pthread -I"$SRC/include" -I"$SRC/ggml/include" -I"$SRC/common" -I"$SRC/vendor")
LIBS=(-L"$DIR" -l:libllama-common.so -l:"$llama_lib" -l:"$ggml_lib" -l:libggml-base.so -Wl,-rpath,'$ORIGIN')
"$CXX" "${FLAGS[@]}" "$SRC/tools/llama-bench/llama-bench.cpp" "$SRC/tools/llama-bench/main.cpp" \
    -o "$DIR/llama-bench" "${LIBS[@]}"
"$CXX" "${FLAGS[@]}" "$HERE/llama-cpp-logits.cpp" -o "$DIR/llama-cpp-logits" "${LIBS[@]}"
printf 'node-llama-cpp %s\nllama.cpp %s (%s, commit of the bundle %s)\n' "$VERSION" "$rel" \
    "$(sed -n 's/.*"llamaCppGithubRepo": *"\([^"]*\)".*/\1/p' "$WORK/main/package/llama/llama.cpp.info.json")" \
    "$(git -C "$SRC" rev-parse --short HEAD)" >"$DIR/VERSION"
echo "fetch-llama-cpp: built $DIR/llama-bench and $DIR/llama-cpp-logits ($(head -2 "$DIR/VERSION" | tail -1))"
