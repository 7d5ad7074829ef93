tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. GEMM microbench: vec4-along-K loads on and off, Whisper b8 / SmolLM2 / 4096^3 shapes, with register counts.
for kv in 1 0; do
  MGN_GEMM_K_VEC4=$kv MGN_PIPELINE_STATS=1 timeout 120 $M bench-gemm --backend vulkan --layout nt --tag kv$kv \
    12000x1536x384 12000x384x1536 12000x384x384 128x576x576 128x1536x576 128x576x1536 4096x4096x4096 \
    > $OUT/gemm_nt_kv$kv.jsonl 2> $OUT/gemm_nt_kv$kv.stats.txt
  MGN_GEMM_K_VEC4=$kv MGN_PIPELINE_STATS=1 timeout 60 $M bench-gemm --backend vulkan --layout nn --tag kv$kv \
    12000x384x1536 4096x4096x4096 > $OUT/gemm_nn_kv$kv.jsonl 2> $OUT/gemm_nn_kv$kv.stats.txt
done
date >> $OUT/call_log.txt
# Whisper b8 attention products: P.V (N = 64) in other blocks; Q.K^T (K = 64) with and without vec4-along-K.
for t in auto 256x64x8,t8x8 256x64x16,t8x8 128x64x16 128x64x8,t8x4; do
  MGN_PIPELINE_STATS=1 timeout 60 $M bench-gemm --backend vulkan --layout nn --tile $t --tag pv_$t 48x1500x64x1500 >> $OUT/gemm_pv.jsonl 2>> $OUT/gemm_pv.err
done
for kv in 1 0; do
  MGN_GEMM_K_VEC4=$kv timeout 60 $M bench-gemm --backend vulkan --layout nt --tag qk_kv$kv 48x1500x1500x64 >> $OUT/gemm_qk.jsonl 2>> $OUT/gemm_qk.err
done
# Weight gradients of Whisper b8's linears: batched over 8 (K = 1500) or folded (K = 12000), tiles.
for t in auto 128x128x8,s8 128x128x8,s16 128x64x16,s8 64x64x16,s4; do
  timeout 60 $M bench-gemm --backend vulkan --layout tn --tile $t --tag dw_$t 8x384x384x1500 384x384x12000 1536x384x12000 >> $OUT/gemm_dw.jsonl 2>> $OUT/gemm_dw.err
done
date >> $OUT/call_log.txt
# 2. Whisper b8, ours, both settings, all phases; then the profile of F+L+B.
for kv in 1 0; do
  MGN_GEMM_K_VEC4=$kv timeout 150 $M bench whisper-tiny-encoder --batch 8 --json $OUT/w8_kv$kv.jsonl > $OUT/w8_kv$kv.txt 2>&1
done
date >> $OUT/call_log.txt
MGN_PROFILE=1 MGN_PIPELINE_STATS=1 timeout 90 $M bench whisper-tiny-encoder --batch 8 --warmup 3 --warmup-ms 100 --samples 10 --phases flb > $OUT/w8_flb_profile.txt 2>&1
date >> $OUT/call_log.txt
# 3. SmolLM2 b1x128, ours, both settings.
for kv in 1 0; do
  MGN_GEMM_K_VEC4=$kv timeout 120 $M bench smollm2-135m --json $OUT/sm_kv$kv.jsonl > $OUT/sm_kv$kv.txt 2>&1
done
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
