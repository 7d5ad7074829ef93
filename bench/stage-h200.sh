#!/usr/bin/env bash
# Stages what bench/h200.sh needs into .h200/ (stripped binaries and the oracle files, xz-packed) so that
# one `run` call can carry it with .gl and .fmdata (the carry limit is 64 MiB in all).
# Usage here: bench/stage-h200.sh BUILD_DIR    (a Release build with tests on)
#             STAGE_TESTS="vulkan_gemm_test ..." narrows the test binaries (each ~3 MB packed); STAGE_TESTS=none
#             stages mgn alone, which leaves room in the carry for .fmdata (the bench and cnn jobs need it).
# There:      tar -xJf .h200/bin.tar.xz -C .h200 && bench/h200.sh .h200/bin .fmdata JOB...
set -euo pipefail
B=$(realpath "${1:-build-h200}")
cd "$(dirname "$0")/.."
rm -rf .h200 && mkdir -p .h200/bin/tests
cp "$B/mgn" .h200/bin/
TESTS=${STAGE_TESTS:-vulkan_ops_test vulkan_session_test vulkan_attention_test plan_test vulkan_kernels_test \
  vulkan_gemm_test vulkan_fusion_test vulkan_llama_test}
[ "$TESTS" = none ] && TESTS=""
for t in $TESTS; do
  [ -x "$B/tests/$t" ] && cp "$B/tests/$t" .h200/bin/tests/
done
strip .h200/bin/mgn .h200/bin/tests/* 2>/dev/null || true
# Shared libraries the GPU machine's image lacks (ONNX's protobuf classes, the audio libraries and theirs, and
# Open MPI's, which mgn loads when it was built with MPI even if --data-parallel mpi is not used: without them
# mgn would not start there; a build with -DMGN_MPI=OFF needs none); h200.sh puts lib/ on the path.
mkdir -p .h200/bin/lib
for l in $(ldd .h200/bin/mgn | awk '/libonnx_proto|libprotobuf|libsndfile|libsamplerate|libfftw3|libFLAC|libvorbis|libopus|libogg|libmpg123|libmp3lame|libjpeg|libpng16|libwebp|libmpi|libopen-rte|libopen-pal|libhwloc|libevent|libudev/ {print $3}'); do
  cp -L "$l" .h200/bin/lib/
done
# Real speech for the Whisper job: two ALSA recordings (48 kHz) and an espeak-ng sentence (22.05 kHz).
mkdir -p .h200/audio
cp /usr/share/sounds/alsa/Front_Center.wav /usr/share/sounds/alsa/Rear_Left.wav .h200/audio/
espeak-ng -w .h200/audio/espeak.wav 'Meganeura compiles neural networks for any graphics card with a Vulkan driver.'
# Photographs for the DinoVision job: opencv-doc's JPEGs and python3-skimage's colour photos (about 8 MB).
mkdir -p .h200/photos
cp /usr/share/doc/opencv-doc/examples/data/*.jpg .h200/photos/
for f in astronaut.png chelsea.png coffee.png rocket.jpg motorcycle_left.png hubble_deep_field.jpg retina.jpg; do
  cp "/usr/lib/python3/dist-packages/skimage/data/$f" .h200/photos/
done
[ -n "$TESTS" ] && [ -d "$B/oracle" ] && cp -r "$B/oracle" .h200/bin/oracle
tar -cJf .h200/bin.tar.xz -C .h200 bin && rm -rf .h200/bin
cp bench/h200.sh .h200/h200.sh
# The soak job's tokenizer: the tiny BPE tokenizer the FinetuneThenGenerate test writes (ids below 562).
[ -f "$B/tests/finetune_check/model/tokenizer.json" ] && cp "$B/tests/finetune_check/model/tokenizer.json" .h200/soak-tokenizer.json
[ -d .fmdata ] || { mkdir -p .fmdata && cp /usr/share/datasets/fashion-mnist/*.gz .fmdata/; }
du -sh .h200 .gl .fmdata
