// Data-movement archetype: reshape (copy; the executor aliases where it can), permute, slice and its
// gradient, concat, pad, expand, gather, gather_grad (deterministic scatter-add through per-row index
// lists) and one_hot. Index arithmetic is specialized to the shapes.
#include <algorithm>

#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::u;

const std::vector<Binding> kUnary = {{BindingKind::Input, 0}, {BindingKind::Output, 0, true}};

std::string io_decls(const ir::Node& in, const ir::Node& out) {
  return gl::buffer(0, "x", in.dtype, true) + gl::buffer(1, "y", out.dtype, false, true);
}

Lowering one(Kernel k) { return gl::one_kernel(std::move(k)); }

std::string name_of(const ir::Node& n, const Shape& s) { return std::string(ir::op_name(n.op)) + "_" + shape_str(s); }

// y[i] = x[start + the offset of i over `dims`]: a strided view of x copied out (permute, slice).
Lowering strided_copy(const LowerContext& ctx, uint64_t start, const std::vector<gl::Dim>& dims,
                      const std::string& comment) {
  const ir::Node& n = ctx.node;
  std::string body = "  uint src = " + u(start) + ";\n" + gl::offset_code(dims, "i", "src", "pt") + "  y[i] = x[src];\n";
  return one(gl::elementwise(name_of(n, ctx.input(0).shape), "data " + comment, io_decls(ctx.input(0), n), body,
                             gl::numel_u(n.shape), kUnary, ctx.caps));
}

Lowering lower_permute(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  const auto& perm = n.attrs.ints("perm");
  return strided_copy(ctx, 0, gl::permuted_dims(xs, n.shape, perm), "permute " + shape_str(xs) + " perm " + shape_str(perm));
}

Lowering lower_slice(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  const auto &st = n.attrs.ints("starts"), &sp = n.attrs.ints("steps");
  std::vector<int64_t> xst = gl::strides(xs);
  uint64_t start = 0;
  std::vector<gl::Dim> dims;
  for (size_t i = 0; i < xs.size(); ++i) {
    start += uint64_t(st[i] * xst[i]);
    dims.push_back({n.shape[i], sp[i] * xst[i]});
  }
  return strided_copy(ctx, start, dims, "slice " + shape_str(xs) + " starts " + shape_str(st) + " steps " + shape_str(sp));
}

// Each output element finds the dy element that maps to it, if any: a gather, so no atomics.
Lowering lower_slice_grad(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& ys = ctx.input(0).shape;
  const auto &st = n.attrs.ints("starts"), &sp = n.attrs.ints("steps");
  std::vector<int64_t> dst = gl::strides(ys);
  std::string body = gl::unravel(n.shape, "i", "c") + "  uint src = 0u;\n  bool hit = true;\n";
  for (size_t d = 0; d < n.shape.size(); ++d) {
    std::string c = "c" + std::to_string(d);
    body += "  if (" + c + " < " + u(uint64_t(st[d])) + ") hit = false;\n";
    body += "  uint q" + std::to_string(d) + " = (" + c + " - " + u(uint64_t(st[d])) + ") / " + u(uint64_t(sp[d])) +
            ";\n";
    std::string q = "q" + std::to_string(d);
    body += "  if ((" + c + " - " + u(uint64_t(st[d])) + ") % " + u(uint64_t(sp[d])) + " != 0u || " + q + " >= " +
            u(uint64_t(ys[d])) + ") hit = false;\n";
    body += "  src += " + q + " * " + u(uint64_t(dst[d])) + ";\n";
  }
  body += "  y[i] = hit ? x[hit ? src : 0u] : 0.0;\n";  // never form an out-of-range address
  return one(gl::elementwise(name_of(n, n.shape), "data slice_grad " + shape_str(n.shape) + " starts " + shape_str(st) +
                                                      " steps " + shape_str(sp),
                             io_decls(ctx.input(0), n), body, gl::numel_u(n.shape), kUnary, ctx.caps));
}

// One kernel per input, each writing its block of the output (disjoint writes).
Lowering lower_concat(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const int axis = int(n.attrs.i("axis"));
  Lowering l;
  int64_t off = 0;
  int64_t out_n = n.shape[size_t(axis)];
  int64_t inner = 1;
  for (size_t i = size_t(axis) + 1; i < n.shape.size(); ++i) inner *= n.shape[i];
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const ir::Node& in = ctx.input(int(k));
    int64_t kn = in.shape[size_t(axis)];
    std::string body = "  uint ii = i % " + u(uint64_t(inner)) + ", r = i / " + u(uint64_t(inner)) + ";\n" +
                       "  uint kk = r % " + u(uint64_t(kn)) + ", o = r / " + u(uint64_t(kn)) + ";\n" +
                       "  y[(o * " + u(uint64_t(out_n)) + " + " + u(uint64_t(off)) + " + kk) * " + u(uint64_t(inner)) +
                       " + ii] = x[i];\n";
    l.kernels.push_back(gl::elementwise("concat_part_" + shape_str(in.shape) + "_at" + std::to_string(off),
                                        "data concat part " + shape_str(in.shape) + " into " + shape_str(n.shape) +
                                            " axis " + std::to_string(axis) + " offset " + std::to_string(off),
                                        gl::buffer(0, "x", in.dtype, true) + gl::buffer(1, "y", n.dtype, false, true),
                                        body, gl::numel_u(in.shape),
                                        {{BindingKind::Input, int(k)}, {BindingKind::Output, 0, true}}, ctx.caps));
    off += kn;
  }
  return l;
}

Lowering lower_pad(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  const auto& p = n.attrs.ints("pads");
  std::vector<int64_t> xst = gl::strides(xs);
  const std::string T = gl::type_of(n.dtype);
  std::string value = n.dtype == DType::I32 ? std::to_string(int64_t(n.attrs.f("value")))
                      : n.dtype == DType::Bool ? (n.attrs.f("value") != 0 ? "1u" : "0u")
                                               : gl::flit(n.attrs.f("value"));
  std::string body = gl::unravel(n.shape, "i", "c") + "  uint src = 0u;\n  bool inside = true;\n";
  for (size_t d = 0; d < xs.size(); ++d) {
    std::string c = "c" + std::to_string(d);
    body += "  if (" + c + " < " + u(uint64_t(p[d])) + " || " + c + " >= " + u(uint64_t(p[d] + xs[d])) +
            ") inside = false;\n  src += (" + c + " - " + u(uint64_t(p[d])) + ") * " + u(uint64_t(xst[d])) + ";\n";
  }
  body += "  y[i] = inside ? x[inside ? src : 0u] : " + T + "(" + value + ");\n";
  return one(gl::elementwise(name_of(n, xs), "data pad " + shape_str(xs) + " pads " + shape_str(p),
                             io_decls(ctx.input(0), n), body, gl::numel_u(n.shape), kUnary, ctx.caps));
}

Lowering lower_copy_like(const LowerContext& ctx, const std::string& what) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  // A reshape keeps the flat order; expand maps through the broadcast.
  std::string decls = io_decls(ctx.input(0), n) +
                      (n.op == ir::Op::Reshape ? gl::broadcast_fn("src_of", n.shape, n.shape)
                                               : gl::broadcast_fn("src_of", xs, n.shape));
  return one(gl::elementwise(name_of(n, xs) + "_to_" + shape_str(n.shape),
                             "data " + what + " " + shape_str(xs) + " -> " + shape_str(n.shape), decls,
                             "  y[i] = x[src_of(i)];\n", gl::numel_u(n.shape), kUnary, ctx.caps));
}

struct Split {
  uint64_t outer, n, inner;
};
Split split_at(const Shape& s, int axis) {
  Split r{1, uint64_t(s[size_t(axis)]), 1};
  for (int i = 0; i < axis; ++i) r.outer *= uint64_t(s[size_t(i)]);
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) r.inner *= uint64_t(s[i]);
  return r;
}

// Out-of-range indices cannot raise on the GPU: they read 0 (the CPU reference throws).
Lowering lower_gather(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const ir::Node& t = ctx.input(0);
  const int axis = int(n.attrs.i("axis"));
  Split s = split_at(t.shape, axis);
  uint64_t ni = gl::numel_u(ctx.input(1).shape);
  std::string decls = gl::buffer(0, "tab", t.dtype, true) + gl::buffer(1, "idx", DType::I32, true) +
                      gl::buffer(2, "y", n.dtype, false, true);
  std::string body = "  uint ii = i % " + u(s.inner) + ", r = i / " + u(s.inner) + ";\n  uint j = r % " + u(ni) +
                     ", o = r / " + u(ni) + ";\n  int k = idx[j];\n  if (k < 0) k += " + std::to_string(s.n) +
                     ";\n  if (k < 0 || k >= " + std::to_string(s.n) + ") { y[i] = " + gl::type_of(n.dtype) +
                     "(0); return; }\n  y[i] = tab[(o * " + u(s.n) + " + uint(k)) * " + u(s.inner) + " + ii];\n";
  return one(gl::elementwise(name_of(n, t.shape) + "_idx" + shape_str(ctx.input(1).shape),
                             "data gather table " + shape_str(t.shape) + " axis " + std::to_string(axis) +
                                 " indices " + shape_str(ctx.input(1).shape),
                             decls, body, gl::numel_u(n.shape),
                             {{BindingKind::Input, 0}, {BindingKind::Input, 1}, {BindingKind::Output, 0, true}},
                             ctx.caps));
}

// Deterministic scatter-add: count the indices hitting each table row, prefix-sum the counts, list the
// index positions per row in increasing order, then each output element sums its row's dy entries in that
// fixed order. No float atomics; the result does not depend on scheduling.
Lowering lower_gather_grad(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const int axis = ir::normalize_axis(n.attrs.i("axis"), int(n.shape.size()), ctx.graph.describe(n.id));
  Split s = split_at(n.shape, axis);
  uint64_t ni = gl::numel_u(ctx.input(1).shape);
  const std::string N = u(s.n), NI = u(ni), NS = std::to_string(s.n);
  const std::string key = shape_str(n.shape) + " axis " + std::to_string(axis) + " indices " +
                          shape_str(ctx.input(1).shape);
  // scratch 0: start[n + 1] (counts, then exclusive prefix sums); scratch 1: list[ni]
  Lowering l;
  l.scratch_words = {s.n + 1, std::max<uint64_t>(ni, 1)};
  // Each index, wrapped like the CPU reference's negative indices; `hit` runs for those naming row i.
  auto scan_indices = [&](const std::string& hit) {
    return gl::render(R"(  for (uint j = 0u; j < ${NI}; ++j) {
    int k = idx[j];
    if (k < 0) k += ${NS};
    if (k == int(i)) ${HIT}
  }
)",
                      {{"NI", NI}, {"NS", NS}, {"HIT", hit}});
  };
  const std::string idx_decl = gl::buffer(0, "idx", DType::I32, true);
  l.kernels.push_back(gl::elementwise(
      "gather_grad_count_" + shape_str(n.shape), "data gather_grad count " + key,
      idx_decl + gl::buffer(1, "cnt", DType::I32, false, true),
      "  int c = 0;\n" + scan_indices("++c;") + "  cnt[i] = c;\n", s.n,
      {{BindingKind::Input, 1}, {BindingKind::Scratch, 0, true}}, ctx.caps));
  // Exclusive prefix sum over the table rows in one workgroup: each thread sums a chunk of consecutive rows,
  // thread 0 scans the chunk sums in shared memory, then each thread rewrites its chunk. Integer sums, so
  // the result is exact whatever the chunking. (One thread walking a 49,152-row vocabulary took 11.7 ms on
  // an H100: issue 27.)
  {
    const uint32_t wg = std::min<uint32_t>(256, ctx.caps.max_workgroup_invocations);
    const uint64_t chunk = std::max<uint64_t>(1, (s.n + wg - 1) / wg);
    Kernel k;
    k.name = "gather_grad_scan_" + shape_str(n.shape);
    k.glsl = gl::render(R"(#version 450
// archetype: data gather_grad scan ${KEY}
layout(local_size_x = ${WG}) in;
${DECL}shared int part[${WG}];
void main() {
  uint t = gl_LocalInvocationID.x;
  uint lo = min(t * ${CHUNK}, ${N}), hi = min(lo + ${CHUNK}, ${N});
  int acc = 0;
  for (uint k = lo; k < hi; ++k) acc += cnt[k];
  part[t] = acc;
  barrier();
  if (t == 0u) {
    int run = 0;
    for (uint w = 0u; w < ${WG}u; ++w) {
      int c = part[w];
      part[w] = run;
      run += c;
    }
    cnt[${N}] = run;
  }
  barrier();
  int run = part[t];
  for (uint k = lo; k < hi; ++k) {
    int c = cnt[k];
    cnt[k] = run;
    run += c;
  }
}
)",
                        {{"KEY", key},
                         {"WG", std::to_string(wg)},
                         {"DECL", gl::buffer(0, "cnt", DType::I32, false)},
                         {"CHUNK", u(chunk)},
                         {"N", N}});
    k.bindings = {{BindingKind::Scratch, 0, true}};
    k.groups = {1, 1, 1};
    l.kernels.push_back(std::move(k));
  }
  l.kernels.push_back(gl::elementwise(
      "gather_grad_list_" + shape_str(n.shape), "data gather_grad list " + key,
      idx_decl + gl::buffer(1, "start", DType::I32, true) + gl::buffer(2, "list", DType::I32, false, true),
      "  int p = start[i];\n" + scan_indices("list[p++] = int(j);"), s.n,
      {{BindingKind::Input, 1}, {BindingKind::Scratch, 0}, {BindingKind::Scratch, 1, true}}, ctx.caps));
  l.kernels.push_back(gl::elementwise(
      "gather_grad_sum_" + shape_str(n.shape), "data gather_grad sum " + key,
      gl::buffer(0, "dy", DType::F32, true) + gl::buffer(1, "start", DType::I32, true) +
          gl::buffer(2, "list", DType::I32, true) + gl::buffer(3, "y", DType::F32, false, true),
      gl::render(R"(  uint ii = i % ${INNER}, r = i / ${INNER};
  uint k = r % ${N}, o = r / ${N};
  float acc = 0.0;
  for (int p = start[k]; p < start[k + 1u]; ++p)
    acc += dy[(o * ${NI} + uint(list[p])) * ${INNER} + ii];
  y[i] = acc;
)",
                 {{"INNER", u(s.inner)}, {"N", N}, {"NI", NI}}),
      gl::numel_u(n.shape),
      {{BindingKind::Input, 0}, {BindingKind::Scratch, 0}, {BindingKind::Scratch, 1}, {BindingKind::Output, 0, true}},
      ctx.caps));
  return l;
}

Lowering lower_one_hot(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const uint64_t d = uint64_t(n.attrs.i("depth"));
  std::string body = "  int k = x[i / " + u(d) + "];\n  y[i] = k == int(i % " + u(d) + ") ? 1.0 : 0.0;\n";
  return one(gl::elementwise(name_of(n, n.shape), "data one_hot " + shape_str(n.shape),
                             io_decls(ctx.input(0), n), body, gl::numel_u(n.shape), kUnary, ctx.caps));
}

}  // namespace

Lowering lower_data(const LowerContext& ctx) {
  switch (ctx.node.op) {
    case ir::Op::Reshape: return lower_copy_like(ctx, "reshape copy");
    case ir::Op::Permute: return lower_permute(ctx);
    case ir::Op::Slice: return lower_slice(ctx);
    case ir::Op::SliceGrad: return lower_slice_grad(ctx);
    case ir::Op::Concat: return lower_concat(ctx);
    case ir::Op::Pad: return lower_pad(ctx);
    case ir::Op::Expand: return lower_copy_like(ctx, "expand");
    case ir::Op::Gather: return lower_gather(ctx);
    case ir::Op::GatherGrad: return lower_gather_grad(ctx);
    case ir::Op::OneHot: return lower_one_hot(ctx);
    case ir::Op::GatherElements: return lower_gather_elements(ctx);
    case ir::Op::ScatterElements: return lower_scatter_elements(ctx);
#define MGN_FAMILY_DataMovement
#include "codegen/other_ops.inc"
      break;
  }
  throw Error("internal: " + ctx.graph.describe(ctx.node.id) + " is not a data-movement op");
}

}  // namespace mgn::codegen
