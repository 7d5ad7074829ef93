// Attention archetype: attention, attention_lse and attention_grad_{q,k,v} (semantics, GQA head mapping,
// mask broadcast, causal rule and the no-visible-key convention: src/backend/cpu/kernels_attention.cpp).
// This file routes the nodes and the two attention fusions to the kernel families and holds what they share
// (attention_common.h); the families: attention_row.cpp, attention_tiled.cpp (query-tiled),
// attention_grad_kv.cpp (key-tiled dK+dV). The kernels are row-wise online softmax and per-row dot products
// fused with it, not block GEMMs: they do not use the tiled GEMM emitter.
//
//   attention / attention_lse  one workgroup per query row (b, h, i). The keys are walked in tiles of WG:
//       thread t scores key j0 + t against the row's q (staged in shared memory), the tile maximum updates
//       the running maximum m (uniform across the workgroup), each thread keeps its share of the rescaled
//       running sum l, and the tile's probabilities go through shared memory so that thread t accumulates
//       output dims e = t, t + WG, ... of o (online softmax: one pass, no Skv-long scratch). lse = m + log l.
//   attention_grad_q  one workgroup per query row; per key tile thread t forms dS_ij = P_ij (do_i·v_j - D_i)
//       with P_ij = exp(s_ij - lse_i), and the threads accumulate dq over the dims of D.
//   attention_grad_k / _v  one workgroup per key row (b, hk, j), walking every query row of every query
//       head that reads kv head hk in tiles of WG: thread t forms the coefficient (dS_ij scale for dk, P_ij
//       for dv) and the threads accumulate over the dims of q (dk) or do (dv). dk first runs a
//       one-thread-per-row kernel writing D_i = do_i·o_i to scratch. Each output element has one owner.
//   attention_grad_kv (a fusion of _k and _v with the same inputs, see kernel.h): the same walk, thread t
//       forms P_ij and dS_ij scale once, and the workgroup accumulates dk (over q) and dv (over do) from
//       the same tile, so the scores and do_i·v_j are computed once for both.
//   attention / attention_lse, query-tiled (KernelOptions::attention, query_tiled below): one workgroup per
//   block of
//       WG query rows of one (b, h), one thread per row. Key and value tiles of BK rows are staged in shared
//       memory as vec4s and read by every thread of the block (broadcast), so each key row crosses L2 once
//       per block instead of once per query row. Each thread keeps its q and o in registers and runs the
//       online softmax of its own row (tile maximum, one rescale per tile), with no reduction across threads.
//       attention_grad_q has the same query-tiled form (q, do, dq in registers).
//   attention_grad_kv, key-tiled (grad_kv_tiled): a workgroup per block of WG key rows of one kv head, a
//       thread per key row; query tiles of every query head reading the kv head are shared by the block.
//   KernelOptions::attention (auto | row | tiled) picks between the forms (use_tiled, use_kv_tiled); auto
//   takes the tiled forms for the forward kernels only (the tiled derivative kernels were measured slower,
//   run 8). Every form sums a score's dims in the same order, so the derivatives' P = exp(s - lse) sees the
//   forward's scores.
// Masked scores are -inf and get probability exactly 0; a row with no visible key has m = -inf (forward:
// o = 0, lse = -inf) or lse = -inf (derivatives: the row is skipped), so no NaN is formed. Causal rows
// and columns are cut at the tile-loop bounds (key j visible to query i iff j <= i + Skv - Sq).
#include <algorithm>
#include <string>
#include <vector>

#include "codegen/attention_common.h"

namespace mgn::codegen {
namespace attn {

using gl::u;

bool is_forward(Kind k) {
  return k == Kind::Forward || k == Kind::Lse || k == Kind::ForwardLse;
}

Dims dims_of(const ir::Graph& g, const ir::Node& n) {
  const Shape &qs = g.node(n.inputs[0]).shape, &ks = g.node(n.inputs[1]).shape,
              &vs = g.node(n.inputs[2]).shape;
  return {uint64_t(qs[0]), uint64_t(qs[1]), uint64_t(ks[1]), uint64_t(qs[2]),
          uint64_t(ks[2]), uint64_t(qs[3]), uint64_t(vs[3])};
}

std::string dims_key(const Dims& d, bool causal, const Shape* mask) {
  auto join = [](const std::vector<uint64_t>& v) {
    std::string s;
    for (uint64_t e : v) s += (s.empty() ? "" : "x") + std::to_string(e);
    return s.empty() ? std::string("1") : s;
  };
  std::string k = "q" + join({d.B, d.Hq, d.Sq, d.D}) + "_kv" + join({d.Hkv, d.Skv, d.Dv});
  if (causal) k += "_causal";
  if (mask) k += "_mask" + join(std::vector<uint64_t>(mask->begin(), mask->end()));
  return k;
}

uint32_t workgroup_for(uint64_t tile, uint64_t dims, const DeviceCaps& caps) {
  uint32_t wg = 32;
  while (wg < 128 && (wg < tile || wg < dims) && wg * 2 <= caps.max_workgroup_invocations) wg *= 2;
  return wg;
}

uint32_t tiled_workgroup(const DeviceCaps& caps) {
  return std::min<uint32_t>(std::max<uint32_t>(caps.subgroup_size, 32), 64);
}

void Shared::add(const std::string& name, uint64_t n, const std::string& comment) {
  n = std::max<uint64_t>(n, 1);
  decls += "shared float " + name + "[" + std::to_string(n) + "];  // " + comment + "\n";
  words += n;
}

void check_shared(uint64_t bytes, const Problem& p, const std::string& what) {
  if (bytes > p.caps->max_shared_bytes)
    throw Error(p.who + ": " + what + " " + std::to_string(bytes) +
                " bytes of shared memory, the device allows " + std::to_string(p.caps->max_shared_bytes));
}

// Named constants, -inf, and `float mask_at(uint b, uint h, uint i, uint j)`: the mask broadcast to
// [B, Hq, Sq, Skv] with stride 0 on its broadcast dims (resolved here, at codegen time).
std::string prelude(const Dims& d, uint32_t wg, double scale, bool causal, const Shape* mask) {
  std::string s = "#define NEG_INF uintBitsToFloat(0xff800000u)\n";
  s += "const uint WG = " + u(wg) + ";\n";
  s += "const uint HQ = " + u(d.Hq) + ", HKV = " + u(d.Hkv) + ", REP = " + u(d.Hq / d.Hkv) +
       ";  // query head h reads kv head h / REP\n";
  s += "const uint SQ = " + u(d.Sq) + ", SKV = " + u(d.Skv) + ", D = " + u(d.D) + ", DV = " + u(d.Dv) + ";\n";
  s += "const float SCALE = " + gl::flit(scale) + ";\n";
  if (causal)
    s += "const int CAUSAL_OFF = " + std::to_string(int64_t(d.Skv) - int64_t(d.Sq)) +
         ";  // key j visible to query i iff j <= i + CAUSAL_OFF\n";
  if (mask) {
    Shape full = {int64_t(d.B), int64_t(d.Hq), int64_t(d.Sq), int64_t(d.Skv)};
    Shape m(4 - mask->size(), 1);
    m.insert(m.end(), mask->begin(), mask->end());
    std::vector<int64_t> st = gl::strides(m);
    const char* coord[4] = {"b", "h", "i", "j"};
    std::string idx;
    for (size_t a = 0; a < 4; ++a) {
      if (m[a] == 1) continue;  // broadcast (or size-1) dim: stride 0
      if (!idx.empty()) idx += " + ";
      idx += coord[a] + (st[a] == 1 ? "" : " * " + u(uint64_t(st[a])));
    }
    if (idx.empty()) idx = "0u";
    s += "// mask " + shape_str(*mask) + " broadcast to " + shape_str(full) + "\n";
    s += "float mask_at(uint b, uint h, uint i, uint j) { return MASK[" + idx + "]; }\n";
  }
  return s;
}

// `uint o_row(uint r)`: where query row r = (b * HQ + h) * SQ + i of o is stored: row r itself, or, with the
// head merge fused into the store, row (b * SQ + i) * HQ + h of [B, Sq, Hq, Dv].
std::string o_row_fn(bool bshd) {
  if (!bshd) return "uint o_row(uint r) { return r; }\n";
  return "uint o_row(uint r) {  // o stored as [B, SQ, HQ, DV]: the head merge\n"
         "  uint i = r % SQ, h = (r / SQ) % HQ, b = r / (SQ * HQ);\n"
         "  return (b * SQ + i) * HQ + h;\n}\n";
}

std::string attention_kernel_glsl(const Problem& p, bool unroll, const std::string& op,
                                  const std::string& design, uint32_t wg, const gl::Buffers& bufs,
                                  const std::string& decls, const std::string& main) {
  return gl::render(R"(#version 450
${UNROLL}// archetype: attention ${OP} ${KEY} scale ${SCALE}: ${DESIGN}
layout(local_size_x = ${WG}) in;
${BUFFERS}${PRELUDE}${DECLS}${MAIN})",
                    {{"UNROLL", unroll ? "#extension GL_EXT_control_flow_attributes : require\n" : ""},
                     {"OP", op},
                     {"KEY", p.key},
                     {"SCALE", gl::flit(p.scale)},
                     {"DESIGN", design},
                     {"WG", std::to_string(wg)},
                     {"BUFFERS", bufs.decls},
                     {"PRELUDE", prelude(p.d, wg, p.scale, p.causal, p.mask) + o_row_fn(p.o_bshd)},
                     {"DECLS", decls},
                     {"MAIN", main}});
}

std::string vec4_dot(const std::string& out, const std::string& x, const std::string& y,
                     const std::string& n4, const std::string& in) {
  std::string g = in + "float " + out + " = 0.0;\n" + in + "[[unroll]] for (uint c = 0u; c < " + n4 +
                  "; ++c) {\n" + in + "  vec4 x = " + x + ", y = " + y + ";\n";
  for (const char* e : {"x", "y", "z", "w"}) g += in + "  " + out + " += x." + e + " * y." + e + ";\n";
  return g + in + "}\n";
}

void add_delta_kernel(Lowering& l, const Problem& p) {
  const Dims& d = p.d;
  const uint64_t qrows = d.B * d.Hq * d.Sq;
  l.scratch_words = {std::max<uint64_t>(qrows, 1)};
  const std::string decls = gl::buffer(0, "O", DType::F32, true) + gl::buffer(1, "DO", DType::F32, true) +
                            gl::buffer(2, "DELTA", DType::F32, false, true) + gl::const_uint("DV", d.Dv);
  const std::string body =
      "  float a = 0.0;\n  for (uint e = 0u; e < DV; ++e) a += DO[i * DV + e] * O[i * DV + e];\n"
      "  DELTA[i] = a;\n";
  l.kernels.push_back(gl::elementwise(
      "attention_grad_delta_" + p.key, "attention " + p.op + " D_i = do_i . o_i " + p.key, decls, body, qrows,
      {gl::input(3), gl::input(4), {BindingKind::Scratch, 0, true}}, *p.caps));
}

namespace {

// The problem of attention node `n` (`op`: the kernels' name prefix, `who`: the node(s) for errors), its
// index spaces checked against 32-bit indexing.
Problem problem_of(const ir::Graph& g, const ir::Node& n, int mask_input, const std::string& op,
                   const std::string& who, const DeviceCaps& caps) {
  Problem p;
  p.d = dims_of(g, n);
  p.mask = n.inputs.size() > size_t(mask_input) ? &g.node(n.inputs[size_t(mask_input)]).shape : nullptr;
  p.causal = n.attrs.i("causal") != 0;
  p.scale = n.attrs.f("scale");
  p.key = dims_key(p.d, p.causal, p.mask);
  p.op = op;
  p.who = who;
  p.caps = &caps;
  const Dims& d = p.d;
  const Shape o{int64_t(d.B), int64_t(d.Hq), int64_t(d.Sq), int64_t(d.Dv)};
  for (const Shape& s : {g.node(n.inputs[0]).shape, g.node(n.inputs[1]).shape, g.node(n.inputs[2]).shape, o})
    gl::check_32bit(gl::numel_u(s), who);
  if (p.mask) gl::check_32bit(gl::numel_u(*p.mask), who);
  return p;
}

// The nodes of a two-node attention fusion: the position in `nodes` of the `first` op, after checking that
// the two are `first` and `second` with the same inputs and attributes (`what` names them in errors).
int attention_pair(const ir::Graph& g, const std::vector<int>& nodes, ir::Op first, ir::Op second,
                   const std::string& what) {
  if (nodes.size() != 2) throw Error("internal: the " + what + " kernel takes two nodes");
  const int pa = g.node(nodes[0]).op == first ? 0 : 1;
  const ir::Node &na = g.node(nodes[size_t(pa)]), &nb = g.node(nodes[size_t(1 - pa)]);
  if (na.op != first || nb.op != second || na.inputs != nb.inputs || !(na.attrs == nb.attrs))
    throw Error("internal: " + g.describe(na.id) + " and " + g.describe(nb.id) + " are not the " + what +
                " pair of one attention");
  return pa;
}

// One attention node's kernels (`n`; for ForwardLse the attention node of the pair, `who` names both).
// `outs`: the dispatch nodes the forward kinds write.
Lowering lower_one(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                   const CodegenOptions& options, Kind kind, FwdOuts outs, const std::string& who,
                   const std::string& op) {
  if (gl::numel_u(n.shape) == 0) return {};
  Problem p = problem_of(g, n, is_forward(kind) ? 3 : 6, op, who, caps);
  if (outs.o_bshd) {
    p.o_bshd = true;
    p.key += "_obshd";  // another kernel: its name (and so its cache entries) must say so
  }
  if (use_query_tiled(p.d, kind, caps, options.kernels.attention))
    return gl::one_kernel(query_tiled(p, kind, outs));
  return row_lowering(p, kind, outs);
}

}  // namespace
}  // namespace attn

bool attention_grad_kv_fits(const ir::Graph& g, int grad_k, int grad_v, const DeviceCaps& caps) {
  const ir::Node &nk = g.node(grad_k), &nv = g.node(grad_v);
  if (nk.op != ir::Op::AttentionGradK || nv.op != ir::Op::AttentionGradV || nk.inputs != nv.inputs)
    return false;
  if (gl::numel_u(nk.shape) == 0 || gl::numel_u(nv.shape) == 0) return false;
  const attn::Dims d = attn::dims_of(g, nk);
  return attn::grad_kv_shared_bytes(d, attn::grad_kv_workgroup(d, caps)) <= caps.max_shared_bytes;
}

// attention_grad_k and attention_grad_v of the same inputs (nodes: both, ascending): the D_i kernel, then
// one kernel writing both derivatives.
Lowering lower_attention_grad_kv(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                                 const CodegenOptions& options) {
  const int pk = attn::attention_pair(g, nodes, ir::Op::AttentionGradK, ir::Op::AttentionGradV, "dK+dV"),
            pv = 1 - pk;
  const ir::Node &nk = g.node(nodes[size_t(pk)]), &nv = g.node(nodes[size_t(pv)]);
  const attn::Problem p =
      attn::problem_of(g, nk, 6, "attention_grad_kv", g.describe(nk.id) + " + " + g.describe(nv.id), caps);
  if (!attn::use_kv_tiled(p.d, options.kernels.attention)) return attn::row_grad_kv_lowering(p, pk, pv);
  Lowering l;
  attn::add_delta_kernel(l, p);
  attn::grad_kv_tiled(l, p, pk, pv);
  return l;
}

Lowering lower_attention(const LowerContext& ctx) {
  using attn::Kind;
  Kind kind = Kind::Forward;
  attn::FwdOuts outs;
  // clang-format off
  switch (ctx.node.op) {
    case ir::Op::Attention: kind = Kind::Forward, outs.o = 0; break;
    case ir::Op::AttentionLse: kind = Kind::Lse, outs.lse = 0; break;
    case ir::Op::AttentionGradQ: kind = Kind::GradQ; break;
    case ir::Op::AttentionGradK: kind = Kind::GradK; break;
    case ir::Op::AttentionGradV: kind = Kind::GradV; break;
#define MGN_FAMILY_Attention
#include "codegen/other_ops.inc"
      throw Error("internal: " + ctx.graph.describe(ctx.node.id) + " is not an attention op");
  }
  // clang-format on
  return attn::lower_one(ctx.graph, ctx.node, ctx.caps, ctx.options, kind, outs,
                         ctx.graph.describe(ctx.node.id), ir::op_name(ctx.node.op));
}

bool attention_head_merge(const ir::Graph& g, const ir::Node& permute) {
  if (permute.op != ir::Op::Permute || permute.dtype != DType::F32 || permute.inputs.size() != 1)
    return false;
  const ir::Node& a = g.node(permute.inputs[0]);
  return a.op == ir::Op::Attention && a.dtype == DType::F32 && a.shape.size() == 4 &&
         gl::numel_u(a.shape) > 0 && permute.attrs.ints("perm") == std::vector<int64_t>{0, 2, 1, 3};
}

// The forward fusions (nodes ascending): attention and attention_lse of the same inputs, one forward pass
// writing o and lse (every element the one the separate kernels write: lse never depended on whether o is
// formed); and either of attention or that pair with the head merge of o (attention_head_merge), which then
// stores o permuted in place of the permute's copy (o itself is not stored).
Lowering lower_attention_fused(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                               const CodegenOptions& options) {
  int po = -1, pl = -1, pp = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = g.node(nodes[i]);
    int& slot = n.op == ir::Op::Attention ? po : n.op == ir::Op::AttentionLse ? pl : pp;
    if (slot >= 0 ||
        (n.op != ir::Op::Attention && n.op != ir::Op::AttentionLse && !attention_head_merge(g, n)))
      throw Error("internal: " + g.describe(n.id) + " in an attention forward fusion");
    slot = int(i);
  }
  if (po < 0 || (pl < 0 && pp < 0) || (pp >= 0 && g.node(nodes[size_t(pp)]).inputs[0] != nodes[size_t(po)]))
    throw Error("internal: " + g.describe(nodes.at(0)) + "... is no attention forward fusion");
  const ir::Node& no = g.node(nodes[size_t(po)]);
  std::string who = g.describe(no.id);
  if (pl >= 0) {
    const ir::Node& nl = g.node(nodes[size_t(pl)]);
    if (no.inputs != nl.inputs || !(no.attrs == nl.attrs))
      throw Error("internal: " + g.describe(no.id) + " and " + g.describe(nl.id) +
                  " are not the attention + lse pair of one attention");
    if (gl::numel_u(nl.shape) == 0)
      throw Error("internal: " + g.describe(no.id) +
                  ": the attention + lse kernel needs both outputs non-empty");
    who += " + " + g.describe(nl.id);
  }
  if (pp >= 0) who += " + " + g.describe(nodes[size_t(pp)]);
  attn::FwdOuts outs{pp >= 0 ? pp : po, pl, pp >= 0};
  return attn::lower_one(g, no, caps, options, pl >= 0 ? attn::Kind::ForwardLse : attn::Kind::Forward, outs,
                         who, pl >= 0 ? "attention_with_lse" : "attention");
}

}  // namespace mgn::codegen
