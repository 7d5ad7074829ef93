#!/bin/sh
# The benchmark harness end to end on tiny settings (ctest BenchHarnessTiny, CPU/lavapipe): mgn bench writes
# the weights and its gate outputs, the PyTorch script reads them, compare.py applies the gates. It checks
# that the harness runs and that both sides compute the same function; it asserts nothing about timings.
# Usage: bench/tiny.sh MGN PYTHON OUT_DIR [WORKLOAD...]   (default workload: fashion-cnn)
set -eu
MGN=$1 PY=$2 OUT=$3
shift 3
[ $# -gt 0 ] || set -- fashion-cnn
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT" && mkdir -p "$OUT"
TINY="--warmup 1 --samples 2 --batch 8"
FILES=""
for W in "$@"; do
  "$MGN" bench "$W" $TINY --weights "$OUT/$W.weights.safetensors" --outputs "$OUT/$W.mgn_out.safetensors" \
    --json "$OUT/$W.mgn.jsonl"
  # Eager only: torch.compile on a CPU compiles C++ for minutes, and Debian's torch 1.13 has none.
  "$PY" "$HERE/pytorch/fashion_cnn.py" --workload "$W" $TINY --impls eager --weights "$OUT/$W.weights.safetensors" \
    --outputs "$OUT/$W.torch_out.safetensors" --json "$OUT/$W.torch.jsonl"
  FILES="$FILES $OUT/$W.mgn.jsonl $OUT/$W.torch.jsonl $OUT/$W.mgn_out.safetensors $OUT/$W.torch_out.safetensors"
done
"$PY" "$HERE/compare.py" --require-gates --out "$OUT/table.md" $FILES
