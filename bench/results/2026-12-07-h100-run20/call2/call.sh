# Run 20 call 2: the head merge in the attention's store. .h200/bin.tar.xz holds mgn of ab65224 (before it),
# .h200/new.tar.xz mgn with it (the working tree of this commit); same call, same card.
tar -xJf .h200/bin.tar.xz -C .h200 && tar -xJf .h200/new.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p .fmdata  # not carried: bench-llama does not read it
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
OLD=.h200/bin/mgn NEW=.h200/newbin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. SmolLM2 b1x128 and DINOv3 b8, before / after, twice each (interleaved).
for rep in 1 2; do
  for v in old new; do
    M=$OLD; [ $v = new ] && M=$NEW
    timeout 60 $M bench smollm2-135m --phases inference,flb,step --samples 30 --json $OUT/sm_${v}_$rep.jsonl > /dev/null 2> $OUT/sm_${v}_$rep.err
    timeout 60 $M bench dinov3-vits16 --batch 8 --phases inference,flb,step --json $OUT/d8_${v}_$rep.jsonl > /dev/null 2> $OUT/d8_${v}_$rep.err
  done
done
date >> $OUT/call_log.txt
# 2. The new build's SmolLM2 inference profile.
MGN_PROFILE=1 timeout 60 $NEW bench smollm2-135m --phases inference --samples 10 --json $OUT/sm_prof_new.jsonl > $OUT/sm_prof_new.txt 2>&1
date >> $OUT/call_log.txt
# 3. bench-llama (ours: the new build) with torch.compile + CUDA graphs, eager, eager + CUDA graph.
cp $NEW .h200/bin/mgn
( COMPILED_IMPLS=compiled-graph BENCH_LLAMA_COMPILE_TIMEOUT=230 timeout 330 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
