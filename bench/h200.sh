#!/usr/bin/env bash
# One call on the GPU machine: the Vulkan loader from .gl/, then the GEMM comparison (ours vs torch.mm in
# the same run), the Vulkan whole-graph test, and the main job (Fashion-MNIST on the default Vulkan device).
# Usage there: bench/h200.sh BUILD_DIR DATA_DIR   (results under $OUT)
set -uo pipefail
B=${1:-build-release}
DATA=${2:-.fmdata}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$OUT/env.txt" 2>&1
export MGN_VALIDATION=0 MGN_CACHE_DIR=/tmp/mgn-cache MGN_FASHION_MNIST_DIR="$(realpath "$DATA")"
SHAPES="512x512x512 1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192 128x1536x576 128x576x1536"
"$B/mgn" bench-gemm $SHAPES > "$OUT/gemm_mgn.jsonl" 2> "$OUT/gemm_mgn.err"
python3 bench/pytorch/gemm.py $SHAPES > "$OUT/gemm_torch.jsonl" 2> "$OUT/gemm_torch.err"
"$B/mgn" bench-gemm 1024x1024x1024 > "$OUT/gemm_mgn_warm.jsonl" 2>&1   # warm SPIR-V/pipeline caches
[ -x "$B/tests/vulkan_session_test" ] && "$B/tests/vulkan_session_test" > "$OUT/vulkan_session_test.txt" 2>&1
( time "$B/mgn" train-fashion-mnist --epochs 5 --no-progress --data "$DATA" --out "$OUT/fashion_mlp.safetensors" ) \
  > "$OUT/main_job.txt" 2>&1
rm -f "$OUT/fashion_mlp.safetensors"
echo done
