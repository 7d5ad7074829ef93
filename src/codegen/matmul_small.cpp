// matmul's small kernels: for M or N tiny (GEMV-like, e.g. a single token's projection) a block tile would
// waste most of its threads. Either one workgroup reduces K for one output (when the large operand is
// contiguous along K, so the reads coalesce), or one thread computes one output (consecutive threads along
// the large operand's contiguous axis).
#include <algorithm>
#include <set>
#include <string>

#include "codegen/glsl.h"
#include "codegen/matmul_common.h"

namespace mgn::codegen {
namespace {

using gl::u;

std::string decls() {
  return gl::buffer(0, "A", DType::F32, true) + gl::buffer(1, "B", DType::F32, true) +
         gl::buffer(2, "C", DType::F32, false, true);
}

// acc = sum over k (in `loop`, which declares k) of A(m, k) * B(k, n), an fma chain.
std::string k_sum(const GemmShape& s, const std::string& loop) {
  return "  float acc = 0.0;\n" + loop + "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " +
         b_index(s, "k", "n") + "], acc);\n";
}

std::string transposes(const GemmShape& s) {
  return "t" + su(s.transpose_a) + su(s.transpose_b);
}

// Threads of the workgroup-per-output kernels: two subgroups (32..128), a power of two the device allows.
uint32_t ksplit_workgroup(const DeviceCaps& caps) {
  uint32_t wg = std::max<uint32_t>(32, std::min<uint32_t>(caps.subgroup_size * 2, 128));
  wg = std::min(wg, caps.max_workgroup_invocations);
  uint32_t p2 = 1;
  while (p2 * 2 <= wg) p2 *= 2;
  return p2;
}

}  // namespace

Kernel small_gemm_kernel(const GemmShape& s, const DeviceCaps& caps) {
  // The large operand decides the strategy: with M small it is B, with N small it is A.
  const bool b_large = s.m <= s.n;
  const bool large_contig_k = b_large ? s.transpose_b : !s.transpose_a;
  const uint64_t outs = s.m * s.n * batch_count(s);
  const std::string MN = u(s.m * s.n);
  if (large_contig_k || s.k >= 4096) {
    // One workgroup per output: threads stride over K, then a shared-memory tree reduction.
    const uint32_t wg = ksplit_workgroup(caps);
    Kernel k;
    k.name = "matmul_small_ksplit_" + transposes(s);
    const gl::Grid grid = gl::flat_groups(outs, caps, k.name);
    k.glsl = gl::render(R"(#version 450
// archetype: matmul small ${T} ${DIMS}: workgroup-per-output K reduction
layout(local_size_x = ${WG}) in;
${DECLS}shared float partial[${WG}];
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint batch = gid / ${MN}, mn = gid % ${MN};
  uint m = mn / ${N}, n = mn % ${N};
${OFFSETS}${SUM}  partial[t] = acc;
  barrier();
${REDUCE}  if (t == 0u) C[gid] = partial[0];
}
)",
                        {{"T", transposes(s)},
                         {"DIMS", gemm_dims(s)},
                         {"WG", std::to_string(wg)},
                         {"DECLS", decls()},
                         {"GRID", grid.glsl},
                         {"MN", MN},
                         {"N", u(s.n)},
                         {"OFFSETS", batch_offsets(s)},
                         {"SUM", k_sum(s, "  for (uint k = t; k < " + u(s.k) + "; k += " + u(wg) + ")\n")},
                         {"REDUCE", gl::tree_reduce(wg, " partial[t] += partial[t + s];", "  ")}});
    k.bindings = gemm_bindings();
    k.groups = grid.groups;
    return k;
  }
  // One thread per output; consecutive threads take consecutive elements of the large operand's
  // contiguous axis (n for B, m for a transposed A).
  const std::string coords = b_large ? "  uint batch = i / " + MN + ", mn = i % " + MN +
                                           ";\n  uint m = mn / " + u(s.n) + ", n = mn % " + u(s.n) + ";\n"
                                     : "  uint batch = i / " + MN + ", nm = i % " + MN +
                                           ";\n  uint n = nm / " + u(s.m) + ", m = nm % " + u(s.m) + ";\n";
  const std::string body = coords + batch_offsets(s) +
                           k_sum(s, "  for (uint k = 0u; k < " + u(s.k) + "; ++k)\n") + "  C[batch * " + MN +
                           " + m * " + u(s.n) + " + n] = acc;\n";
  return gl::elementwise("matmul_small_thread_" + transposes(s),
                         "matmul small " + transposes(s) + " " + gemm_dims(s) + ": thread-per-output K loop",
                         decls(), body, outs, gemm_bindings(), caps);
}

namespace {

// Whether `s` lowers to the workgroup-per-output kernel (small_gemm_kernel's first branch) because M is small:
// one matrix, M <= 8 <= ... N, B read along K.
bool gemv_shape(const GemmShape& s) {
  return batch_count(s) == 1 && s.m <= 8 && s.m <= s.n && s.k > 0 && s.transpose_b;
}

}  // namespace

std::string gemv_sibling_key(const ir::Graph& g, const ir::Node& n) {
  if (n.op != ir::Op::MatMul || numel(n.shape) == 0) return {};
  const GemmShape s = matmul_shape(g, n);
  if (!gemv_shape(s)) return {};
  return std::to_string(n.inputs[0]) + " " + su(s.transpose_a) + " " + su(s.m) + " " + su(s.k);
}

namespace {

// The workgroup-per-output kernel over several matmuls of one left operand A (bound at 0, or the prologue's
// buffers 0 .. pro.buffers - 1; member j's weights next as W<j>): one workgroup per output of any member, in
// member order, each reducing K exactly as small_gemm_kernel's workgroup-per-output branch does (same strided
// partial sums, same tree), so every value is bitwise what the member's own dispatch computes. `decls` declares
// the rest of the bindings (from pro.buffers + members); `finish` runs on thread 0 with the value in `partial[0]`, `gid` the flat output index
// over the members and `local` the index within its member (`finish` branches on `gid` when there are several).
// `pro` says how A(m, k) is formed:
//   plain      A is a buffer.
//   norm       (a GEMV norm prologue, kernel.h): A is the norm's input, scaled per k by GAMMA (when `gamma`; the
//              caller declares it) in the product, and x² is summed alongside in `partial2`; thread 0 scales
//              partial[0] by inversesqrt(mean(x²) + eps) before `finish`.
//   pointwise  (a GEMV pointwise prologue): `decls` (buffers 0 .. buffers - 1) and `code` (loads and nodes at the
//              element m * K + k) compute A(m, k) into the variable `value` inside the K loop, bitwise as the
//              pointwise kernel of those nodes would store it.
struct GemvPrologue {
  bool norm = false, gamma = false;  // the rms_norm prologue, with gamma
  double eps = 0;
  std::string decls, code, value;  // the pointwise prologue (value empty: none)
  int buffers = 1;                 // bindings before the weights
};

Kernel gemv_kernel(const std::vector<GemmShape>& ss, const std::string& name, const std::string& what,
                   const std::string& decls, const std::string& finish, const DeviceCaps& caps,
                   const GemvPrologue& pro = {}) {
  const uint32_t wg = ksplit_workgroup(caps);
  const bool pw = !pro.value.empty();
  std::string all_decls = pw ? pro.decls : gl::buffer(0, "A", DType::F32, true), sums, dims;
  uint64_t off = 0;
  for (size_t j = 0; j < ss.size(); ++j) {
    const GemmShape& s = ss[j];
    all_decls += gl::buffer(pro.buffers + int(j), "W" + su(j), DType::F32, true);
    const std::string cond = j + 1 == ss.size() ? "" : "if (gid < " + su(off + s.m * s.n) + "u) ";
    const std::string a = "A[" + a_index(s, "m", "k") + "]", w = "W" + su(j) + "[" + b_index(s, "k", "n") + "]";
    sums += std::string(j == 0 ? "  " : "  else ") + cond + "{\n    uint local = gid - " + su(off) +
            "u, m = local / " + su(s.n) + ", n = local % " + su(s.n) + ";\n    for (uint k = t; k < " + su(s.k) +
            "; k += " + su(wg) + ")" +
            (pro.norm   ? " {\n      float x = " + a + ";\n      acc = fma(x" + (pro.gamma ? " * GAMMA[k]" : "") +
                             ", " + w + ", acc);\n      ss = fma(x, x, ss);\n    }\n  }\n"
             : pw ? " {\n" + pro.code + "      acc = fma(" + pro.value + ", " + w + ", acc);\n    }\n  }\n"
                  : "\n      acc = fma(" + a + ", " + w + ", acc);\n  }\n");
    dims += std::string(j ? "; " : "") + gemm_dims(s);
    off += s.m * s.n;
  }
  Kernel k;
  k.name = name;
  const gl::Grid grid = gl::flat_groups(off, caps, k.name);
  k.glsl = gl::render(R"(#version 450
// archetype: matmul small ${WHAT} (${DIMS}): workgroup-per-output K reduction
layout(local_size_x = ${WG}) in;
${DECLS}shared float partial[${WG}];
${NORM_DECL}void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  float acc = 0.0;
${NORM_INIT}${SUMS}  partial[t] = acc;
${NORM_PUBLISH}  barrier();
${REDUCE}  if (t != 0u) return;
${NORM_SCALE}${FINISH}}
)",
                      {{"WHAT", what},
                       {"DIMS", dims},
                       {"WG", std::to_string(wg)},
                       {"DECLS", all_decls + decls},
                       {"NORM_DECL", pro.norm ? "shared float partial2[" + std::to_string(wg) + "];  // sums of x²\n" : ""},
                       {"GRID", grid.glsl},
                       {"NORM_INIT", pro.norm ? "  float ss = 0.0;\n" : ""},
                       {"SUMS", sums},
                       {"NORM_PUBLISH", pro.norm ? "  partial2[t] = ss;\n" : ""},
                       {"REDUCE", gl::tree_reduce(wg,
                                                  pro.norm ? " {\n      partial[t] += partial[t + s];\n      "
                                                            "partial2[t] += partial2[t + s];\n    }"
                                                          : " partial[t] += partial[t + s];",
                                                  "  ")},
                       {"NORM_SCALE", pro.norm ? "  partial[0] *= inversesqrt(partial2[0] * " +
                                                    gl::flit(1.0 / double(ss[0].k)) + " + " + gl::flit(pro.eps) +
                                                    ");  // rms_norm's rstd\n"
                                              : ""},
                       {"FINISH", finish}});
  k.groups = grid.groups;
  return k;
}

}  // namespace

namespace {

// The outputs of a GEMV fusion's members (the dispatch's nodes first, first + 1, ...): buffers Y<j> bound after
// `bindings`, and the stores of partial[0] by flat output index.
void sibling_outputs(const std::vector<GemmShape>& ss, int first, std::vector<Binding>& bindings, std::string& decls,
                     std::string& stores) {
  uint64_t off = 0;
  for (size_t j = 0; j < ss.size(); ++j) {
    decls += gl::buffer(int(bindings.size()), "Y" + su(j), DType::F32, false, true);
    bindings.push_back({BindingKind::Output, 0, true, first + int(j)});
    off += ss[j].m * ss[j].n;
    const std::string cond = j + 1 == ss.size() ? "" : "if (gid < " + su(off) + "u) ";
    stores += std::string(j == 0 ? "  " : "  else ") + cond + "Y" + su(j) + "[gid - " +
              su(off - ss[j].m * ss[j].n) + "u] = partial[0];\n";
  }
}

// The GEMV fusion of the matmuls `mms`, led by the norm prologue `norm` (the dispatch's first node) or not (-1).
Lowering gemv_siblings(const ir::Graph& g, const std::vector<int>& mms, int norm, const DeviceCaps& caps) {
  if (mms.empty() || mms.size() > kMaxGemvSiblings)
    throw Error("internal: a GEMV fusion of " + std::to_string(mms.size()) + " matmuls");
  std::vector<GemmShape> ss;
  const std::string key = gemv_sibling_key(g, g.node(mms[0]));
  for (int id : mms) {
    if (key.empty() || gemv_sibling_key(g, g.node(id)) != key)
      throw Error("internal: " + g.describe(id) + " cannot join the GEMV fusion of " + g.describe(mms[0]));
    ss.push_back(matmul_shape(g, g.node(id)));
  }
  const size_t J = mms.size();
  const int first = norm >= 0 ? 1 : 0;  // the dispatch's nodes: [norm,] the matmuls
  GemvPrologue pro;
  if (norm >= 0) {
    const ir::Node& nn = g.node(norm);
    for (int id : mms)
      if (!gemv_norm_prologue(g, nn, g.node(id)))
        throw Error("internal: " + g.describe(norm) + " cannot lead the GEMV fusion of " + g.describe(id));
    pro = {true, nn.inputs.size() > 1, nn.attrs.f("eps")};
  }
  std::string decls, stores;
  std::vector<Binding> bindings = {{BindingKind::Input, 0, false, 0}};  // A: the norm's input or the matmuls' A
  for (size_t j = 0; j < J; ++j) bindings.push_back({BindingKind::Input, 1, false, first + int(j)});
  sibling_outputs(ss, first, bindings, decls, stores);
  if (pro.gamma) {
    decls += gl::buffer(int(1 + 2 * J), "GAMMA", DType::F32, true);
    bindings.push_back({BindingKind::Input, 1, false, 0});
  }
  Kernel k = gemv_kernel(ss,
                         std::string("matmul_small_") + (norm >= 0 ? "rms_" : "") + "siblings" + su(J) + "_t" +
                             su(ss[0].transpose_a) + "1",
                         std::string(norm >= 0 ? "rms_norm prologue and " : "") + "GEMV fusion of " + su(J) +
                             " matmuls",
                         decls, stores, caps, pro);
  k.bindings = std::move(bindings);
  return gl::one_kernel(std::move(k));
}

}  // namespace

Lowering lower_gemv_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps) {
  if (nodes.size() < 2) throw Error("internal: a GEMV fusion of one matmul");
  return gemv_siblings(g, nodes, -1, caps);
}

bool gemv_norm_prologue(const ir::Graph& g, const ir::Node& norm, const ir::Node& mm) {
  if (norm.op != ir::Op::RmsNorm || mm.op != ir::Op::MatMul || mm.inputs[0] != norm.id ||
      gemv_sibling_key(g, mm).empty())
    return false;
  const GemmShape s = matmul_shape(g, mm);
  const Shape& x = g.node(norm.inputs[0]).shape;
  // A is the norm's output read along its last axis: K is that axis, M its rows.
  return !s.transpose_a && !x.empty() && uint64_t(x.back()) == s.k && uint64_t(numel(x)) == s.m * s.k &&
         (norm.inputs.size() < 2 || g.node(norm.inputs[1]).shape == Shape{x.back()});
}

Lowering lower_gemv_norm_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps) {
  if (nodes.size() < 2 || g.node(nodes[0]).op != ir::Op::RmsNorm)
    throw Error("internal: a GEMV norm prologue needs the norm first and a matmul");
  return gemv_siblings(g, std::vector<int>(nodes.begin() + 1, nodes.end()), nodes[0], caps);
}

namespace {

// A pointwise-prologue dispatch split into its parts: the pointwise nodes before the matmuls (p), the matmuls
// (mms), the pointwise nodes after them (e); empty mms when `nodes` is not one (gemv_pointwise_prologue).
struct PrologueParts {
  std::vector<int> p, mms, e;
};
PrologueParts prologue_parts(const ir::Graph& g, const std::vector<int>& nodes) {
  PrologueParts r;
  size_t k = 0;
  for (; k < nodes.size() && g.node(nodes[k]).op != ir::Op::MatMul; ++k) {
    if (!pointwise_fusible(g.node(nodes[k]))) return {};
    r.p.push_back(nodes[k]);
  }
  for (; k < nodes.size() && g.node(nodes[k]).op == ir::Op::MatMul; ++k) r.mms.push_back(nodes[k]);
  for (; k < nodes.size(); ++k) {
    if (!pointwise_fusible(g.node(nodes[k]))) return {};
    r.e.push_back(nodes[k]);
  }
  if (r.p.empty() || r.mms.empty() || r.mms.size() > kMaxGemvSiblings || (r.mms.size() > 1 && !r.e.empty()))
    return {};
  const int a = g.node(r.mms[0]).inputs[0];
  if (std::find(r.p.begin(), r.p.end(), a) == r.p.end()) return {};
  const std::string key = gemv_sibling_key(g, g.node(r.mms[0]));
  for (int id : r.mms) {
    const ir::Node& mm = g.node(id);
    if (key.empty() || gemv_sibling_key(g, mm) != key || std::count(r.p.begin(), r.p.end(), mm.inputs[1])) return {};
  }
  for (int id : r.e)  // the epilogue reads the matmul's value, never a prologue node's
    for (int x : g.node(id).inputs)
      if (std::count(r.p.begin(), r.p.end(), x)) return {};
  return r;
}

}  // namespace

bool gemv_pointwise_prologue(const ir::Graph& g, const std::vector<int>& nodes) {
  return !prologue_parts(g, nodes).mms.empty();
}

Lowering lower_gemv_pointwise_prologue(const ir::Graph& g, const std::vector<int>& nodes,
                                       const std::vector<bool>& stored, const DeviceCaps& caps) {
  const PrologueParts parts = prologue_parts(g, nodes);
  if (parts.mms.empty()) throw Error("internal: " + g.describe(nodes[0]) + "... is no GEMV pointwise prologue");
  for (size_t k = 0; k < parts.p.size(); ++k)
    if (stored.at(k)) throw Error("internal: the GEMV prologue node " + g.describe(parts.p[k]) + " is read outside");
  const size_t J = parts.mms.size(), first = parts.p.size();
  std::vector<GemmShape> ss;
  for (int id : parts.mms) ss.push_back(matmul_shape(g, g.node(id)));
  const int a = g.node(parts.mms[0]).inputs[0];
  // A(m, k) at element m * K + k of the prologue's shape (A untransposed: gemv_shape).
  PointwiseBody pb = pointwise_body(g, parts.p, std::vector<bool>(first, false), {}, {},
                                    "(m * " + u(ss[0].k) + " + k)");
  GemvPrologue pro;
  pro.decls = pb.decls;
  pro.code = pb.loads + pb.body;
  pro.value = "v" + std::to_string(a);
  pro.buffers = int(pb.bindings.size());
  std::vector<Binding> bindings = pb.bindings;
  for (size_t j = 0; j < J; ++j) bindings.push_back({BindingKind::Input, 1, false, int(first + j)});
  std::string decls, finish, what = "GEMV pointwise prologue (" + pb.ops + ")";
  if (parts.e.empty()) {
    sibling_outputs(ss, int(first), bindings, decls, finish);
    decls += gl::math_lib();
    what += " and " + su(J) + " matmul" + (J > 1 ? "s" : "");
  } else {
    const int mm = parts.mms[0];
    std::set<int> given(parts.p.begin(), parts.p.end());
    given.insert(mm);
    PointwiseBody eb = pointwise_body(g, nodes, stored, given, bindings, "gid");
    if (eb.written == 0) throw Error("internal: the GEMV epilogue of " + g.describe(mm) + " writes nothing");
    decls = eb.decls + gl::math_lib();
    finish = "  float v" + std::to_string(mm) + " = partial[0];\n" + eb.loads + eb.body + eb.stores;
    bindings = eb.bindings;
    what += ", a matmul and its epilogue (" + eb.ops + ")";
  }
  Kernel k = gemv_kernel(ss, "matmul_small_prologue" + su(first) + "_" + su(J) + "_e" + su(parts.e.size()), what,
                         decls, finish, caps, pro);
  k.bindings = std::move(bindings);
  return gl::one_kernel(std::move(k));
}

bool gemv_epilogue(const ir::Graph& g, const std::vector<int>& nodes) {
  if (nodes.size() < 2) return false;
  int matmuls = 0, mm = -1;
  for (int id : nodes) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::MatMul) ++matmuls, mm = id;
    else if (!pointwise_fusible(n)) return false;
  }
  if (matmuls != 1) return false;
  for (int x : g.node(mm).inputs)  // a member the matmul reads makes it a prologue
    if (std::count(nodes.begin(), nodes.end(), x)) return false;
  return true;
}

// The one matmul's workgroup-per-output reduction (gemv_kernel), then its pointwise readers at that output's
// element.
Lowering lower_gemv_epilogue(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                             const DeviceCaps& caps) {
  size_t km = nodes.size();
  for (size_t k = 0; k < nodes.size(); ++k)
    if (g.node(nodes[k]).op == ir::Op::MatMul) km = k;
  if (!gemv_epilogue(g, nodes) || gemv_sibling_key(g, g.node(nodes[km])).empty())
    throw Error("internal: " + g.describe(nodes[0]) + "... is no GEMV epilogue");
  const ir::Node& mm = g.node(nodes[km]);
  const GemmShape s = matmul_shape(g, mm);
  for (int id : nodes)
    if (g.node(id).shape != mm.shape)
      throw Error("internal: " + g.describe(id) + " has not the shape of " + g.describe(mm.id));
  PointwiseBody b = pointwise_body(g, nodes, stored, {mm.id},
                                   {{BindingKind::Input, 0, false, int(km)}, {BindingKind::Input, 1, false, int(km)}},
                                   "gid");
  if (b.written == 0) throw Error("internal: the GEMV epilogue of " + g.describe(mm.id) + " writes nothing");
  Kernel k = gemv_kernel({s}, "matmul_small_epilogue" + su(nodes.size() - 1) + "_" + transposes(s),
                         "GEMV epilogue: " + b.ops, b.decls + gl::math_lib(),
                         "  float v" + std::to_string(mm.id) + " = partial[0];\n" + b.loads + b.body + b.stores, caps);
  k.bindings = std::move(b.bindings);
  return gl::one_kernel(std::move(k));
}

}  // namespace mgn::codegen
