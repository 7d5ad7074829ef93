#!/usr/bin/env bash
# Installs the Debian 12 packages meganeura needs (idempotent; needs root or sudo). Debian's archive only:
#   scripts/setup-debian.sh           what the main job needs: build, install, train (mgn, the library, the
#                                     Python module, the Fashion-MNIST data, Mesa's Vulkan drivers, Open MPI
#                                     for data-parallel training across processes)
#   scripts/setup-debian.sh --tests   that, and what the test suite needs: GoogleTest, the validation layer,
#                                     PyTorch and ONNX (the oracles), pytest, clang (fuzzing), test audio
#                                     (alsa-utils' recordings, espeak-ng), test images (opencv-doc's photos;
#                                     PIL, skimage), Node.js with the pinned npm
#                                     reference package of the tokenizer tests (tests/ref), and llama.cpp's
#                                     prebuilt libraries from npm with the tools built against them
#                                     (scripts/fetch-llama-cpp.sh -> tests/ref/llama_cpp: ~60 MB download,
#                                     ~20 s of compiling) for the GGUF test (GgufLlamaCppLogits)
set -euo pipefail
TESTS=0
for arg in "$@"; do
  case "$arg" in
    --tests) TESTS=1 ;;
    *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
  esac
done
PKGS=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  libvulkan-dev mesa-vulkan-drivers vulkan-tools
  libshaderc-dev glslang-dev spirv-tools
  libonnx-dev libprotobuf-dev protobuf-compiler
  pybind11-dev python3-dev python3-numpy python3-matplotlib
  libsndfile1-dev libsamplerate0-dev libfftw3-dev
  libjpeg-dev libpng-dev libwebp-dev
  dataset-fashion-mnist
  libopenmpi-dev openmpi-bin
)
if [ "$TESTS" = 1 ]; then
  PKGS+=(
    libgtest-dev libgmock-dev vulkan-validationlayers
    python3-torch python3-torchvision python3-onnx python3-pytest libopenblas0-pthread
    clang libclang-rt-14-dev
    alsa-utils espeak-ng
    python3-pil python3-skimage opencv-doc
    libonnx-testdata
  )
  # Node.js runs the Hugging Face tokenizers library (npm package) as the tokenizer tests' reference.
  command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The npm reference packages, pinned in tests/ref/package-lock.json, into tests/ref/node_modules.
if [ "$TESTS" = 1 ] && [ ! -d "$(dirname "$0")/../tests/ref/node_modules/tokenizers" ]; then
  (cd "$(dirname "$0")/../tests/ref" && npm ci --no-audit --no-fund --loglevel=error)
fi
if [ "$TESTS" = 1 ]; then
  "$(dirname "$0")/fetch-llama-cpp.sh" "$(dirname "$0")/../tests/ref/llama_cpp"
fi
echo "setup: all packages present$([ "$TESTS" = 1 ] && echo ", with the test references")"
