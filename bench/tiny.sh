#!/bin/sh
# The benchmark harness end to end on tiny settings (ctest BenchHarnessTiny, CPU/lavapipe): for each workload
# mgn bench writes the weights or inputs and its gate outputs, the PyTorch script reads them and writes its
# own, and compare.py applies the gates and writes one table. It checks that the harness runs and that both
# sides compute the same function; it asserts nothing about timings.
# Usage: bench/tiny.sh MGN PYTHON OUT_DIR [WORKLOAD...]
#   workloads: fashion-cnn fashion-mlp llama-tiny resnet-tiny attention conv gemm (default: all of them)
#   BENCH_BACKEND=cpu|vulkan|auto (default auto) picks our side's backend (bench-gemm always uses auto)
set -eu
MGN=$1 PY=$2 OUT=$3
shift 3
[ $# -gt 0 ] || set -- fashion-cnn fashion-mlp llama-tiny resnet-tiny attention conv gemm
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT" && mkdir -p "$OUT"
RUNS="--warmup 1 --samples 2"
BACKEND="--backend ${BENCH_BACKEND:-auto}"
FILES=""
for W in "$@"; do
  P="$OUT/$W"
  case "$W" in
    fashion-cnn|fashion-mlp)
      "$MGN" bench "$W" $BACKEND $RUNS --batch 8 --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
        --json "$P.mgn.jsonl"
      # Eager only: torch.compile on a CPU compiles C++ for minutes, and Debian's torch 1.13 has none.
      "$PY" "$HERE/pytorch/fashion_cnn.py" --workload "$W" $RUNS --batch 8 --impls eager \
        --weights "$P.weights.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl"
      ;;
    llama-tiny)
      # Batch 2 so that the batched paths (prefill, loss, the KV-cache step of every row) are gated too.
      "$MGN" bench llama-tiny $BACKEND $RUNS --batch 2 --seq 16 --weights "$P.weights.safetensors" \
        --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/llama_ref.py" --bench $RUNS --batch 2 --seq 16 --impls eager --device cpu \
        --weights "$P.weights.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl"
      # Every timed phase carries the session's planned and measured memory.
      [ "$(grep -c '"plan_physical_bytes"' "$P.mgn.jsonl")" -eq 4 ] || { echo "tiny.sh: memory fields missing"; exit 1; }
      ;;
    resnet-tiny)
      # ResNet-18, width 8, batch 2, 64x64, 10 classes; the PyTorch side reads our inputs from the gate file and
      # adds its float64 reference (f64.*), so that compare.py's gate vs exact (f64) runs too.
      "$MGN" bench resnet-tiny $BACKEND $RUNS --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
        --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/resnet_bench.py" $RUNS --impls eager --device cpu --weights "$P.weights.safetensors" \
        --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" --f64-reference
      ;;
    attention|conv)
      "$MGN" bench "$W" --tiny $BACKEND $RUNS --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/$W.py" $RUNS --device cpu --inputs "$P.mgn_out.safetensors" \
        --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl"
      ;;
    gemm)
      # mgn bench-gemm and gemm.py exchange no tensors: timings only (the kernel is gated by the conformance tests).
      "$MGN" bench-gemm 24x40x16 > "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/gemm.py" --device cpu $RUNS 24x40x16 > "$P.torch.jsonl"
      FILES="$FILES $P.mgn.jsonl $P.torch.jsonl"
      continue
      ;;
    *) echo "tiny.sh: unknown workload $W"; exit 2 ;;
  esac
  FILES="$FILES $P.mgn.jsonl $P.torch.jsonl $P.mgn_out.safetensors $P.torch_out.safetensors"
done
"$PY" "$HERE/compare.py" --require-gates --out "$OUT/table.md" $FILES
case " $* " in
  *" resnet-tiny "*)
    grep -q "^Gate vs exact (f64), resnet-tiny" "$OUT/table.md" || { echo "tiny.sh: no gate vs exact (f64) in the table"; exit 1; } ;;
esac
