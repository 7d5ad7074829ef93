#!/usr/bin/env bash
# Installs the Debian 12 packages meganeura needs to build, test and run (idempotent; needs root or sudo).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
  libshaderc-dev glslang-dev spirv-tools
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libsndfile1-dev libsamplerate0-dev libfftw3-dev
  python3-torch python3-torchvision python3-numpy python3-onnx libopenblas0-pthread
  clang libclang-rt-14-dev
  dataset-fashion-mnist
  alsa-utils espeak-ng
)
# Node.js runs the Hugging Face tokenizers library (npm package) as the tokenizer tests' reference.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
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
if [ ! -d "$(dirname "$0")/../tests/ref/node_modules/tokenizers" ]; then
  (cd "$(dirname "$0")/../tests/ref" && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "setup: all packages present"
