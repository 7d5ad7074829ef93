#!/usr/bin/env bash
# GEMM variant sweep on one GPU: `mgn bench-gemm` once per kernel configuration (the MGN_GEMM_* variables,
# docs/environment.md: MGN_GEMM_VARIANT is auto, simt or small) on the cube and SmolLM2 shapes, bench/pytorch/gemm.py (cuBLAS f32 strict/TF32 and
# f16) in the same run, and one table. About 2-4 minutes on an H200.
#
#   bench/gemm_sweep.sh [BIN_DIR] [--out DIR] [--shapes "MxNxK ..."] [--only NAME,NAME] [--no-torch] [--no-f16]
#                       [--no-profile]
#   bench/gemm_sweep.sh [BIN_DIR] --ncu NAME [--out DIR]   # Nsight Compute report of one variant at 4096^3
#                                                          # ($NCU_SHAPE overrides the shape)
#
# BIN_DIR holds mgn (default build-release); $PYTHON (default python3) runs gemm.py. Writes under DIR (default $OUT/gemm_sweep, $OUT defaulting to
# /tmp/out): gemm_sweep.jsonl (every mgn line, with "tag" = variant name), gemm_torch.jsonl,
# gemm_sweep.md (TFLOP/s per variant and shape, % of cuBLAS, worst sampled error, kernel names),
# gemm_sweep.json (the same numbers, plus the best variant per shape), gemm_sweep.log (stderr, timings),
# profile_NAME.txt (MGN_PROFILE's GPU time per kernel at 4096^3 or $PROFILE_SHAPE, unless --no-profile).
# With --ncu: ncu_NAME.ncu-rep and ncu_NAME.txt (`ncu --import ... --page details`).
set -uo pipefail

B=build-release
OUTDIR=""
SHAPES="2048x2048x2048 4096x4096x4096 8192x8192x8192 128x576x1536 128x1536x576 128x576x49152"
ONLY=""
NCU_VARIANT=""
TORCH=1
F16=1
PROFILE=1
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then B=$1; shift; fi
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUTDIR=$2; shift 2 ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --ncu) NCU_VARIANT=$2; shift 2 ;;
    --no-torch) TORCH=0; shift ;;
    --no-f16) F16=0; shift ;;
    --no-profile) PROFILE=0; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gemm_sweep.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUTDIR=${OUTDIR:-${OUT:-/tmp/out}/gemm_sweep}
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gemm_sweep.log"
: > "$LOG"
MGN="$(realpath "$B")/mgn"
[ -x "$MGN" ] || { echo "gemm_sweep.sh: no mgn in $B" >&2; exit 2; }

# The GPU machine's Vulkan loader comes as .deb files next to the tree (as bench/h200.sh installs it).
if [ -d .gl ] && ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1; then
  for f in .gl/*.deb; do dpkg -x "$f" / 2>>"$LOG"; done
  ldconfig 2>>"$LOG"
fi
export LD_LIBRARY_PATH="$(realpath "$B")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MGN_VALIDATION=0
export MGN_CACHE_DIR="$OUTDIR/.cache"  # fresh SPIR-V cache: no kernel from an older build
rm -rf "$MGN_CACHE_DIR"

# name | MGN_GEMM_VARIANT | MGN_GEMM_TILE (f32) or MGN_GEMM_F16_TILE (f16) | precision [| MGN_GEMM_F16_ABLATE]
# Ablated rows (noload: no global loads after the first K slice; nomma: no multiplies; mmaonly: the first
# step's fragments loaded once, then only multiplies; fragonly: the first slice's fragments reloaded from
# shared memory every slice and multiplied, no barriers) compute wrong results on purpose: their times split
# the f16 kernel's time into its parts.
# "default" is what a session gets with no knob set. Tile fields: BMxBNxBK, tTMxTN per thread, lLXxLY
# lanes of a subgroup (along N x M), gG tile rows walked together, sS K splits; f16: wWMxWN subgroup tile.
# (The f16 variants with one shared buffer, two slices in flight or fragments from global memory were removed
# after runs 5 and 8 measured them slower than the default: docs/perf-notes.md, "Kept variants".)
VARIANTS=(
  "default|auto||strict"
  "bk8|simt|128x128x8|strict"
  "bk8_l8x4|simt|128x128x8,l8x4|strict"
  "bk16_l8x4|simt|128x128x16,l8x4|strict"
  "bk16_l4x8|simt|128x128x16,l4x8|strict"
  "bk16_g1|simt|128x128x16,g1|strict"
  "bk16_g16|simt|128x128x16,g16|strict"
  "128x64|simt|128x64x16,t8x4|strict"
  "64x128|simt|64x128x16,t4x8|strict"
  "64x64|simt|64x64x16|strict"
  "64x64_t8x8|simt|64x64x16,t8x8|strict"
  "32x32|simt|32x32x16|strict"
  "f16_default|auto||f16"
  "f16_w32x32|auto|128x128x32,w32x32|f16"
  "f16_64x128_w32x32|auto|64x128x32,w32x32|f16"
  "f16_128x64_w32x32|auto|128x64x32,w32x32|f16"
  "f16_w64x64|auto|128x128x32,w64x64|f16"
  "f16_128x256|auto|128x256x16,w64x64|f16"
  "f16_64x64|auto|64x64x32|f16"
  "f16_64x64_nosplit|auto|64x64x32,s1|f16"
  "f16_128x128x16|auto|128x128x16|f16"
  "f16_128x128x16_noload|auto|128x128x16|f16|noload"
  "f16_256x128x16_w64x32|auto|256x128x16,w64x32|f16"
  "f16_128x256x16_w64x32|auto|128x256x16,w64x32|f16"
  "f16_128x128x16_w32x64|auto|128x128x16,w32x64|f16"
  "f16_default_noload|auto||f16|noload"
  "f16_default_nomma|auto||f16|nomma"
  "f16_w32x32_noload|auto|128x128x32,w32x32|f16|noload"
  "f16_w32x32_nomma|auto|128x128x32,w32x32|f16|nomma"
  "f16_default_mmaonly|auto||f16|mmaonly"
  "f16_w32x32_mmaonly|auto|128x128x32,w32x32|f16|mmaonly"
  "f16_w64x64_mmaonly|auto|128x128x32,w64x64|f16|mmaonly"
  "f16_128x128x16_mmaonly|auto|128x128x16|f16|mmaonly"
  "f16_default_fragonly|auto||f16|fragonly"
  "f16_128x128x16_fragonly|auto|128x128x16|f16|fragonly"
)

run_variant() {  # name variant tile precision ablate shapes... -> one JSON line per shape on stdout
  local name=$1 variant=$2 tile=$3 prec=$4 ablate=$5
  shift 5
  local flags=(--tag "$name" --backend vulkan)
  local env_tile=MGN_GEMM_TILE
  if [ "$prec" = f16 ]; then flags+=(--f16); env_tile=MGN_GEMM_F16_TILE; fi
  [ -n "$ablate" ] && flags+=(--no-check)
  env MGN_GEMM_VARIANT="$variant" "$env_tile=$tile" MGN_GEMM_F16_ABLATE="$ablate" \
    timeout 150 "$MGN" bench-gemm "$@" "${flags[@]}"
}

find_ncu() {
  command -v ncu 2>/dev/null && return
  for c in /usr/local/cuda/bin/ncu /usr/local/cuda-*/bin/ncu /opt/nvidia/nsight-compute/*/ncu \
           /usr/local/NVIDIA-Nsight-Compute*/ncu /usr/bin/ncu; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}

if [ -n "$NCU_VARIANT" ]; then
  NCU=$(find_ncu)
  [ -n "$NCU" ] || { echo "gemm_sweep.sh: ncu not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute)" >&2; exit 2; }
  for row in "${VARIANTS[@]}"; do
    IFS='|' read -r name variant tile prec ablate <<< "$row"
    [ "$name" = "$NCU_VARIANT" ] || continue
    env_tile=MGN_GEMM_TILE; flags=()
    if [ "$prec" = f16 ]; then flags=(--f16); env_tile=MGN_GEMM_F16_TILE; fi
    # Vulkan compute dispatches show up under their SPIR-V entry point ("main"); -c 1 keeps the first one
    # after the self-test (f16) and the warm-up-free single sample. A driver/ncu pair that does not
    # profile Vulkan reports "No kernels were profiled": then use nsys or the sweep's timings.
    # --clock-control none: leave the GPU's clocks as they are (the device notes ask for it).
    echo "$NCU --set full --clock-control none -k regex:'main|matmul' -c 1 --target-processes all -f -o $OUTDIR/ncu_$name ..." | tee -a "$LOG"
    env MGN_GEMM_VARIANT="$variant" "$env_tile=$tile" MGN_GEMM_F16_ABLATE="$ablate" "$NCU" --set full \
      --clock-control none -k 'regex:main|matmul' -c 1 --target-processes all -f -o "$OUTDIR/ncu_$name" \
      "$MGN" bench-gemm "${NCU_SHAPE:-4096x4096x4096}" --warmup 0 --samples 1 --no-check --backend vulkan \
      --tag "$name" "${flags[@]}" \
      > "$OUTDIR/ncu_$name.stdout" 2>>"$LOG"
    echo "ncu rc=$?" >> "$LOG"
    [ -f "$OUTDIR/ncu_$name.ncu-rep" ] && "$NCU" --import "$OUTDIR/ncu_$name.ncu-rep" --page details \
      > "$OUTDIR/ncu_$name.txt" 2>>"$LOG"
    exit 0
  done
  echo "gemm_sweep.sh: no variant named $NCU_VARIANT" >&2
  exit 2
fi

T0=$(date +%s)
: > "$OUTDIR/gemm_sweep.jsonl"
for row in "${VARIANTS[@]}"; do
  IFS='|' read -r name variant tile prec ablate <<< "$row"
  if [ -n "$ONLY" ] && ! printf ',%s,' "$ONLY" | grep -q ",$name,"; then continue; fi
  [ "$prec" = f16 ] && [ "$F16" = 0 ] && continue
  t=$(date +%s)
  echo "== $name ($variant ${tile:-auto} $prec)" >> "$LOG"
  run_variant "$name" "$variant" "$tile" "$prec" "$ablate" $SHAPES >> "$OUTDIR/gemm_sweep.jsonl" 2>>"$LOG"
  echo "   rc=$? $(( $(date +%s) - t )) s" >> "$LOG"
  # GPU time per kernel (timestamp queries, MGN_PROFILE) at 4096^3: the f16 rows' packing passes apart
  # from the multiply.
  if [ "$PROFILE" = 1 ]; then
    MGN_PROFILE=1 run_variant "$name" "$variant" "$tile" "$prec" "$ablate" "${PROFILE_SHAPE:-4096x4096x4096}" --no-check \
      > /dev/null 2> "$OUTDIR/profile_$name.txt"
  fi
done
if [ "$TORCH" = 1 ]; then
  PY=${PYTHON:-$(command -v python3)}
  G="$(dirname "$0")/pytorch/gemm.py"
  timeout 200 "$PY" "$G" $SHAPES > "$OUTDIR/gemm_torch.jsonl" 2>>"$LOG"
  [ "$F16" = 1 ] && timeout 120 "$PY" "$G" --dtype f16 $SHAPES >> "$OUTDIR/gemm_torch.jsonl" 2>>"$LOG"
fi
echo "total $(( $(date +%s) - T0 )) s" >> "$LOG"

python3 - "$OUTDIR" <<'EOF'
import json, os, sys
out = sys.argv[1]
def lines(name):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        return []
    rows = []
    for l in open(p):
        l = l.strip()
        if l.startswith("{"):
            try:
                rows.append(json.loads(l))
            except ValueError:
                pass
    return rows
mgn, torch = lines("gemm_sweep.jsonl"), lines("gemm_torch.jsonl")
shape = lambda r: "%dx%dx%d" % (r["m"], r["n"], r["k"])
shapes = []
for r in mgn + torch:
    if shape(r) not in shapes:
        shapes.append(shape(r))
ref = {}  # (shape, mode) -> cuBLAS TFLOP/s
for r in torch:
    ref[(shape(r), r["mode"])] = r["tflops"]
tags = []
for r in mgn:
    if r["tag"] not in tags:
        tags.append(r["tag"])
cell = {(r["tag"], shape(r)): r for r in mgn}
summary = {"shapes": shapes, "cublas": {"%s %s" % k: v for k, v in ref.items()}, "variants": {}, "best": {}}
md = ["# GEMM variant sweep", "",
      "TFLOP/s (`mgn bench-gemm`, wall clock per synchronized run, median) and % of cuBLAS from the same run "
      "(f32 rows vs torch strict = TF32 off, f16 rows vs torch f16). err = worst sampled |c - ref| / sum|a||b|.", ""]
md.append("| variant | " + " | ".join(shapes) + " | worst err | kernel (first shape) |")
md.append("|---|" + "---|" * len(shapes) + "---|---|")
for mode, label in (("strict", "cuBLAS f32 (TF32 off)"), ("tf32", "cuBLAS TF32"), ("f16", "cuBLAS f16")):
    if any((s, mode) in ref for s in shapes):
        md.append("| **%s** | " % label + " | ".join("%.3g" % ref[(s, mode)] if (s, mode) in ref else "" for s in shapes) + " | | |")
for t in tags:
    cells, errs, kern, info = [], [], "", {}
    for s in shapes:
        r = cell.get((t, s))
        if not r:
            cells.append("—")
            continue
        base = ref.get((s, "f16" if r["precision"] == "f16" else "strict"))
        pct = " (%d%%)" % round(100 * r["tflops"] / base) if base else ""
        cells.append("%.3g%s" % (r["tflops"], pct))
        if r.get("check_err", -1) >= 0:
            errs.append(r["check_err"])
        kern = kern or r["kernels"].split(" %")[0]
        info[s] = {"tflops": r["tflops"], "median_ms": r["median_ms"], "pct_cublas": (100 * r["tflops"] / base) if base else None,
                   "check_err": r.get("check_err"), "kernels": r["kernels"], "compile_ms": r["compile_ms"]}
        if r["precision"] == "f16" and "cooperative" not in r["kernels"] and "coopmat" not in r["kernels"]:
            info[s]["note"] = "f16 requested but the f32 kernel ran: " + r.get("coopmat", "")
    md.append("| %s | %s | %s | `%s` |" % (t, " | ".join(cells), ("%.1e" % max(errs)) if errs else "", kern))
    summary["variants"][t] = info
for s in shapes:
    for prec in ("strict", "f16"):
        cands = [(cell[(t, s)]["tflops"], t) for t in tags if (t, s) in cell and cell[(t, s)]["precision"] == prec
                 and (prec == "strict" or "coopmat" in cell[(t, s)]["kernels"])
                 and "ABLATED" not in cell[(t, s)]["kernels"]]
        if cands:
            summary["best"]["%s %s" % (s, prec)] = max(cands)[1]
md += ["", "Best f32 variant per shape: " + ", ".join("%s → %s" % (k.split()[0], v) for k, v in summary["best"].items() if k.endswith("strict"))]
f16_notes = sorted({r.get("coopmat", "") for r in mgn if r["precision"] == "f16"})
if f16_notes:
    md += ["", "f16 cooperative-matrix self-test: " + "; ".join(f16_notes)]
profiles = sorted(f for f in os.listdir(out) if f.startswith("profile_") and f.endswith(".txt"))
if profiles:
    md += ["", "## GPU time per kernel at 4096x4096x4096 (MGN_PROFILE timestamps)", ""]
    for f in profiles:
        rows = [l.rstrip() for l in open(os.path.join(out, f)) if "ms/run" in l or "GPU time per run" in l]
        if rows:
            md += ["`%s`:" % f[len("profile_"):-4], "", "```"] + rows + ["```", ""]
open(os.path.join(out, "gemm_sweep.md"), "w").write("\n".join(md) + "\n")
json.dump(summary, open(os.path.join(out, "gemm_sweep.json"), "w"), indent=1)
print("\n".join(md))
EOF
