# Run 20, call 3 (calls 1 and 2 never got a machine; under 5 minutes of device time left): SmolLM2-135M with the
# grouped sibling GEMMs and the in-kernel split-K sum both on, then both off (the previous kernels), then the
# per-dispatch profile with both on.
tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
M=.h200/bin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
for cfg in 11 00 11; do
  MGN_GEMM_SIBLINGS=${cfg:0:1} MGN_GEMM_SPLITK_FIXUP=${cfg:1:1} timeout 40 $M bench smollm2-135m --phases inference,flb,step \
    --samples 20 --json $OUT/sm_$cfg.jsonl >> $OUT/sm_$cfg.txt 2>&1
done
MGN_PROFILE=1 timeout 40 $M bench smollm2-135m --phases inference,flb --samples 10 --json $OUT/sm_prof_11.jsonl > $OUT/sm_prof_11.txt 2>&1
cd $O && tar -cJf all.tar.xz r && rm -rf r
