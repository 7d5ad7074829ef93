// libFuzzer target for tokenizer.json: any text loads or throws mgn::Error; a loaded tokenizer encodes
// fixed strings and the input itself, and decodes what it encoded, without a fault.
#include "fuzz_common.h"
#include "mgn/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s = mgn::fuzz::text(data, size);
  mgn::fuzz::expect_clean([&] {
    mgn::Tokenizer tok = mgn::Tokenizer::from_json(s, "fuzz/tokenizer.json");
    for (const std::string& t : {std::string("Hello, world! 123 <|endoftext|>"), s.substr(0, 256)}) {
      std::vector<int32_t> ids = tok.encode(t, true);
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
    }
  });
  return 0;
}
