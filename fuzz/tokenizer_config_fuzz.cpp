// libFuzzer target for tokenizer_config.json (bos_token / eos_token), applied to a fixed small tokenizer.
#include "fuzz_common.h"
#include "mgn/tokenizer.h"

namespace {

const char* kTokenizer = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<s>": 3, "</s>": 4},
  "merges": ["a b"]}, "added_tokens": [{"id": 3, "content": "<s>", "special": true},
  {"id": 4, "content": "</s>", "special": true}], "pre_tokenizer": {"type": "ByteLevel"},
  "decoder": {"type": "ByteLevel"}})";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Parsed once: apply_config's outcome does not depend on the bos/eos an earlier input left, and re-parsing
  // the fixed tokenizer every time made this target 100x slower.
  static mgn::Tokenizer tok = mgn::Tokenizer::from_json(kTokenizer, "fixed/tokenizer.json");
  mgn::fuzz::expect_clean([&] {
    tok.apply_config(mgn::fuzz::text(data, size), "fuzz/tokenizer_config.json", "fixed/tokenizer.json");
  });
  return 0;
}
