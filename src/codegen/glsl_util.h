// GLSL-emitting helpers of the pointwise, reduction, data-movement and loss generators: typed storage
// buffers, literals, flat grids, index arithmetic specialized to shapes, and a small math library.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel.h"
#include "mgn/types.h"

namespace mgn::codegen::gl {

// The GLSL type of one 32-bit storage word of a dtype: float (f32, f16/bf16 stored as f32), int, uint (bool).
const char* type_of(DType t);
// A float literal that round-trips f32 exactly; inf/nan through uintBitsToFloat.
std::string flit(double v);
// An unsigned literal; throws when it does not fit 32 bits.
std::string u(uint64_t v);
// "layout(std430, set = 0, binding = i) [readonly|writeonly] buffer Bi { T name[]; };"
std::string buffer(int binding, const std::string& name, DType t, bool readonly, bool writeonly = false);
uint64_t numel_u(const Shape& s);
// Throws mgn::Error naming `who` when an index space exceeds 32-bit indexing.
void check_32bit(uint64_t n, const std::string& who);

// One thread per element (local size 256) or one workgroup per row; groups folded into x/y so no count
// exceeds the device limit.
struct Grid {
  std::array<uint32_t, 3> groups{1, 1, 1};
  std::string glsl;  // declares `uint gid` (flat workgroup index) and returns past `total`
};
Grid flat_groups(uint64_t total_groups, const DeviceCaps& caps, const std::string& who);

// A strided view dimension; merge_dims() fuses neighbours that are contiguous and drops size-1 dims.
struct Dim {
  int64_t size, stride;
};
std::vector<Dim> merge_dims(const std::vector<Dim>& dims);
std::vector<int64_t> strides(const Shape& s);
// GLSL statements adding to `acc` the offset of flat index `var` unravelled over `dims` (row-major); `var`
// is consumed (a copy named tmp is used).
std::string offset_code(const std::vector<Dim>& dims, const std::string& var, const std::string& acc,
                        const std::string& tmp);
// A function `uint name(uint i)` mapping a flat index of `out` to the flat index of `in` broadcast to it.
std::string broadcast_fn(const std::string& name, const Shape& in, const Shape& out);
// Statements declaring `uint c0..c{r-1}` = coordinates of flat index `var` in `shape`.
std::string unravel(const Shape& shape, const std::string& var, const std::string& prefix);

// Functions every generated kernel may call: mgn_nan(), mgn_erf, mgn_tanh, mgn_sigmoid, mgn_log1p.
std::string math_lib();

// A kernel over a flat element range: `body` sees `uint i` (< total).
Kernel elementwise(const std::string& name, const std::string& comment, const std::string& decls,
                   const std::string& body, uint64_t total, std::vector<Binding> bindings, const DeviceCaps& caps);

// Workgroup size for one-workgroup-per-row reductions over `m` elements (power of two, 32..256).
uint32_t row_workgroup(uint64_t m, const DeviceCaps& caps);
// Shared-memory tree reductions for a workgroup of `wg` threads: float wg_sum(float), float wg_max(float).
// Call from uniform control flow; each call ends with a barrier so they can be chained.
std::string wg_reduce_lib(uint32_t wg);

}  // namespace mgn::codegen::gl
