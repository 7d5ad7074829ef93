// Reduction archetype: reduce_sum/mean/max/min over any axis set, argmax, softmax, log_softmax, logsumexp.
// The input is viewed as kept dims × reduced dims (each merged where contiguous), so inner, outer, middle
// and multiple axes are one code path: short reductions run one thread per output with a serial loop,
// longer ones one workgroup per output with a shared-memory tree (fixed order: deterministic).
#include <algorithm>
#include <set>

#include "codegen/glsl_util.h"

namespace mgn::codegen {
namespace {

using gl::u;

constexpr uint64_t kSerialMax = 32;  // at most this many reduced elements: one thread per output

struct View {
  std::vector<gl::Dim> kept, reduced;
  uint64_t outputs = 1, m = 1;
};

View make_view(const Shape& in, const std::set<int>& axes) {
  View v;
  std::vector<int64_t> st = gl::strides(in);
  for (int i = 0; i < int(in.size()); ++i) {
    gl::Dim d{in[size_t(i)], st[size_t(i)]};
    if (axes.count(i)) {
      v.reduced.push_back(d);
      v.m *= uint64_t(d.size);
    } else {
      v.kept.push_back(d);
      v.outputs *= uint64_t(d.size);
    }
  }
  return v;
}

// `uint base_of(uint o)` and `uint roff(uint r)`: input offsets of output o and reduced element r.
std::string view_fns(const View& v) {
  return "uint base_of(uint o) {\n  uint b = 0u;\n" + gl::offset_code(v.kept, "o", "b", "ot") +
         "  return b;\n}\nuint roff(uint r) {\n  uint b = 0u;\n" + gl::offset_code(v.reduced, "r", "b", "rt") +
         "  return b;\n}\n";
}

std::string key_of(const Shape& in, const std::set<int>& axes) {
  std::string k = shape_str(in) + " axes[";
  bool first = true;
  for (int a : axes) {
    k += (first ? "" : ",") + std::to_string(a);
    first = false;
  }
  return k + "]";
}

// reduce_sum/mean/max/min and argmax.
Lowering lower_reduce(const LowerContext& ctx, const std::set<int>& axes) {
  const ir::Node& n = ctx.node;
  const ir::Node& x = ctx.input(0);
  View v = make_view(x.shape, axes);
  gl::check_32bit(gl::numel_u(x.shape), ctx.graph.describe(n.id));
  const bool is_arg = n.op == ir::Op::ArgMax;
  const bool flt = is_float(x.dtype);
  const std::string T = gl::type_of(x.dtype);
  std::string init, comb;  // comb(a, b) as an expression of a and b
  switch (n.op) {
    case ir::Op::ReduceSum:
    case ir::Op::ReduceMean:
      init = flt ? "0.0" : "0";
      comb = "a + b";
      break;
    case ir::Op::ReduceMax:
    case ir::Op::ArgMax:
      init = flt ? "uintBitsToFloat(0xff800000u)" : "int(0x80000000u)";
      comb = flt ? "(isnan(a) || isnan(b)) ? mgn_nan() : max(a, b)" : "max(a, b)";
      break;
    case ir::Op::ReduceMin:
      init = flt ? "uintBitsToFloat(0x7f800000u)" : "int(0x7fffffffu)";
      comb = flt ? "(isnan(a) || isnan(b)) ? mgn_nan() : min(a, b)" : "min(a, b)";
      break;
    default: throw Error("internal: not a reduce op");
  }
  std::string fin = "acc";
  if (n.op == ir::Op::ReduceMean) fin = "acc / " + gl::flit(double(v.m));
  std::string decls = gl::buffer(0, "x", x.dtype, true) + gl::buffer(1, "y", n.dtype, false, true) + gl::math_lib() +
                      view_fns(v) + T + " comb(" + T + " a, " + T + " b) { return " + comb + "; }\n";
  // argmax: the first maximum wins; NaN counts as the maximum (first NaN wins).
  if (is_arg)
    decls += "bool better(" + T + " a, uint ia, " + T + " b, uint ib) {\n" +
             (flt ? "  if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || ia < ib);\n" : "") +
             "  return a > b || (a == b && ia < ib);\n}\n";
  std::string name = std::string(ir::op_name(n.op)) + "_" + key_of(x.shape, axes);
  std::string comment = std::string("reduction ") + ir::op_name(n.op) + " " + key_of(x.shape, axes) + " " +
                        dtype_name(x.dtype);
  std::vector<Binding> bindings = {{BindingKind::Input, 0}, {BindingKind::Output, 0, true}};
  Lowering l;
  if (v.m <= kSerialMax) {
    std::string body = "  uint base = base_of(i);\n";
    if (is_arg) {
      body += "  " + T + " best = x[base];\n  uint bi = 0u;\n  for (uint r = 1u; r < " + u(v.m) +
              "; ++r) {\n    " + T + " e = x[base + roff(r)];\n    if (better(e, r, best, bi)) { best = e; bi = r; }\n  }\n"
              "  y[i] = int(bi);\n";
    } else {
      body += "  " + T + " acc = " + init + ";\n  for (uint r = 0u; r < " + u(v.m) +
              "; ++r) acc = comb(acc, x[base + roff(r)]);\n  y[i] = " + fin + ";\n";
    }
    l.kernels.push_back(gl::elementwise(name, comment + " serial", decls, body, v.outputs, bindings, ctx.caps));
    return l;
  }
  const uint32_t wg = gl::row_workgroup(v.m, ctx.caps);
  gl::Grid grid = gl::flat_groups(v.outputs, ctx.caps, name);
  std::string W = u(wg);
  std::string g = "#version 450\n// archetype: " + comment + " workgroup-per-output\nlayout(local_size_x = " +
                  std::to_string(wg) + ") in;\n" + decls + "shared " + T + " s_v[" + W + "];\n";
  if (is_arg) g += "shared uint s_i[" + W + "];\n";
  g += "void main() {\n" + grid.glsl + "  uint o = gid, t = gl_LocalInvocationID.x;\n  uint base = base_of(o);\n";
  if (is_arg) {
    g += "  " + T + " best = x[base];\n  uint bi = 0u;\n  for (uint r = t; r < " + u(v.m) + "; r += " + W +
         ") {\n    " + T + " e = x[base + roff(r)];\n    if (better(e, r, best, bi)) { best = e; bi = r; }\n  }\n"
         "  s_v[t] = best;\n  s_i[t] = bi;\n  barrier();\n"
         "  for (uint s = " + u(wg / 2) + "; s > 0u; s >>= 1) {\n    if (t < s && better(s_v[t + s], s_i[t + s], s_v[t], s_i[t])) {\n"
         "      s_v[t] = s_v[t + s];\n      s_i[t] = s_i[t + s];\n    }\n    barrier();\n  }\n"
         "  if (t == 0u) y[o] = int(s_i[0]);\n}\n";
  } else {
    g += "  " + T + " acc = " + init + ";\n  for (uint r = t; r < " + u(v.m) + "; r += " + W +
         ") acc = comb(acc, x[base + roff(r)]);\n  s_v[t] = acc;\n  barrier();\n"
         "  for (uint s = " + u(wg / 2) + "; s > 0u; s >>= 1) {\n    if (t < s) s_v[t] = comb(s_v[t], s_v[t + s]);\n"
         "    barrier();\n  }\n  if (t == 0u) {\n    acc = s_v[0];\n    y[o] = " + fin + ";\n  }\n}\n";
  }
  Kernel k;
  k.name = name;
  k.glsl = g;
  k.bindings = bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

// softmax, log_softmax (write every element) and logsumexp (one value per row), one workgroup per row.
Lowering lower_softmax_like(const LowerContext& ctx, int axis) {
  const ir::Node& n = ctx.node;
  const ir::Node& x = ctx.input(0);
  View v = make_view(x.shape, {axis});
  gl::check_32bit(gl::numel_u(x.shape), ctx.graph.describe(n.id));
  const uint32_t wg = gl::row_workgroup(v.m, ctx.caps);
  std::string name = std::string(ir::op_name(n.op)) + "_" + key_of(x.shape, {axis});
  gl::Grid grid = gl::flat_groups(v.outputs, ctx.caps, name);
  std::string W = u(wg), M = u(v.m);
  std::string g = "#version 450\n// archetype: reduction " + std::string(ir::op_name(n.op)) + " " +
                  key_of(x.shape, {axis}) + " workgroup-per-row\nlayout(local_size_x = " + std::to_string(wg) +
                  ") in;\n" + gl::buffer(0, "x", DType::F32, true) + gl::buffer(1, "y", DType::F32, false, true) +
                  gl::math_lib() + view_fns(v) + gl::wg_reduce_lib(wg);
  g += "void main() {\n" + grid.glsl + "  uint t = gl_LocalInvocationID.x;\n  uint base = base_of(gid);\n";
  g += "  float m = uintBitsToFloat(0xff800000u);\n  for (uint r = t; r < " + M + "; r += " + W +
       ") { float e = x[base + roff(r)]; m = (isnan(m) || isnan(e)) ? mgn_nan() : max(m, e); }\n  m = wg_max(m);\n";
  // An all -inf (or +inf / NaN) row has lse = m, like the CPU reference.
  g += "  float s = 0.0;\n  if (!isinf(m)) for (uint r = t; r < " + M + "; r += " + W +
       ") s += exp(x[base + roff(r)] - m);\n  s = wg_sum(s);\n  float lse = isinf(m) ? m : m + log(s);\n";
  if (n.op == ir::Op::LogSumExp) {
    g += "  if (t == 0u) y[gid] = lse;\n}\n";
  } else {
    std::string val = n.op == ir::Op::Softmax ? "exp(x[k] - lse)" : "x[k] - lse";
    g += "  for (uint r = t; r < " + M + "; r += " + W + ") {\n    uint k = base + roff(r);\n    y[k] = " + val +
         ";\n  }\n}\n";
  }
  Kernel k;
  k.name = name;
  k.glsl = g;
  k.bindings = {{BindingKind::Input, 0}, {BindingKind::Output, 0, true}};
  k.groups = grid.groups;
  Lowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace

Lowering lower_reduction(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const int rank = int(ctx.input(0).shape.size());
  switch (n.op) {
    case ir::Op::ReduceSum:
    case ir::Op::ReduceMean:
    case ir::Op::ReduceMax:
    case ir::Op::ReduceMin: {
      std::set<int> axes;
      for (int64_t a : n.attrs.ints("axes")) axes.insert(ir::normalize_axis(a, rank, ctx.graph.describe(n.id)));
      if (n.attrs.ints("axes").empty())
        for (int i = 0; i < rank; ++i) axes.insert(i);
      return lower_reduce(ctx, axes);
    }
    case ir::Op::ArgMax:
      return lower_reduce(ctx, {ir::normalize_axis(n.attrs.i("axis"), rank, ctx.graph.describe(n.id))});
    case ir::Op::Softmax:
    case ir::Op::LogSoftmax:
    case ir::Op::LogSumExp:
      return lower_softmax_like(ctx, ir::normalize_axis(n.attrs.i("axis"), rank, ctx.graph.describe(n.id)));
    default: break;
  }
  throw Error("internal: " + ctx.graph.describe(n.id) + " is not a reduction");
}

}  // namespace mgn::codegen
