// libFuzzer target for the safetensors reader (the in-memory parse read() shares its header checks with):
// any byte string parses or throws mgn::Error; a parsed tensor converts to f32/f64/i32 without a fault.
#include "fuzz_common.h"
#include "mgn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mgn::fuzz::expect_clean([&] {
    mgn::SafetensorsFile f = mgn::SafetensorsFile::parse(mgn::fuzz::bytes(data, size), "fuzz.safetensors");
    for (const std::string& name : f.names()) {
      const mgn::StoredTensor& t = f.get(name);
      if (t.numel() > (1 << 16)) continue;
      (void)t.to_f32();
      (void)t.to_f64();
      mgn::fuzz::expect_clean([&] { (void)t.to_i32(); });
    }
  });
  return 0;
}
