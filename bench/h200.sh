#!/usr/bin/env bash
# One call on the GPU machine: the Vulkan loader from .gl/, then the chosen jobs; results under $OUT.
# Usage there: bench/h200.sh BIN_DIR DATA_DIR JOB...
#   BIN_DIR holds mgn and (for `conformance`) tests/vulkan_*_test plus oracle/ (see bench/stage-h200.sh)
#   gemm         mgn bench-gemm vs torch.mm on the same GPU, same run
#   conformance  the Vulkan op harness and whole-graph tests on this device (validation layer off: the
#                GPU machine has no layer package)
#   cnn          compile time per phase for the Fashion-MNIST CNN, cold and warm caches, a profiled short
#                run, then the main job: the CNN, 5 epochs, AdamW, checkpoint, reload, test accuracy
#   bench        mgn bench fashion-cnn next to bench/pytorch/fashion_cnn.py, then bench/compare.py
#   llama        SmolLM2-135M, random weights: transformers as the reference, then mgn llama-check
#                (gates of issue 6 and timings next to PyTorch eager)
#   bench        the harness of docs/benchmarks.md: mgn bench fashion-cnn and bench/pytorch/fashion_cnn.py
#                (eager and torch.compile, strict and accelerated) at batch $BENCH_BATCHES (default "64 256"),
#                same weights and inputs, then bench/compare.py (gates + table) -> bench_table.md
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
for job in "$@"; do
  case "$job" in
    gemm)
      SHAPES="512x512x512 1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192 128x1536x576 128x576x1536"
      "$B/mgn" bench-gemm $SHAPES > "$OUT/gemm_mgn.jsonl" 2> "$OUT/gemm_mgn.err"
      python3 bench/pytorch/gemm.py $SHAPES > "$OUT/gemm_torch.jsonl" 2> "$OUT/gemm_torch.err"
      ;;
    conformance)
      # The oracle files sit next to the binaries; the test looks for them where they were built.
      for t in ${CONF_TESTS:-vulkan_ops_test vulkan_session_test vulkan_attention_test plan_test vulkan_kernels_test}; do
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
      # tensors stay in /tmp; the table holds their verdicts). Compile once with empty caches (ours and the
      # driver's), then per batch: one untimed compile fills the caches, so the timed run's compile is warm.
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
        python3 bench/pytorch/fashion_cnn.py --batch "$BATCH" --weights "$P.weights.safetensors" \
          --outputs "$P.torch_out.safetensors" --json "$P.torch.jsonl" > /dev/null 2>> "$L"
        echo "fashion_cnn.py b$BATCH rc=$?" >> "$L"
        FILES="$FILES $P.mgn.jsonl $P.torch.jsonl $P.mgn_out.safetensors $P.torch_out.safetensors"
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
    *) echo "unknown job $job" >> "$OUT/errors.txt" ;;
  esac
done
echo done
