#!/bin/sh
# The benchmark harness end to end on tiny settings (ctest BenchHarnessTiny, CPU/lavapipe): for each workload
# mgn bench writes the weights or inputs and its gate outputs, the PyTorch script reads them and writes its
# own, and compare.py applies the gates and writes one table. It checks that the harness runs and that both
# sides compute the same function; it asserts nothing about timings.
# Usage: bench/tiny.sh MGN PYTHON OUT_DIR [WORKLOAD...]
#   workloads: fashion-cnn fashion-mlp llama-tiny resnet-tiny whisper-encoder-test dinov3-test dinovision-test
#   smolvla-expert-test
#   sd-unet-test
#   attention conv gemm (default: all of them)
#   BENCH_BACKEND=cpu|vulkan|auto (default auto) picks our side's backend (bench-gemm always uses auto)
set -eu
MGN=$1 PY=$2 OUT=$3
shift 3
[ $# -gt 0 ] || set -- fashion-cnn fashion-mlp llama-tiny resnet-tiny whisper-encoder-test dinov3-test dinovision-test \
  smolvla-expert-test sd-unet-test attention conv gemm
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$OUT" && mkdir -p "$OUT"
RUNS="--warmup 1 --warmup-ms 0 --samples 2"
# Every model script also writes PyTorch's float64 result (f64.*, compare.py's gate vs exact) and is asked for its
# TF32 result (acc.*, the allowance of the accelerated gate): on the CPU it records that it made none (checked below).
REFS="--f64-reference --accelerated-reference"
BACKEND="--backend ${BENCH_BACKEND:-auto}"
FILES="" MODELS=""
# Our accelerated mode too, for one model and one microbenchmark workload, so that compare.py gates each of our
# modes against the one PyTorch strict reference (without coopmat, e.g. on lavapipe, it computes in f32).
accelerated() {  # accelerated WORKLOAD PREFIX [ARG...]
  w=$1 p=$2
  shift 2
  "$MGN" bench "$w" "$@" $BACKEND $RUNS --mode accelerated --outputs "$p.acc.mgn_out.safetensors" \
    --json "$p.acc.mgn.jsonl"
  FILES="$FILES $p.acc.mgn.jsonl $p.acc.mgn_out.safetensors"
}
for W in "$@"; do
  P="$OUT/$W"
  case "$W" in
    fashion-cnn|fashion-mlp)
      "$MGN" bench "$W" $BACKEND $RUNS --batch 8 --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
        --json "$P.mgn.jsonl"
      # Eager only: torch.compile on a CPU compiles C++ for minutes, and Debian's torch 1.13 has none.
      "$PY" "$HERE/pytorch/fashion_cnn.py" --workload "$W" $RUNS --batch 8 --impls eager \
        --weights "$P.weights.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" $REFS
      if [ "$W" = fashion-mlp ]; then accelerated "$W" "$P" --batch 8 --weights "$P.weights.safetensors"; fi
      ;;
    llama-tiny)
      # Batch 2 so that the batched paths (prefill, loss, the KV-cache step of every row) are gated too.
      "$MGN" bench llama-tiny $BACKEND $RUNS --batch 2 --seq 16 --weights "$P.weights.safetensors" \
        --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/llama_ref.py" --bench $RUNS --batch 2 --seq 16 --impls eager --device cpu \
        --weights "$P.weights.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" $REFS
      # Every timed phase carries the session's planned and measured memory.
      [ "$(grep -c '"plan_physical_bytes"' "$P.mgn.jsonl")" -eq 4 ] || { echo "tiny.sh: memory fields missing"; exit 1; }
      [ "$(grep -c '"session_arena_bytes"' "$P.mgn.jsonl")" -eq 4 ] || { echo "tiny.sh: session arena missing"; exit 1; }
      ;;
    resnet-tiny)
      # ResNet-18, width 8, batch 2, 64x64, 10 classes; the PyTorch side reads our inputs from the gate file and
      # adds its float64 reference (f64.*), so that compare.py's gate vs exact (f64) runs too.
      "$MGN" bench resnet-tiny $BACKEND $RUNS --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
        --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/resnet_bench.py" $RUNS --impls eager --device cpu --weights "$P.weights.safetensors" \
        --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" $REFS
      ;;
    whisper-encoder-test)
      # The Whisper encoder at 2 layers, d_model 64, 300 frames, batch 2 (the paper's objective); PyTorch runs the
      # plain-torch encoder with WhisperEncoder's names (transformers is not in Debian).
      "$MGN" bench whisper-encoder-test $BACKEND $RUNS --batch 2 --weights "$P.weights.safetensors" \
        --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/whisper_bench.py" $RUNS --impls eager --device cpu --model plain \
        --weights "$P.weights.safetensors" --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" \
        --json "$P.torch.jsonl" $REFS
      ;;
    dinov3-test|dinovision-test)
      # The DINOv3 ViT at 2 layers, hidden 64, 64x64 images, batch 2 (4 x 4 patches + 5 prefix tokens, the paper's
      # objective), and the DinoVision decoder at hidden 64, 4 x 4 features -> 64 x 64 RGB, batch 2 (MSE); PyTorch
      # runs plain-torch modules with DINOv3ViTModel's / the decoder's names (transformers is not in Debian).
      "$MGN" bench "$W" $BACKEND $RUNS --batch 2 --weights "$P.weights.safetensors" \
        --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/dinov3_bench.py" $RUNS --impls eager --device cpu --model plain \
        --weights "$P.weights.safetensors" --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" \
        --json "$P.torch.jsonl" $REFS
      ;;
    smolvla-expert-test)
      # The SmolVLA action expert at 4 layers, hidden 48, 6 actions, 5 VLM tokens, batch 1 (the spec's inputs and
      # loss) with the latency-shape minimal phase (1 action token); PyTorch: bench/pytorch/smolvla_expert.py.
      "$MGN" bench "$W" $BACKEND $RUNS --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
        --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/smolvla_bench.py" $RUNS --impls eager --device cpu --weights "$P.weights.safetensors" \
        --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" $REFS
      ;;
    sd-unet-test)
      # The conditioned U-Net: the spec's tiny() cut to 2 levels, 16x16 latent, 8-token context, batch 2 (the
      # spec's inputs and objective); PyTorch runs bench/pytorch/sd_unet.py (plain torch, the same names). AdamW
      # lr 1e-4, not 1e-3: Adam's first update is lr·sign(g), and a few conv-weight elements whose gradient is ~1e-4
      # of the tensor's median flip sign under f32 summation order (docs/unet.md, "Gates").
      "$MGN" bench sd-unet-test $BACKEND $RUNS --batch 2 --lr 1e-4 --weights "$P.weights.safetensors" \
        --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/sd_unet_bench.py" $RUNS --impls eager --device cpu --lr 1e-4 \
        --weights "$P.weights.safetensors" --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" \
        --json "$P.torch.jsonl" $REFS
      ;;
    attention|conv)
      "$MGN" bench "$W" --tiny $BACKEND $RUNS --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/$W.py" $RUNS --device cpu --inputs "$P.mgn_out.safetensors" \
        --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl"
      if [ "$W" = conv ]; then accelerated "$W" "$P" --tiny; fi
      ;;
    gemm)
      # mgn bench-gemm and gemm.py exchange no tensors: timings only (the kernel is gated by the conformance tests).
      "$MGN" bench-gemm 24x40x16 > "$P.mgn.jsonl"
      "$MGN" bench-gemm 24x40x16 --f16 >> "$P.mgn.jsonl"
      "$PY" "$HERE/pytorch/gemm.py" --device cpu $RUNS 24x40x16 > "$P.torch.jsonl"
      FILES="$FILES $P.mgn.jsonl $P.torch.jsonl"
      continue
      ;;
    *) echo "tiny.sh: unknown workload $W"; exit 2 ;;
  esac
  FILES="$FILES $P.mgn.jsonl $P.torch.jsonl $P.mgn_out.safetensors $P.torch_out.safetensors"
  case "$W" in attention|conv) ;; *) MODELS="$MODELS $P.torch_out.safetensors" ;; esac
done
# Every model script wrote the float64 reference and, on the CPU, no TF32 one, saying why in its metadata.
if [ -n "$MODELS" ]; then
  # shellcheck disable=SC2086 # MODELS: words
  "$PY" - "$HERE/pytorch" $MODELS <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite
for path in sys.argv[2:]:
    t, meta = safetensors_lite.read(path)
    grads = [k for k in t if k.startswith("grad.")]
    f64 = [k for k in t if k.startswith("f64.")]
    want = {"f64.logits", "f64.loss", "f64.step.loss"} | {"f64." + k for k in grads}
    if not want <= set(f64) or any(t[k].dtype.name != "float64" for k in f64):
        sys.exit(f"tiny.sh: {path}: float64 reference incomplete: missing {sorted(want - set(f64))[:3]}")
    if any(k.startswith("acc.") for k in t) or not meta.get("acc_reference", "").startswith("none: cpu"):
        sys.exit(f"tiny.sh: {path}: on the CPU, no acc.* and acc_reference 'none: cpu ...', got {meta.get('acc_reference')}")
PY
fi
"$PY" "$HERE/compare.py" --require-gates --out "$OUT/table.md" $FILES
# Our accelerated runs have their own rows (no † fallback to the strict figure) and their own gate.
need() { grep -q -- "$1" "$OUT/table.md" || { echo "tiny.sh: the table lacks: $1"; exit 1; }; }
case " $* " in *" fashion-mlp "*)
  need "^| fashion-mlp | 8 | flb | accelerated | [0-9.]* |"
  need "^Gates, fashion-mlp batch 8 (ours accelerated"
  # The accelerated gate: the paper's gates decide, and without PyTorch's TF32 result (the CPU) the per-tensor
  # accelerated limits against PyTorch f32, the table saying why (tests/ref/compare_gate_check.py: with one).
  need "^| paper: total gradient norm | .* | pass (paper gate) |"
  need "^| paper: per-parameter gradient norms, rel-L2 | .* | pass (paper gate) |"
  need "^| grad.fc1.weight | .* | pass (per-tensor gate) |"
  need "the reference has no acc.\* tensors (none: cpu device"
  need "^| fashion-mlp | 8 | flb | accelerated | .* | pass (paper max"
  # The accelerated gate can fail: one gradient of our accelerated file scaled by 1.2 (relative L2 0.2, over
  # the 5e-2 limit) must make compare.py exit 1 and name that tensor.
  P="$OUT/fashion-mlp"
  "$PY" - "$HERE/pytorch" "$P.acc.mgn_out.safetensors" "$OUT/bad.acc.mgn_out.safetensors" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite
t, meta = safetensors_lite.read(sys.argv[2])
name = sorted(k for k in t if k.startswith("grad."))[0]
t[name] = t[name] * 1.2
safetensors_lite.write(sys.argv[3], t, meta)
PY
  if "$PY" "$HERE/compare.py" "$P.mgn.jsonl" "$P.acc.mgn.jsonl" "$P.torch.jsonl" "$P.mgn_out.safetensors" \
      "$OUT/bad.acc.mgn_out.safetensors" "$P.torch_out.safetensors" > "$OUT/bad_table.md" 2>&1; then
    echo "tiny.sh: compare.py passed a perturbed accelerated gradient"; exit 1
  fi
  grep -q "^| fashion-mlp | 8 | flb | accelerated | .*FAIL" "$OUT/bad_table.md" \
    || { echo "tiny.sh: the perturbed accelerated row is not marked FAIL"; exit 1; } ;;
esac
case " $* " in *" conv "*)
  need "^| conv | .* | forward | accelerated | [0-9.]* ([0-9.]*) |"
  need "^Checks, conv (ours accelerated" ;;
esac
case " $* " in *" gemm "*)
  need "^| gemm | 24x40x16 | matmul | accelerated | [0-9.]* |" ;;
esac
case " $* " in
  *" resnet-tiny "*)
    grep -q "^Gate vs exact (f64), resnet-tiny" "$OUT/table.md" || { echo "tiny.sh: no gate vs exact (f64) in the table"; exit 1; } ;;
esac
