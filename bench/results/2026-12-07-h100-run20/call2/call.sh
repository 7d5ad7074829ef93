# Run 20, call 2 (call 1 never got a machine; the device budget left for one short call): grouped sibling GEMMs
# (KernelOptions::gemm_siblings) and the in-kernel split-K sum (KernelOptions::gemm_splitk_fixup) on and off, the
# per-dispatch profile, and the PyTorch eager / CUDA-graph anchor for SmolLM2 in the same call (torch.compile + CUDA
# graphs left out for time: its figures are run 19's, another lease).
tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. SmolLM2-135M b1x128, all phases: both on, both off (the previous kernels), each alone.
for cfg in 11 00 10 01; do
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 40 $M bench smollm2-135m --phases inference,flb,step \
    --samples 20 --json $OUT/sm_$cfg.jsonl >> $OUT/sm_$cfg.txt 2>&1
done
date >> $OUT/call_log.txt
# 2. bench-llama: ours next to PyTorch eager and eager + CUDA graphs.
( COMPILED_IMPLS=" " timeout 150 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
# 3. The per-dispatch profile with both on (inference and F+L+B).
MGN_PROFILE=1 timeout 40 $M bench smollm2-135m --phases inference,flb --samples 10 --json $OUT/sm_prof_11.jsonl > $OUT/sm_prof_11.txt 2>&1
date >> $OUT/call_log.txt
# 4. Whisper b8 and DINOv3 b8: both on, both off.
for cfg in 11 00; do
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 40 $M bench whisper-tiny-encoder --batch 8 \
    --phases inference,flb --samples 15 --json $OUT/wh8_$cfg.jsonl >> $OUT/wh8_$cfg.txt 2>&1
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 40 $M bench dinov3-vits16 --batch 8 \
    --phases inference,flb --samples 15 --json $OUT/dn8_$cfg.jsonl >> $OUT/dn8_$cfg.txt 2>&1
done
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
