# Pending (written 2026-12-08, not run: no GPU machine was lent that session). Run from the repository root on the
# GPU machine with carry [".gl", ".h200/bin.tar.xz", ".h200/new.tar.xz"]; results under $OUT/all.tar.xz. Staging:
# a build of 3b96743 through `STAGE_TESTS=none bash bench/stage-h200.sh build` (.h200/bin.tar.xz), then this tree's
# stripped mgn as newbin/mgn in .h200/new.tar.xz, and ../shared/tools/vulkan-loader-bundle.sh (.gl/).
# .h200/bin.tar.xz: mgn of 3b96743; .h200/new.tar.xz: mgn with the conv K splits, the empty
# stride phases skipped, each stride phase on its own taps and the glslang warm-up (ec24040). Same call, same card:
# 1. ResNet-50 b4 old / new interleaved twice, DinoVision's decoder b8 and the U-Net old / new, and ResNet-50 new
#    with MGN_CONV_SPLITS=1 (splits off, phase skip on);
# 2. the per-kernel profile of ResNet-50 inference and F+L+B, old and new;
# 3. SmolLM2's compile cold / warm / warm, old and new (own cache folders);
# 4. bench-resnet (ours: new) against eager, eager + CUDA graph and torch.compile + CUDA graph.
tar -xJf .h200/bin.tar.xz -C .h200 && tar -xJf .h200/new.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
mkdir -p .fmdata  # not carried: no job here reads it
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
OLD=.h200/bin/mgn NEW=.h200/newbin/mgn
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
for rep in 1 2; do
  for v in old new; do
    M=$OLD; [ $v = new ] && M=$NEW
    timeout 90 $M bench resnet50 --phases inference,flb,step --json $OUT/rn_${v}_$rep.jsonl > /dev/null 2> $OUT/rn_${v}_$rep.err
  done
done
for v in old new; do
  M=$OLD; [ $v = new ] && M=$NEW
  timeout 60 $M bench dinovision --batch 8 --phases inference,flb,step --json $OUT/dv8_${v}.jsonl > /dev/null 2> $OUT/dv8_${v}.err
  timeout 60 $M bench sd-unet-small --phases inference,flb,step --json $OUT/unet_${v}.jsonl > /dev/null 2> $OUT/unet_${v}.err
done
MGN_CONV_SPLITS=1 timeout 90 $NEW bench resnet50 --phases inference,flb,step --json $OUT/rn_nosplit.jsonl > /dev/null 2> $OUT/rn_nosplit.err
date >> $OUT/call_log.txt
for v in old new; do
  M=$OLD; [ $v = new ] && M=$NEW
  MGN_PROFILE=1 timeout 90 $M bench resnet50 --phases inference,flb --samples 10 --json $OUT/rn_prof_$v.jsonl > $OUT/rn_prof_$v.txt 2>&1
done
date >> $OUT/call_log.txt
for v in old new; do
  M=$OLD; [ $v = new ] && M=$NEW
  for i in cold warm warm2; do
    MGN_CACHE_DIR=/tmp/cc-sm-$v timeout 60 $M bench smollm2-135m --phases compile --verbose --json $OUT/sm_compile_${v}_$i.jsonl > /dev/null 2> $OUT/sm_compile_${v}_$i.err
  done
done
date >> $OUT/call_log.txt
cp $NEW .h200/bin/mgn
( COMPILED_IMPLS=compiled-graph BENCH_RESNET_COMPILE_TIMEOUT=150 timeout 280 bash bench/h200.sh .h200/bin .fmdata bench-resnet ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
