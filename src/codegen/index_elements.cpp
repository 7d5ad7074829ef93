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

// What both kernels share: the 32-bit checks, data and indices bound as x and idx, the axis and the
// specialization key (data shape, axis, indices shape).
struct ElementsOp {
  int axis;
  std::string key;
  gl::Buffers buffers;
};

ElementsOp elements_op(const LowerContext& ctx) {
  const ir::Node &n = ctx.node, &data = ctx.input(0), &idx = ctx.input(1);
  const std::string who = ctx.graph.describe(n.id);
  gl::check_32bit(gl::numel_u(data.shape), who);
  gl::check_32bit(gl::numel_u(idx.shape), who);
  ElementsOp e{int(n.attrs.i("axis")), "", {}};
  e.key = shape_str(data.shape) + "_a" + std::to_string(e.axis) + "_idx" + shape_str(idx.shape);
  e.buffers.add("x", gl::input(0), data.dtype);
  e.buffers.add("idx", gl::input(1), DType::I32);
  return e;
}

}  // namespace

Lowering lower_gather_elements(const LowerContext& ctx) {
  const ir::Node &n = ctx.node, &data = ctx.input(0), &idx = ctx.input(1);
  ElementsOp e = elements_op(ctx);
  e.buffers.add("y", gl::output(), n.dtype);
  const std::vector<int64_t> ds = gl::strides(data.shape);
  const std::string body =
      gl::unravel(idx.shape, "i", "c") + offset_without_axis(ds, e.axis, "off") +
      load_index("i", data.shape[size_t(e.axis)], "  ") +
      gl::render("  y[i] = ok ? x[off + uint(k) * ${STRIDE}] : ${ZERO};\n",
                 {{"STRIDE", u(uint64_t(ds[size_t(e.axis)]))}, {"ZERO", std::string(gl::type_of(n.dtype)) + "(0)"}});
  return gl::one_kernel(gl::elementwise("gather_elements_" + e.key, "data gather_elements " + e.key, e.buffers.decls,
                                        body, gl::numel_u(n.shape), e.buffers.bindings, ctx.caps));
}

Lowering lower_scatter_elements(const LowerContext& ctx) {
  const ir::Node &n = ctx.node, &data = ctx.input(0), &idx = ctx.input(1);
  const std::string& reduction = n.attrs.s("reduction");
  ElementsOp e = elements_op(ctx);
  const int axis = e.axis;
  e.buffers.add("upd", gl::input(2), data.dtype);
  e.buffers.add("y", gl::output(), n.dtype);
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
  return gl::one_kernel(gl::elementwise("scatter_elements_" + reduction + "_" + e.key,
                                        "data scatter_elements " + e.key + " reduction " + reduction,
                                        e.buffers.decls + gl::math_lib(), body, gl::numel_u(n.shape),
                                        e.buffers.bindings, ctx.caps));
}

}  // namespace mgn::codegen
