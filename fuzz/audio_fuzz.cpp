// libFuzzer target for the sound-file reader (libsndfile behind mgn::audio::read: WAV and the other formats it
// detects), through a file, as users reach it: the bytes go to a temporary file that is read back.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "fuzz_common.h"
#include "mgn/audio.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/mgn_audio_fuzz_" + std::to_string(getpid()) + ".wav";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  mgn::fuzz::expect_clean([&] { (void)mgn::audio::read(path); });
  return 0;
}
