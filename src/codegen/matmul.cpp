// Batched matmul: c[b] = op(a[b']) · op(b[b'']) with numpy-broadcast batch axes and transpose flags. This
// file picks the kernel family and holds what the families share; each family has its file:
//  * Tiled (matmul_simt.cpp, the default): the register-tiled SIMT kernel, an instantiation of the tiled
//    GEMM emitter (gemm_tiled.h); small grids split K.
//  * Small (matmul_small.cpp): for M or N tiny (GEMV-like), a workgroup or a thread per output.
//  * CoopMatF16 (matmul_coopmat.cpp): A and B rounded to zero-padded f16 copies (non-parameter operands
//    scaled by a power of two first, matmul_coopmat_scale.cpp), then multiplied with
//    GL_NV_cooperative_matrix with f32 accumulation; Accelerated nodes only, once the device self-test
//    passed.
#include "codegen/matmul.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "codegen/glsl.h"
#include "codegen/matmul_common.h"
#include "mgn/types.h"

namespace mgn::codegen {

using gl::u;

uint64_t batch_count(const GemmShape& s) {
  uint64_t b = 1;
  for (uint64_t d : s.batch) b *= d;
  return b;
}

std::string gemm_dims(const GemmShape& s) {
  return "M=" + su(s.m) + " N=" + su(s.n) + " K=" + su(s.k) + " batch=" + su(batch_count(s));
}

std::string batch_offsets(const GemmShape& s) {
  std::string out = "  uint aoff = 0u, boff = 0u;\n  uint rest = batch;\n";
  for (size_t d = s.batch.size(); d-- > 0;) {
    if (s.batch[d] == 1) continue;
    out += "  { uint idx = rest % " + u(s.batch[d]) + "; rest /= " + u(s.batch[d]) + "; aoff += idx * " +
           u(s.a_stride[d] * s.m * s.k) + "; boff += idx * " + u(s.b_stride[d] * s.k * s.n) + "; }\n";
  }
  return out;
}

std::string a_index(const GemmShape& s, const std::string& m, const std::string& k) {
  return s.transpose_a ? "(" + k + ") * " + u(s.m) + " + (" + m + ")"
                       : "(" + m + ") * " + u(s.k) + " + (" + k + ")";
}
std::string b_index(const GemmShape& s, const std::string& k, const std::string& n) {
  return s.transpose_b ? "(" + n + ") * " + u(s.k) + " + (" + k + ")"
                       : "(" + k + ") * " + u(s.n) + " + (" + n + ")";
}

std::vector<Binding> gemm_bindings() {
  return {gl::input(0), gl::input(1), gl::output()};
}

uint64_t auto_splits(const GemmShape& s, uint64_t blocks, const SplitRule& rule) {
  uint64_t splits = 1;
  if (blocks < rule.below_blocks && s.k >= rule.min_k) {
    while (splits * 2 * blocks <= rule.max_blocks && s.k / (splits * 2) >= rule.min_chunk && splits < 16)
      splits *= 2;
    while (splits * 2 * blocks <= rule.long_max_blocks && s.k / (splits * 2) >= rule.long_chunk && splits < 16)
      splits *= 2;
  }
  return splits;
}

Binding GemmEpilogue::operand(int slot) const {
  return {BindingKind::Input, slot, false, int(km)};
}

PointwiseBody GemmEpilogue::body(std::vector<Binding> before, const std::string& index) const {
  PointwiseBody b = pointwise_body(*graph, nodes, stored, {matmul()}, std::move(before), index);
  if (b.written == 0) throw Error("internal: the GEMM epilogue of " + graph->describe(matmul()) + " writes nothing");
  return b;
}

std::string GemmEpilogue::code(const PointwiseBody& b, const std::string& value) const {
  return "  float v" + std::to_string(matmul()) + " = " + value + ";\n" + b.loads + b.body + b.stores;
}

uint64_t simt_scratch_words(const GemmShape& s, uint64_t splits) {
  return splits > 1 ? splits * batch_count(s) * s.m * s.n : 0;
}

namespace {

// The sum kernels' first statements: `sum`, item i's partial products (of type T, `count` per split) in split
// order.
std::string splitk_sum_head(const std::string& T, uint64_t splits, uint64_t count) {
  return gl::render(R"(  ${T} sum = P[i];
  for (uint p = 1u; p < ${SPLITS}; ++p) sum += P[p * ${COUNT} + i];
)",
                    {{"T", T}, {"SPLITS", u(splits)}, {"COUNT", u(count)}});
}

}  // namespace

Kernel splitk_sum_kernel(uint64_t splits, uint64_t outs, int slot, const DeviceCaps& caps,
                         const GemmEpilogue* epilogue) {
  const bool v4 = outs % 4 == 0;
  const std::string T = v4 ? "vec4" : "float";
  const uint64_t count = v4 ? outs / 4 : outs;
  std::string body = splitk_sum_head(T, splits, count);
  std::string decls = gl::buffer_as(0, T, "P", "readonly restrict ");
  std::vector<Binding> bindings = {{BindingKind::Scratch, slot, false}};
  std::string name = "matmul_splitk_sum_" + su(splits), what = "matmul split-K sum of " + su(splits) +
                                                             " partial products, in split order";
  if (!epilogue) {
    body += "  C[i] = sum;\n";
    decls += gl::buffer_as(1, T, "C", "writeonly restrict ");
    bindings.push_back(gl::output());
  } else {
    PointwiseBody b = epilogue->body(bindings, "ei");
    if (v4)
      body += "  for (uint q = 0u; q < 4u; ++q) {\n    uint ei = i * 4u + q;\n" +
              epilogue->code(b, "sum[q]") + "  }\n";
    else
      body += "  uint ei = i;\n" + epilogue->code(b, "sum");
    decls += b.decls + gl::math_lib();
    bindings = std::move(b.bindings);
    name += "_e" + su(epilogue->nodes.size() - 1);
    what += ", then the matmul's epilogue (" + b.ops + ")";
  }
  return gl::elementwise(name, what, decls, body, count, std::move(bindings), caps);
}

Kernel splitk_sum_grouped_kernel(uint64_t splits, const std::vector<uint64_t>& outs, int slot,
                                 const DeviceCaps& caps) {
  uint64_t total = 0;
  for (uint64_t o : outs) total += o;
  const bool v4 = std::all_of(outs.begin(), outs.end(), [](uint64_t o) { return o % 4 == 0; });
  const std::string T = v4 ? "vec4" : "float";
  const uint64_t w = v4 ? 4 : 1, count = total / w;
  std::string body = splitk_sum_head(T, splits, count);
  std::string decls = gl::buffer_as(0, T, "P", "readonly restrict ");
  std::vector<Binding> bindings = {{BindingKind::Scratch, slot, false}};
  uint64_t first = 0;
  for (size_t j = 0; j < outs.size(); ++j) {
    const std::string J = std::to_string(j), end = u((first + outs[j]) / w);
    decls += gl::buffer_as(int(1 + j), T, "C" + J, "writeonly restrict ");
    bindings.push_back(gl::output(int(j)));
    body += std::string(j ? "  else " : "  ") + (j + 1 < outs.size() ? "if (i < " + end + ") " : "") + "C" +
            J + "[i - " + u(first / w) + "] = sum;\n";
    first += outs[j];
  }
  return gl::elementwise("matmul_splitk_sum_" + su(splits) + "_x" + su(outs.size()),
                         "grouped matmul split-K sum of " + su(splits) + " partial products of " +
                             su(outs.size()) + " products, in split order",
                         decls, body, count, std::move(bindings), caps);
}

namespace {

// The cooperative-matrix kernel assumes 32-lane subgroups (NVIDIA's warps).
bool caps_allow_coopmat(const DeviceCaps& caps) {
  return caps.cooperative_matrix_nv && caps.subgroup_size == 32;
}

// Auto: the small kernel when M or N is tiny (GEMV-like), else the tiled one.
GemmVariant resolved_variant(const GemmShape& s, GemmVariant v) {
  if (v != GemmVariant::Auto) return v;
  return (s.m <= 8 || s.n <= 8) ? GemmVariant::Small : GemmVariant::Tiled;
}

}  // namespace

Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant) {
  GemmOptions o;
  o.variant = variant;
  o.mma = caps.coopmat_mma;
  return lower_gemm(s, caps, o);
}

Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmOptions& options) {
  if (s.a_stride.size() != s.batch.size() || s.b_stride.size() != s.batch.size())
    throw Error("matmul: batch strides do not match the batch rank");
  const GemmVariant variant = resolved_variant(s, options.variant);
  if (s.k == 0) {  // empty contraction: C is all zeros
    Lowering l;
    l.output_zero_filled = true;
    return l;
  }
  switch (variant) {
    case GemmVariant::Auto:
    case GemmVariant::Tiled:
      return simt_gemm(s, caps, options.tile, nullptr, options.k_vec4, options.splitk_fixup);
    case GemmVariant::Small:
      return gl::one_kernel(small_gemm_kernel(s, caps));
    case GemmVariant::CoopMatF16:
      return coopmat_gemm(s, caps, options.coopmat_tile, options.mma, options.coopmat_ablate, false,
                          options.coopmat_scaling);
  }
  throw Error("internal: unknown GEMM variant");
}

Lowering lower_gemm_coopmat(const GemmShape& s, const DeviceCaps& caps, const GemmTile& tile,
                            const CoopMatShape& mma, bool emulate, GemmAblation ablate, F16Scaling scaling) {
  if (s.a_stride.size() != s.batch.size() || s.b_stride.size() != s.batch.size())
    throw Error("matmul: batch strides do not match the batch rank");
  Lowering l;
  if (s.k == 0) {
    l.output_zero_filled = true;
    return l;
  }
  return coopmat_gemm(s, caps, tile, mma, ablate, emulate, scaling);
}

GemmShape matmul_shape(const ir::Graph& g, const ir::Node& node) {
  const Shape& as = g.node(node.inputs.at(0)).shape;
  const Shape& bs = g.node(node.inputs.at(1)).shape;
  const Shape& out = node.shape;
  GemmShape s;
  s.transpose_a = node.attrs.i("transpose_a") != 0;
  s.transpose_b = node.attrs.i("transpose_b") != 0;
  s.m = uint64_t(out[out.size() - 2]);
  s.n = uint64_t(out.back());
  s.k = uint64_t(s.transpose_a ? as[as.size() - 2] : as.back());
  const size_t nb = out.size() - 2, na = as.size() - 2, nbb = bs.size() - 2;
  s.batch.assign(out.begin(), out.end() - 2);
  s.a_stride.assign(nb, 0);
  s.b_stride.assign(nb, 0);
  // Right-aligned broadcast: an operand's batch dim of size 1 (or missing) has stride 0.
  uint64_t sa = 1, sb = 1;
  for (size_t d = nb; d-- > 0;) {
    size_t off = nb - d;  // 1-based position from the right
    if (off <= na) {
      uint64_t dim = uint64_t(as[na - off]);
      s.a_stride[d] = dim == 1 ? 0 : sa;
      sa *= dim;
    }
    if (off <= nbb) {
      uint64_t dim = uint64_t(bs[nbb - off]);
      s.b_stride[d] = dim == 1 ? 0 : sb;
      sb *= dim;
    }
  }
  return s;
}

namespace {

// Whether lower_matmul gives this node the f16 cooperative-matrix GEMM: an Accelerated node on a device whose
// self-test passed, with a product big enough to win back the packing passes (KernelOptions::f16_min_work,
// f16_min_dim).
bool takes_coopmat(const LowerContext& ctx, const GemmShape& s) {
  const KernelOptions& ko = ctx.options.kernels;
  const double work = double(s.m) * double(s.n) * double(s.k) * double(batch_count(s));
  return ctx.precision() == Precision::Accelerated && ko.f16_gemm && caps_allow_coopmat(ctx.caps) &&
         ctx.caps.coopmat_f16_verified && s.m > 8 && s.n > 8 && work >= double(ko.f16_min_work) &&
         std::min({s.m, s.n, s.k}) >= ko.f16_min_dim;
}

}  // namespace

std::string tunable_gemm_key(const LowerContext& ctx) {
  const KernelOptions& ko = ctx.options.kernels;
  if (ctx.node.op != ir::Op::MatMul || numel(ctx.node.shape) == 0 || !ko.gemm_tile.is_auto()) return "";
  const GemmShape s = matmul_shape(ctx.graph, ctx.node);
  if (s.k == 0 || ko.gemm == GemmKernel::Small || takes_coopmat(ctx, s)) return "";
  if (ko.gemm == GemmKernel::Auto && (s.m <= 8 || s.n <= 8)) return "";  // Auto's Small kernel
  std::string key = std::string(dtype_name(ctx.node.dtype)) + "/" +
                    (ctx.precision() == Precision::Accelerated ? "accelerated" : "strict") + "/" + su(s.m) + "x" +
                    su(s.n) + "x" + su(s.k) + "/t" + su(s.transpose_a) + su(s.transpose_b) + "/";
  for (size_t d = 0; d < s.batch.size(); ++d)
    key += (d ? "," : "") + su(s.batch[d]) + "." + su(s.a_stride[d]) + "." + su(s.b_stride[d]);
  return key;
}

std::vector<GemmTile> gemm_tune_candidates(const GemmShape& s, const DeviceCaps& caps) {
  std::vector<GemmTile> out;
  auto add = [&](const GemmTile& want) {
    try {
      GemmTile t = resolve_simt_tile(s, caps, want);
      t = resolve_simt_tile(s, caps, t);  // canonical: resolving again changes nothing
      if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
    } catch (const Error&) {
      // Not valid for this shape or device (threads, shared memory): not a candidate.
    }
  };
  add({});
  if (out.empty()) return out;
  const GemmTile def = out[0];
  for (uint32_t b : {32u, 64u, 128u}) add({.bm = b, .bn = b});
  // Split K around the default's count, each split keeping at least 64 of K.
  for (uint32_t f : {2u, 4u}) {
    const uint64_t splits = uint64_t(def.splits) * f;
    if (splits <= 16 && s.k / splits >= 64) add({.bm = def.bm, .bn = def.bn, .splits = uint32_t(splits)});
  }
  if (def.splits > 1) add({.bm = def.bm, .bn = def.bn, .splits = 1});
  return out;
}

namespace {

GemmOptions gemm_options(const LowerContext& ctx, const GemmShape& s) {
  const KernelOptions& ko = ctx.options.kernels;
  GemmOptions o;
  o.variant = ko.gemm == GemmKernel::Tiled   ? GemmVariant::Tiled
              : ko.gemm == GemmKernel::Small ? GemmVariant::Small
                                             : GemmVariant::Auto;
  o.tile = ko.gemm_tile;
  o.k_vec4 = ko.gemm_k_vec4;
  o.splitk_fixup = ko.gemm_splitk_fixup;
  if (!ctx.options.gemm_tuned.empty()) {
    auto it = ctx.options.gemm_tuned.find(tunable_gemm_key(ctx));
    if (it != ctx.options.gemm_tuned.end()) o.tile = it->second;
  }
  o.coopmat_tile = ko.f16_tile;
  o.coopmat_ablate = ko.f16_ablation;
  o.mma = ctx.caps.coopmat_mma;
  // Operands below f16's range (gradients) or above it are scaled by powers of two; parameters (weights,
  // O(1e-2..1)) are not, which saves their max pass.
  if (ko.f16_operand_scaling)
    o.coopmat_scaling = {ctx.input(0).op != ir::Op::Parameter, ctx.input(1).op != ir::Op::Parameter};
  // f16 inputs are only for nodes that allow reduced precision, on a device whose self-test passed.
  if (takes_coopmat(ctx, s)) o.variant = GemmVariant::CoopMatF16;
  return o;
}

}  // namespace

Lowering lower_matmul(const LowerContext& ctx) {
  if (numel(ctx.node.shape) == 0) return {};
  const GemmShape s = matmul_shape(ctx.graph, ctx.node);
  return lower_gemm(s, ctx.caps, gemm_options(ctx, s));
}

namespace {

// The options of matmul `n` when it lowers to the tiled GEMM, else nothing.
std::optional<GemmOptions> tiled_gemm_options(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                                              const CodegenOptions& options) {
  if (n.op != ir::Op::MatMul || numel(n.shape) == 0) return std::nullopt;
  const GemmShape s = matmul_shape(g, n);
  GemmOptions o = gemm_options({g, n, caps, options}, s);
  if (s.k == 0 || resolved_variant(s, o.variant) != GemmVariant::Tiled) return std::nullopt;
  return o;
}

// ... when it can also take an epilogue.
std::optional<GemmOptions> tiled_options(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                                         const CodegenOptions& options) {
  if (!options.kernels.gemm_epilogue) return std::nullopt;
  return tiled_gemm_options(g, n, caps, options);
}

}  // namespace

bool tiled_gemm_epilogue(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps, const CodegenOptions& options) {
  return tiled_options(g, n, caps, options).has_value();
}

size_t tiled_gemm_epilogue_room(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                                const CodegenOptions& options) {
  const std::optional<GemmOptions> o = tiled_options(g, n, caps, options);
  if (!o) return 0;
  const GemmTile t = resolve_simt_tile(matmul_shape(g, n), caps, o->tile);
  if (t.splits > 1) return SIZE_MAX;
  if (t.tm * t.tn > kStoreEpilogueAccumulators) return 0;
  const bool parameter_operand = g.node(n.inputs[0]).op == ir::Op::Parameter || g.node(n.inputs[1]).op == ir::Op::Parameter;
  return parameter_operand ? kStoreEpilogueNodes : 0;
}

std::vector<uint64_t> gemm_epilogue_scratch_words(const ir::Graph& g, const std::vector<int>& nodes,
                                                  const DeviceCaps& caps, const CodegenOptions& options) {
  for (int id : nodes) {
    const ir::Node& n = g.node(id);
    if (n.op != ir::Op::MatMul) continue;
    const std::optional<GemmOptions> o = tiled_options(g, n, caps, options);
    if (!o) return {};  // the GEMV kernel needs none
    const GemmShape s = matmul_shape(g, n);
    const uint64_t words = simt_scratch_words(s, resolve_simt_tile(s, caps, o->tile).splits);
    return words ? std::vector<uint64_t>{words} : std::vector<uint64_t>{};
  }
  return {};
}

Lowering lower_tiled_gemm_epilogue(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                                   const DeviceCaps& caps, const CodegenOptions& options) {
  GemmEpilogue e{&g, nodes, stored, nodes.size()};
  for (size_t k = 0; k < nodes.size(); ++k)
    if (g.node(nodes[k]).op == ir::Op::MatMul) e.km = k;
  if (!gemv_epilogue(g, nodes) || e.km == nodes.size()) throw Error("internal: " + g.describe(nodes.at(0)) + "... is no GEMM epilogue");
  const ir::Node& mm = g.node(e.matmul());
  const std::optional<GemmOptions> o = tiled_options(g, mm, caps, options);
  if (!o) return lower_gemv_epilogue(g, nodes, stored, caps);
  for (int id : nodes)
    if (g.node(id).shape != mm.shape)
      throw Error("internal: " + g.describe(id) + " has not the shape of " + g.describe(mm.id));
  return simt_gemm(matmul_shape(g, mm), caps, o->tile, &e, o->k_vec4, o->splitk_fixup);
}

std::string gemm_sibling_key(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                             const CodegenOptions& options) {
  if (!options.kernels.gemm_siblings) return {};
  const std::optional<GemmOptions> o = tiled_gemm_options(g, n, caps, options);
  if (!o) return {};
  const GemmShape s = matmul_shape(g, n);
  if (!s.transpose_b || g.node(n.inputs[1]).shape.size() != 2 || s.n % kGemmSiblingAlign != 0) return {};
  // Only products that would leave a big GPU partly idle alone (the grid the split-K rule tops up).
  const GemmTile t = resolve_simt_tile(s, caps, o->tile);
  if (div_up(s.m, t.bm) * div_up(s.n, t.bn) * batch_count(s) >= kSimtSplits.below_blocks) return {};
  std::string key = std::to_string(n.inputs[0]) + " " + su(s.transpose_a) + " " + su(s.m) + " " + su(s.k) +
                    " " +
                    (n.precision.value_or(options.default_precision) == Precision::Accelerated ? "a" : "s") +
                    " " + std::string(dtype_name(n.dtype));
  for (size_t d = 0; d < s.batch.size(); ++d) key += " " + su(s.batch[d]) + "." + su(s.a_stride[d]);
  return key;
}

Lowering lower_gemm_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                             const CodegenOptions& options) {
  if (nodes.size() < 2 || nodes.size() > kMaxGemmSiblings)
    throw Error("internal: a grouped GEMM of " + su(nodes.size()) + " matmuls");
  const std::string key = gemm_sibling_key(g, g.node(nodes[0]), caps, options);
  std::vector<uint64_t> seg_n;
  for (int id : nodes) {
    if (key.empty() || gemm_sibling_key(g, g.node(id), caps, options) != key)
      throw Error("internal: " + g.describe(id) + " is no sibling of " + g.describe(nodes[0]));
    seg_n.push_back(matmul_shape(g, g.node(id)).n);
  }
  const ir::Node& first = g.node(nodes[0]);
  GemmShape s = matmul_shape(g, first);
  s.n = 0;
  for (uint64_t n : seg_n) s.n += n;
  const GemmOptions o = *tiled_gemm_options(g, first, caps, options);
  return simt_gemm_grouped(s, seg_n, caps, options.kernels.gemm_tile, o.k_vec4, o.splitk_fixup);
}

}  // namespace mgn::codegen
