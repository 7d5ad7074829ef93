// Shared by the libFuzzer targets: the one rule every reader obeys on any input. It either succeeds or throws
// mgn::Error; any other exception escapes LLVMFuzzerTestOneInput and libFuzzer reports it as a crash
// (uncaught exception → abort), as it does a sanitizer report, a leak or a timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mgn/types.h"

namespace mgn::fuzz {

inline std::string text(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }
inline std::vector<uint8_t> bytes(const uint8_t* data, size_t size) { return std::vector<uint8_t>(data, data + size); }

template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const mgn::Error&) {
    // The expected outcome for malformed input.
  }
}

}  // namespace mgn::fuzz
