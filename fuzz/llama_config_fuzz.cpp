// libFuzzer target for a Hugging Face config.json (Llama family): any text parses into a validated config
// or throws mgn::Error; a valid config lists its parameter shapes without a fault (sizes are bounded).
#include "fuzz_common.h"
#include "mgn/llama.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mgn::fuzz::expect_clean([&] {
    mgn::llama::Config c = mgn::llama::Config::from_json(mgn::fuzz::text(data, size), "fuzz/config.json");
    int64_t total = 0;
    for (const auto& [name, shape] : mgn::llama::parameter_shapes(c)) total += mgn::numel(shape);
    (void)total;
  });
  return 0;
}
