#!/usr/bin/env bash
# GPU soak (issue 30): the same SmolLM2 fine-tune run twice for STEPS steps; the two loss curves must be
# bitwise identical, and the device memory sampled every step (the session's VkDeviceMemory and the process's
# device-local heap usage under VK_EXT_memory_budget) must not grow after the first step. Prints one summary
# for docs/reliability.md and leaves both logs in OUT.
# Usage: bench/soak.sh MODEL_DIR [STEPS] [OUT]   (defaults: 10000 steps, soak-out/)
#   MODEL_DIR: a Hugging Face SmolLM2 folder (config.json, model.safetensors, tokenizer.json)
#   SOAK_TEXT: the training text (default: README.md and docs/*.md of this tree), SOAK_BATCH (4), SOAK_SEQ (256),
#   SOAK_WEIGHTS=random: no weights file (a config and tokenizer suffice; for a dry run on a tiny model),
#   MGN: the mgn binary (default build/mgn). Choose STEPS to fit the time you have: the script prints steps/s.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:?usage: bench/soak.sh MODEL_DIR [STEPS] [OUT]}
STEPS=${2:-10000}
OUT=${3:-soak-out}
MGN=${MGN:-build/mgn}
mkdir -p "$OUT"
TEXT=${SOAK_TEXT:-$OUT/text.txt}
[ -n "${SOAK_TEXT:-}" ] || cat README.md docs/*.md > "$TEXT"
for run in 1 2; do
  start=$(date +%s.%N)
  "$MGN" finetune "$MODEL" --text "$TEXT" --out "$OUT/model$run" --steps "$STEPS" --batch "${SOAK_BATCH:-4}" \
    --seq "${SOAK_SEQ:-256}" --lr 1e-5 ${SOAK_WEIGHTS:+--weights "$SOAK_WEIGHTS"} --log "$OUT/run$run.log" \
    2> "$OUT/run$run.stderr"
  end=$(date +%s.%N)
  echo "run $run: $STEPS steps in $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"  # no bc on the GPU machine
done
# Columns: step, loss bits, loss, session device bytes, heap usage bytes.
if cmp -s <(cut -d' ' -f1,2 "$OUT/run1.log") <(cut -d' ' -f1,2 "$OUT/run2.log"); then
  echo "loss curves: bitwise identical over $STEPS steps"
else
  echo "loss curves: DIFFER (first difference below)"
  diff <(cut -d' ' -f1,2 "$OUT/run1.log") <(cut -d' ' -f1,2 "$OUT/run2.log") | head -4
fi
for run in 1 2; do
  awk -v r="$run" 'NR == 1 { first = $3; s1 = $4; h1 = $5; smax = $4; hmax = $5 }
    { if ($4 > smax) smax = $4; if ($5 > hmax) hmax = $5; last = $3; sl = $4; hl = $5 }
    END { printf "run %s: loss first %s last %s; session device bytes step 1 %d, max %d, last %d; " \
                 "device-local heap usage step 1 %d, max %d, last %d (growth %d bytes)\n", \
                 r, first, last, s1, smax, sl, h1, hmax, hl, hl - h1 }' "$OUT/run$run.log"
done
