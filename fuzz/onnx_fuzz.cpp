// libFuzzer target for the ONNX importer: any byte string must either import or throw mgn::Error.
// Build: cmake -B build-fuzz -DCMAKE_CXX_COMPILER=clang++ -DMGN_FUZZ=ON && cmake --build build-fuzz -t onnx_fuzz
// Run:   ./build-fuzz/onnx_fuzz -max_total_time=60 corpus/   (seed corpus: any .onnx files)
#include <cstddef>
#include <cstdint>
#include <string>

#include "mgn/types.h"
#include "mgn/onnx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)mgn::onnx::inspect_bytes(bytes, "fuzz");
    (void)mgn::onnx::import_bytes(bytes, "fuzz");
  } catch (const mgn::Error&) {
    // Expected for malformed input; anything else (crash, other exception type) is a bug.
  }
  return 0;
}
