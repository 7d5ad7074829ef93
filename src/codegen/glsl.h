// The GLSL helper library of every kernel generator (helper-private: not part of the codegen contract in
// kernel.h): render() for the kernels' templates, literals, storage buffers, flat grids, index arithmetic
// specialized to shapes, a small math library and workgroup reductions.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codegen/kernel.h"
#include "mgn/types.h"

namespace mgn::codegen::gl {

// ---- templates ------------------------------------------------------------------------------------------

// `tmpl` with every placeholder ${NAME} (upper-case letters, digits, '_') replaced by its value. Throws
// (an internal error) when the template names a placeholder that `vars` lacks, or `vars` holds one the
// template never names, so a template and its caller cannot drift apart silently.
using Vars = std::initializer_list<std::pair<std::string_view, std::string>>;
std::string render(std::string_view tmpl, Vars vars);

// ---- literals and declarations --------------------------------------------------------------------------

// The GLSL type of one 32-bit storage word of a dtype: float (f32, f16/bf16 stored as f32), int, uint (bool).
const char* type_of(DType t);
// A float literal that round-trips f32 exactly; inf/nan through uintBitsToFloat.
std::string flit(double v);
// An unsigned literal; throws when it does not fit 32 bits.
std::string u(uint64_t v);
// "const uint NAME = Vu;\n" and "const int NAME = V;\n".
std::string const_uint(const std::string& name, uint64_t v);
std::string const_int(const std::string& name, int64_t v);

// "layout(std430, set = 0, binding = i) <qualifiers>buffer Bi { <type> name[]; };" with qualifiers such as
// "readonly ", "writeonly restrict " or "" (read and written).
std::string buffer_as(int binding, const std::string& type, const std::string& name,
                      const std::string& qualifiers);
// A buffer of dtype words (type_of), read-only, write-only or both.
std::string buffer(int binding, const std::string& name, DType t, bool readonly, bool writeonly = false);

// Storage buffers numbered in the order they are added: binding i of the shader is bindings[i]. A written
// buffer is declared writeonly, any other readonly.
struct Buffers {
  std::string decls;
  std::vector<Binding> bindings;
  void add(const std::string& name, Binding b, DType t = DType::F32);
  // The buffer seen as `type` words (vec4 rows; bindings start 16-byte aligned).
  void add_as(const std::string& type, const std::string& name, Binding b);
};
Binding input(int i);
Binding output(int node = 0);

// ---- sizes and grids ------------------------------------------------------------------------------------

uint64_t numel_u(const Shape& s);
// Throws mgn::Error naming `who` when an index space exceeds 32-bit indexing.
void check_32bit(uint64_t n, const std::string& who);

// Workgroups for `total` logical groups, folded into x/y so no count exceeds the device limit.
struct Grid {
  std::array<uint32_t, 3> groups{1, 1, 1};
  std::string glsl;  // declares `uint gid` (flat workgroup index) and returns past `total`
};
Grid flat_groups(uint64_t total_groups, const DeviceCaps& caps, const std::string& who);

// A kernel over a flat element range: `body` sees `uint i` (< total); `comment` follows "archetype: ".
Kernel elementwise(const std::string& name, const std::string& comment, const std::string& decls,
                   const std::string& body, uint64_t total, std::vector<Binding> bindings,
                   const DeviceCaps& caps);

// A lowering of one kernel.
Lowering one_kernel(Kernel k);

// ---- index arithmetic -----------------------------------------------------------------------------------

// A strided view dimension; merge_dims() fuses neighbours that are contiguous and drops size-1 dims.
struct Dim {
  int64_t size, stride;
};
std::vector<Dim> merge_dims(const std::vector<Dim>& dims);
std::vector<int64_t> strides(const Shape& s);
// The dims of a permute's output (`out`) as a strided view of its row-major input `in`: out[d] walks input axis
// perm[d] (negative axes count from the end).
std::vector<Dim> permuted_dims(const Shape& in, const Shape& out, const std::vector<int64_t>& perm);
// GLSL statements adding to `acc` the offset of flat index `var` unravelled over `dims` (row-major); `var`
// is consumed (a copy named tmp is used).
std::string offset_code(const std::vector<Dim>& dims, const std::string& var, const std::string& acc,
                        const std::string& tmp);
// A function `uint name(uint i)` mapping a flat index of `out` to the flat index of `in` broadcast to it.
std::string broadcast_fn(const std::string& name, const Shape& in, const Shape& out);
// Statements declaring `uint c0..c{r-1}` = coordinates of flat index `var` in `shape`.
std::string unravel(const Shape& shape, const std::string& var, const std::string& prefix);
// Statements (at `indent`) declaring the named coordinates of flat index `var` over `dims`, outermost
// first, through a scratch copy `r_`.
std::string unflatten(const std::string& var, const std::vector<std::pair<std::string, uint64_t>>& dims,
                      const std::string& indent);

// ---- libraries ------------------------------------------------------------------------------------------

// Functions every generated kernel may call: mgn_nan(), mgn_erf, mgn_tanh, mgn_sigmoid, mgn_log1p.
std::string math_lib();

// Workgroup size for one-workgroup-per-row reductions over `m` elements (power of two, 32..256).
uint32_t row_workgroup(uint64_t m, const DeviceCaps& caps);
// Shared-memory tree reductions for a workgroup of `wg` threads: float wg_sum(float), float wg_max(float).
// Call from uniform control flow; each call ends with a barrier so they can be chained.
std::string wg_reduce_lib(uint32_t wg);
// The statements of a shared-memory tree reduction over `wg` threads (thread index `t`, at `indent`): for
// each halving stride s, threads t < s run `combine` (which sees t and s), then a barrier.
std::string tree_reduce(uint32_t wg, const std::string& combine, const std::string& indent);

}  // namespace mgn::codegen::gl
