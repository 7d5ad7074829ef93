#!/usr/bin/env bash
# Stages what bench/h200.sh needs into .h200/ (stripped binaries and the oracle files, xz-packed) so that
# one `run` call can carry it with .gl and .fmdata (the carry limit is 64 MiB in all).
# Usage here: bench/stage-h200.sh BUILD_DIR    (a Release build with tests on)
#             STAGE_TESTS="vulkan_gemm_test ..." narrows the test binaries (each ~3 MB packed); STAGE_TESTS=none
#             stages mgn alone, which leaves room in the carry for .fmdata (the bench and cnn jobs need it).
#             STAGE_LLAMA_CPP=1 also stages the llama.cpp peer of the job llama-cpp (below; about 9 MB packed).
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
# The llama.cpp peer (job llama-cpp): scripts/fetch-llama-cpp.sh builds it into $LLAMA_CPP_BUILD (default
# build-llama-cpp/, git-ignored; npm registry, pinned version), then llama-bench (stripped), its VERSION and
# license and only the libraries it loads are packed: libllama, libllama-common, libggml, libggml-base,
# libggml-vulkan (43 MB of shaders, 4.7 MB packed) and 8 of the 15 libggml-cpu variants (ggml picks the best the
# host's CPU runs; x64 and sse42 run anywhere): about 9 MB. The carry is 64 MiB in all and today's .h200 + .gl +
# .fmdata hold about 55 MB, so the call that runs llama-cpp carries .h200 and .gl without .fmdata (the job reads
# no data folder).
if [ "${STAGE_LLAMA_CPP:-0}" = 1 ]; then
  LCB=${LLAMA_CPP_BUILD:-build-llama-cpp}
  scripts/fetch-llama-cpp.sh "$LCB"
  mkdir -p .h200/llama-cpp
  for f in llama-bench VERSION LICENSE-llama.cpp libggml-base.so libggml-vulkan.so libllama-common.so \
           libggml-cpu-{x64,sse42,haswell,skylakex,icelake,sapphirerapids,zen4,alderlake}.so; do
    cp "$LCB/$f" .h200/llama-cpp/
  done
  cp "$LCB"/libllama.*.so "$LCB"/libggml.*.so .h200/llama-cpp/  # names carry the release (libllama.vulkan.v0.5.0.so)
  strip .h200/llama-cpp/llama-bench
  tar -cJf .h200/llama-cpp.tar.xz -C .h200 llama-cpp && rm -rf .h200/llama-cpp
fi
du -sh .h200 .gl .fmdata
