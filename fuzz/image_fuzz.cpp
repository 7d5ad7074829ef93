// libFuzzer target for the image decoders (JPEG, PNG, WebP by their magic bytes), on the file's bytes.
#include "fuzz_common.h"
#include "mgn/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A pixel cap well under the default keeps each input's allocation small; a larger header is refused.
  mgn::fuzz::expect_clean([&] { (void)mgn::image::decode({data, size}, "fuzz.img", int64_t(1) << 22); });
  return 0;
}
