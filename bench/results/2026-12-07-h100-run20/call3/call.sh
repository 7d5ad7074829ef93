# Run 20 call 3 (build fc277f3): ResNet-50 b4 against eager and eager + CUDA graph in the same call, and
# SmolLM2's compile cold / warm / warm with the one-read session-cache load.
tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p .fmdata  # not carried: neither job reads it
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
# 1. Compile of SmolLM2's four sessions: an empty cache folder, then twice warm (fresh processes).
for i in cold warm warm2; do
  MGN_CACHE_DIR=/tmp/cc-sm timeout 60 $M bench smollm2-135m --phases compile --verbose --json $OUT/sm_compile_$i.jsonl > /dev/null 2> $OUT/sm_compile_$i.err
done
date >> $OUT/call_log.txt
# 2. bench-resnet: ours strict and accelerated, PyTorch eager and eager + CUDA graph (no torch.compile).
( COMPILED_IMPLS=" " timeout 300 bash bench/h200.sh .h200/bin .fmdata bench-resnet ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
