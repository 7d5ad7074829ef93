// Reduction archetype: reduce_sum/mean/max/min over any axis set, argmax, softmax, log_softmax, logsumexp.
// The input is viewed as kept dims × reduced dims (each merged where contiguous), so inner, outer, middle
// and multiple axes are one code path: short reductions run one thread per output with a serial loop,
// longer ones one workgroup per output with a shared-memory tree (fixed order: deterministic; a few outputs of
// many elements in two passes over row chunks), or, when the
// outputs lie along a contiguous axis (bias gradients), one workgroup per block of 16 outputs whose threads
// split the rows (column_view).
#include <algorithm>
#include <set>

#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::u;

constexpr uint64_t kSerialMax = 32;  // at most this many reduced elements: one thread per output
constexpr uint32_t kColumns = 16;    // outputs per workgroup of the column kernel (64-byte rows)
// A reduction of fewer workgroups than this (column blocks, or outputs of the workgroup-per-output kernel) splits
// its rows into chunks as well: two passes through scratch (row_chunks).
constexpr uint64_t kGroupsWanted = 128;
constexpr uint64_t kRowChunkMin = 8192;  // elements per chunk of the workgroup-per-output kernel, at least

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

// Whether the column kernel takes the reduction: the innermost kept dim is contiguous and at least kColumns
// long (consecutive outputs are consecutive elements) and the reduced dims are all outside it.
bool column_view(const View& v) {
  if (v.kept.empty() || v.m <= kSerialMax) return false;
  const gl::Dim& in = v.kept.back();
  if (in.stride != 1 || uint64_t(in.size) < kColumns) return false;
  for (const gl::Dim& r : v.reduced)
    if (r.stride < in.size) return false;
  return true;
}

// How many chunks the m rows of `groups` workgroups split into: enough for kGroupsWanted workgroups in all, each
// chunk at least `min_rows` long; 1 when there are workgroups enough.
uint64_t row_chunks(uint64_t groups, uint64_t m, uint64_t min_rows) {
  if (groups >= kGroupsWanted) return 1;
  return std::max<uint64_t>(1, std::min<uint64_t>(div_up(kGroupsWanted, groups), m / min_rows));
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

// A kernel of the reduction archetypes: `wg` threads per workgroup, `groups` workgroups (`uint gid` in scope),
// the shared array s_v[wg] of T (plus `extra_shared`), `body` the rest of main().
Kernel shared_reduction_kernel(const std::string& name, const std::string& archetype, uint32_t wg,
                               const std::string& decls, const std::string& T, const std::string& extra_shared,
                               uint64_t groups, const std::string& body, std::vector<Binding> bindings,
                               const DeviceCaps& caps) {
  const gl::Grid grid = gl::flat_groups(groups, caps, name);
  Kernel k;
  k.name = name;
  k.glsl = gl::render(R"(#version 450
// archetype: ${ARCHETYPE}
layout(local_size_x = ${WG}) in;
${DECLS}shared ${T} s_v[${WG}];
${EXTRA}void main() {
${GRID}${BODY}}
)",
                      {{"ARCHETYPE", archetype},
                       {"WG", std::to_string(wg)},
                       {"DECLS", decls},
                       {"T", T},
                       {"EXTRA", extra_shared},
                       {"GRID", grid.glsl},
                       {"BODY", body}});
  k.bindings = std::move(bindings);
  k.groups = grid.groups;
  return k;
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
    case ir::Op::Softmax:
    case ir::Op::LogSoftmax:
    case ir::Op::LogSumExp:
#define MGN_FAMILY_Reduction
#include "codegen/other_ops.inc"
      throw Error("internal: " + ctx.graph.describe(n.id) + " is not a reduce op");
  }
  std::string fin = "acc";
  if (n.op == ir::Op::ReduceMean) fin = "acc / " + gl::flit(double(v.m));
  const std::string comb_fn = gl::math_lib() + T + " comb(" + T + " a, " + T + " b) { return " + comb + "; }\n";
  std::string decls =
      gl::buffer(0, "x", x.dtype, true) + gl::buffer(1, "y", n.dtype, false, true) + view_fns(v) + comb_fn;
  // argmax: the first maximum wins; NaN counts as the maximum (first NaN wins).
  if (is_arg)
    decls += "bool better(" + T + " a, uint ia, " + T + " b, uint ib) {\n" +
             (flt ? "  if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || ia < ib);\n" : "") +
             "  return a > b || (a == b && ia < ib);\n}\n";
  std::string name = std::string(ir::op_name(n.op)) + "_" + key_of(x.shape, axes);
  std::string comment = std::string("reduction ") + ir::op_name(n.op) + " " + key_of(x.shape, axes) + " " +
                        dtype_name(x.dtype);
  std::vector<Binding> bindings = {{BindingKind::Input, 0}, {BindingKind::Output, 0, true}};
  // Two-pass reductions (few outputs, many elements): pass 1 writes partials to the scratch P, pass 2 reads them.
  const std::string pass1_decls =
      gl::buffer(0, "x", x.dtype, true) + gl::buffer(1, "P", x.dtype, false, true) + view_fns(v) + comb_fn;
  const std::string pass2_decls = gl::buffer(0, "P", x.dtype, true) + gl::buffer(1, "y", n.dtype, false, true);
  const std::vector<Binding> pass1_bindings = {{BindingKind::Input, 0}, {BindingKind::Scratch, 0, true}};
  const std::vector<Binding> pass2_bindings = {{BindingKind::Scratch, 0, false}, {BindingKind::Output, 0, true}};
  Lowering l;
  // argmax's scan over this thread's elements (from `first`, by `step`) of the output's reduced elements.
  auto arg_scan = [&](const std::string& first, const std::string& step) {
    return gl::render(R"(  ${T} best = x[base];
  uint bi = 0u;
  for (uint r = ${FIRST}; r < ${M}; ${STEP}) {
    ${T} e = x[base + roff(r)];
    if (better(e, r, best, bi)) { best = e; bi = r; }
  }
)",
                      {{"T", T}, {"FIRST", first}, {"M", u(v.m)}, {"STEP", step}});
  };
  if (v.m <= kSerialMax) {
    std::string body = "  uint base = base_of(i);\n";
    if (is_arg)
      body += arg_scan("1u", "++r") + "  y[i] = int(bi);\n";
    else
      body += "  " + T + " acc = " + init + ";\n  for (uint r = 0u; r < " + u(v.m) +
              "; ++r) acc = comb(acc, x[base + roff(r)]);\n  y[i] = " + fin + ";\n";
    l.kernels.push_back(gl::elementwise(name, comment + " serial", decls, body, v.outputs, bindings, ctx.caps));
    return l;
  }
  if (!is_arg && column_view(v)) {
    // Outputs along a contiguous axis (a bias gradient: [rows, C] summed over the rows): workgroup-per-output
    // would read one element per cache line per thread. Instead a workgroup takes kColumns consecutive outputs
    // and its threads (column c, row lane rl) walk the rows rl, rl + lanes, ...: each row's kColumns elements
    // are one coalesced read; the lanes' partials meet in a fixed tree (deterministic). With few column blocks
    // (C = 384: 24 workgroups) the rows are also split into chunks: a first kernel writes each chunk's partial
    // to scratch [chunks, outputs], a second reduces the chunks in order.
    const uint32_t wg = ctx.caps.max_workgroup_invocations >= 256 ? 256 : 128;  // 128: Vulkan's minimum
    const uint32_t lanes = wg / kColumns;
    const uint64_t blocks = div_up(v.outputs, kColumns);
    const uint64_t chunks = row_chunks(blocks, v.m, uint64_t(lanes) * 8);  // at least 8 rows per lane and chunk
    const uint64_t per_chunk = div_up(v.m, chunks);
    // One column kernel: `load` is the element (o, r) (uint base = base_of(o) is in scope), rows [r0, r1) of
    // chunk `ch`, `store` writes acc for output o.
    auto column_kernel = [&](const std::string& kname, const std::string& what, const std::string& kdecls,
                             uint64_t groups, const std::string& load, const std::string& r0, const std::string& r1,
                             const std::string& store, std::vector<Binding> kb) {
      const std::string body = gl::render(R"(  uint t = gl_LocalInvocationID.x, c = t % ${C}, rl = t / ${C};
  uint cb = gid % ${BLOCKS}, ch = gid / ${BLOCKS};
  uint o = cb * ${C} + c;
  ${T} acc = ${INIT};
  if (o < ${OUTS}) {
    uint base = base_of(o);
    uint r1 = ${R1};
    for (uint r = ${R0} + rl; r < r1; r += ${L}) acc = comb(acc, ${LOAD});
  }
  s_v[t] = acc;
  barrier();
  for (uint s = ${HALF}; s > 0u; s >>= 1) {
    if (rl < s) s_v[t] = comb(s_v[t], s_v[t + s * ${C}]);
    barrier();
  }
  if (rl == 0u && o < ${OUTS}) {
    acc = s_v[c];
${STORE}  }
)",
                                          {{"C", u(kColumns)},
                                           {"L", u(lanes)},
                                           {"T", T},
                                           {"BLOCKS", u(blocks)},
                                           {"INIT", init},
                                           {"OUTS", u(v.outputs)},
                                           {"R0", r0},
                                           {"R1", r1},
                                           {"LOAD", load},
                                           {"HALF", u(lanes / 2)},
                                           {"STORE", store}});
      l.kernels.push_back(shared_reduction_kernel(
          kname,
          comment + " " + what + ", column blocks of " + std::to_string(kColumns) + " outputs, " +
              std::to_string(lanes) + " row lanes",
          wg, kdecls, T, "", groups, body, std::move(kb), ctx.caps));
    };
    if (chunks == 1) {
      column_kernel(name + "_cols", "one pass", decls, blocks, "x[base + roff(r)]", "0u", u(v.m),
                    "    y[o] = " + fin + ";\n", bindings);
      return l;
    }
    // Pass 1: chunk ch's rows [ch * per_chunk, ...) into P[ch * outputs + o]; pass 2: the chunks in order.
    l.scratch_words = {chunks * v.outputs};
    column_kernel(name + "_cols_part" + std::to_string(chunks), "pass 1 of 2 (" + std::to_string(chunks) + " row chunks)",
                  pass1_decls, blocks * chunks, "x[base + roff(r)]", "ch * " + u(per_chunk),
                  "min(ch * " + u(per_chunk) + " + " + u(per_chunk) + ", " + u(v.m) + ")",
                  "    P[ch * " + u(v.outputs) + " + o] = acc;\n", pass1_bindings);
    column_kernel(name + "_cols_sum" + std::to_string(chunks), "pass 2 of 2",
                  pass2_decls + "uint base_of(uint o) { return o; }\n" + comb_fn, blocks,
                  "P[r * " + u(v.outputs) + " + o]", "0u", u(chunks), "    y[o] = " + fin + ";\n", pass2_bindings);
    return l;
  }
  if (!is_arg) {
    // One workgroup per output walks its elements and meets in a shared-memory tree. Few outputs over long rows
    // (a loss's mean over every element: Whisper's 4.6 M at batch 8 took 1.9 ms in one workgroup on an H100) split
    // each output's elements into chunks: a first kernel reduces chunk ch of output o into P[o * chunks + ch], a
    // second each output's chunks in order (fixed order: deterministic).
    const uint64_t chunks = row_chunks(v.outputs, v.m, kRowChunkMin);
    const uint64_t per_chunk = div_up(v.m, chunks);
    // One kernel: workgroup `gid` of `groups` (`index` sets o and base), `load` the element at r for r in
    // [r0, r1), `store` of acc by thread 0.
    auto row_kernel = [&](const std::string& kname, const std::string& what, const std::string& kdecls, uint64_t groups,
                          uint64_t longest, const std::string& index, const std::string& load, const std::string& r0,
                          const std::string& r1, const std::string& store, std::vector<Binding> kb) {
      const uint32_t kwg = gl::row_workgroup(longest, ctx.caps);
      const std::string body = gl::render(R"(  uint t = gl_LocalInvocationID.x;
${INDEX}  ${T} acc = ${INIT};
  uint r1 = ${R1};
  for (uint r = ${R0} + t; r < r1; r += ${WG}) acc = comb(acc, ${LOAD});
  s_v[t] = acc;
  barrier();
${TREE}  if (t == 0u) {
    acc = s_v[0];
${STORE}  }
)",
                                          {{"INDEX", index},
                                           {"T", T},
                                           {"INIT", init},
                                           {"R0", r0},
                                           {"R1", r1},
                                           {"WG", u(kwg)},
                                           {"LOAD", load},
                                           {"TREE", gl::tree_reduce(kwg, " s_v[t] = comb(s_v[t], s_v[t + s]);", "  ")},
                                           {"STORE", store}});
      l.kernels.push_back(
          shared_reduction_kernel(kname, comment + " " + what, kwg, kdecls, T, "", groups, body, std::move(kb), ctx.caps));
    };
    const std::string store_y = "    y[o] = " + fin + ";\n";
    if (chunks == 1) {
      row_kernel(name, "workgroup-per-output", decls, v.outputs, v.m, "  uint o = gid, base = base_of(o);\n",
                 "x[base + roff(r)]", "0u", u(v.m), store_y, bindings);
      return l;
    }
    l.scratch_words = {chunks * v.outputs};
    row_kernel(name + "_part" + std::to_string(chunks), "pass 1 of 2 (" + std::to_string(chunks) + " row chunks)",
               pass1_decls, v.outputs * chunks, per_chunk,
               "  uint o = gid / " + u(chunks) + ", ch = gid % " + u(chunks) + ", base = base_of(o);\n",
               "x[base + roff(r)]", "ch * " + u(per_chunk),
               "min(ch * " + u(per_chunk) + " + " + u(per_chunk) + ", " + u(v.m) + ")", "    P[gid] = acc;\n",
               pass1_bindings);
    row_kernel(name + "_sum" + std::to_string(chunks), "pass 2 of 2", pass2_decls + comb_fn, v.outputs, chunks,
               "  uint o = gid, base = o * " + u(chunks) + ";\n", "P[base + r]", "0u", u(chunks), store_y,
               pass2_bindings);
    return l;
  }
  // argmax: one workgroup per output; each thread's first maximum, then a tree that keeps the earlier index.
  const uint32_t wg = gl::row_workgroup(v.m, ctx.caps);
  const std::string body = "  uint o = gid, t = gl_LocalInvocationID.x;\n  uint base = base_of(o);\n" +
                           arg_scan("t", "r += " + u(wg)) + gl::render(R"(  s_v[t] = best;
  s_i[t] = bi;
  barrier();
  for (uint s = ${HALF}; s > 0u; s >>= 1) {
    if (t < s && better(s_v[t + s], s_i[t + s], s_v[t], s_i[t])) {
      s_v[t] = s_v[t + s];
      s_i[t] = s_i[t + s];
    }
    barrier();
  }
  if (t == 0u) y[o] = int(s_i[0]);
)",
                                                                       {{"HALF", u(wg / 2)}});
  l.kernels.push_back(shared_reduction_kernel(name, comment + " workgroup-per-output", wg, decls, T,
                                              "shared uint s_i[" + std::to_string(wg) + "];\n", v.outputs, body,
                                              bindings, ctx.caps));
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
  const std::string W = u(wg), M = u(v.m);
  // An all -inf (or +inf / NaN) row has lse = m, like the CPU reference. Softmax is exp(x - m) / s and
  // log-softmax (x - m) - log s, not exp(x - lse) / x - lse: lse = m + log s rounds at the scale of the logits,
  // which for logits near 1e5 is an error of ~1e-3 in every probability (ONNX's test_softmax_large_number).
  const std::string tail =
      n.op == ir::Op::LogSumExp
          ? "  if (t == 0u) y[gid] = lse;\n"
          : "  for (uint r = t; r < " + M + "; r += " + W + ") {\n    uint k = base + roff(r);\n    y[k] = " +
                (n.op == ir::Op::Softmax ? "isinf(m) ? exp(x[k] - m) : exp(x[k] - m) / s"
                                         : "isinf(m) ? x[k] - m : (x[k] - m) - log(s)") +
                ";\n  }\n";
  const std::string g = gl::render(R"(#version 450
// archetype: reduction ${OP} ${KEY} workgroup-per-row
layout(local_size_x = ${WG}) in;
${DECLS}void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint base = base_of(gid);
  float m = uintBitsToFloat(0xff800000u);
  for (uint r = t; r < ${M}; r += ${W}) { float e = x[base + roff(r)]; m = (isnan(m) || isnan(e)) ? mgn_nan() : max(m, e); }
  m = wg_max(m);
  float s = 0.0;
  if (!isinf(m)) for (uint r = t; r < ${M}; r += ${W}) s += exp(x[base + roff(r)] - m);
  s = wg_sum(s);
  float lse = isinf(m) ? m : m + log(s);
${TAIL}}
)",
                                   {{"OP", ir::op_name(n.op)},
                                    {"KEY", key_of(x.shape, {axis})},
                                    {"WG", std::to_string(wg)},
                                    {"DECLS", gl::buffer(0, "x", DType::F32, true) +
                                                  gl::buffer(1, "y", DType::F32, false, true) + gl::math_lib() +
                                                  view_fns(v) + gl::wg_reduce_lib(wg)},
                                    {"GRID", grid.glsl},
                                    {"M", M},
                                    {"W", W},
                                    {"TAIL", tail}});
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
#define MGN_FAMILY_Reduction
#include "codegen/other_ops.inc"
      break;
  }
  throw Error("internal: " + ctx.graph.describe(n.id) + " is not a reduction");
}

}  // namespace mgn::codegen
