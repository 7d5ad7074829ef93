// libFuzzer target for the IDX reader (Fashion-MNIST's format), on the decompressed bytes.
#include "fuzz_common.h"
#include "mgn/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mgn::fuzz::expect_clean([&] { (void)mgn::parse_idx(mgn::fuzz::bytes(data, size), "fuzz.idx"); });
  return 0;
}
