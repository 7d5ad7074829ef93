tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. vec4-along-K per operand: off, A only, B only, both (50 samples per shape).
for kv in 0 a b 1; do
  MGN_GEMM_K_VEC4=$kv MGN_PIPELINE_STATS=1 timeout 100 $M bench-gemm --backend vulkan --layout nt --tag kv$kv --samples 50 \
    12000x384x1536 12000x1536x384 4096x4096x4096 128x576x576 128x1536x576 128x576x1536 128x49152x576 \
    >> $OUT/gemm_nt.jsonl 2>> $OUT/gemm_nt_stats.txt
done
date >> $OUT/call_log.txt
# 2. SmolLM2 b1x128: per-kernel profiles, vec4-along-K off / A only / both.
for kv in 0 a 1; do
  MGN_GEMM_K_VEC4=$kv MGN_PROFILE=1 timeout 90 $M bench smollm2-135m --phases inference,flb --samples 10 --json $OUT/sm_prof_kv$kv.jsonl > $OUT/sm_prof_kv$kv.txt 2>&1
done
date >> $OUT/call_log.txt
# 3. bench-llama with torch.compile + CUDA graphs (mode="reduce-overhead").
( COMPILED_IMPLS=compiled-graph BENCH_LLAMA_COMPILE_TIMEOUT=230 timeout 330 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
