// Numerics trace: with the build option MGN_NUMERICS_TRACE=<dir>, every tensor a backend hands back to its
// caller (CPU executor outputs and state; every Vulkan download) is hashed into one file per process under
// <dir>, in order, and so is the SPIR-V of every kernel a Vulkan session compiles ("vk.spirv"). Two builds traced over the same test run can then be compared bitwise
// (scripts/numerics-trace.sh, scripts/numerics-compare.py): a refactor that claims not to move numerics
// proves it. Compiled out (an empty inline function) otherwise.
#pragma once

#include <cstddef>

namespace mgn::trace {

#ifdef MGN_NUMERICS_TRACE_DIR
void record(const char* what, const void* data, size_t bytes);
#else
inline void record(const char*, const void*, size_t) {}
#endif

}  // namespace mgn::trace
