tar -xJf .h200/bin.tar.xz -C .h200
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
O=$OUT; export OUT=$O/r; mkdir -p $OUT
export LD_LIBRARY_PATH=$PWD/.h200/bin/lib MGN_VALIDATION=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/env.txt 2>&1
date > $OUT/call_log.txt
( COMPILED_IMPLS=" " timeout 200 bash bench/h200.sh .h200/bin .fmdata bench-llama ) >> $OUT/call_log.txt 2>&1
date >> $OUT/call_log.txt
cd $O && tar -cJf all.tar.xz r && rm -rf r
