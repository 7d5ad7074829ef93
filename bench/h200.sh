#!/usr/bin/env bash
# One call on the GPU machine: the Vulkan loader from .gl/, then the chosen jobs; results under $OUT.
# Usage there: bench/h200.sh BIN_DIR DATA_DIR JOB...
#   The model jobs (bench-*) time torch.compile as $COMPILED_IMPLS (default "compiled compiled-graph": the default
#   mode and mode="reduce-overhead", whose kernels replay from CUDA graphs), each in its own process under the job's
#   compile cap; compare.py names the fastest PyTorch variant per phase.
#   BIN_DIR holds mgn and (for `conformance`) tests/vulkan_*_test plus oracle/ (see bench/stage-h200.sh)
#   gemm         mgn bench-gemm vs torch.mm on the same GPU, same run
#   conformance  the Vulkan op harness and whole-graph tests on this device (validation layer off: the
#                GPU machine has no layer package)
#   cnn          compile time per phase for the Fashion-MNIST CNN, cold and warm caches, a profiled short
#                run, then the main job: the CNN, 5 epochs, AdamW, checkpoint, reload, test accuracy
#   llama        SmolLM2-135M, random weights: transformers as the reference, then mgn llama-check
#                (gates of issue 6 and timings next to PyTorch eager)
#   bench        the harness of docs/benchmarks.md: mgn bench fashion-cnn (strict and accelerated) and
#                bench/pytorch/fashion_cnn.py (eager, eager + CUDA graph, torch.compile; strict and accelerated) at batch
#                $BENCH_BATCHES (default "64 256"),
#                same weights and inputs, then bench/compare.py (gates + table) -> bench_table.md
#   bench-llama  the same harness for SmolLM2-135M (batch 1, 128 tokens; phases compile, inference, minimal,
#                flb, step; planned and measured memory): mgn bench smollm2-135m (strict and accelerated) next to
#                llama_ref.py --bench
#                (transformers eager and eager + CUDA-graph replay, strict and accelerated; torch.compile strict only, capped at
#                $BENCH_LLAMA_COMPILE_TIMEOUT s, default 300) -> bench_llama_table.md (about 3-6 minutes, plus
#                about 3 minutes per torch.compile variant: run 18 measured 166 s of first calls for the default
#                mode; COMPILED_IMPLS=compiled-graph keeps one)
#   bench-resnet the same harness for ResNet-50 (batch 4, 3x224x224, 1000 classes, real BatchNorm; phases compile,
#                inference, flb, step): mgn bench resnet50 (strict and accelerated) next to resnet_bench.py (eager
#                and eager + CUDA-graph replay, strict and accelerated;
#                torch.compile strict only, capped at $BENCH_RESNET_COMPILE_TIMEOUT s, default 150) -> bench_resnet_table.md
#                (about 2-4 minutes)
#                Every model job (bench, bench-llama, bench-resnet, bench-whisper, bench-dinov3, bench-dinovision,
#                bench-smolvla, bench-unet): PyTorch's eager run also writes its float64 and TF32 gate references
#                ($GATE_REFS), so that compare.py applies the accelerated gate of issue 33 (docs/benchmarks.md)
#   gemm-warmup  the micro job's GEMM shapes with 5 and 100 warm-up calls, GPU timestamps and clocks logged
#   f16-probe    the f16 cooperative-matrix GEMM: a sweep of its tiles and ablations (F16_PROBE_VARIANTS, on
#                F16_PROBE_SHAPES) with the driver's register counts, and what the driver exposes of the default
#                kernel's internal representations
#   micro        mgn bench attention / conv (strict and accelerated; attention once more with MGN_ATTENTION=row
#                and =tiled, and profiled per kernel at seq 1024 -> micro_attention.tar.xz)
#                next to bench/pytorch/attention.py / conv.py
#                (same inputs, outputs checked), and mgn bench-gemm (f32 and --f16) next to gemm.py (f32, TF32
#                and --dtype f16) on the SmolLM2 and cube shapes, one
#                table -> micro_table.md (about 2 minutes)
#   bench-dinov3 / bench-dinovision  DINOv3 ViT-S/16 (b1, b8) and DinoVision's decoder step (b8) next to
#                dinov3_bench.py (transformers' DINOv3ViTModel: the full-model gate) -> bench_dinov3_bN_table.md,
#                bench_dinovision_table.md
#   attention-forms  the attention rewrite into matrix products vs the kernels vs SDPA at several sequence
#                lengths, and Whisper's F+L+B profile with and without it
#   gemm-epilogue the workloads with MGN_GEMM_EPILOGUE=1 and =0 (tiled GEMM epilogues on / off), strict, same call
#   soak         bench/soak.sh on the SmolLM2-135M shape (random weights), \$SOAK_STEPS steps twice
#   bench-smolvla the SmolVLA action expert (99.85 M, batch 1, 50 actions x 32, 16 VLM tokens; phases compile,
#                inference, minimal = the latency shape of 1 action token, flb, step) next to smolvla_bench.py
#                (plain torch from the spec: eager and eager + CUDA-graph replay, strict and accelerated;
#                torch.compile strict, capped at $BENCH_SMOLVLA_COMPILE_TIMEOUT s, default 300); gates of the
#                full config vs torch -> bench_smolvla_table.md; SMOLVLA_WORKLOADS="smolvla-expert
#                smolvla-expert-lerobot" adds lerobot's attention variant -> bench_smolvla_lerobot_table.md
#   smolvla-train mgn smolvla train|act at the paper's config on synthetic VLM K/V (bench/pytorch/smolvla_data.py):
#                $SMOLVLA_TRAIN_STEPS (default 300) flow-matching steps at batch 8, then the 10-step Euler sampler
#                for 1 example (median of 20) -> smolvla_train.txt, smolvla_act.txt, smolvla_train_log.txt
#   compile-times  issue 32: compile time of every session of each workload ($COMPILE_WORKLOADS, default
#                smollm2-135m resnet50 whisper-tiny-encoder dinov3-vits16 dinovision), ours cold (empty cache
#                folder and driver cache), warm (second and third process, caches present) and warm with the
#                compiled-session cache off (the previous warm path), each with the per-phase breakdown; next to
#                torch.compile strict, cold (empty inductor/triton caches) and warm (second process, its caches
#                present), capped at $COMPILE_TORCH_TIMEOUT s (default 300) -> compile_times_*.jsonl,
#                compile_times_log.txt (about 5-10 minutes)
#   dinovision   the case study on .h200/photos: train, the PyTorch anchor (within 0.2 dB), reconstruct
#   bench-unet   the paper's conditioned U-Net (sd-unet-small: 10.93 M, batch 1, the spec's inputs) next to
#                sd_unet_bench.py (plain torch from the spec: eager, CUDA graph, compile) -> bench_unet_table.md
#   f16-scaling  issue 33, the f16 GEMM's power-of-two operand scaling: vulkan_gemm_test's cooperative-matrix tests on
#                the device (the real kernels, scaled operands ~1e-7 / ~1e5 included), then Whisper-tiny b1 accelerated
#                with MGN_GEMM_F16_SCALING=0 and =1 (timings side by side, MGN_PROFILE per-kernel times of both), and
#                mgn bench-gemm --f16 on Whisper's and the cube shapes ($F16_SCALING_SHAPES) with it off and on ->
#                f16_scaling_gemm_test.txt, f16_scaling_whisper_{off,on}{.jsonl,_profile.txt},
#                f16_scaling_gemm_{off,on}.jsonl, f16_scaling_log.txt. The gates come
#                from running bench-whisper, bench-smolvla and bench-unet in the same call (scaling is on by default).
#   unet-train   mgn unet train on Fashion-MNIST (small config, 4 channels, bounded time), DDIM samples PNG + loss
#   data-parallel  issue 31 on ONE GPU (no multi-GPU kind lent, so no scaling): what the host-staged data-parallel
#                path costs. The Fashion-MNIST CNN, 1 epoch over $DP_IMAGES (default 25600) images at batch $DP_BATCH
#                (default 256): the plain path; the trainer with one replica (--devices 0: gradients and weights
#                through the host every step); two replicas on the same GPU (--devices 0,0: two logical devices,
#                half batches). Each prints rank 0's time by phase -> dp_{plain,r1,r2}.txt (about 1-3 minutes).
#                On a machine with N > 1 GPUs it also runs N replicas on GPUs 0..N-1 at N times the batch (weak
#                scaling; Vulkan device indices are assumed to follow nvidia-smi's order) -> dp_gpus$N.txt
#   f16-threshold  KernelOptions::f16_min_work (issue 33): each workload of $F16_THRESHOLD_WORKLOADS (default
#                "sd-unet-small:1 smolvla-expert:1 whisper-tiny-encoder:1 dinov3-vits16:8 smollm2-135m:1") timed strict,
#                accelerated with the default thresholds (2^26, 64) and accelerated with MGN_GEMM_F16_MIN_WORK=0 and MGN_GEMM_F16_MIN_DIM=0 (every
#                eligible matmul f16, the behaviour before), phases inference, flb, step, one warm cache per workload
#                -> f16_threshold.jsonl (the `f16_gemm_dispatches` field says how many matmuls went f16),
#                f16_threshold_log.txt (about 2-3 minutes)
#   spirv-opt    issue 32, KernelOptions::spirv_optimize: each workload of $SPIRV_OPT_WORKLOADS (default "smollm2-135m:1
#                whisper-tiny-encoder:1 dinov3-vits16:8 resnet50:4") with MGN_SPIRV_OPT=1 and 0, each from empty caches:
#                the cold compile (phases) and the timed inference and F+L+B -> spirv_opt_<workload>_<1|0>.jsonl,
#                spirv_opt_log.txt (about 3-5 minutes)
#   finetune-dp  issue 31, mgn finetune data-parallel on ONE GPU: the SmolLM2-135M shape (random weights, the staged
#                test tokenizer, README + docs as text), $FTDP_STEPS steps (default 30) of batch $FTDP_BATCH (default
#                8) x seq $FTDP_SEQ (default 256): the plain session, the trainer with one replica (--devices 0) and
#                two replicas on the same GPU (--replicas 2 --devices 0,0); each prints its time by phase ->
#                ftdp_{plain,r1,r2}.txt and .log (the per-step loss bits), ftdp_summary.txt (seconds per run, the
#                largest loss difference of r1 and r2 from plain) (about 3-6 minutes)
#   llama-cpp    issue 27's peer column: llama.cpp's Vulkan backend (node-llama-cpp's prebuilt ggml-vulkan, staged by
#                STAGE_LLAMA_CPP=1 bench/stage-h200.sh as .h200/llama-cpp.tar.xz; DATA_DIR unused, so the call
#                leaves .fmdata out) on our random SmolLM2-135M weights (mgn bench writes them), exported by
#                mgn export --gguf as f32 and f16: llama-bench -p S -n N -ngl 99 -fa 0,1 -r R -o jsonl (its
#                default f16 KV cache: llama-bench offers no f32 one) and -p 0 -n 1 -d S (one token at position
#                S), next to mgn bench (phases inference and minimal, strict and accelerated) in the same call;
#                S=$LLAMA_CPP_PROMPT (128), N=$LLAMA_CPP_GEN (128), R=$LLAMA_CPP_REPS (20),
#                $LLAMA_CPP_WORKLOAD (smollm2-135m; llama-tiny for a dry run) -> llama_cpp_table.md,
#                llama_cpp_bench.jsonl, llama_cpp_mgn.jsonl, llama_cpp_log.txt (about 2-4 minutes)
#   tune         measured GEMM kernel choice (docs/tuning.md): mgn bench of each $TUNE_WORKLOADS (default
#                "smollm2-135m resnet50"; batch 1 and 4), phases compile, inference, flb, step, untuned (fresh cache),
#                then --tune cold (fresh cache: every shape measured) and --tune warm (second process, same cache:
#                nothing measured), each --verbose, capped at $TUNE_TIMEOUT s (default 900) -> tune_W_{untuned,cold,
#                warm}.jsonl, tune_table.md (tuning time, shapes measured/cached, phase medians vs untuned),
#                tune_W.txt (the tuning file: every shape's candidates and times), tune_log.txt (about 5-10 minutes)
set -uo pipefail
B=${1:-build-release}
DATA=${2:-.fmdata}
shift 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$OUT/env.txt" 2>&1
export LD_LIBRARY_PATH="$(realpath "$B")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MGN_VALIDATION=0 MGN_CACHE_DIR=/tmp/mgn-cache MGN_FASHION_MNIST_DIR="$(realpath "$DATA")"
# The gate references every model job's PyTorch eager run writes next to its strict f32 gate tensors
# (bench/pytorch/gates.py): the same model, weights and inputs in float64 (f64.*: compare.py's gate vs exact) and
# the same f32 code once more with TF32 on for matmul and cuDNN (acc.*: PyTorch's accelerated error against f64,
# the allowance of the accelerated gate, issue 33: ours accelerated vs f64 <= max(limit, 2 x TF32 vs f64)). Both
# are untimed; their times go to the job's log.
GATE_REFS="--f64-reference --accelerated-reference"
# The harness of one model workload (jobs bench-llama, bench-resnet, bench-whisper, bench-dinov3,
# bench-dinovision, bench-smolvla), files in T=/tmp/bench_TAG with the prefix
# P=$T/WORKLOAD_bBATCH: our cold compile in an empty cache (ours and the driver's), an untimed compile that fills
# the caches, the timed run that writes the weights (and inputs) the PyTorch side loads; the PyTorch script eager
# (strict and accelerated; the gate tensors with $GATE_REFS, and EAGER_FLAGS) and torch.compile strict, capped at
# LIMIT seconds; then compare.py -> $OUT/bench_TAG_{mgn,torch}.jsonl, bench_TAG_table.md, bench_TAG_log.txt.
# Our accelerated mode (f16 matmuls where the device's coopmat self-test passes) of a model workload, with the
# weights the strict run wrote: an untimed compile for the f16 kernels, then the timed run -> PREFIX.acc.*
# (compare.py gates it against the same PyTorch strict eager reference as our strict run).
# Usage: ours_accelerated WORKLOAD PREFIX LOG [ARG...]
ours_accelerated() {
  local w=$1 p=$2 log=$3
  shift 3
  "$B/mgn" bench "$w" "$@" --mode accelerated --phases compile > /dev/null 2>> "$log"
  "$B/mgn" bench "$w" "$@" --mode accelerated --weights "$p.weights.safetensors" \
    --outputs "$p.acc.mgn_out.safetensors" --json "$p.acc.mgn.jsonl" > /dev/null 2>> "$log"
  echo "mgn bench $w accelerated rc=$?" >> "$log"
}

# Usage: model_bench TAG WORKLOAD BATCH LIMIT LABEL EAGER_FLAGS SCRIPT [ARG...] (LABEL: the script in the log)
model_bench() {
  local tag=$1 w=$2 batch=$3 limit=$4 label=$5 eager_flags=$6
  shift 6
  local L="$OUT/bench_${tag}_log.txt" T="/tmp/bench_$tag"
  local P="$T/${w}_b$batch"
  rm -rf "$T" && mkdir -p "$T"
  export MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache"
  __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache-cold" "$B/mgn" bench "$w" --batch "$batch" --phases compile --cache cold \
    --json "$T/cold.mgn.jsonl" > /dev/null 2>> "$L"
  echo "mgn bench $w compile cold rc=$?" >> "$L"
  "$B/mgn" bench "$w" --batch "$batch" --phases compile > /dev/null 2>> "$L"
  "$B/mgn" bench "$w" --batch "$batch" --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
    --json "$P.mgn.jsonl" > /dev/null 2>> "$L"
  echo "mgn bench $w rc=$?" >> "$L"
  ours_accelerated "$w" "$P" "$L" --batch "$batch"
  # shellcheck disable=SC2086 # GATE_REFS, EAGER_FLAGS: words
  python3 "$@" --device cuda --impls eager $GATE_REFS $eager_flags --weights "$P.weights.safetensors" \
    --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" > /dev/null 2>> "$L"
  echo "$label eager rc=$?" >> "$L"
  # torch.compile's variants (COMPILED_IMPLS, default both: "compiled" and "compiled-graph", mode="reduce-overhead"),
  # each in its own process under the cap, so that one timing out still leaves the other's lines.
  local impl
  for impl in ${COMPILED_IMPLS:-compiled compiled-graph}; do
    timeout "$limit" python3 "$@" --device cuda --impls "$impl" --modes strict --weights "$P.weights.safetensors" \
      --json "$P.$impl.torch.jsonl" > /dev/null 2>> "$L"
    echo "$label $impl rc=$? (124: timed out)" >> "$L"
  done
  cat "$T"/*.mgn.jsonl > "$OUT/bench_${tag}_mgn.jsonl"
  cat "$T"/*.torch.jsonl > "$OUT/bench_${tag}_torch.jsonl"
  python3 bench/compare.py --require-gates --out "$OUT/bench_${tag}_table.md" "$T"/*.mgn.jsonl "$T"/*.torch.jsonl \
    "$P.mgn_out.safetensors" "$P.acc.mgn_out.safetensors" "$P.torch_out.safetensors" > /dev/null 2>> "$L"
  echo "compare rc=$?" >> "$L"
  export MGN_CACHE_DIR=/tmp/mgn-cache
  unset __GL_SHADER_DISK_CACHE_PATH
}

# One workload of the compile-times job: ours cold, warm (x2) and warm without the compiled-session cache, then
# the weights and inputs the PyTorch side loads, then torch.compile cold and warm (second process).
# Usage: compile_times WORKLOAD BATCH SCRIPT [ARG...]
compile_times() {
  local w=$1 batch=$2
  shift 2
  local L="$OUT/compile_times_log.txt" T P="/tmp/ct_$w/${w}_b$batch" J="$OUT/compile_times_$w"
  T="/tmp/ct_$w"
  rm -rf "$T" && mkdir -p "$T"
  local run
  for run in cold warm warm2; do
    MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache" timeout 600 "$B/mgn" bench "$w" \
      --batch "$batch" --phases compile --verbose --json "${J}_mgn_$run.jsonl" > /dev/null 2>> "$L"
    echo "mgn bench $w compile $run rc=$?" >> "$L"
  done
  MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache" timeout 600 "$B/mgn" bench "$w" \
    --batch "$batch" --phases compile --verbose --session-cache-mb 0 --json "${J}_mgn_nosession.jsonl" > /dev/null 2>> "$L"
  echo "mgn bench $w compile warm, session cache off rc=$?" >> "$L"
  MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache" timeout 600 "$B/mgn" bench "$w" \
    --batch "$batch" --phases inference --weights "$P.weights.safetensors" --outputs "$P.mgn_out.safetensors" \
    > /dev/null 2>> "$L"
  echo "mgn bench $w weights/inputs rc=$?" >> "$L"
  local extra=()
  [ "$1" != "bench/pytorch/llama_ref.py" ] && extra=(--inputs "$P.mgn_out.safetensors")
  for run in cold warm; do
    TORCHINDUCTOR_CACHE_DIR="$T/inductor" TRITON_CACHE_DIR="$T/triton" TORCHINDUCTOR_FX_GRAPH_CACHE=1 \
      timeout "${COMPILE_TORCH_TIMEOUT:-300}" python3 "$@" "${extra[@]}" --device cuda --impls compiled --modes strict \
      --phases compile --weights "$P.weights.safetensors" --json "${J}_torch_$run.jsonl" > /dev/null 2>> "$L"
    echo "torch.compile $w $run rc=$? (124: timed out)" >> "$L"
  done
}

for job in "$@"; do
  case "$job" in
    compile-times)
      for w in ${COMPILE_WORKLOADS:-smollm2-135m resnet50 whisper-tiny-encoder dinov3-vits16 dinovision}; do
        case "$w" in
          smollm2-135m) compile_times "$w" 1 bench/pytorch/llama_ref.py --bench ;;
          resnet50) compile_times "$w" 4 bench/pytorch/resnet_bench.py ;;
          whisper-tiny-encoder) compile_times "$w" 1 bench/pytorch/whisper_bench.py ;;
          dinov3-vits16) compile_times "$w" 1 bench/pytorch/dinov3_bench.py ;;
          dinovision) compile_times "$w" 8 bench/pytorch/dinov3_bench.py ;;
          smolvla-expert) compile_times "$w" 1 bench/pytorch/smolvla_bench.py ;;
          sd-unet-small) compile_times "$w" 1 bench/pytorch/sd_unet_bench.py ;;
          *) echo "compile-times: unknown workload $w" >> "$OUT/compile_times_log.txt" ;;
        esac
      done
      ;;
    tune)
      L="$OUT/tune_log.txt" T=/tmp/tune
      rm -rf "$T" && mkdir -p "$T"
      for w in ${TUNE_WORKLOADS:-smollm2-135m resnet50}; do
        batch=1; [ "$w" = resnet50 ] && batch=4
        for run in untuned cold warm; do
          C="$T/$w-tuned"; TF=(--tune)
          [ $run = untuned ] && C="$T/$w-untuned" && TF=()
          MGN_CACHE_DIR="$C" __GL_SHADER_DISK_CACHE_PATH="$C/nv" timeout "${TUNE_TIMEOUT:-900}" "$B/mgn" bench "$w" \
            --batch "$batch" --phases compile,inference,flb,step --verbose "${TF[@]}" --json "$OUT/tune_${w}_$run.jsonl" \
            > /dev/null 2>> "$L"
          echo "mgn bench $w $run rc=$? (124: timed out)" >> "$L"
        done
        cat "$T/$w-tuned"/tuning/*.txt > "$OUT/tune_$w.txt" 2>/dev/null
      done
      python3 - "$OUT" ${TUNE_WORKLOADS:-smollm2-135m resnet50} > "$OUT/tune_table.md" 2>> "$L" <<'PY'
import json, os, sys
out = sys.argv[1]
print("| workload | run | tune_ms | measured | cached | timed | compile ms | inference | flb | step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for w in sys.argv[2:]:
    for run in ("untuned", "cold", "warm"):
        p = os.path.join(out, f"tune_{w}_{run}.jsonl")
        rows = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
        by = {r["phase"]: r for r in rows}
        c = by.get("compile", {}).get("phase_totals", {})
        med = lambda ph: f'{by[ph]["median_ms"]:.3f}' if ph in by else "-"
        comp = f'{by["compile"]["median_ms"]:.0f}' if "compile" in by else "-"
        print(f'| {w} | {run} | {c.get("tune_ms", 0):.0f} | {c.get("tune_measured", 0):.0f} | '
              f'{c.get("tune_cached", 0):.0f} | {c.get("tune_timed", 0):.0f} | {comp} | {med("inference")} | '
              f'{med("flb")} | {med("step")} |')
PY
      ;;
    gemm)
      SHAPES="512x512x512 1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192 128x1536x576 128x576x1536"
      "$B/mgn" bench-gemm $SHAPES > "$OUT/gemm_mgn.jsonl" 2> "$OUT/gemm_mgn.err"
      python3 bench/pytorch/gemm.py $SHAPES > "$OUT/gemm_torch.jsonl" 2> "$OUT/gemm_torch.err"
      ;;
    conformance)
      # The oracle files sit next to the binaries; the test looks for them where they were built.
      for t in ${CONF_TESTS:-vulkan_ops_test vulkan_session_test vulkan_attention_test plan_test vulkan_kernels_test vulkan_gemm_test vulkan_fusion_test vulkan_llama_test}; do
        [ -x "$B/tests/$t" ] && (cd "$B" && MGN_ORACLE_DIR="$PWD/oracle" "./tests/$t") > "$OUT/$t.txt" 2>&1
        echo "$t rc=$?" >> "$OUT/conformance_rc.txt"
      done
      ;;
    cnn)
      for phase in cold warm; do
        [ $phase = cold ] && rm -rf /tmp/mgn-cache-cnn
        MGN_CACHE_DIR=/tmp/mgn-cache-cnn MGN_PROFILE=1 "$B/mgn" train-fashion-mnist --model cnn --epochs 1 --limit-train 6400 \
          --no-progress --data "$DATA" --out /tmp/cnn_short.safetensors > "$OUT/cnn_profile_$phase.txt" 2>&1
      done
      ( time "$B/mgn" train-fashion-mnist --model cnn --epochs 5 --no-progress --data "$DATA" --out /tmp/fashion_cnn.safetensors ) \
        > "$OUT/main_job_cnn.txt" 2>&1
      ;;
    bench)
      # Four files come back: bench_mgn.jsonl, bench_torch.jsonl, bench_table.md, bench_log.txt (the gate
      # tensors, with PyTorch's float64 and TF32 references ($GATE_REFS), stay in /tmp; the table holds their
      # verdicts). Compile once with empty caches (ours and the driver's), then per batch: one untimed compile fills
      # the caches, so the timed run's compile is warm.
      L="$OUT/bench_log.txt" T=/tmp/bench
      rm -rf "$T" && mkdir -p "$T"
      export MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache"
      __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache-cold" "$B/mgn" bench fashion-cnn --phases compile --cache cold \
        --json "$T/cold.mgn.jsonl" > /dev/null 2>> "$L"
      echo "mgn bench compile cold rc=$?" >> "$L"
      FILES="$T/cold.mgn.jsonl"
      for BATCH in ${BENCH_BATCHES:-64 256}; do
        P="$T/fashion-cnn_b$BATCH"
        "$B/mgn" bench fashion-cnn --batch "$BATCH" --phases compile > /dev/null 2>> "$L"
        # mgn bench writes its initial weights (seed 0) to the file; the PyTorch side loads them.
        "$B/mgn" bench fashion-cnn --batch "$BATCH" --weights "$P.weights.safetensors" \
          --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench b$BATCH rc=$?" >> "$L"
        ours_accelerated fashion-cnn "$P" "$L" --batch "$BATCH"
        # shellcheck disable=SC2086 # GATE_REFS: words
        python3 bench/pytorch/fashion_cnn.py --batch "$BATCH" --impls eager,cudagraph,compiled \
          --weights "$P.weights.safetensors" $GATE_REFS \
          --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" > /dev/null 2>> "$L"
        echo "fashion_cnn.py b$BATCH rc=$?" >> "$L"
        FILES="$FILES $P.mgn.jsonl $P.acc.mgn.jsonl $P.torch.jsonl $P.mgn_out.safetensors $P.acc.mgn_out.safetensors"
        FILES="$FILES $P.torch_out.safetensors"
      done
      cat "$T"/*.mgn.jsonl > "$OUT/bench_mgn.jsonl"
      cat "$T"/*.torch.jsonl > "$OUT/bench_torch.jsonl"
      python3 bench/compare.py --require-gates --out "$OUT/bench_table.md" $FILES > /dev/null 2>> "$L"
      echo "compare rc=$?" >> "$L"
      export MGN_CACHE_DIR=/tmp/mgn-cache
      unset __GL_SHADER_DISK_CACHE_PATH
      ;;
    llama)
      rm -rf /tmp/llm
      python3 bench/pytorch/llama_ref.py /tmp/llm --config smollm2-135m --device cuda > "$OUT/llama_ref.txt" 2>&1 \
        && "$B/mgn" llama-check /tmp/llm --json "$OUT/llama_check.json" > "$OUT/llama_check.txt" 2>&1
      echo "llama rc=$?" >> "$OUT/llama_ref.txt"
      [ -f /tmp/llm/torch_times.json ] && cp /tmp/llm/torch_times.json "$OUT/torch_times.json"
      ;;
    bench-llama)
      # Back: bench_llama_{mgn,torch}.jsonl, bench_llama_table.md, bench_llama_log.txt (the gate tensors and the
      # 540 MB of weights stay in /tmp).
      model_bench llama smollm2-135m 1 "${BENCH_LLAMA_COMPILE_TIMEOUT:-300}" "llama_ref.py --bench" "--impls eager,cudagraph" \
        bench/pytorch/llama_ref.py --bench
      ;;
    bench-resnet)
      # Back: bench_resnet_{mgn,torch}.jsonl, bench_resnet_table.md, bench_resnet_log.txt (the gate tensors, with
      # PyTorch's float64 and TF32 references ($GATE_REFS), and the weights stay in /tmp). The PyTorch side reads our
      # inputs.
      model_bench resnet resnet50 4 "${BENCH_RESNET_COMPILE_TIMEOUT:-150}" "resnet_bench.py" "--impls eager,cudagraph" \
        bench/pytorch/resnet_bench.py --inputs /tmp/bench_resnet/resnet50_b4.mgn_out.safetensors
      ;;
    bench-whisper)
      # The Whisper-tiny encoder (3000 mel frames, the paper's objective and init) at batch $WHISPER_BATCHES (default
      # "1 8"): ours strict and accelerated next to whisper_bench.py (transformers' WhisperEncoder: eager and
      # eager + CUDA-graph replay, strict and accelerated; torch.compile strict, capped at
      # $BENCH_WHISPER_COMPILE_TIMEOUT s, default 200). Back: bench_whisper_bN_{mgn,torch}.jsonl, _table.md, _log.txt.
      for WB in ${WHISPER_BATCHES:-1 8}; do
        model_bench "whisper_b$WB" whisper-tiny-encoder "$WB" "${BENCH_WHISPER_COMPILE_TIMEOUT:-200}" whisper_bench.py \
          "--impls eager,cudagraph" bench/pytorch/whisper_bench.py \
          --inputs "/tmp/bench_whisper_b$WB/whisper-tiny-encoder_b$WB.mgn_out.safetensors"
      done
      ;;
    bench-dinov3)
      # DINOv3 ViT-S/16 (224², 5 + 196 tokens, the paper's objective and init) at batch $DINOV3_BATCHES (default
      # "1 8"): ours strict and accelerated next to dinov3_bench.py (transformers' DINOv3ViTModel, so the gate is the
      # full model against transformers: eager and eager + CUDA-graph replay, strict and accelerated; torch.compile
      # strict, capped at $BENCH_DINOV3_COMPILE_TIMEOUT s, default 200). Back: bench_dinov3_bN_{mgn,torch}.jsonl,
      # _table.md, _log.txt.
      for DB in ${DINOV3_BATCHES:-1 8}; do
        model_bench "dinov3_b$DB" dinov3-vits16 "$DB" "${BENCH_DINOV3_COMPILE_TIMEOUT:-200}" dinov3_bench.py \
          "--impls eager,cudagraph" bench/pytorch/dinov3_bench.py \
          --inputs "/tmp/bench_dinov3_b$DB/dinov3-vits16_b$DB.mgn_out.safetensors"
      done
      ;;
    bench-dinovision)
      # DinoVision's decoder training step at batch 8 (features [384, 14, 14] -> RGB 224², MSE): ours strict and
      # accelerated next to dinov3_bench.py (eager, eager + CUDA graph, compile capped at
      # $BENCH_DINOVISION_COMPILE_TIMEOUT s, default 200). Back: bench_dinovision_{mgn,torch}.jsonl, _table.md, _log.txt.
      model_bench dinovision dinovision 8 "${BENCH_DINOVISION_COMPILE_TIMEOUT:-200}" dinov3_bench.py \
        "--impls eager,cudagraph" bench/pytorch/dinov3_bench.py --inputs /tmp/bench_dinovision/dinovision_b8.mgn_out.safetensors
      ;;
    bench-smolvla)
      # The SmolVLA action expert at the paper's shapes (the spec's benchmark inputs, loss mean((v - 0)²), the paper's
      # sine init): ours strict and accelerated next to smolvla_bench.py (eager and eager + CUDA-graph replay, strict
      # and accelerated; torch.compile strict, capped at $BENCH_SMOLVLA_COMPILE_TIMEOUT s, default 300), forward,
      # latency shape, every gradient and the step gated. Back: bench_smolvla_{mgn,torch}.jsonl, _table.md, _log.txt.
      # SMOLVLA_WORKLOADS (default "smolvla-expert") may add smolvla-expert-lerobot (lerobot's attention: the VLM
      # prefix in the self layers, RoPE), whose files are bench_smolvla_lerobot_*.
      for SW in ${SMOLVLA_WORKLOADS:-smolvla-expert}; do
        ST=smolvla${SW#smolvla-expert}
        ST=${ST//-/_}
        model_bench "$ST" "$SW" 1 "${BENCH_SMOLVLA_COMPILE_TIMEOUT:-300}" smolvla_bench.py \
          "--impls eager,cudagraph" bench/pytorch/smolvla_bench.py \
          --inputs "/tmp/bench_$ST/${SW}_b1.mgn_out.safetensors"
      done
      ;;
    smolvla-train)
      # mgn smolvla at the paper's config (99.85 M) on synthetic VLM K/V and action chunks (64 examples, actions a
      # function of the K/V): flow-matching training, AdamW 1e-4 at batch 8, then act on one example (10 Euler steps
      # reusing one session, 20 repetitions, the median). Back: smolvla_train.txt, smolvla_act.txt, smolvla_train_log.txt.
      L="$OUT/smolvla_train_log.txt" T=/tmp/smolvla_train
      rm -rf "$T" && mkdir -p "$T"
      python3 bench/pytorch/smolvla_data.py "$T/data.safetensors" --examples 64 >> "$L" 2>&1
      python3 bench/pytorch/smolvla_data.py "$T/one.safetensors" --examples 1 --seed 1 >> "$L" 2>&1
      timeout 900 "$B/mgn" smolvla train --data "$T/data.safetensors" --steps "${SMOLVLA_TRAIN_STEPS:-300}" --batch 8 \
        --lr 1e-4 --progress 25 --out "$T/w.safetensors" > "$OUT/smolvla_train.txt" 2>> "$L"
      echo "mgn smolvla train rc=$?" >> "$L"
      timeout 300 "$B/mgn" smolvla act --data "$T/one.safetensors" --weights "$T/w.safetensors" --repeat 20 \
        --out "$T/actions.safetensors" > "$OUT/smolvla_act.txt" 2>> "$L"
      echo "mgn smolvla act rc=$?" >> "$L"
      ;;
    f16-scaling)
      L="$OUT/f16_scaling_log.txt"
      (cd "$B" && timeout 600 ./tests/vulkan_gemm_test --gtest_filter='*CoopMat*:*SelfTest*') \
        > "$OUT/f16_scaling_gemm_test.txt" 2>&1
      echo "vulkan_gemm_test CoopMat rc=$?" >> "$L"
      for SC in 0 1; do
        NAME=$([ $SC = 1 ] && echo on || echo off)
        MGN_GEMM_F16_SCALING=$SC timeout 300 "$B/mgn" bench whisper-tiny-encoder --batch 1 --mode accelerated \
          --phases compile > /dev/null 2>> "$L"
        MGN_GEMM_F16_SCALING=$SC timeout 300 "$B/mgn" bench whisper-tiny-encoder --batch 1 --mode accelerated \
          --json "$OUT/f16_scaling_whisper_$NAME.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench whisper-tiny-encoder accelerated scaling=$SC rc=$?" >> "$L"
        MGN_GEMM_F16_SCALING=$SC MGN_PROFILE=1 timeout 300 "$B/mgn" bench whisper-tiny-encoder --batch 1 \
          --mode accelerated --phases flb > "$OUT/f16_scaling_whisper_${NAME}_profile.txt" 2>&1
        echo "mgn bench whisper-tiny-encoder accelerated profile scaling=$SC rc=$?" >> "$L"
        # shellcheck disable=SC2086 # F16_SCALING_SHAPES: words
        MGN_GEMM_F16_SCALING=$SC timeout 300 "$B/mgn" bench-gemm --f16 --tag "scaling_$NAME" \
          ${F16_SCALING_SHAPES:-1500x384x384 1500x1536x384 1500x384x1536 384x384x1500 4096x4096x4096} \
          > "$OUT/f16_scaling_gemm_$NAME.jsonl" 2>> "$L"
        echo "mgn bench-gemm --f16 scaling=$SC rc=$?" >> "$L"
      done
      ;;
    bench-unet)
      # The paper's conditioned U-Net (SDUNetConfig::small(), 10,928,768 parameters; latent 4x32x32, context 77x768,
      # the spec's inputs, loss MSE against noise_target, the paper's sine init) at batch $UNET_BATCHES (default "1"):
      # ours strict and accelerated next to sd_unet_bench.py (plain torch written from the spec, our names: eager
      # and eager + CUDA-graph replay, strict and accelerated; torch.compile strict, capped at
      # $BENCH_UNET_COMPILE_TIMEOUT s, default 200). AdamW lr $UNET_LR (default 1e-4) on both sides: at 1e-3 Adam's
      # first update lr·sign(g) of the few conv weights with a near-zero gradient flips with f32 summation order
      # (docs/unet.md). PyTorch's float64 reference (--f64-reference) gives the gate vs exact: at full config with the
      # paper's init the middle block's attention gradients are ill-conditioned (PyTorch CPU f32 is 2.5e-3 from f64
      # there); its TF32 reference (--accelerated-reference, both in $GATE_REFS) the allowance of the accelerated gate
      # (the cross-attention k/q projections). Back: bench_unet_bN_{mgn,torch}.jsonl, _table.md, _log.txt.
      for UB in ${UNET_BATCHES:-1}; do
        TAG="unet_b$UB" L="$OUT/bench_unet_b${UB}_log.txt" T="/tmp/bench_unet_b$UB"
        P="$T/sd-unet-small_b$UB" LR="${UNET_LR:-1e-4}"
        rm -rf "$T" && mkdir -p "$T"
        export MGN_CACHE_DIR="$T/mgn-cache" __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache"
        __GL_SHADER_DISK_CACHE_PATH="$T/nv-cache-cold" timeout 300 "$B/mgn" bench sd-unet-small --batch "$UB" \
          --phases compile --cache cold --json "$T/cold.mgn.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench sd-unet-small compile cold rc=$?" >> "$L"
        timeout 300 "$B/mgn" bench sd-unet-small --batch "$UB" --phases compile > /dev/null 2>> "$L"
        timeout 300 "$B/mgn" bench sd-unet-small --batch "$UB" --lr "$LR" --weights "$P.weights.safetensors" \
          --outputs "$P.mgn_out.safetensors" --json "$P.mgn.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench sd-unet-small rc=$?" >> "$L"
        ours_accelerated sd-unet-small "$P" "$L" --batch "$UB" --lr "$LR"
        # shellcheck disable=SC2086 # GATE_REFS: words
        timeout 300 python3 bench/pytorch/sd_unet_bench.py --device cuda --impls eager,cudagraph --lr "$LR" \
          --weights "$P.weights.safetensors" --inputs "$P.mgn_out.safetensors" --outputs "$P.torch_out.safetensors" \
          --json "$P.torch.jsonl" $GATE_REFS > /dev/null 2>> "$L"
        echo "sd_unet_bench.py eager rc=$?" >> "$L"
        for impl in ${COMPILED_IMPLS:-compiled compiled-graph}; do
          timeout "${BENCH_UNET_COMPILE_TIMEOUT:-200}" python3 bench/pytorch/sd_unet_bench.py --device cuda \
            --impls "$impl" --modes strict --lr "$LR" --weights "$P.weights.safetensors" \
            --inputs "$P.mgn_out.safetensors" --json "$P.$impl.torch.jsonl" > /dev/null 2>> "$L"
          echo "sd_unet_bench.py $impl rc=$? (124: timed out)" >> "$L"
        done
        cat "$T"/*.mgn.jsonl > "$OUT/bench_${TAG}_mgn.jsonl"
        cat "$T"/*.torch.jsonl > "$OUT/bench_${TAG}_torch.jsonl"
        python3 bench/compare.py --require-gates --out "$OUT/bench_${TAG}_table.md" "$T"/*.mgn.jsonl "$T"/*.torch.jsonl \
          "$P.mgn_out.safetensors" "$P.acc.mgn_out.safetensors" "$P.torch_out.safetensors" > /dev/null 2>> "$L"
        echo "compare rc=$?" >> "$L"
        export MGN_CACHE_DIR=/tmp/mgn-cache
        unset __GL_SHADER_DISK_CACHE_PATH
      done
      ;;
    data-parallel)
      for run in plain r1 r2; do
        case $run in plain) extra="" ;; r1) extra="--devices 0" ;; r2) extra="--replicas 2 --devices 0,0" ;; esac
        timeout 900 "$B/mgn" train-fashion-mnist --model cnn --epochs 1 --limit-train "${DP_IMAGES:-25600}" \
          --batch "${DP_BATCH:-256}" $extra --no-progress --metrics none --data "$DATA" \
          --out "/tmp/dp_$run.safetensors" > "$OUT/dp_$run.txt" 2>&1
        echo "data-parallel $run rc=$?" >> "$OUT/dp_$run.txt"
      done
      ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
      if [ "$ngpu" -gt 1 ]; then
        devs=$(seq -s, 0 $((ngpu - 1)))
        timeout 900 "$B/mgn" train-fashion-mnist --model cnn --epochs 1 --limit-train $((${DP_IMAGES:-25600} * ngpu)) \
          --batch $((${DP_BATCH:-256} * ngpu)) --replicas "$ngpu" --devices "$devs" --no-progress --metrics none \
          --data "$DATA" --out /tmp/dp_gpus.safetensors > "$OUT/dp_gpus$ngpu.txt" 2>&1
        echo "data-parallel $ngpu GPUs rc=$?" >> "$OUT/dp_gpus$ngpu.txt"
      fi
      ;;
    finetune-dp)
      M=/tmp/ftdp-model
      rm -rf "$M" && mkdir -p "$M"
      cp .h200/soak-tokenizer.json "$M/tokenizer.json"
      echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0, "tie_word_embeddings": true, "hidden_act": "silu", "initializer_range": 0.041666666666666664}' > "$M/config.json"
      cat README.md docs/*.md > /tmp/ftdp-text.txt
      for run in plain r1 r2; do
        case $run in plain) extra="" ;; r1) extra="--devices 0" ;; r2) extra="--replicas 2 --devices 0,0" ;; esac
        start=$(date +%s.%N)
        timeout 900 "$B/mgn" finetune "$M" --text /tmp/ftdp-text.txt --out "/tmp/ftdp_$run" --weights random \
          --steps "${FTDP_STEPS:-30}" --batch "${FTDP_BATCH:-8}" --seq "${FTDP_SEQ:-256}" --lr 1e-4 $extra \
          --log "$OUT/ftdp_$run.log" > "$OUT/ftdp_$run.txt" 2>&1
        rc=$?
        end=$(date +%s.%N)
        echo "finetune-dp $run rc=$rc" >> "$OUT/ftdp_$run.txt"
        echo "$run: rc=$rc, $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s (compile + steps)" \
          >> "$OUT/ftdp_summary.txt"
        rm -rf "/tmp/ftdp_$run"
      done
      python3 - "$OUT" >> "$OUT/ftdp_summary.txt" 2>&1 <<'PY'
import struct, sys
def losses(p):
    return [struct.unpack("<f", struct.pack("<I", int(l.split()[1], 16)))[0] for l in open(p)]
base = losses(sys.argv[1] + "/ftdp_plain.log")
for run in ("r1", "r2"):
    other = losses(sys.argv[1] + "/ftdp_" + run + ".log")
    d = max((abs(a - b) for a, b in zip(base, other)), default=float("nan"))
    print(f"{run}: {len(other)} steps, max |loss - plain| {d:.3g}, last loss {other[-1] if other else float('nan')}"
          f" (plain {base[-1] if base else float('nan')})")
PY
      ;;
    unet-train)
      # DDPM on Fashion-MNIST with the paper's U-Net (small config, 4 input channels: the image padded to 32x32 and
      # tiled; class as a one-token context): mgn unet train for $UNET_TRAIN_SECONDS s of training (default 180, so
      # that the job stays under 5 minutes) at batch $UNET_TRAIN_BATCH (default 64), lr $UNET_TRAIN_LR (default
      # 3e-4), then mgn unet sample (DDIM, 50 steps, 4 per class, one session). Back: unet_samples.png,
      # unet_metrics.jsonl, unet_run.json, unet_loss.png (when matplotlib is there; else plot unet_metrics.jsonl with
      # scripts/plot-training.py), unet_train_log.txt.
      L="$OUT/unet_train_log.txt" T=/tmp/unet_train
      rm -rf "$T" && mkdir -p "$T"
      timeout 240 "$B/mgn" unet train --run "$T/run" --config small --channels 4 --steps 1000000 \
        --time-limit "${UNET_TRAIN_SECONDS:-180}" --batch "${UNET_TRAIN_BATCH:-64}" --lr "${UNET_TRAIN_LR:-3e-4}" \
        --progress 200 >> "$L" 2>&1
      echo "mgn unet train rc=$?" >> "$L"
      timeout 50 "$B/mgn" unet sample --run "$T/run" --sample-steps 50 --per-class 4 --out "$OUT/unet_samples.png" \
        >> "$L" 2>&1
      echo "mgn unet sample rc=$?" >> "$L"
      cp "$T/run/metrics.jsonl" "$OUT/unet_metrics.jsonl"; cp "$T/run/run.json" "$OUT/unet_run.json"
      python3 scripts/plot-training.py "$OUT/unet_metrics.jsonl" -o "$OUT/unet_loss.png" --title "mgn unet train" \
        >> "$L" 2>&1 || echo "plot-training rc=$? (plot unet_metrics.jsonl locally)" >> "$L"
      ;;
    dinovision)
      # The case study on Debian's photographs (PHOTO_DIR, default .h200/photos): mgn dinovision train (ViT-S/16's
      # first 3 layers with the paper's sine init, no pretrained weights; split by image 80/20, 4 cached crops per
      # training image, Adam at batch 8 for $DINOVISION_STEPS updates, default 12000), then the PyTorch anchor
      # (same decoder, init, order and optimizer on the same cached features, CUDA, TF32 off) within 0.2 dB, then
      # reconstruct. Back: dinovision_metrics.json, dinovision_anchor.json, dinovision_run.json, dinovision_grid.png,
      # dinovision_reconstruct.png, dinovision_log.txt.
      L="$OUT/dinovision_log.txt" T=/tmp/dinovision PH=$(realpath "${PHOTO_DIR:-.h200/photos}")
      rm -rf "$T" && mkdir -p "$T"
      "$B/mgn" dinovision train --images "$PH" --run "$T/run" --steps "${DINOVISION_STEPS:-12000}" --progress 1000 \
        > "$OUT/dinovision_train.txt" 2>> "$L"
      echo "mgn dinovision train rc=$?" >> "$L"
      python3 bench/pytorch/dinovision_anchor.py "$T/run" --device cuda --json "$OUT/dinovision_anchor.json" \
        > /dev/null 2>> "$L"
      echo "dinovision_anchor rc=$? (0: within 0.2 dB)" >> "$L"
      "$B/mgn" dinovision reconstruct $(ls "$PH"/* | head -4) --run "$T/run" --out "$OUT/dinovision_reconstruct.png" \
        >> "$L" 2>&1
      echo "mgn dinovision reconstruct rc=$?" >> "$L"
      cp "$T/run/metrics.json" "$OUT/dinovision_metrics.json"; cp "$T/run/run.json" "$OUT/dinovision_run.json"
      cp "$T/run/grid.png" "$OUT/dinovision_grid.png"
      ;;
    whisper-audio)
      # Real speech (AUDIO_DIR, default .h200/audio) with the paper-init whisper-tiny weights as a model directory:
      # our front end and encoder against transformers' WhisperFeatureExtractor and WhisperEncoder, then the time
      # per batch of features + encoder with the spectrogram on the host (FFTW) and in the graph (device), batch 1
      # and 16. Back: whisper_audio_check.jsonl, whisper_features_timing.txt, whisper_audio_log.txt.
      L="$OUT/whisper_audio_log.txt" T=/tmp/whisper_audio AUD=$(realpath "${AUDIO_DIR:-.h200/audio}")
      rm -rf "$T" && mkdir -p "$T/model"
      "$B/mgn" bench whisper-tiny-encoder --phases compile --weights "$T/model/model.safetensors" > /dev/null 2>> "$L"
      echo '{"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536, "num_mel_bins": 80, "max_source_positions": 1500, "activation_function": "gelu"}' > "$T/model/config.json"
      "$B/mgn" whisper-encode "$AUD"/*.wav --model "$T/model" --dump-features "$T/feat.safetensors" \
        --out "$T/states.safetensors" >> "$L" 2>&1
      echo "mgn whisper-encode rc=$?" >> "$L"
      python3 bench/pytorch/whisper_audio_check.py --features "$T/feat.safetensors" --states "$T/states.safetensors" \
        --model "$T/model" > "$OUT/whisper_audio_check.jsonl" 2>> "$L"
      echo "whisper_audio_check rc=$?" >> "$L"
      FILES16=""
      for i in $(seq 1 16); do cp "$AUD/espeak.wav" "$T/clip$i.wav"; FILES16="$FILES16 $T/clip$i.wav"; done
      for F in host graph; do
        # shellcheck disable=SC2086 # FILES16: words
        "$B/mgn" whisper-encode $FILES16 --model "$T/model" --features "$F" --batch 1 --repeat 3 2>> "$L" | grep timing
        # shellcheck disable=SC2086
        "$B/mgn" whisper-encode $FILES16 --model "$T/model" --features "$F" --batch 16 --repeat 6 2>> "$L" | grep timing
      done > "$OUT/whisper_features_timing.txt"
      ;;
    micro)
      # Back: micro_{mgn,torch}.jsonl, micro_table.md, micro_log.txt.
      L="$OUT/micro_log.txt" T=/tmp/micro
      rm -rf "$T" && mkdir -p "$T"
      FILES=""
      for W in attention conv; do
        "$B/mgn" bench "$W" --outputs "$T/$W.mgn_out.safetensors" --json "$T/$W.mgn.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench $W rc=$?" >> "$L"
        "$B/mgn" bench "$W" --mode accelerated --outputs "$T/$W.acc.mgn_out.safetensors" --json "$T/$W.acc.mgn.jsonl" \
          > /dev/null 2>> "$L"
        echo "mgn bench $W accelerated rc=$?" >> "$L"
        python3 "bench/pytorch/$W.py" --device cuda --inputs "$T/$W.mgn_out.safetensors" \
          --outputs "$T/$W.torch_out.safetensors" --json "$T/$W.torch.jsonl" > /dev/null 2>> "$L"
        echo "$W.py rc=$?" >> "$L"
        FILES="$FILES $T/$W.mgn.jsonl $T/$W.acc.mgn.jsonl $T/$W.torch.jsonl $T/$W.mgn_out.safetensors"
        FILES="$FILES $T/$W.acc.mgn_out.safetensors $T/$W.torch_out.safetensors"
      done
      # Auto takes the query-tiled forward kernels at long sequences and the row derivative kernels: the same
      # cases with every kernel on the row form and on the tiled form, and a per-kernel GPU-time profile of the
      # seq-1024 case for each knob (same inputs; not in the table). Back: micro_attention.tar.xz
      # (micro_attention/{row,tiled}.mgn.jsonl, profile_{auto,row,tiled}.txt).
      A="$OUT/micro_attention"
      mkdir -p "$A"
      for knob in row tiled; do
        MGN_ATTENTION=$knob "$B/mgn" bench attention --json "$A/$knob.mgn.jsonl" > /dev/null 2>> "$L"
        echo "mgn bench attention MGN_ATTENTION=$knob rc=$?" >> "$L"
      done
      for knob in auto row tiled; do
        MGN_ATTENTION=$knob MGN_PROFILE=1 "$B/mgn" bench attention --cases h9-3_d64_s1024 > "$A/profile_$knob.txt" 2>&1
        echo "mgn bench attention profile MGN_ATTENTION=$knob rc=$?" >> "$L"
      done
      tar -cJf "$OUT/micro_attention.tar.xz" -C "$OUT" micro_attention && rm -rf "$A"
      # The Fashion CNN's fc1 at batch 64, SmolLM2's projections (k/v, q/o, MLP), its lm_head forward and
      # input gradient, and the cubes: the small shapes show where f16 (three dispatches) stops paying off.
      SHAPES="64x128x1568 128x192x576 128x576x576 128x1536x576 128x576x1536 128x49152x576 128x576x49152 512x512x512 1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192"
      "$B/mgn" bench-gemm $SHAPES > "$T/gemm.mgn.jsonl" 2>> "$L"
      echo "mgn bench-gemm rc=$?" >> "$L"
      "$B/mgn" bench-gemm $SHAPES --f16 >> "$T/gemm.mgn.jsonl" 2>> "$L"
      echo "mgn bench-gemm --f16 rc=$?" >> "$L"
      python3 bench/pytorch/gemm.py --device cuda $SHAPES > "$T/gemm.torch.jsonl" 2>> "$L"
      echo "gemm.py rc=$?" >> "$L"
      python3 bench/pytorch/gemm.py --device cuda --dtype f16 $SHAPES >> "$T/gemm.torch.jsonl" 2>> "$L"
      echo "gemm.py --dtype f16 rc=$?" >> "$L"
      cat "$T"/*.mgn.jsonl > "$OUT/micro_mgn.jsonl"
      cat "$T"/*.torch.jsonl > "$OUT/micro_torch.jsonl"
      python3 bench/compare.py --require-gates --out "$OUT/micro_table.md" $FILES "$T/gemm.mgn.jsonl" \
        "$T/gemm.torch.jsonl" > /dev/null 2>> "$L"
      echo "compare rc=$?" >> "$L"
      ;;
    attention-forms)
      # The attention rewrite into matrix products (MGN_ATTENTION=matmul; passes/attention_matmul.h) against the
      # attention kernels (row, tiled, auto) at seq $ATTN_SEQS (default "128 256 512 1024 1500"; SmolLM2's 9/3 heads
      # of 64, causal), next to bench/pytorch/attention.py (SDPA) on the same inputs, outputs checked; then the
      # per-kernel profile of Whisper's F+L+B (b1) with the rewrite (auto) and without it (row).
      # Back: attention_forms_{mgn,torch}.jsonl, attention_forms_table.md, attention_forms_log.txt,
      # whisper_profile_{auto,row}.txt.
      L="$OUT/attention_forms_log.txt" T=/tmp/attention_forms
      rm -rf "$T" && mkdir -p "$T"
      FILES=""
      for S in ${ATTN_SEQS:-128 256 512 1024 1500}; do
        for knob in ${ATTN_KNOBS:-matmul row tiled}; do
          MGN_ATTENTION=$knob "$B/mgn" bench attention --seq "$S" --outputs "$T/s$S.$knob.mgn_out.safetensors" \
            --json "$T/s$S.$knob.mgn.jsonl" > /dev/null 2>> "$L"
          echo "mgn bench attention --seq $S MGN_ATTENTION=$knob rc=$?" >> "$L"
          FILES="$FILES $T/s$S.$knob.mgn.jsonl"
        done
        python3 bench/pytorch/attention.py --device cuda --inputs "$T/s$S.matmul.mgn_out.safetensors" \
          --outputs "$T/s$S.torch_out.safetensors" --json "$T/s$S.torch.jsonl" > /dev/null 2>> "$L"
        echo "attention.py --seq $S rc=$?" >> "$L"
        FILES="$FILES $T/s$S.torch.jsonl"
      done
      cat "$T"/*.mgn.jsonl > "$OUT/attention_forms_mgn.jsonl"
      cat "$T"/*.torch.jsonl > "$OUT/attention_forms_torch.jsonl"
      # shellcheck disable=SC2086 # FILES: words
      python3 bench/compare.py --out "$OUT/attention_forms_table.md" $FILES > /dev/null 2>> "$L"
      echo "compare rc=$?" >> "$L"
      for knob in auto row; do
        MGN_ATTENTION=$knob MGN_PROFILE=1 timeout 120 "$B/mgn" bench whisper-tiny-encoder --phases flb \
          > "$OUT/whisper_profile_$knob.txt" 2>&1
        echo "whisper profile MGN_ATTENTION=$knob rc=$?" >> "$L"
      done
      ;;
    soak)
      # The GPU soak of docs/reliability.md (issue 30): bench/soak.sh with the SmolLM2-135M shape (config below,
      # random weights, the staged test tokenizer: ids stay below the vocabulary) for $SOAK_STEPS steps (default
      # 1500) twice, batch 4 x seq 256. Back: soak/ (run logs, summary).
      M=/tmp/soak-model
      rm -rf "$M" && mkdir -p "$M"
      cp .h200/soak-tokenizer.json "$M/tokenizer.json"
      echo '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05, "rope_theta": 100000.0, "tie_word_embeddings": true, "hidden_act": "silu", "initializer_range": 0.041666666666666664}' > "$M/config.json"
      MGN="$B/mgn" SOAK_WEIGHTS=random bash bench/soak.sh "$M" "${SOAK_STEPS:-1500}" "$OUT/soak" > "$OUT/soak_summary.txt" 2>&1
      echo "soak rc=$?" >> "$OUT/soak_summary.txt"
      rm -rf "$OUT/soak/model1" "$OUT/soak/model2"
      ;;
    gemm-warmup)
      # Does a GEMM's time depend on what ran before it in the process (the micro job's shape order) or on
      # how long it was warmed up? The micro job's shapes, f32 and --f16, with 5 and with 100 warm-up calls,
      # MGN_PROFILE=1 (GPU timestamps per dispatch next to the wall time), and the GPU's SM clock, memory
      # clock, power and P-state every 50 ms. Back: gemm_warmup/{w5,w100}_{f32,f16}.{jsonl,err}, clocks.csv.
      D="$OUT/gemm_warmup"
      mkdir -p "$D"
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu --format=csv \
        -lms 50 > "$D/clocks.csv" 2>&1 &
      SMI=$!
      SHAPES="128x1536x576 128x576x1536 128x49152x576 128x576x49152 512x512x512 1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192"
      for W in 5 100; do
        for PREC in f32 f16; do
          F=""; [ $PREC = f16 ] && F=--f16
          echo "$(date +%T.%N) start w$W $PREC" >> "$D/marks.txt"
          MGN_PROFILE=1 "$B/mgn" bench-gemm $SHAPES $F --warmup $W > "$D/w${W}_$PREC.jsonl" 2> "$D/w${W}_$PREC.err"
          echo "$(date +%T.%N) end w$W $PREC rc=$?" >> "$D/marks.txt"
        done
      done
      kill $SMI
      ;;
    f16-probe)
      # The f16 GEMM's tiles next to cuBLAS (gemm_sweep.sh --only $F16_PROBE_VARIANTS, MGN_PIPELINE_STATS=1: the
      # driver's register and shared-memory counts per pipeline land in gemm_sweep.log), then the default
      # kernel at 4096^3 once more with MGN_PIPELINE_IR (every internal representation the driver offers,
      # e.g. machine code) in a cold cache. Back: f16_probe.tar.xz (f16_probe/{gemm_sweep.*,profile_*.txt}, f16_ir/), f16_ir.txt.
      MGN_PIPELINE_STATS=1 bash bench/gemm_sweep.sh "$B" --out "$OUT/f16_probe" \
        --shapes "${F16_PROBE_SHAPES:-4096x4096x4096 8192x8192x8192 128x576x1536 128x576x49152}" \
        --only "${F16_PROBE_VARIANTS:-f16_default,f16_default_noload,f16_default_fragonly,f16_128x128x16_fragonly,f16_default_mmaonly,f16_w32x32_mmaonly,f16_w64x64_mmaonly,f16_128x128x16_mmaonly}" \
        > "$OUT/f16_probe_stdout.txt" 2>&1
      echo "gemm_sweep rc=$?" >> "$OUT/f16_probe_stdout.txt"
      MGN_CACHE_DIR=/tmp/mgn-ir-cache MGN_PIPELINE_IR="$OUT/f16_ir" "$B/mgn" bench-gemm 4096x4096x4096 --f16 \
        --samples 3 > "$OUT/f16_ir.txt" 2>&1
      echo "ir rc=$?" >> "$OUT/f16_ir.txt"
      # One archive instead of a file per variant (a call returns a limited number of files).
      rm -rf "$OUT/f16_probe/.cache"
      tar -cJf "$OUT/f16_probe.tar.xz" -C "$OUT" f16_probe f16_ir && rm -rf "$OUT/f16_probe" "$OUT/f16_ir"
      ;;
    gemm-sweep)
      # Every GEMM variant (bench/gemm_sweep.sh) next to cuBLAS, then an Nsight Compute report of the default
      # f32 kernel at 4096^3 (text page only; the .ncu-rep stays in /tmp). Back: gemm_sweep/{gemm_sweep.md,
      # gemm_sweep.json, gemm_sweep.jsonl, gemm_torch.jsonl, gemm_sweep.log, ncu_default.txt}.
      bash bench/gemm_sweep.sh "$B" --out "$OUT/gemm_sweep" > "$OUT/gemm_sweep_stdout.txt" 2>&1
      echo "gemm_sweep rc=$?" >> "$OUT/gemm_sweep_stdout.txt"
      timeout 120 bash bench/gemm_sweep.sh "$B" --ncu default --out /tmp/ncu >> "$OUT/gemm_sweep_stdout.txt" 2>&1
      echo "ncu rc=$?" >> "$OUT/gemm_sweep_stdout.txt"
      cp /tmp/ncu/*.txt "$OUT/gemm_sweep/" 2>/dev/null
      ;;
    resnet-mem)
      # ResNet-50 (batch 4, 224x224, AdamW): our planned memory (training and inference) next to PyTorch's
      # peak allocated memory on this GPU. Back: resnet_plan_{train,infer}.txt, resnet_torch_memory.json.
      "$B/mgn" plan --model resnet50 --show report > "$OUT/resnet_plan_train.txt" 2>&1
      "$B/mgn" plan --model resnet50 --mode infer --show report > "$OUT/resnet_plan_infer.txt" 2>&1
      rm -rf /tmp/rn50 && python3 bench/pytorch/resnet50_ref.py /tmp/rn50 --device cuda > "$OUT/resnet_torch.txt" 2>&1
      echo "resnet50_ref rc=$?" >> "$OUT/resnet_torch.txt"
      cp /tmp/rn50/torch_memory.json "$OUT/resnet_torch_memory.json" 2>/dev/null
      ;;
    spirv-opt)
      # KernelOptions::spirv_optimize (MGN_SPIRV_OPT): the same workloads with and without spirv-opt's passes, in one
      # call: cold compile (empty caches each) and the timed phases. Back: spirv_opt_<workload>_<0|1>.jsonl, _log.txt.
      L="$OUT/spirv_opt_log.txt"
      for wb in ${SPIRV_OPT_WORKLOADS:-smollm2-135m:1 whisper-tiny-encoder:1 dinov3-vits16:8 resnet50:4}; do
        w=${wb%%:*} b=${wb##*:}
        for o in 1 0; do
          rm -rf "/tmp/spv$o" && mkdir -p "/tmp/spv$o"
          MGN_SPIRV_OPT=$o MGN_CACHE_DIR="/tmp/spv$o/mgn" __GL_SHADER_DISK_CACHE_PATH="/tmp/spv$o/nv" timeout 300 \
            "$B/mgn" bench "$w" --batch "$b" --phases compile,inference,flb --verbose \
            --json "$OUT/spirv_opt_${w}_$o.jsonl" > /dev/null 2>> "$L"
          echo "mgn bench $w MGN_SPIRV_OPT=$o rc=$?" >> "$L"
        done
      done
      ;;
    gemm-epilogue)
      # KernelOptions::gemm_epilogue (MGN_GEMM_EPILOGUE): each workload with the tiled GEMM's epilogues on and off,
      # same call, strict, the timed phases and the dispatch counts; then SmolLM2's prefill profiled both ways.
      # Back: gemm_epilogue.jsonl (mode strict_e1 / strict_e0), gemm_epilogue_log.txt, gemm_epilogue_profile_{0,1}.txt.
      L="$OUT/gemm_epilogue_log.txt"
      for wb in ${GEMM_EPILOGUE_WORKLOADS:-smollm2-135m:1 whisper-tiny-encoder:1 dinov3-vits16:8 smolvla-expert:1 sd-unet-small:1 resnet50:4}; do
        w=${wb%%:*} b=${wb##*:}
        for e in 1 0; do
          MGN_GEMM_EPILOGUE=$e timeout 180 "$B/mgn" bench "$w" --batch "$b" --phases inference,flb,step \
            --json "/tmp/gemm_epi_${w}_$e.jsonl" > /dev/null 2>> "$L"
          echo "mgn bench $w b$b MGN_GEMM_EPILOGUE=$e rc=$?" >> "$L"
          sed "s/\"mode\":\"strict\"/\"mode\":\"strict_e$e\"/" "/tmp/gemm_epi_${w}_$e.jsonl" >> "$OUT/gemm_epilogue.jsonl"
        done
      done
      for e in 1 0; do
        MGN_GEMM_EPILOGUE=$e MGN_PROFILE=1 timeout 60 "$B/mgn" bench smollm2-135m --phases inference \
          > "$OUT/gemm_epilogue_profile_$e.txt" 2>&1
      done
      ;;
    f16-threshold)
      L="$OUT/f16_threshold_log.txt"
      for wb in ${F16_THRESHOLD_WORKLOADS:-sd-unet-small:1 smolvla-expert:1 whisper-tiny-encoder:1 dinov3-vits16:8 smollm2-135m:1}; do
        w=${wb%%:*} b=${wb##*:}
        timeout 120 "$B/mgn" bench "$w" --batch "$b" --phases compile > /dev/null 2>> "$L"
        for run in strict acc acc0; do
          case $run in strict) mode=strict mw= ;; acc) mode=accelerated mw= ;; acc0) mode=accelerated mw=0 ;; esac
          MGN_GEMM_F16_MIN_WORK=${mw:-67108864} MGN_GEMM_F16_MIN_DIM=${mw:-64} timeout 180 "$B/mgn" bench "$w" --batch "$b" --mode "$mode" \
            --phases inference,flb,step --json "/tmp/f16t_${w}_$run.jsonl" > /dev/null 2>> "$L"
          echo "mgn bench $w b$b $run rc=$?" >> "$L"
          sed "s/\"mode\":\"$mode\"/\"mode\":\"$run\"/" "/tmp/f16t_${w}_$run.jsonl" >> "$OUT/f16_threshold.jsonl"
        done
      done
      ;;
    llama-cpp)
      L="$OUT/llama_cpp_log.txt" T=/tmp/llama_cpp LC=${LLAMA_CPP_DIR:-.h200/llama-cpp}
      LW=${LLAMA_CPP_WORKLOAD:-smollm2-135m} LS=${LLAMA_CPP_PROMPT:-128} LN=${LLAMA_CPP_GEN:-128} LR=${LLAMA_CPP_REPS:-20}
      rm -rf "$T" && mkdir -p "$T"
      [ -x "$LC/llama-bench" ] || { [ -f .h200/llama-cpp.tar.xz ] && tar -xJf .h200/llama-cpp.tar.xz -C .h200; }
      cat "$LC/VERSION" >> "$L" 2>&1
      timeout 60 "$LC/llama-bench" --list-devices >> "$L" 2>&1
      W="$T/$LW.weights.safetensors"
      # Ours first: the strict run writes the weights (seed 0), the accelerated run and the exports read them.
      timeout 900 "$B/mgn" bench "$LW" --seq "$LS" --phases inference,minimal --weights "$W" \
        --json "$T/mgn_strict.jsonl" > /dev/null 2>> "$L"
      echo "mgn bench $LW strict rc=$?" >> "$L"
      timeout 900 "$B/mgn" bench "$LW" --seq "$LS" --phases inference,minimal --mode accelerated --weights "$W" \
        --json "$T/mgn_acc.jsonl" > /dev/null 2>> "$L"
      echo "mgn bench $LW accelerated rc=$?" >> "$L"
      for ty in f32 f16; do
        G="$T/$LW.$ty.gguf"
        timeout 300 "$B/mgn" export "$W" --gguf "$G" --gguf-type "$ty" 2>> "$L"
        echo "mgn export --gguf-type $ty rc=$?" >> "$L"
        timeout 600 "$LC/llama-bench" -m "$G" -p "$LS" -n "$LN" -ngl 99 -fa 0,1 -r "$LR" -o jsonl \
          > "$T/lb_$ty.jsonl" 2>> "$L"
        echo "llama-bench $ty -p $LS -n $LN rc=$?" >> "$L"
        timeout 600 "$LC/llama-bench" -m "$G" -p 0 -n 1 -d "$LS" -ngl 99 -fa 0,1 -r "$LR" -o jsonl \
          > "$T/lb_${ty}_at.jsonl" 2>> "$L"
        echo "llama-bench $ty -n 1 -d $LS rc=$?" >> "$L"
      done
      cat "$T"/lb_*.jsonl > "$OUT/llama_cpp_bench.jsonl"
      cat "$T"/mgn_*.jsonl > "$OUT/llama_cpp_mgn.jsonl"
      timeout 60 python3 bench/llama_cpp_table.py --out "$OUT/llama_cpp_table.md" "$OUT/llama_cpp_mgn.jsonl" \
        "$OUT/llama_cpp_bench.jsonl" "$LC/VERSION" > /dev/null 2>> "$L"
      echo "llama_cpp_table rc=$?" >> "$L"
      ;;
    *) echo "unknown job $job" >> "$OUT/errors.txt" ;;
  esac
done
echo done
