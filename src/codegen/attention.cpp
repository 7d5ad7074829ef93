// Attention archetype: attention, attention_lse and attention_grad_{q,k,v} (semantics, GQA head mapping,
// mask broadcast, causal rule and the no-visible-key convention: src/backend/cpu/kernels_attention.cpp).
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
// Masked scores are -inf and get probability exactly 0; a row with no visible key has m = -inf (forward:
// o = 0, lse = -inf) or lse = -inf (derivatives: the row is skipped), so no NaN is formed. Causal rows
// and columns are cut at the tile-loop bounds (key j visible to query i iff j <= i + Skv - Sq).
#include <algorithm>
#include <string>
#include <vector>

#include "codegen/glsl_util.h"

namespace mgn::codegen {
namespace {

using gl::u;

struct Dims {
  uint64_t B, Hq, Hkv, Sq, Skv, D, Dv;
};

enum class Kind { Forward, Lse, GradQ, GradK, GradV };

// Threads per workgroup: the tile length, also enough to cover `dims` output dims with one accumulator.
uint32_t workgroup_for(uint64_t tile, uint64_t dims, const DeviceCaps& caps) {
  uint32_t wg = 32;
  while (wg < 128 && (wg < tile || wg < dims) && wg * 2 <= caps.max_workgroup_invocations) wg *= 2;
  return wg;
}

// Storage buffers numbered in the order they are added (binding i of the shader is bindings[i]).
struct Buffers {
  std::string decls;
  std::vector<Binding> bindings;
  void add(const std::string& name, Binding b) {
    decls += gl::buffer(int(bindings.size()), name, DType::F32, !b.written, b.written);
    bindings.push_back(b);
  }
};

// Shared float arrays, counted against the device limit.
struct Shared {
  std::string decls;
  uint64_t words = 0;
  void add(const std::string& name, uint64_t n, const std::string& comment) {
    n = std::max<uint64_t>(n, 1);
    decls += "shared float " + name + "[" + std::to_string(n) + "];  // " + comment + "\n";
    words += n;
  }
};

Binding in(int i) { return {BindingKind::Input, i, false}; }

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

// Row kernels (forward, grad_q): this workgroup's query row gid unpacked into (b, h, i), the first row of
// its kv head in K and V, the end of its visible keys, and its q staged in s_q (published by a barrier
// the caller issues).
std::string query_row_setup(bool causal) {
  std::string s =
      "  uint t = gl_LocalInvocationID.x;\n"
      "  uint i = gid % SQ, h = (gid / SQ) % HQ, b = gid / (SQ * HQ);\n"
      "  uint kbase = (b * HKV + h / REP) * SKV;  // row of key 0 of this kv head\n";
  if (causal)
    s += "  uint kend = uint(clamp(int(i) + CAUSAL_OFF + 1, 0, int(SKV)));  // keys [0, kend) visible\n";
  else
    s += "  uint kend = SKV;\n";
  return s + "  for (uint d = t; d < D; d += WG) s_q[d] = Q[gid * D + d];\n";
}

// The scaled, masked score of the staged query against key row kbase + j.
std::string score_fn(bool has_mask) {
  return "float score(uint b, uint h, uint i, uint j, uint kbase) {\n  float a = 0.0;\n"
         "  for (uint d = 0u; d < D; ++d) a += s_q[d] * K[(kbase + j) * D + d];\n  return SCALE * a" +
         std::string(has_mask ? " + mask_at(b, h, i, j)" : "") + ";\n}\n";
}

// Per-thread accumulators: thread t owns output dims t, t + WG, ... (n of them). acc_update adds, at
// indentation `in`, the tile's n rows: acc[c] = acc[c] * scale + sum_r coef[r] * X[(row0 + r) * dims + e].
std::string acc_decl(uint64_t n, const std::string& acc = "acc") {
  return "  float " + acc + "[" + std::to_string(std::max<uint64_t>(n, 1)) + "];\n  for (uint c = 0u; c < " + u(n) +
         "; ++c) " + acc + "[c] = 0.0;\n";
}
std::string acc_update(uint64_t n, const std::string& coef, const std::string& x, const std::string& row0,
                       const std::string& dims, const std::string& scale, const std::string& in,
                       const std::string& acc = "acc") {
  return in + "for (uint c = 0u; c < " + u(n) + "; ++c) {\n" +  //
         in + "  uint e = t + c * WG;\n" +                       //
         in + "  if (e >= " + dims + ") break;\n" +              //
         in + "  float a = " + acc + "[c]" + scale + ";\n" +     //
         in + "  for (uint r = 0u; r < n; ++r)\n" +                //
         in + "    a += " + coef + "[r] * " + x + "[(" + row0 + " + r) * " + dims + " + e];\n" +  //
         in + "  " + acc + "[c] = a;\n" + in + "}\n";
}
std::string acc_store(uint64_t n, const std::string& out, const std::string& dims, const std::string& factor,
                      const std::string& acc = "acc") {
  return "  for (uint c = 0u; c < " + u(n) + "; ++c) {\n    uint e = t + c * WG;\n    if (e < " + dims +
         ") " + out + "[gid * " + dims + " + e] = " + acc + "[c]" + factor + ";\n  }\n";
}

// attention / attention_lse. The maximum is reduced across the workgroup per tile (so every thread
// rescales by the same alpha), the sum only once at the end (each thread rescales its own share).
std::string forward_main(const std::string& grid, bool out_o, bool causal, bool has_mask, uint64_t acc_n) {
  std::string g = score_fn(has_mask) + "void main() {\n" + grid + query_row_setup(causal) + "  barrier();\n";
  g += "  float m = NEG_INF;  // running maximum of the row's scores (uniform across the workgroup)\n"
       "  float l = 0.0;      // this thread's share of sum_j exp(s_j - m)\n";
  if (out_o) g += acc_decl(acc_n);
  g += "  for (uint j0 = 0u; j0 < kend; j0 += WG) {\n"
       "    uint j = j0 + t;\n"
       "    float s = j < kend ? score(b, h, i, j, kbase) : NEG_INF;\n"
       "    float mn = max(m, wg_max(s));\n"
       "    if (mn == NEG_INF) continue;  // nothing visible so far (uniform)\n"
       "    float alpha = m == NEG_INF ? 0.0 : exp(m - mn);\n"
       "    float p = s == NEG_INF ? 0.0 : exp(s - mn);\n"
       "    l = l * alpha + p;\n"
       "    m = mn;\n";
  if (out_o)
    g += "    s_p[t] = p;\n    barrier();\n    uint n = min(WG, kend - j0);\n" +
         acc_update(acc_n, "s_p", "V", "kbase + j0", "DV", " * alpha", "    ") + "    barrier();\n";
  g += "  }\n  l = wg_sum(l);\n";
  if (out_o)
    g += "  float inv = m == NEG_INF ? 0.0 : 1.0 / l;  // no visible key: o = 0\n" +
         acc_store(acc_n, "O", "DV", " * inv");
  else
    g += "  if (t == 0u) LSE[gid] = m == NEG_INF ? NEG_INF : m + log(l);\n";
  return g + "}\n";
}

// attention_grad_q: P is recomputed from the saved lse, so one pass over the keys suffices.
std::string grad_q_main(const std::string& grid, bool causal, bool has_mask, uint64_t acc_n) {
  std::string g = score_fn(has_mask) + "void main() {\n" + grid + query_row_setup(causal);
  g += "  for (uint e = t; e < DV; e += WG) s_do[e] = DO[gid * DV + e];\n"
       "  float part = 0.0;\n"
       "  for (uint e = t; e < DV; e += WG) part += DO[gid * DV + e] * O[gid * DV + e];\n"
       "  float di = wg_sum(part);  // D_i = do_i . o_i; the barriers inside also publish s_q and s_do\n"
       "  float lse = LSE[gid];\n" +
       acc_decl(acc_n);
  g += "  if (lse != NEG_INF) {  // a row with no visible key has no derivative (uniform)\n"
       "    for (uint j0 = 0u; j0 < kend; j0 += WG) {\n"
       "      uint j = j0 + t;\n"
       "      float ds = 0.0;\n"
       "      if (j < kend) {\n"
       "        float s = score(b, h, i, j, kbase);\n"
       "        if (s != NEG_INF) {\n"
       "          float dp = 0.0;\n"
       "          for (uint e = 0u; e < DV; ++e) dp += s_do[e] * V[(kbase + j) * DV + e];\n"
       "          ds = exp(s - lse) * (dp - di) * SCALE;\n"
       "        }\n"
       "      }\n"
       "      s_ds[t] = ds;\n"
       "      barrier();\n"
       "      uint n = min(WG, kend - j0);\n";
  g += acc_update(acc_n, "s_ds", "K", "kbase + j0", "D", "", "      ") + "      barrier();\n    }\n  }\n";
  return g + acc_store(acc_n, "DQ", "D", "") + "}\n";
}

// attention_grad_k / _v: the key row owns its output, so the sum over queries and heads needs no atomics.
std::string grad_kv_main(const std::string& grid, bool dk, bool causal, bool has_mask, uint64_t acc_n) {
  const std::string X = dk ? "Q" : "DO", XD = dk ? "D" : "DV";
  std::string g = "void main() {\n" + grid +
                  "  uint t = gl_LocalInvocationID.x;\n"
                  "  uint j = gid % SKV, hk = (gid / SKV) % HKV, b = gid / (SKV * HKV);\n"
                  "  for (uint d = t; d < D; d += WG) s_k[d] = K[gid * D + d];\n";
  if (dk) g += "  for (uint e = t; e < DV; e += WG) s_v[e] = V[gid * DV + e];\n";
  g += "  barrier();\n";
  if (causal)
    g += "  uint istart = uint(clamp(int(j) - CAUSAL_OFF, 0, int(SQ)));  // first query that sees key j\n";
  else
    g += "  uint istart = 0u;\n";
  g += acc_decl(acc_n);
  g += "  for (uint h = hk * REP; h < (hk + 1u) * REP; ++h) {\n"
       "    uint qrow0 = (b * HQ + h) * SQ;  // row of query 0 of head h\n"
       "    for (uint i0 = istart; i0 < SQ; i0 += WG) {\n"
       "      uint i = i0 + t;\n"
       "      float coef = 0.0;\n"
       "      if (i < SQ) {\n"
       "        uint r = qrow0 + i;\n"
       "        float lse = LSE[r];\n"
       "        if (lse != NEG_INF) {  // rows with no visible key contribute nothing\n"
       "          float a = 0.0;\n"
       "          for (uint d = 0u; d < D; ++d) a += Q[r * D + d] * s_k[d];\n"
       "          float s = SCALE * a" +
       std::string(has_mask ? " + mask_at(b, h, i, j)" : "") +
       ";\n"
       "          if (s != NEG_INF) {\n"
       "            float p = exp(s - lse);\n";
  if (dk)
    g += "            float dp = 0.0;\n"
         "            for (uint e = 0u; e < DV; ++e) dp += DO[r * DV + e] * s_v[e];\n"
         "            coef = p * (dp - DELTA[r]) * SCALE;  // dS_ij * scale\n";
  else
    g += "            coef = p;\n";
  g += "          }\n"
       "        }\n"
       "      }\n"
       "      s_coef[t] = coef;\n"
       "      barrier();\n"
       "      uint n = min(WG, SQ - i0);\n";
  g += acc_update(acc_n, "s_coef", X, "qrow0 + i0", XD, "", "      ") + "      barrier();\n    }\n  }\n";
  return g + acc_store(acc_n, "OUT", XD, "") + "}\n";
}

// attention_grad_k + attention_grad_v in one pass: each thread forms P_ij once and, from it, dS_ij; the
// workgroup accumulates dk over the dims of q and dv over the dims of do from the same query tiles.
std::string grad_kv_fused_main(const std::string& grid, bool causal, bool has_mask, uint64_t acc_k, uint64_t acc_v) {
  std::string g = "void main() {\n" + grid +
                  "  uint t = gl_LocalInvocationID.x;\n"
                  "  uint j = gid % SKV, hk = (gid / SKV) % HKV, b = gid / (SKV * HKV);\n"
                  "  for (uint d = t; d < D; d += WG) s_k[d] = K[gid * D + d];\n"
                  "  for (uint e = t; e < DV; e += WG) s_v[e] = V[gid * DV + e];\n"
                  "  barrier();\n";
  if (causal)
    g += "  uint istart = uint(clamp(int(j) - CAUSAL_OFF, 0, int(SQ)));  // first query that sees key j\n";
  else
    g += "  uint istart = 0u;\n";
  g += acc_decl(acc_k, "acc_k") + acc_decl(acc_v, "acc_v");
  g += "  for (uint h = hk * REP; h < (hk + 1u) * REP; ++h) {\n"
       "    uint qrow0 = (b * HQ + h) * SQ;  // row of query 0 of head h\n"
       "    for (uint i0 = istart; i0 < SQ; i0 += WG) {\n"
       "      uint i = i0 + t;\n"
       "      float p = 0.0, ds = 0.0;\n"
       "      if (i < SQ) {\n"
       "        uint r = qrow0 + i;\n"
       "        float lse = LSE[r];\n"
       "        if (lse != NEG_INF) {  // rows with no visible key contribute nothing\n"
       "          float a = 0.0;\n"
       "          for (uint d = 0u; d < D; ++d) a += Q[r * D + d] * s_k[d];\n"
       "          float s = SCALE * a" +
       std::string(has_mask ? " + mask_at(b, h, i, j)" : "") +
       ";\n"
       "          if (s != NEG_INF) {\n"
       "            p = exp(s - lse);\n"
       "            float dp = 0.0;\n"
       "            for (uint e = 0u; e < DV; ++e) dp += DO[r * DV + e] * s_v[e];\n"
       "            ds = p * (dp - DELTA[r]) * SCALE;  // dS_ij * scale\n"
       "          }\n"
       "        }\n"
       "      }\n"
       "      s_p[t] = p;\n"
       "      s_ds[t] = ds;\n"
       "      barrier();\n"
       "      uint n = min(WG, SQ - i0);\n";
  g += acc_update(acc_k, "s_ds", "Q", "qrow0 + i0", "D", "", "      ", "acc_k") +
       acc_update(acc_v, "s_p", "DO", "qrow0 + i0", "DV", "", "      ", "acc_v") + "      barrier();\n    }\n  }\n";
  return g + acc_store(acc_k, "DK", "D", "", "acc_k") + acc_store(acc_v, "DVOUT", "DV", "", "acc_v") + "}\n";
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

// D_i = do_i . o_i, once per query row, into scratch 0 (the kernel before dk's).
void add_delta_kernel(Lowering& l, const Dims& d, const std::string& key, const std::string& op,
                      const DeviceCaps& caps) {
  const uint64_t qrows = d.B * d.Hq * d.Sq;
  l.scratch_words = {std::max<uint64_t>(qrows, 1)};
  std::string decls = gl::buffer(0, "O", DType::F32, true) + gl::buffer(1, "DO", DType::F32, true) +
                      gl::buffer(2, "DELTA", DType::F32, false, true) + "const uint DV = " + u(d.Dv) + ";\n";
  std::string b =
      "  float a = 0.0;\n  for (uint e = 0u; e < DV; ++e) a += DO[i * DV + e] * O[i * DV + e];\n"
      "  DELTA[i] = a;\n";
  l.kernels.push_back(gl::elementwise("attention_grad_delta_" + key, "attention " + op + " D_i = do_i . o_i " + key,
                                      decls, b, qrows, {in(3), in(4), {BindingKind::Scratch, 0, true}}, caps));
}

Dims dims_of(const ir::Graph& g, const ir::Node& n) {
  const Shape &qs = g.node(n.inputs[0]).shape, &ks = g.node(n.inputs[1]).shape, &vs = g.node(n.inputs[2]).shape;
  return {uint64_t(qs[0]), uint64_t(qs[1]), uint64_t(ks[1]), uint64_t(qs[2]),
          uint64_t(ks[2]), uint64_t(qs[3]), uint64_t(vs[3])};
}

// The fused dK+dV kernel's workgroup and shared memory (s_k, s_v, s_p, s_ds, and wg_reduce_lib's s_red).
uint32_t grad_kv_workgroup(const Dims& d, const DeviceCaps& caps) {
  return workgroup_for(d.Sq, std::max(d.D, d.Dv), caps);
}
uint64_t grad_kv_shared_bytes(const Dims& d, uint32_t wg) {
  return (std::max<uint64_t>(d.D, 1) + std::max<uint64_t>(d.Dv, 1) + 3 * uint64_t(wg)) * 4;
}

}  // namespace

bool attention_grad_kv_fits(const ir::Graph& g, int grad_k, int grad_v, const DeviceCaps& caps) {
  const ir::Node &nk = g.node(grad_k), &nv = g.node(grad_v);
  if (nk.op != ir::Op::AttentionGradK || nv.op != ir::Op::AttentionGradV || nk.inputs != nv.inputs) return false;
  if (gl::numel_u(nk.shape) == 0 || gl::numel_u(nv.shape) == 0) return false;
  const Dims d = dims_of(g, nk);
  return grad_kv_shared_bytes(d, grad_kv_workgroup(d, caps)) <= caps.max_shared_bytes;
}

// attention_grad_k and attention_grad_v of the same inputs (nodes: both, ascending): the D_i kernel, then
// one workgroup per key row writing both derivatives.
Lowering lower_attention_grad_kv(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps) {
  if (nodes.size() != 2) throw Error("internal: the dK+dV kernel takes two nodes");
  const int pk = g.node(nodes[0]).op == ir::Op::AttentionGradK ? 0 : 1, pv = 1 - pk;
  const ir::Node &nk = g.node(nodes[size_t(pk)]), &nv = g.node(nodes[size_t(pv)]);
  if (nk.op != ir::Op::AttentionGradK || nv.op != ir::Op::AttentionGradV || nk.inputs != nv.inputs ||
      !(nk.attrs == nv.attrs))
    throw Error("internal: " + g.describe(nk.id) + " and " + g.describe(nv.id) + " are not dK and dV of one attention");
  const std::string who = g.describe(nk.id) + " + " + g.describe(nv.id);
  const Dims d = dims_of(g, nk);
  const int mask_input = 6;
  const bool has_mask = nk.inputs.size() > size_t(mask_input);
  const Shape* mask = has_mask ? &g.node(nk.inputs[size_t(mask_input)]).shape : nullptr;
  for (const Shape& s : {g.node(nk.inputs[0]).shape, g.node(nk.inputs[1]).shape, g.node(nk.inputs[2]).shape,
                         g.node(nk.inputs[4]).shape})
    gl::check_32bit(gl::numel_u(s), who);
  if (mask) gl::check_32bit(gl::numel_u(*mask), who);
  const bool causal = nk.attrs.i("causal") != 0;
  const double scale = nk.attrs.f("scale");
  const std::string key = dims_key(d, causal, mask);

  Lowering l;
  add_delta_kernel(l, d, key, "attention_grad_kv", caps);
  Buffers bufs;
  bufs.add("Q", in(0));
  bufs.add("K", in(1));
  bufs.add("V", in(2));
  bufs.add("DO", in(4));
  bufs.add("LSE", in(5));
  bufs.add("DELTA", {BindingKind::Scratch, 0, false});
  if (has_mask) bufs.add("MASK", in(mask_input));
  bufs.add("DK", {BindingKind::Output, 0, true, pk});
  bufs.add("DVOUT", {BindingKind::Output, 0, true, pv});
  const uint32_t wg = grad_kv_workgroup(d, caps);
  Shared shared;
  shared.add("s_k", d.D, "this key row");
  shared.add("s_v", d.Dv, "this value row");
  shared.add("s_p", wg, "the tile's probabilities");
  shared.add("s_ds", wg, "the tile's dS * scale");
  const uint64_t shared_bytes = (shared.words + wg) * 4;  // + wg_reduce_lib's s_red
  if (shared_bytes > caps.max_shared_bytes)
    throw Error(who + ": head dims D " + std::to_string(d.D) + " / Dv " + std::to_string(d.Dv) + " need " +
                std::to_string(shared_bytes) + " bytes of shared memory, the device allows " +
                std::to_string(caps.max_shared_bytes));
  gl::Grid grid = gl::flat_groups(d.B * d.Hkv * d.Skv, caps, who);
  Kernel k;
  k.name = "attention_grad_kv_" + key + "_wg" + std::to_string(wg);
  k.glsl = "#version 450\n// archetype: attention attention_grad_k + attention_grad_v " + key + " scale " +
           gl::flit(scale) +
           ": workgroup per key row, tiles of the query rows of every query head reading it; P and dS formed "
           "once for both (WG = " +
           std::to_string(wg) + ")\nlayout(local_size_x = " + std::to_string(wg) + ") in;\n" + bufs.decls +
           prelude(d, wg, scale, causal, mask) + gl::math_lib() + gl::wg_reduce_lib(wg) + shared.decls +
           grad_kv_fused_main(grid.glsl, causal, has_mask, div_up(d.D, wg), div_up(d.Dv, wg));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

Lowering lower_attention(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  Kind kind;
  switch (n.op) {
    case ir::Op::Attention: kind = Kind::Forward; break;
    case ir::Op::AttentionLse: kind = Kind::Lse; break;
    case ir::Op::AttentionGradQ: kind = Kind::GradQ; break;
    case ir::Op::AttentionGradK: kind = Kind::GradK; break;
    case ir::Op::AttentionGradV: kind = Kind::GradV; break;
    default: throw Error("internal: " + ctx.graph.describe(n.id) + " is not an attention op");
  }
  const std::string who = ctx.graph.describe(n.id);
  const Shape &qs = ctx.input(0).shape, &ks = ctx.input(1).shape, &vs = ctx.input(2).shape;
  const Dims d{uint64_t(qs[0]), uint64_t(qs[1]), uint64_t(ks[1]), uint64_t(qs[2]),
               uint64_t(ks[2]), uint64_t(qs[3]), uint64_t(vs[3])};
  if (gl::numel_u(n.shape) == 0) return {};
  const bool fwd = kind == Kind::Forward || kind == Kind::Lse;
  const int mask_input = fwd ? 3 : 6;
  const bool has_mask = n.inputs.size() > size_t(mask_input);
  const Shape* mask = has_mask ? &ctx.input(mask_input).shape : nullptr;
  for (const Shape& s : {qs, ks, vs, Shape{qs[0], qs[1], qs[2], vs[3]}}) gl::check_32bit(gl::numel_u(s), who);
  if (mask) gl::check_32bit(gl::numel_u(*mask), who);
  const bool causal = n.attrs.i("causal") != 0;
  const double scale = n.attrs.f("scale");
  const std::string key = dims_key(d, causal, mask);
  const std::string op = ir::op_name(n.op);

  Lowering l;
  Buffers bufs;
  Shared shared;
  uint32_t wg;
  std::string body, design;
  gl::Grid grid;
  auto grid_for = [&](uint64_t rows) {
    grid = gl::flat_groups(rows, ctx.caps, who);
    return grid.glsl;
  };
  switch (kind) {
    case Kind::Forward:
    case Kind::Lse: {
      const bool out_o = kind == Kind::Forward;
      bufs.add("Q", in(0));
      bufs.add("K", in(1));
      if (out_o) bufs.add("V", in(2));
      if (has_mask) bufs.add("MASK", in(mask_input));
      bufs.add(out_o ? "O" : "LSE", {BindingKind::Output, 0, true});
      wg = workgroup_for(d.Skv, out_o ? d.Dv : 0, ctx.caps);
      shared.add("s_q", d.D, "this row's query");
      if (out_o) shared.add("s_p", wg, "the tile's probabilities");
      body = forward_main(grid_for(d.B * d.Hq * d.Sq), out_o, causal, has_mask, div_up(d.Dv, wg));
      design = "workgroup per query row, online softmax over key tiles";
      break;
    }
    case Kind::GradQ:
      for (int i = 0; i < 6; ++i)
        bufs.add(std::vector<std::string>{"Q", "K", "V", "O", "DO", "LSE"}[size_t(i)], in(i));
      if (has_mask) bufs.add("MASK", in(mask_input));
      bufs.add("DQ", {BindingKind::Output, 0, true});
      wg = workgroup_for(d.Skv, d.D, ctx.caps);
      shared.add("s_q", d.D, "this row's query");
      shared.add("s_do", d.Dv, "this row's do");
      shared.add("s_ds", wg, "the tile's dS * scale");
      body = grad_q_main(grid_for(d.B * d.Hq * d.Sq), causal, has_mask, div_up(d.D, wg));
      design = "workgroup per query row, key tiles";
      break;
    case Kind::GradK:
    case Kind::GradV: {
      const bool dk = kind == Kind::GradK;
      bufs.add("Q", in(0));
      bufs.add("K", in(1));
      if (dk) bufs.add("V", in(2));
      bufs.add("DO", in(4));
      bufs.add("LSE", in(5));
      if (dk) bufs.add("DELTA", {BindingKind::Scratch, 0, false});
      if (has_mask) bufs.add("MASK", in(mask_input));
      bufs.add("OUT", {BindingKind::Output, 0, true});
      const uint64_t xd = dk ? d.D : d.Dv;
      wg = workgroup_for(d.Sq, xd, ctx.caps);
      shared.add("s_k", d.D, "this key row");
      if (dk) shared.add("s_v", d.Dv, "this value row");
      shared.add("s_coef", wg, dk ? "the tile's dS * scale" : "the tile's probabilities");
      body = grad_kv_main(grid_for(d.B * d.Hkv * d.Skv), dk, causal, has_mask, div_up(xd, wg));
      design = "workgroup per key row, tiles of the query rows of every query head reading it";
      if (dk) add_delta_kernel(l, d, key, op, ctx.caps);
      break;
    }
  }
  const uint64_t shared_bytes = (shared.words + wg) * 4;  // + wg_reduce_lib's s_red
  if (shared_bytes > ctx.caps.max_shared_bytes)
    throw Error(who + ": head dims D " + std::to_string(d.D) + " / Dv " + std::to_string(d.Dv) + " need " +
                std::to_string(shared_bytes) + " bytes of shared memory, the device allows " +
                std::to_string(ctx.caps.max_shared_bytes));
  Kernel k;
  k.name = op + "_" + key + "_wg" + std::to_string(wg);
  k.glsl = "#version 450\n// archetype: attention " + op + " " + key + " scale " + gl::flit(scale) + ": " +
           design + " (WG = " + std::to_string(wg) + ")\nlayout(local_size_x = " + std::to_string(wg) +
           ") in;\n" +
           bufs.decls + prelude(d, wg, scale, causal, mask) + gl::math_lib() + gl::wg_reduce_lib(wg) +
           shared.decls + body;
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace mgn::codegen
