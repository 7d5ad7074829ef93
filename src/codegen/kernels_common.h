// Small GLSL-emitting helpers shared by the matmul/norm/conv/attention generators (helper-private: not part
// of the codegen contract in kernel.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "codegen/kernel.h"
#include "mgn/types.h"

namespace mgn::codegen::detail {

// A float literal GLSL parses as float whatever the value ("1e-05" alone would be fine, "1" would not).
inline std::string flit(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

inline std::string u(uint64_t v) {
  if (v > 0xffffffffull) throw Error("codegen: index " + std::to_string(v) + " does not fit 32 bits");
  return std::to_string(v) + "u";
}

// One storage buffer declaration: binding i is float data named `name`.
inline std::string buffer_decl(int binding, const std::string& name, bool write, bool read = true) {
  std::string q = write ? (read ? "" : "writeonly ") : "readonly ";
  return "layout(std430, set = 0, binding = " + std::to_string(binding) + ") " + q + "buffer B" +
         std::to_string(binding) + " { float " + name + "[]; };\n";
}

// Workgroups for `total` logical groups, folded into x/y so no count exceeds the device limit; the shader
// recovers the flat index with flat_group_glsl() and returns when it is past the end.
struct Grid {
  std::array<uint32_t, 3> groups{1, 1, 1};
  std::string glsl;  // declares `uint gid` and returns early for padding groups
};

inline Grid flat_grid(uint64_t total, const DeviceCaps& caps) {
  Grid g;
  uint64_t gx = std::min<uint64_t>(std::max<uint64_t>(total, 1), caps.max_workgroup_count[0]);
  uint64_t gy = div_up(std::max<uint64_t>(total, 1), gx);
  if (gy > caps.max_workgroup_count[1]) throw Error("codegen: " + std::to_string(total) + " workgroups exceed the device grid");
  g.groups = {uint32_t(gx), uint32_t(gy), 1};
  g.glsl = "  uint gid = gl_WorkGroupID.x + gl_WorkGroupID.y * " + u(gx) + ";\n  if (gid >= " + u(total) +
           ") return;\n";
  return g;
}

// A one-thread-per-element kernel over `total` elements: `body` sees `uint i` (the element) and the
// buffers declared in `decls`.
inline Kernel elementwise_kernel(const std::string& name, const std::string& decls, const std::string& body,
                                 uint64_t total, std::vector<Binding> bindings, const DeviceCaps& caps) {
  const uint32_t wg = std::min<uint32_t>(256, caps.max_workgroup_invocations);
  Grid grid = flat_grid(div_up(total, wg), caps);
  Kernel k;
  k.name = name;
  k.glsl = "#version 450\n// " + name + "\nlayout(local_size_x = " + std::to_string(wg) + ") in;\n" + decls +
           "void main() {\n" + grid.glsl + "  uint i = gid * " + u(wg) + " + gl_LocalInvocationID.x;\n  if (i >= " +
           u(total) + ") return;\n" + body + "}\n";
  k.bindings = std::move(bindings);
  k.groups = grid.groups;
  return k;
}

inline uint64_t numel_u(const Shape& s) {
  uint64_t n = 1;
  for (int64_t d : s) n *= uint64_t(d);
  return n;
}

}  // namespace mgn::codegen::detail
