#!/usr/bin/env bash
# Speed of two builds of mgn on one GPU, in one call: SmolLM2-135M (batch 1 x 128 tokens) and ResNet-50
# (batch 4), every phase of `mgn bench` (compile, inference, minimal, flb, step; strict), the two binaries
# alternated REPS times (the order flipped every rep) so that clock drift hits both alike. Writes
# before_after.md (per phase: the median over reps of each binary's median, and after/before) and
# before_after.tar.xz (every JSON line and the log) to $OUT.
# Usage there: bench/before-after.sh BEFORE_DIR AFTER_DIR [REPS]   (each DIR holds mgn and lib/)
#   WORKLOADS="smollm2-135m resnet50" (default) chooses the models; resnet50 runs at batch 4.
set -uo pipefail
A=$(realpath "$1") B=$(realpath "$2") REPS=${3:-3}
OUT=${OUT:-/tmp/out}
W=/tmp/before-after
rm -rf "$W" && mkdir -p "$OUT" "$W"
export MGN_VALIDATION=0
run() {  # run LABEL DIR WORKLOAD REP ARGS...
  local label=$1 dir=$2 w=$3 rep=$4
  shift 4
  # Each binary keeps its own warm shader cache (filled by the first rep's compile), as users see it.
  MGN_CACHE_DIR="/tmp/cache-$label" LD_LIBRARY_PATH="$dir/lib" "$dir/mgn" bench "$w" "$@" \
    --json "$W/${label}_${w}_r$rep.jsonl" > /dev/null 2>> "$W/log.txt"
  echo "$label $w rep $rep rc=$?" >> "$W/log.txt"
}
for rep in $(seq 1 "$REPS"); do
  for w in ${WORKLOADS:-smollm2-135m resnet50}; do
    extra=()
    [ "$w" = resnet50 ] && extra=(--batch 4)
    if [ $((rep % 2)) = 1 ]; then order="before after"; else order="after before"; fi
    for label in $order; do
      [ "$label" = before ] && dir=$A || dir=$B
      run "$label" "$dir" "$w" "$rep" "${extra[@]}"
    done
  done
done
python3 - "$W" "$REPS" <<'PY' > "$OUT/before_after.md"
import glob, json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {}
for path in sorted(glob.glob(f"{out}/*_r*.jsonl")):
    label = path.split("/")[-1].split("_")[0]
    for line in open(path):
        r = json.loads(line)
        if r.get("side") != "mgn" or "median_ms" not in r:
            continue
        key = (r.get("workload"), r.get("phase"))
        rows.setdefault(key, {}).setdefault(label, []).append(r["median_ms"])
print("| workload | phase | before ms | after ms | after/before | reps |")
print("|---|---|---|---|---|---|")
for (w, ph), v in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
    b, a = v.get("before", []), v.get("after", [])
    if not a or not b:
        continue
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {w} | {ph} | {mb:.3f} | {ma:.3f} | {ma / mb:.3f} | {len(b)}/{len(a)} |")
PY
tar -cJf "$OUT/before_after.tar.xz" -C "$W" .
cat "$OUT/before_after.md"
