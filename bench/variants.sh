#!/usr/bin/env bash
# The measurements behind docs/perf-notes.md "Kept variants", on the GPU machine, one call; results in $OUT.
# Usage there: bench/variants.sh BIN_DIR ORACLE_DIR   (BIN_DIR holds mgn, lib/ and tests/vulkan_ops_test)
#   gemv.jsonl       mgn bench-gemm on the SmolLM2 decode shapes (M = 1..8), the small GEMV kernels against
#                    the tiled SIMT kernel (--variant small | simt)
#   attention.jsonl  mgn bench attention (9 query / 3 kv heads, d 64, causal) at seq 1024 and 4096, forward
#                    and forward + backward, with MGN_ATTENTION=row, tiled and auto
#   attention_profile.txt  MGN_PROFILE=1 per-kernel GPU times of forward + backward at seq 1024, row and tiled
#   ops.txt          vulkan_ops_test (every PyTorch oracle case on this device) and mgn devices --verbose
set -uo pipefail
B=$(realpath "$1") ORACLE=$(realpath "$2")
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export MGN_VALIDATION=0 MGN_CACHE_DIR=/tmp/variants-cache LD_LIBRARY_PATH="$B/lib"
"$B/mgn" devices --verbose > "$OUT/ops.txt" 2>&1
SHAPES="1x576x576 1x1536x576 1x576x1536 1x49152x576 4x576x576 8x1536x576"
for v in small simt; do
  "$B/mgn" bench-gemm $SHAPES --variant $v --tag $v 2>> "$OUT/log.txt"
done > "$OUT/gemv.jsonl"
T=/tmp/variants-attn
rm -rf "$T" && mkdir -p "$T"
for seq in 1024 4096; do
  for k in row tiled auto; do
    MGN_ATTENTION=$k "$B/mgn" bench attention --seq $seq --json "$T/${k}_$seq.jsonl" > /dev/null 2>> "$OUT/log.txt"
    echo "attention $k seq $seq rc=$?" >> "$OUT/log.txt"
  done
done
cat "$T"/*.jsonl > "$OUT/attention.jsonl"
for k in row tiled; do
  echo "== MGN_ATTENTION=$k" >> "$OUT/attention_profile.txt"
  MGN_ATTENTION=$k MGN_PROFILE=1 "$B/mgn" bench attention --seq 1024 --phases fwdbwd --samples 10 \
    > /dev/null 2>> "$OUT/attention_profile.txt"
done
MGN_ORACLE_DIR="$ORACLE" timeout 240 "$B/tests/vulkan_ops_test" >> "$OUT/ops.txt" 2>&1
echo "vulkan_ops_test rc=$?" >> "$OUT/log.txt"
