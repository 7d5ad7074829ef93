// Elementwise indexing along one axis: gather_elements (a thread per index position reads data there) and
// scatter_elements (a thread per output element walks the index positions that may write it, in index order,
// so duplicates combine in the CPU reference's order and no atomics are needed). Negative indices count from
// the end; an index out of range reads 0 (gather) or writes nothing (scatter), as gather does on the GPU.
#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::u;

// `off` += coordinate * stride over every axis but `axis`, the coordinates named c0.. (gl::unravel).
std::string offset_without_axis(const std::vector<int64_t>& strides, int axis, const std::string& off) {
  std::string s = "  uint " + off + " = 0u;\n";
  for (size_t d = 0; d < strides.size(); ++d)
    if (int(d) != axis) s += "  " + off + " += c" + std::to_string(d) + " * " + u(uint64_t(strides[d])) + ";\n";
  return s;
}

// `int k = idx[p]` wrapped into [0, dim) when negative; `ok` says whether it is in range.
std::string load_index(const std::string& p, int64_t dim, const std::string& indent) {
  return gl::render(R"(${I}int k = idx[${P}];
${I}if (k < 0) k += ${DIM};
${I}bool ok = k >= 0 && k < ${DIM};
)",
                    {{"I", indent}, {"P", p}, {"DIM", std::to_string(dim)}});
}

}  // namespace

Lowering lower_gather_elements(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const ir::Node &data = ctx.input(0), &idx = ctx.input(1);
  const int axis = int(n.attrs.i("axis"));
  const std::string who = ctx.graph.describe(n.id);
  gl::check_32bit(gl::numel_u(data.shape), who);
  gl::check_32bit(gl::numel_u(idx.shape), who);
  gl::Buffers b;
  b.add("x", gl::input(0), data.dtype);
  b.add("idx", gl::input(1), DType::I32);
  b.add("y", gl::output(), n.dtype);
  const std::vector<int64_t> ds = gl::strides(data.shape);
  std::string body = gl::unravel(idx.shape, "i", "c") + offset_without_axis(ds, axis, "off") + load_index("i", data.shape[size_t(axis)], "  ") +
                     gl::render("  y[i] = ok ? x[off + uint(k) * ${STRIDE}] : ${ZERO};\n",
                                {{"STRIDE", u(uint64_t(ds[size_t(axis)]))},
                                 {"ZERO", std::string(gl::type_of(n.dtype)) + "(0)"}});
  const std::string key = "data " + shape_str(data.shape) + " axis " + std::to_string(axis) + " indices " +
                          shape_str(idx.shape);
  return gl::one_kernel(gl::elementwise("gather_elements_" + shape_str(data.shape) + "_a" + std::to_string(axis) +
                                            "_idx" + shape_str(idx.shape),
                                        "data gather_elements " + key, b.decls, body, gl::numel_u(n.shape),
                                        b.bindings, ctx.caps));
}

Lowering lower_scatter_elements(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const ir::Node &data = ctx.input(0), &idx = ctx.input(1);
  const int axis = int(n.attrs.i("axis"));
  const std::string& reduction = n.attrs.s("reduction");
  const std::string who = ctx.graph.describe(n.id);
  gl::check_32bit(gl::numel_u(data.shape), who);
  gl::check_32bit(gl::numel_u(idx.shape), who);
  gl::Buffers b;
  b.add("x", gl::input(0), data.dtype);
  b.add("idx", gl::input(1), DType::I32);
  b.add("upd", gl::input(2), data.dtype);
  b.add("y", gl::output(), n.dtype);
  // The index positions that may write output element i lie on one line along `axis`: the one whose other
  // coordinates are i's, which exists only where every such coordinate is within the indices' extent.
  std::string inside = "true";
  for (size_t d = 0; d < idx.shape.size(); ++d)
    if (int(d) != axis && idx.shape[d] < data.shape[d]) inside += " && c" + std::to_string(d) + " < " + u(uint64_t(idx.shape[d]));
  const bool is_float_data = is_float(data.dtype);
  const std::string combine = reduction == "add"   ? "v + w"
                              : reduction == "mul" ? "v * w"
                              : reduction == "max" ? (is_float_data ? "(isnan(v) || isnan(w)) ? mgn_nan() : max(v, w)" : "max(v, w)")
                              : reduction == "min" ? (is_float_data ? "(isnan(v) || isnan(w)) ? mgn_nan() : min(v, w)" : "min(v, w)")
                                                   : "w";
  const std::vector<int64_t> is = gl::strides(idx.shape);
  std::string body = gl::unravel(data.shape, "i", "c") + offset_without_axis(is, axis, "line") +
                     gl::render(R"(  ${T} v = x[i];
  if (${INSIDE}) {
    for (uint j = 0u; j < ${LEN}; ++j) {
      uint p = line + j * ${STRIDE};
${LOAD}      if (ok && uint(k) == c${AXIS}) {
        ${T} w = upd[p];
        v = ${COMBINE};
      }
    }
  }
  y[i] = v;
)",
                                {{"T", gl::type_of(data.dtype)},
                                 {"INSIDE", inside},
                                 {"LEN", u(uint64_t(idx.shape[size_t(axis)]))},
                                 {"STRIDE", u(uint64_t(is[size_t(axis)]))},
                                 {"LOAD", load_index("p", data.shape[size_t(axis)], "      ")},
                                 {"AXIS", std::to_string(axis)},
                                 {"COMBINE", combine}});
  const std::string key = "data " + shape_str(data.shape) + " axis " + std::to_string(axis) + " indices " +
                          shape_str(idx.shape) + " reduction " + reduction;
  return gl::one_kernel(gl::elementwise("scatter_elements_" + reduction + "_" + shape_str(data.shape) + "_a" +
                                            std::to_string(axis) + "_idx" + shape_str(idx.shape),
                                        "data scatter_elements " + key, b.decls + gl::math_lib(), body,
                                        gl::numel_u(n.shape), b.bindings, ctx.caps));
}

}  // namespace mgn::codegen
