tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# Ours, this build, strict: SmolLM2, Whisper b1, DINOv3 b8 (all phases).
timeout 100 $M bench smollm2-135m --json $OUT/sm.jsonl > /dev/null 2> $OUT/sm.err
timeout 60 $M bench whisper-tiny-encoder --batch 1 --json $OUT/w1.jsonl > /dev/null 2> $OUT/w1.err
timeout 80 $M bench dinov3-vits16 --batch 8 --json $OUT/d8.jsonl > /dev/null 2> $OUT/d8.err
date >> $OUT/call_log.txt
# Whisper b8 against PyTorch (eager, CUDA graph, torch.compile + CUDA graph), gates.
( WHISPER_BATCHES=8 COMPILED_IMPLS=compiled-graph BENCH_WHISPER_COMPILE_TIMEOUT=150 timeout 330 bash bench/h200.sh .h200/bin .fmdata bench-whisper ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
