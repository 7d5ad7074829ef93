tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. SmolLM2 b1x128: grouped sibling GEMMs (S) and split-K fixup (F) on/off.
for sf in 11 00 10 01; do
  MGN_GEMM_SIBLINGS=${sf:0:1} MGN_GEMM_SPLITK_FIXUP=${sf:1:1} timeout 60 $M bench smollm2-135m --phases inference,flb,step \
    --samples 20 --json $OUT/sm_sf$sf.jsonl > /dev/null 2> $OUT/sm_sf$sf.err
done
date >> $OUT/call_log.txt
# 2. Per-kernel profile of the default build (inference, flb).
MGN_PROFILE=1 timeout 60 $M bench smollm2-135m --phases inference,flb --samples 10 --json $OUT/sm_prof.jsonl > $OUT/sm_prof.txt 2>&1
date >> $OUT/call_log.txt
# 3. Whisper b8 and DINOv3 b8, both features on and off.
for sf in 11 00; do
  MGN_GEMM_SIBLINGS=${sf:0:1} MGN_GEMM_SPLITK_FIXUP=${sf:1:1} timeout 60 $M bench whisper-tiny-encoder --batch 8 --phases inference,flb,step --json $OUT/w8_sf$sf.jsonl > /dev/null 2> $OUT/w8_sf$sf.err
  MGN_GEMM_SIBLINGS=${sf:0:1} MGN_GEMM_SPLITK_FIXUP=${sf:1:1} timeout 60 $M bench dinov3-vits16 --batch 8 --phases inference,flb,step --json $OUT/d8_sf$sf.jsonl > /dev/null 2> $OUT/d8_sf$sf.err
done
date >> $OUT/call_log.txt
# 4. bench-llama with torch.compile + CUDA graphs (mode="reduce-overhead"), eager, eager + graph; ours default.
( COMPILED_IMPLS=compiled-graph BENCH_LLAMA_COMPILE_TIMEOUT=230 timeout 330 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
