// libFuzzer target for the NNEF reader: the graph.nnef parser and graph builder, and the .dat tensor reader.
// An input starting with the tensor magic (0x4E 0xEF) is read as a .dat file; any other input is split at its
// first NUL byte into graph text and the bytes every variable's .dat file holds. Each must build or throw
// mgn::Error. Seeds: fuzz/corpus/nnef_fuzz/ (fuzz/make_corpus.py).
#include "fuzz_common.h"
#include "mgn/nnef.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = mgn::fuzz::text(data, size);
  if (size >= 2 && data[0] == 0x4E && data[1] == 0xEF) {
    mgn::fuzz::expect_clean([&] { (void)mgn::nnef::read_tensor_bytes(in, "fuzz.dat"); });
    return 0;
  }
  const size_t nul = in.find('\0');
  const std::string text = in.substr(0, nul);
  const std::string dat = nul == std::string::npos ? std::string() : in.substr(nul + 1);
  mgn::fuzz::expect_clean([&] { (void)mgn::nnef::inspect_text(text, "fuzz.nnef"); });
  mgn::fuzz::expect_clean([&] {
    (void)mgn::nnef::import_text(text, "fuzz.nnef", [&](const std::string&) -> std::optional<std::string> {
      if (dat.empty()) return std::nullopt;
      return dat;
    });
  });
  return 0;
}
