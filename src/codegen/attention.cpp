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
//   attention / attention_lse, query-tiled (KernelOptions::attention, query_tiled below): one workgroup per block of
//       WG query rows of one (b, h), one thread per row. Key and value tiles of BK rows are staged in shared
//       memory as vec4s and read by every thread of the block (broadcast), so each key row crosses L2 once
//       per block instead of once per query row. Each thread keeps its q and o in registers and runs the
//       online softmax of its own row (tile maximum, one rescale per tile), with no reduction across threads.
//       attention_grad_q has the same query-tiled form (q, do, dq in registers).
//   attention_grad_kv, key-tiled (grad_kv_tiled): a workgroup per block of WG key rows of one kv head, a
//       thread per key row; query tiles of every query head reading the kv head are shared by the block.
//   KernelOptions::attention (auto | row | tiled) picks between the forms (use_tiled, use_kv_tiled); auto takes the tiled
//   forms for the forward kernels only (the tiled derivative kernels were measured slower, run 8). Every form
//   sums a score's dims in the same order, so the derivatives' P = exp(s - lse) sees the forward's scores.
// Masked scores are -inf and get probability exactly 0; a row with no visible key has m = -inf (forward:
// o = 0, lse = -inf) or lse = -inf (derivatives: the row is skipped), so no NaN is formed. Causal rows
// and columns are cut at the tile-loop bounds (key j visible to query i iff j <= i + Skv - Sq).
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "codegen/glsl_util.h"

namespace mgn::codegen {
namespace {

using gl::u;

struct Dims {
  uint64_t B, Hq, Hkv, Sq, Skv, D, Dv;
};

// ForwardLse: attention and attention_lse of the same inputs in one kernel (o and lse; see
// lower_attention_with_lse).
enum class Kind { Forward, Lse, ForwardLse, GradQ, GradK, GradV };

bool is_forward(Kind k) {
  return k == Kind::Forward || k == Kind::Lse || k == Kind::ForwardLse;
}

// Which node of the dispatch takes each forward output (-1: not written).
struct FwdOuts {
  int o = -1, lse = -1;
};

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
  // The same buffer seen as vec4s (its rows are whole vec4s; bindings start 16-byte aligned).
  void add_vec4(const std::string& name, Binding b) {
    const std::string i = std::to_string(bindings.size());
    decls += "layout(std430, set = 0, binding = " + i + ") " + (b.written ? "writeonly " : "readonly ") +
             "buffer B" + i + " { vec4 " + name + "[]; };\n";
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

Binding in(int i) {
  return {BindingKind::Input, i, false};
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
  return "  float " + acc + "[" + std::to_string(std::max<uint64_t>(n, 1)) + "];\n  for (uint c = 0u; c < " +
         u(n) + "; ++c) " + acc + "[c] = 0.0;\n";
}
std::string acc_update(uint64_t n, const std::string& coef, const std::string& x, const std::string& row0,
                       const std::string& dims, const std::string& scale, const std::string& in,
                       const std::string& acc = "acc") {
  return in + "for (uint c = 0u; c < " + u(n) + "; ++c) {\n" +                                    //
         in + "  uint e = t + c * WG;\n" +                                                        //
         in + "  if (e >= " + dims + ") break;\n" +                                               //
         in + "  float a = " + acc + "[c]" + scale + ";\n" +                                      //
         in + "  for (uint r = 0u; r < n; ++r)\n" +                                               //
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
std::string forward_main(const std::string& grid, bool out_o, bool out_lse, bool causal, bool has_mask,
                         uint64_t acc_n) {
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
  if (out_lse) g += "  if (t == 0u) LSE[gid] = m == NEG_INF ? NEG_INF : m + log(l);\n";
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
std::string grad_kv_fused_main(const std::string& grid, bool causal, bool has_mask, uint64_t acc_k,
                               uint64_t acc_v) {
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
       acc_update(acc_v, "s_p", "DO", "qrow0 + i0", "DV", "", "      ", "acc_v") +
       "      barrier();\n    }\n  }\n";
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
  l.kernels.push_back(gl::elementwise("attention_grad_delta_" + key,
                                      "attention " + op + " D_i = do_i . o_i " + key, decls, b, qrows,
                                      {in(3), in(4), {BindingKind::Scratch, 0, true}}, caps));
}

Dims dims_of(const ir::Graph& g, const ir::Node& n) {
  const Shape &qs = g.node(n.inputs[0]).shape, &ks = g.node(n.inputs[1]).shape,
              &vs = g.node(n.inputs[2]).shape;
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

// ------------------------------------------------------------------ attention / attention_lse, query-tiled
constexpr uint32_t kTiledBk = 16;  // key rows per shared tile (and scores per thread in registers)

uint32_t tiled_workgroup(const DeviceCaps& caps) {
  return std::min<uint32_t>(std::max<uint32_t>(caps.subgroup_size, 32), 64);
}

// A thread keeps its row's vectors in registers as vec4s: head dims that are whole vec4s, up to 128 for
// the forward (q, o) and up to 64 for grad_q (q, do, dq).
bool tiled_fits(const Dims& d, Kind kind) {
  const uint64_t most = kind == Kind::GradQ ? 64 : 128;
  return (is_forward(kind) || kind == Kind::GradQ) && d.D > 0 && d.Dv > 0 && d.D % 4 == 0 && d.Dv % 4 == 0 &&
         d.D <= most && d.Dv <= most;
}

// KernelOptions::attention is a preference: shapes the tiled kernel does not take stay on the row kernel
// (the kernel's name says which ran).
bool use_tiled(const Dims& d, Kind kind, const DeviceCaps& caps, AttentionKernel want) {
  if (want == AttentionKernel::Row || !tiled_fits(d, kind)) return false;
  if (want == AttentionKernel::Tiled) return true;
  // Auto: the forward kernels (attention, attention_lse) when there are query rows enough to fill a block and
  // blocks enough to fill a large GPU (the row kernel has a workgroup per row, so it keeps the edge when
  // there are few rows). grad_q stays on the row kernel: at seq 1024 on an H100 (run 8) the tiled derivative
  // kernels made forward + backward 1.05 ms slower than the row ones while the tiled forward saved 1.07 ms.
  if (kind == Kind::GradQ) return false;
  const uint32_t wg = tiled_workgroup(caps);
  return d.Sq >= wg && d.B * d.Hq * div_up(d.Sq, wg) >= 128;
}

// The start of a query-tiled kernel's main: this thread's row (live: inside Sq), its kv head, the keys the
// block walks [0, kend_blk) and the keys the row sees [0, kend).
std::string tiled_row_setup(const std::string& grid, bool causal) {
  std::string g = "void main() {\n" + grid;
  g += "  uint t = gl_LocalInvocationID.x;\n"
       "  uint qb = gid % NQB, h = (gid / NQB) % HQ, b = gid / (NQB * HQ);\n"
       "  uint i = qb * WG + t;  // this thread's query row\n"
       "  bool live = i < SQ;\n"
       "  uint row = (b * HQ + h) * SQ + i;\n"
       "  uint kbase = (b * HKV + h / REP) * SKV;  // row of key 0 of this kv head\n"
       "  uint ilast = min(qb * WG + WG, SQ) - 1u;  // the block's last query row\n";
  if (causal)
    g += "  uint kend_blk = uint(clamp(int(ilast) + CAUSAL_OFF + 1, 0, int(SKV)));  // keys some row sees\n"
         "  uint kend = live ? uint(clamp(int(i) + CAUSAL_OFF + 1, 0, int(SKV))) : 0u;  // keys [0, kend)\n";
  else
    g += "  uint kend_blk = SKV;\n  uint kend = live ? SKV : 0u;\n";
  return g;
}

// Stage key (and value) rows j0 .. j0 + BK - 1 of the kv head in s_k (s_v) between two barriers.
std::string tiled_stage(bool with_v) {
  std::string g =
      "    barrier();  // the previous tile's readers are done\n"
      "    for (uint e = t; e < BK * D4; e += WG) {\n"
      "      uint j = j0 + e / D4;\n"
      "      s_k[e] = j < SKV ? K4[(kbase + j) * D4 + e % D4] : vec4(0.0);\n"
      "    }\n";
  if (with_v)
    g += "    for (uint e = t; e < BK * DV4; e += WG) {\n"
         "      uint j = j0 + e / DV4;\n"
         "      s_v[e] = j < SKV ? V4[(kbase + j) * DV4 + e % DV4] : vec4(0.0);\n"
         "    }\n";
  return g + "    barrier();\n";
}

// `float out = sum over the dims, in order, of x * y`, x and y being vec4 expressions of the index c < n4
// (the order score() and the derivative kernels use: P = exp(s - lse) there must see the score this lse
// came from, and a peaky softmax amplifies any difference).
std::string tiled_dot(const std::string& out, const std::string& x, const std::string& y,
                      const std::string& n4, const std::string& in) {
  std::string g = in + "float " + out + " = 0.0;\n" + in + "[[unroll]] for (uint c = 0u; c < " + n4 +
                  "; ++c) {\n" + in + "  vec4 x = " + x + ", y = " + y + ";\n";
  for (const char* e : {"x", "y", "z", "w"}) g += in + "  " + out + " += x." + e + " * y." + e + ";\n";
  return g + in + "}\n";
}

std::string forward_tiled_main(const std::string& grid, bool out_o, bool out_lse, bool causal,
                               bool has_mask) {
  std::string g = tiled_row_setup(grid, causal);
  g += "  vec4 q[D4];\n  [[unroll]] for (uint c = 0u; c < D4; ++c) q[c] = live ? Q4[row * D4 + c] : "
       "vec4(0.0);\n";
  if (out_o) g += "  vec4 o[DV4];\n  [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] = vec4(0.0);\n";
  g += "  float m = NEG_INF, l = 0.0;  // the row's running maximum and sum of exp(s - m)\n"
       "  for (uint j0 = 0u; j0 < kend_blk; j0 += BK) {\n" +
       tiled_stage(out_o) +
       "    float s[BK];\n"
       "    float mt = NEG_INF;\n"
       "    [[unroll]] for (uint r = 0u; r < BK; ++r) {\n"
       "      float a = NEG_INF;\n"
       "      if (j0 + r < kend) {\n" +
       tiled_dot("dot", "q[c]", "s_k[r * D4 + c]", "D4", "        ") + "        a = SCALE * dot" +
       std::string(has_mask ? " + mask_at(b, h, i, j0 + r)" : "") +
       ";\n"
       "      }\n"
       "      s[r] = a;\n"
       "      mt = max(mt, a);\n"
       "    }\n"
       "    float mn = max(m, mt);\n"
       "    if (mn != NEG_INF) {  // else nothing of this row is visible yet\n"
       "      float alpha = m == NEG_INF ? 0.0 : exp(m - mn);\n"
       "      l *= alpha;\n";
  if (out_o) g += "      [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] *= alpha;\n";
  g += "      [[unroll]] for (uint r = 0u; r < BK; ++r) {\n"
       "        float p = s[r] == NEG_INF ? 0.0 : exp(s[r] - mn);\n"
       "        l += p;\n";
  if (out_o)
    g += "        [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] = fma(vec4(p), s_v[r * DV4 + c], o[c]);\n";
  g += "      }\n"
       "      m = mn;\n"
       "    }\n"
       "  }\n"
       "  if (!live) return;\n";
  if (out_o)
    g += "  float inv = m == NEG_INF ? 0.0 : 1.0 / l;  // no visible key: o = 0\n"
         "  [[unroll]] for (uint c = 0u; c < DV4; ++c) O4[row * DV4 + c] = o[c] * inv;\n";
  if (out_lse) g += "  LSE[row] = m == NEG_INF ? NEG_INF : m + log(l);\n";
  return g + "}\n";
}

// attention_grad_q, query-tiled: the row kernel's arithmetic (P from the saved lse, dS, dq over the key
// rows in order) with a thread per query row and the key/value tiles shared by the block.
std::string grad_q_tiled_main(const std::string& grid, bool causal, bool has_mask) {
  std::string g = tiled_row_setup(grid, causal);
  g += "  vec4 q[D4], dq[D4], dov[DV4];\n"
       "  [[unroll]] for (uint c = 0u; c < D4; ++c) {\n"
       "    q[c] = live ? Q4[row * D4 + c] : vec4(0.0);\n"
       "    dq[c] = vec4(0.0);\n"
       "  }\n"
       "  [[unroll]] for (uint c = 0u; c < DV4; ++c) dov[c] = live ? DO4[row * DV4 + c] : vec4(0.0);\n"
       "  // D_i = do_i . o_i\n" +
       tiled_dot("di", "dov[c]", "(live ? O4[row * DV4 + c] : vec4(0.0))", "DV4", "  ") +
       "  float lse = live ? LSE[row] : NEG_INF;\n"
       "  if (lse == NEG_INF) kend = 0u;  // a row with no visible key has no derivative\n"
       "  for (uint j0 = 0u; j0 < kend_blk; j0 += BK) {\n" +
       tiled_stage(true) +
       "    [[unroll]] for (uint r = 0u; r < BK; ++r) {\n"
       "      if (j0 + r >= kend) continue;\n" +
       tiled_dot("dot", "q[c]", "s_k[r * D4 + c]", "D4", "      ") + "      float s = SCALE * dot" +
       std::string(has_mask ? " + mask_at(b, h, i, j0 + r)" : "") +
       ";\n"
       "      if (s == NEG_INF) continue;\n" +
       tiled_dot("dp", "dov[c]", "s_v[r * DV4 + c]", "DV4", "      ") +
       "      float ds = exp(s - lse) * (dp - di) * SCALE;\n"
       "      [[unroll]] for (uint c = 0u; c < D4; ++c) dq[c] = fma(vec4(ds), s_k[r * D4 + c], dq[c]);\n"
       "    }\n"
       "  }\n"
       "  if (!live) return;\n"
       "  [[unroll]] for (uint c = 0u; c < D4; ++c) DQ4[row * D4 + c] = dq[c];\n";
  return g + "}\n";
}

// The query-tiled kernel of the forward ops (O and/or LSE, written to the dispatch nodes `outs` names) or of
// attention_grad_q (DQ).
Kernel query_tiled(const Dims& d, Kind kind, FwdOuts outs, bool causal, const Shape* mask, double scale,
                   const std::string& key, const std::string& op, const std::string& who,
                   const DeviceCaps& caps) {
  const uint32_t wg = tiled_workgroup(caps);
  const uint64_t nqb = div_up(d.Sq, wg);
  const bool grad = kind == Kind::GradQ, with_v = kind != Kind::Lse;
  Buffers bufs;
  bufs.add_vec4("Q4", in(0));
  bufs.add_vec4("K4", in(1));
  if (with_v) bufs.add_vec4("V4", in(2));
  if (grad) {
    bufs.add_vec4("O4", in(3));
    bufs.add_vec4("DO4", in(4));
    bufs.add("LSE", in(5));
  }
  if (mask) bufs.add("MASK", in(grad ? 6 : 3));
  if (!grad && outs.o >= 0) bufs.add_vec4("O4", {BindingKind::Output, 0, true, outs.o});
  if (!grad && outs.lse >= 0) bufs.add("LSE", {BindingKind::Output, 0, true, outs.lse});
  if (grad) bufs.add_vec4("DQ4", {BindingKind::Output, 0, true});
  const uint64_t shared_bytes = uint64_t(kTiledBk) * (d.D + (with_v ? d.Dv : 0)) * 4;
  if (shared_bytes > caps.max_shared_bytes)
    throw Error(who + ": the query-tiled kernel needs " + std::to_string(shared_bytes) +
                " bytes of shared memory, the device allows " + std::to_string(caps.max_shared_bytes) +
                " (the row attention kernel avoids it)");
  gl::Grid grid = gl::flat_groups(d.B * d.Hq * nqb, caps, who);
  Kernel k;
  k.name = op + "_tiled_" + key + "_wg" + std::to_string(wg);
  k.glsl = "#version 450\n#extension GL_EXT_control_flow_attributes : require\n// archetype: attention " +
           op + " " + key + " scale " + gl::flit(scale) +
           ": workgroup per block of WG query rows of one head, a thread per row (its vectors and softmax "
           "state in registers), key/value tiles of BK rows in shared memory (WG = " +
           std::to_string(wg) + ", BK = " + std::to_string(kTiledBk) +
           ")\nlayout(local_size_x = " + std::to_string(wg) + ") in;\n" + bufs.decls +
           prelude(d, wg, scale, causal, mask) + "const uint NQB = " + u(nqb) + ", D4 = " + u(d.D / 4) +
           ", DV4 = " + u(d.Dv / 4) + ", BK = " + u(kTiledBk) + ";\nshared vec4 s_k[BK * D4];\n" +
           (with_v ? "shared vec4 s_v[BK * DV4];\n" : "") +
           (grad ? grad_q_tiled_main(grid.glsl, causal, mask != nullptr)
                 : forward_tiled_main(grid.glsl, outs.o >= 0, outs.lse >= 0, causal, mask != nullptr));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  return k;
}

// ------------------------------------------------------------ attention_grad_k + _v, key-tiled (fused)
// A workgroup per block of WG key rows of one kv head, a thread per key row: its k and v rows sit in shared
// memory (rows padded by one vec4, so the per-thread vec4 reads do not collide on banks), its dk and dv in
// registers. Tiles of BQ query rows (q, do, lse, D_i) of every query head reading the kv head are staged
// in shared memory and read by the whole block, so each query row crosses L2 once per block instead of
// once per key row. The arithmetic is the row kernel's, in its order (dims, then heads, then query rows).
constexpr uint32_t kTiledBq = 16;

bool kv_tiled_fits(const Dims& d) {
  return d.D > 0 && d.Dv > 0 && d.D % 4 == 0 && d.Dv % 4 == 0 && d.D <= 64 && d.Dv <= 64;
}

bool use_kv_tiled(const Dims& d, AttentionKernel want) {
  if (want == AttentionKernel::Row || !kv_tiled_fits(d)) return false;
  // Auto: the row kernel. The key-tiled one has few blocks (B x Hkv x Skv/WG, 96 at seq 1024 with 3 kv heads,
  // one warp each, every one walking REP x Sq query rows); at that shape on an H100 (run 8) the tiled
  // derivative kernels lost to the row ones (see use_tiled). AttentionKernel::Tiled still selects it.
  return want == AttentionKernel::Tiled;
}

// `split`: the block takes one part of the work (part sp: query heads hs * HPS.. of its kv head, query rows
// [qc * QCH, (qc + 1) * QCH)) and writes partial dk, dv to PART4; the reduction kernel sums the parts.
std::string grad_kv_tiled_main(const std::string& grid, bool causal, bool has_mask, bool split) {
  std::string g = "void main() {\n" + grid;
  g +=
      "  uint t = gl_LocalInvocationID.x;\n"
      "  uint kb = gid % NKB, hk = (gid / NKB) % HKV, b = (gid / (NKB * HKV)) % NB, sp = gid / (NKB * HKV * "
      "NB);\n"
      "  uint hs = sp % HSPLIT, qc = sp / HSPLIT;  // this block's query heads and query rows\n"
      "  uint qlo = qc * QCH, qhi = min(SQ, qlo + QCH);\n"
      "  uint j = kb * WG + t;  // this thread's key row\n"
      "  bool live = j < SKV;\n"
      "  uint krow = (b * HKV + hk) * SKV + j;\n"
      "  [[unroll]] for (uint c = 0u; c < D4; ++c) s_kt[t * KS + c] = live ? K4[krow * D4 + c] : vec4(0.0);\n"
      "  [[unroll]] for (uint c = 0u; c < DV4; ++c) s_vt[t * VS + c] = live ? V4[krow * DV4 + c] : "
      "vec4(0.0);\n";
  if (causal)
    g += "  uint istart_blk = uint(clamp(int(kb * WG) - CAUSAL_OFF, 0, int(SQ)));  // first query the block "
         "needs\n"
         "  uint istart = live ? uint(clamp(int(j) - CAUSAL_OFF, 0, int(SQ))) : SQ;  // first query that "
         "sees j\n";
  else
    g += "  uint istart_blk = 0u;\n  uint istart = live ? 0u : SQ;\n";
  g += "  vec4 dk[D4], dv[DV4];\n"
       "  [[unroll]] for (uint c = 0u; c < D4; ++c) dk[c] = vec4(0.0);\n"
       "  [[unroll]] for (uint c = 0u; c < DV4; ++c) dv[c] = vec4(0.0);\n"
       "  for (uint h = hk * REP + hs * HPS; h < hk * REP + (hs + 1u) * HPS; ++h) {\n"
       "    uint qrow0 = (b * HQ + h) * SQ;  // row of query 0 of head h\n"
       "    for (uint i0 = max(istart_blk, qlo); i0 < qhi; i0 += BQ) {\n"
       "      barrier();  // the previous tile's readers are done (and, first, the k/v rows are in)\n"
       "      for (uint e = t; e < BQ * D4; e += WG) {\n"
       "        uint i = i0 + e / D4;\n"
       "        s_q[e] = i < qhi ? Q4[(qrow0 + i) * D4 + e % D4] : vec4(0.0);\n"
       "      }\n"
       "      for (uint e = t; e < BQ * DV4; e += WG) {\n"
       "        uint i = i0 + e / DV4;\n"
       "        s_do[e] = i < qhi ? DO4[(qrow0 + i) * DV4 + e % DV4] : vec4(0.0);\n"
       "      }\n"
       "      for (uint e = t; e < BQ; e += WG) {\n"
       "        uint i = i0 + e;\n"
       "        s_lse[e] = i < qhi ? LSE[qrow0 + i] : NEG_INF;\n"
       "        s_delta[e] = i < qhi ? DELTA[qrow0 + i] : 0.0;\n"
       "      }\n"
       "      barrier();\n"
       "      [[unroll]] for (uint r = 0u; r < BQ; ++r) {\n"
       "        uint i = i0 + r;\n"
       "        float lse = s_lse[r];\n"
       "        if (i < istart || lse == NEG_INF) continue;  // rows past qhi have lse -inf\n" +
       tiled_dot("dot", "s_q[r * D4 + c]", "s_kt[t * KS + c]", "D4", "        ") +
       "        float s = SCALE * dot" + std::string(has_mask ? " + mask_at(b, h, i, j)" : "") +
       ";\n"
       "        if (s == NEG_INF) continue;\n"
       "        float p = exp(s - lse);\n" +
       tiled_dot("dp", "s_do[r * DV4 + c]", "s_vt[t * VS + c]", "DV4", "        ") +
       "        float ds = p * (dp - s_delta[r]) * SCALE;  // dS_ij * scale\n"
       "        [[unroll]] for (uint c = 0u; c < D4; ++c) dk[c] = fma(vec4(ds), s_q[r * D4 + c], dk[c]);\n"
       "        [[unroll]] for (uint c = 0u; c < DV4; ++c) dv[c] = fma(vec4(p), s_do[r * DV4 + c], dv[c]);\n"
       "      }\n"
       "    }\n"
       "  }\n"
       "  if (!live) return;\n";
  if (split)
    g +=
        "  // partial sums of part sp: dk at [sp][row][D4], then dv at [sp][row][DV4] after every part's dk\n"
        "  [[unroll]] for (uint c = 0u; c < D4; ++c) PART4[(sp * NROWS + krow) * D4 + c] = dk[c];\n"
        "  [[unroll]] for (uint c = 0u; c < DV4; ++c)\n"
        "    PART4[NSP * NROWS * D4 + (sp * NROWS + krow) * DV4 + c] = dv[c];\n";
  else
    g += "  [[unroll]] for (uint c = 0u; c < D4; ++c) DK4[krow * D4 + c] = dk[c];\n"
         "  [[unroll]] for (uint c = 0u; c < DV4; ++c) DVOUT4[krow * DV4 + c] = dv[c];\n";
  return g + "}\n";
}

// How the key-tiled dK+dV kernel splits its work over more blocks: each block of WG key rows of a kv head
// walks REP x Sq query rows, and there are only B x Hkv x Skv/WG blocks (96 at seq 1024 with 3 kv heads), so
// the query heads (hsplit parts) and the query rows (qc parts of qch rows, whole BQ tiles, at least four)
// are spread over blocks until there are about kKvTiledBlocks of them. Only AttentionKernel::Tiled takes this
// kernel (use_kv_tiled); the split is built for the next measurement, not yet measured.
struct KvSplit {
  uint64_t hsplit = 1, qc = 1, qch = 0;
  uint64_t parts() const { return hsplit * qc; }
};
constexpr uint64_t kKvTiledBlocks = 1024;

KvSplit kv_split(const Dims& d, uint64_t nkb) {
  KvSplit sp;
  sp.qch = d.Sq;
  const uint64_t rep = d.Hq / d.Hkv, base = d.B * d.Hkv * nkb, qtiles = div_up(d.Sq, kTiledBq);
  if (base >= kKvTiledBlocks) return sp;
  sp.hsplit = rep;
  uint64_t qc = 1;
  while (base * sp.hsplit * qc < kKvTiledBlocks && qc * 2 * 4 <= qtiles) qc *= 2;
  sp.qch = div_up(qtiles, qc) * kTiledBq;
  sp.qc = div_up(d.Sq, sp.qch);  // no empty trailing part
  return sp;
}

// The key-tiled dK+dV kernels: one, or (split work) the partial kernel and the reduction of its parts.
void grad_kv_tiled(Lowering& l, const Dims& d, int pk, int pv, bool causal, const Shape* mask, double scale,
                   const std::string& key, const std::string& who, const DeviceCaps& caps) {
  const uint32_t wg = tiled_workgroup(caps);
  const uint64_t nkb = div_up(d.Skv, wg);
  const KvSplit sp = kv_split(d, nkb);
  const bool split = sp.parts() > 1;
  const uint64_t nrows = d.B * d.Hkv * d.Skv, part_vec4s = sp.parts() * nrows * (d.D + d.Dv) / 4;
  if (split) {
    gl::check_32bit(part_vec4s * 4, who);
    l.scratch_words.push_back(part_vec4s * 4);  // scratch 1 (scratch 0: D_i)
  }
  Buffers bufs;
  bufs.add_vec4("Q4", in(0));
  bufs.add_vec4("K4", in(1));
  bufs.add_vec4("V4", in(2));
  bufs.add_vec4("DO4", in(4));
  bufs.add("LSE", in(5));
  bufs.add("DELTA", {BindingKind::Scratch, 0, false});
  if (mask) bufs.add("MASK", in(6));
  if (split) {
    bufs.add_vec4("PART4", {BindingKind::Scratch, 1, true});
  } else {
    bufs.add_vec4("DK4", {BindingKind::Output, 0, true, pk});
    bufs.add_vec4("DVOUT4", {BindingKind::Output, 0, true, pv});
  }
  const uint64_t ks = d.D / 4 + 1, vs = d.Dv / 4 + 1;
  const uint64_t shared_bytes = (wg * (ks + vs) + kTiledBq * (d.D + d.Dv) / 4) * 16 + 2 * kTiledBq * 4;
  if (shared_bytes > caps.max_shared_bytes)
    throw Error(who + ": the key-tiled kernel needs " + std::to_string(shared_bytes) +
                " bytes of shared memory, the device allows " + std::to_string(caps.max_shared_bytes) +
                " (the row attention kernel avoids it)");
  gl::Grid grid = gl::flat_groups(d.B * d.Hkv * nkb * sp.parts(), caps, who);
  Kernel k;
  k.name = "attention_grad_kv_tiled_" + key + "_wg" + std::to_string(wg) +
           (split ? "_split" + std::to_string(sp.hsplit) + "x" + std::to_string(sp.qc) : "");
  k.glsl =
      "#version 450\n#extension GL_EXT_control_flow_attributes : require\n"
      "// archetype: attention attention_grad_k + attention_grad_v " +
      key + " scale " + gl::flit(scale) +
      ": workgroup per block of WG key rows of one kv head, a thread per key row (dk, dv in registers), "
      "tiles of BQ query rows of every query head reading it in shared memory (WG = " +
      std::to_string(wg) + ", BQ = " + std::to_string(kTiledBq) + ")" +
      (split ? "; the query heads in " + std::to_string(sp.hsplit) + " parts and the query rows in " +
                   std::to_string(sp.qc) + ", partial sums out"
             : std::string()) +
      "\nlayout(local_size_x = " + std::to_string(wg) + ") in;\n" + bufs.decls +
      prelude(d, wg, scale, causal, mask) + "const uint NKB = " + u(nkb) + ", D4 = " + u(d.D / 4) +
      ", DV4 = " + u(d.Dv / 4) + ", BQ = " + u(kTiledBq) + ", KS = " + u(ks) + ", VS = " + u(vs) +
      ";  // KS, VS: padded row strides of s_kt, s_vt in vec4s\n"
      "const uint NB = " +
      u(d.B) + ", NROWS = " + u(nrows) + ", HSPLIT = " + u(sp.hsplit) +
      ", HPS = " + u(d.Hq / d.Hkv / sp.hsplit) + ", QCH = " + u(sp.qch) + ", NSP = " + u(sp.parts()) +
      ";  // parts: HSPLIT x (SQ / QCH), HPS query heads each\n"
      "shared vec4 s_kt[WG * KS];  // the block's key rows\nshared vec4 s_vt[WG * VS];  // its value rows\n"
      "shared vec4 s_q[BQ * D4];\nshared vec4 s_do[BQ * DV4];\nshared float s_lse[BQ];\nshared float "
      "s_delta[BQ];\n" +
      grad_kv_tiled_main(grid.glsl, causal, mask != nullptr, split);
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  if (!split) return;
  // The parts summed in order (deterministic): dk rows, then dv rows, a vec4 per invocation.
  Buffers rb;
  rb.add_vec4("PART4", {BindingKind::Scratch, 1, false});
  rb.add_vec4("DK4", {BindingKind::Output, 0, true, pk});
  rb.add_vec4("DVOUT4", {BindingKind::Output, 0, true, pv});
  const uint64_t nk = nrows * d.D / 4, nv = nrows * d.Dv / 4;
  const std::string decls =
      rb.decls + "const uint NK = " + u(nk) + ", NV = " + u(nv) + ", NSP = " + u(sp.parts()) + ";\n";
  const std::string body =
      "  vec4 a = vec4(0.0);\n"
      "  if (i < NK) {\n"
      "    for (uint p = 0u; p < NSP; ++p) a += PART4[p * NK + i];\n"
      "    DK4[i] = a;\n"
      "  } else {\n"
      "    uint e = i - NK;\n"
      "    for (uint p = 0u; p < NSP; ++p) a += PART4[NSP * NK + p * NV + e];\n"
      "    DVOUT4[e] = a;\n"
      "  }\n";
  l.kernels.push_back(gl::elementwise("attention_grad_kv_tiled_sum_" + key,
                                      "attention_grad_k + attention_grad_v " + key + ": the " +
                                          std::to_string(sp.parts()) +
                                          " parts of the key-tiled kernel summed",
                                      decls, body, nk + nv, rb.bindings, caps));
}

}  // namespace

bool attention_grad_kv_fits(const ir::Graph& g, int grad_k, int grad_v, const DeviceCaps& caps) {
  const ir::Node &nk = g.node(grad_k), &nv = g.node(grad_v);
  if (nk.op != ir::Op::AttentionGradK || nv.op != ir::Op::AttentionGradV || nk.inputs != nv.inputs)
    return false;
  if (gl::numel_u(nk.shape) == 0 || gl::numel_u(nv.shape) == 0) return false;
  const Dims d = dims_of(g, nk);
  return grad_kv_shared_bytes(d, grad_kv_workgroup(d, caps)) <= caps.max_shared_bytes;
}

namespace {

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

}  // namespace

// attention_grad_k and attention_grad_v of the same inputs (nodes: both, ascending): the D_i kernel, then
// one workgroup per key row writing both derivatives.
Lowering lower_attention_grad_kv(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                                 const CodegenOptions& options) {
  const int pk = attention_pair(g, nodes, ir::Op::AttentionGradK, ir::Op::AttentionGradV, "dK+dV"),
            pv = 1 - pk;
  const ir::Node &nk = g.node(nodes[size_t(pk)]), &nv = g.node(nodes[size_t(pv)]);
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
  if (use_kv_tiled(d, options.kernels.attention)) {
    grad_kv_tiled(l, d, pk, pv, causal, mask, scale, key, who, caps);
    return l;
  }
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

namespace {

// One attention node's kernels (`n`; for ForwardLse the attention node of the pair, `who` names both).
// `outs`: the dispatch nodes the forward kinds write.
Lowering lower_one(const LowerContext& ctx, Kind kind, FwdOuts outs, const std::string& who,
                   const std::string& op) {
  const ir::Node& n = ctx.node;
  const Shape &qs = ctx.input(0).shape, &ks = ctx.input(1).shape, &vs = ctx.input(2).shape;
  const Dims d{uint64_t(qs[0]), uint64_t(qs[1]), uint64_t(ks[1]), uint64_t(qs[2]),
               uint64_t(ks[2]), uint64_t(qs[3]), uint64_t(vs[3])};
  if (gl::numel_u(n.shape) == 0) return {};
  const bool fwd = is_forward(kind);
  const int mask_input = fwd ? 3 : 6;
  const bool has_mask = n.inputs.size() > size_t(mask_input);
  const Shape* mask = has_mask ? &ctx.input(mask_input).shape : nullptr;
  for (const Shape& s : {qs, ks, vs, Shape{qs[0], qs[1], qs[2], vs[3]}}) gl::check_32bit(gl::numel_u(s), who);
  if (mask) gl::check_32bit(gl::numel_u(*mask), who);
  const bool causal = n.attrs.i("causal") != 0;
  const double scale = n.attrs.f("scale");
  const std::string key = dims_key(d, causal, mask);

  Lowering l;
  if (use_tiled(d, kind, ctx.caps, ctx.options.kernels.attention)) {
    l.kernels.push_back(query_tiled(d, kind, outs, causal, mask, scale, key, op, who, ctx.caps));
    return l;
  }
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
    case Kind::Lse:
    case Kind::ForwardLse: {
      const bool out_o = outs.o >= 0, out_lse = outs.lse >= 0;
      bufs.add("Q", in(0));
      bufs.add("K", in(1));
      if (out_o) bufs.add("V", in(2));
      if (has_mask) bufs.add("MASK", in(mask_input));
      if (out_o) bufs.add("O", {BindingKind::Output, 0, true, outs.o});
      if (out_lse) bufs.add("LSE", {BindingKind::Output, 0, true, outs.lse});
      // The workgroup (and so the order of the reductions of m and l) does not depend on which outputs are
      // written: lse alone, o alone and both together agree bitwise.
      wg = workgroup_for(d.Skv, d.Dv, ctx.caps);
      shared.add("s_q", d.D, "this row's query");
      if (out_o) shared.add("s_p", wg, "the tile's probabilities");
      body = forward_main(grid_for(d.B * d.Hq * d.Sq), out_o, out_lse, causal, has_mask, div_up(d.Dv, wg));
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
           ") in;\n" + bufs.decls + prelude(d, wg, scale, causal, mask) + gl::math_lib() +
           gl::wg_reduce_lib(wg) + shared.decls + body;
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace

Lowering lower_attention(const LowerContext& ctx) {
  Kind kind;
  FwdOuts outs;
  switch (ctx.node.op) {
    case ir::Op::Attention:
      kind = Kind::Forward;
      outs.o = 0;
      break;
    case ir::Op::AttentionLse:
      kind = Kind::Lse;
      outs.lse = 0;
      break;
    case ir::Op::AttentionGradQ:
      kind = Kind::GradQ;
      break;
    case ir::Op::AttentionGradK:
      kind = Kind::GradK;
      break;
    case ir::Op::AttentionGradV:
      kind = Kind::GradV;
      break;
    default:
      throw Error("internal: " + ctx.graph.describe(ctx.node.id) + " is not an attention op");
  }
  return lower_one(ctx, kind, outs, ctx.graph.describe(ctx.node.id), ir::op_name(ctx.node.op));
}

// attention and attention_lse of the same inputs (nodes: both, ascending): one forward pass writes o and lse.
// Every output element is the one the separate kernels write (lse never depended on whether o is formed).
Lowering lower_attention_with_lse(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                                  const CodegenOptions& options) {
  const int po = attention_pair(g, nodes, ir::Op::Attention, ir::Op::AttentionLse, "attention + lse"),
            pl = 1 - po;
  const ir::Node &no = g.node(nodes[size_t(po)]), &nl = g.node(nodes[size_t(pl)]);
  if (gl::numel_u(no.shape) == 0 || gl::numel_u(nl.shape) == 0)
    throw Error("internal: " + g.describe(no.id) +
                ": the attention + lse kernel needs both outputs non-empty");
  return lower_one({g, no, caps, options}, Kind::ForwardLse, {po, pl}, g.describe(no.id) + " + " + g.describe(nl.id),
                   "attention_with_lse");
}

}  // namespace mgn::codegen
