# Run 20, call 1: grouped sibling GEMMs (KernelOptions::gemm_siblings) and the in-kernel split-K sum
# (KernelOptions::gemm_splitk_fixup), each on and off; the per-dispatch profile; the PyTorch anchor (eager, CUDA graph,
# torch.compile + CUDA graph) for SmolLM2 in the same call.
tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. SmolLM2-135M b1x128, all phases: both on, both off (the previous kernels), each alone.
for cfg in 11 00 10 01; do
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 60 $M bench smollm2-135m --phases inference,flb,step \
    --samples 20 --json $OUT/sm_$cfg.jsonl >> $OUT/sm_$cfg.txt 2>&1
done
date >> $OUT/call_log.txt
# 2. The per-dispatch profile, both on (inference and F+L+B).
for cfg in 11; do
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} MGN_PROFILE=1 timeout 60 $M bench smollm2-135m --phases inference,flb \
    --samples 10 --json $OUT/sm_prof_$cfg.jsonl > $OUT/sm_prof_$cfg.txt 2>&1
done
date >> $OUT/call_log.txt
# 3. Whisper b1 and b8, DINOv3 b8: both on, both off.
for cfg in 11 00; do
  for wb in 1 8; do
    MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 60 $M bench whisper-tiny-encoder --batch $wb \
      --phases inference,flb --samples 20 --json $OUT/wh${wb}_$cfg.jsonl >> $OUT/wh${wb}_$cfg.txt 2>&1
  done
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 60 $M bench dinov3-vits16 --batch 8 \
    --phases inference,flb --samples 20 --json $OUT/dn8_$cfg.jsonl >> $OUT/dn8_$cfg.txt 2>&1
done
date >> $OUT/call_log.txt
# 4. The small-M GEMMs' K loop: deeper K slices against more splits, SmolLM2's shapes at 128 tokens (q/k/v side by
#    side 960 wide, o 576, down K = 1536, gate/up side by side 3072 wide).
for t in 32x32x16 32x32x32 32x32x64; do
  for sp in s1 s4; do
    timeout 30 $M bench-gemm --backend vulkan --layout nt --tile $t,$sp --tag ${t}_$sp --samples 20 \
      128x960x576 128x576x576 128x576x1536 128x3072x576 >> $OUT/gemm_small.jsonl 2>> $OUT/gemm_small.err
  done
done
date >> $OUT/call_log.txt
# 5. bench-llama with torch.compile + CUDA graphs (mode="reduce-overhead"): ours next to every PyTorch variant.
( COMPILED_IMPLS=compiled-graph BENCH_LLAMA_COMPILE_TIMEOUT=230 timeout 260 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
