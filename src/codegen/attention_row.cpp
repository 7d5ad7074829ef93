// The row attention kernels: a workgroup per query row for attention / attention_lse (online softmax over
// key tiles of WG) and attention_grad_q; a workgroup per key row for attention_grad_k, attention_grad_v and
// both at once (the dK+dV fusion), walking every query row of every query head that reads its kv head.
// attention.cpp has the overview.
#include <algorithm>
#include <string>

#include "codegen/attention_common.h"

namespace mgn::codegen::attn {
namespace {

using gl::u;

// The keys query row i sees: [0, kend).
std::string kend_line(bool causal) {
  return causal ? "  uint kend = uint(clamp(int(i) + CAUSAL_OFF + 1, 0, int(SKV)));  // keys [0, kend) visible\n"
                : "  uint kend = SKV;\n";
}

// The online-softmax update of one key tile (each thread's score s of its key; -inf past the visible keys): the
// running maximum m (uniform across the workgroup), this thread's share l of the sum and p = exp(s - m) for its
// key; then, after the tiles, lse = m + log(sum of the shares). Both forward row kernels use these, so their m, l
// and lse agree bitwise.
constexpr const char* kOnlineSoftmaxStep = R"(    float mn = max(m, wg_max(s));
    if (mn == NEG_INF) continue;  // nothing visible so far (uniform)
    float alpha = m == NEG_INF ? 0.0 : exp(m - mn);
    float p = s == NEG_INF ? 0.0 : exp(s - mn);
    l = l * alpha + p;
    m = mn;
)";
constexpr const char* kStoreLse = "  if (t == 0u) LSE[gid] = m == NEG_INF ? NEG_INF : m + log(l);\n";
// The vectorized forward kernels' end: the G key groups' partial outputs (in s_o) summed in group order and
// normalized by the row's sum l.
constexpr const char* kSumGroupsStoreO = R"(  barrier();
  if (t < DV4) {
    vec4 o = vec4(0.0);
    for (uint r = 0u; r < G; ++r) o += s_o[r * DV4 + t];
    float inv = m == NEG_INF ? 0.0 : 1.0 / l;  // no visible key: o = 0
    O4[o_row(gid) * DV4 + t] = o * inv;
  }
)";

// Row kernels (forward, grad_q): this workgroup's query row gid unpacked into (b, h, i), the first row of
// its kv head in K and V and the end of its visible keys (row_indices); the scalar kernels also stage its q in
// s_q (published by a barrier the caller issues) and score it against key row kbase + j (score_fn).
std::string row_indices(bool causal) {
  return gl::render(
      R"(  uint t = gl_LocalInvocationID.x;
  uint i = gid % SQ, h = (gid / SQ) % HQ, b = gid / (SQ * HQ);
  uint kbase = (b * HKV + h / REP) * SKV;  // row of key 0 of this kv head
${KEND})",
      {{"KEND", kend_line(causal)}});
}
std::string query_row_setup(bool causal) {
  return row_indices(causal) + "  for (uint d = t; d < D; d += WG) s_q[d] = Q[gid * D + d];\n";
}
std::string score_fn(bool has_mask) {
  return gl::render(R"(float score(uint b, uint h, uint i, uint j, uint kbase) {
  float a = 0.0;
  for (uint d = 0u; d < D; ++d) a += s_q[d] * K[(kbase + j) * D + d];
  return SCALE * a${MASK};
}
)",
                    {{"MASK", has_mask ? " + mask_at(b, h, i, j)" : ""}});
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
  return gl::render(R"(${I}for (uint c = 0u; c < ${N}; ++c) {
${I}  uint e = t + c * WG;
${I}  if (e >= ${DIMS}) break;
${I}  float a = ${ACC}[c]${SCALE};
${I}  for (uint r = 0u; r < n; ++r)
${I}    a += ${COEF}[r] * ${X}[(${ROW0} + r) * ${DIMS} + e];
${I}  ${ACC}[c] = a;
${I}}
)",
                    {{"I", in},
                     {"N", u(n)},
                     {"DIMS", dims},
                     {"ACC", acc},
                     {"SCALE", scale},
                     {"COEF", coef},
                     {"X", x},
                     {"ROW0", row0}});
}
// `row`: the output row this workgroup writes (its query row gid, or o_row(gid) for o).
std::string acc_store(uint64_t n, const std::string& out, const std::string& dims, const std::string& factor,
                      const std::string& acc = "acc", const std::string& row = "gid") {
  return gl::render(
      R"(  for (uint c = 0u; c < ${N}; ++c) {
    uint e = t + c * WG;
    if (e < ${DIMS}) ${OUT}[${ROW} * ${DIMS} + e] = ${ACC}[c]${FACTOR};
  }
)",
      {{"N", u(n)}, {"DIMS", dims}, {"OUT", out}, {"ACC", acc}, {"FACTOR", factor}, {"ROW", row}});
}

// attention / attention_lse. The maximum is reduced across the workgroup per tile (so every thread
// rescales by the same alpha), the sum only once at the end (each thread rescales its own share).
std::string forward_main(const std::string& grid, bool out_o, bool out_lse, bool causal, bool has_mask,
                         uint64_t acc_n) {
  return gl::render(
      R"(${SCORE}void main() {
${GRID}${SETUP}  barrier();
  float m = NEG_INF;  // running maximum of the row's scores (uniform across the workgroup)
  float l = 0.0;      // this thread's share of sum_j exp(s_j - m)
${ACC}  for (uint j0 = 0u; j0 < kend; j0 += WG) {
    uint j = j0 + t;
    float s = j < kend ? score(b, h, i, j, kbase) : NEG_INF;
${STEP}${ACCUMULATE}  }
  l = wg_sum(l);
${STORE_O}${STORE_LSE}}
)",
      {{"SCORE", score_fn(has_mask)},
       {"GRID", grid},
       {"SETUP", query_row_setup(causal)},
       {"STEP", kOnlineSoftmaxStep},
       {"ACC", out_o ? acc_decl(acc_n) : ""},
       {"ACCUMULATE", out_o ? "    s_p[t] = p;\n    barrier();\n    uint n = min(WG, kend - j0);\n" +
                                  acc_update(acc_n, "s_p", "V", "kbase + j0", "DV", " * alpha", "    ") +
                                  "    barrier();\n"
                            : ""},
       {"STORE_O", out_o ? "  float inv = m == NEG_INF ? 0.0 : 1.0 / l;  // no visible key: o = 0\n" +
                               acc_store(acc_n, "O", "DV", " * inv", "acc", "o_row(gid)")
                         : ""},
       {"STORE_LSE", out_lse ? kStoreLse : ""}});
}

// attention_grad_q: P is recomputed from the saved lse, so one pass over the keys suffices.
std::string grad_q_main(const std::string& grid, bool causal, bool has_mask, uint64_t acc_n) {
  return gl::render(R"(${SCORE}void main() {
${GRID}${SETUP}  for (uint e = t; e < DV; e += WG) s_do[e] = DO[gid * DV + e];
  float part = 0.0;
  for (uint e = t; e < DV; e += WG) part += DO[gid * DV + e] * O[gid * DV + e];
  float di = wg_sum(part);  // D_i = do_i . o_i; the barriers inside also publish s_q and s_do
  float lse = LSE[gid];
${ACC}  if (lse != NEG_INF) {  // a row with no visible key has no derivative (uniform)
    for (uint j0 = 0u; j0 < kend; j0 += WG) {
      uint j = j0 + t;
      float ds = 0.0;
      if (j < kend) {
        float s = score(b, h, i, j, kbase);
        if (s != NEG_INF) {
          float dp = 0.0;
          for (uint e = 0u; e < DV; ++e) dp += s_do[e] * V[(kbase + j) * DV + e];
          ds = exp(s - lse) * (dp - di) * SCALE;
        }
      }
      s_ds[t] = ds;
      barrier();
      uint n = min(WG, kend - j0);
${ACCUMULATE}      barrier();
    }
  }
${STORE}}
)",
                    {{"SCORE", score_fn(has_mask)},
                     {"GRID", grid},
                     {"SETUP", query_row_setup(causal)},
                     {"ACC", acc_decl(acc_n)},
                     {"ACCUMULATE", acc_update(acc_n, "s_ds", "K", "kbase + j0", "D", "", "      ")},
                     {"STORE", acc_store(acc_n, "DQ", "D", "")}});
}

// attention_grad_k and/or attention_grad_v (dk, dv): the key row owns its outputs, so the sum over queries
// and heads needs no atomics. Thread t of a query tile forms P_ij (dv) and dS_ij scale (dk) once; the
// workgroup accumulates dk over the dims of q and dv over the dims of do from the same tile. `outs`: the
// output buffers' names (dk's, dv's).
std::string grad_kv_main(const std::string& grid, bool dk, bool dv, bool causal, bool has_mask,
                         uint64_t acc_k, uint64_t acc_v, const std::string& out_k, const std::string& out_v) {
  std::string updates, stores;
  if (dk) {
    updates += acc_update(acc_k, "s_ds", "Q", "qrow0 + i0", "D", "", "      ", "acc_k");
    stores += acc_store(acc_k, out_k, "D", "", "acc_k");
  }
  if (dv) {
    updates += acc_update(acc_v, "s_p", "DO", "qrow0 + i0", "DV", "", "      ", "acc_v");
    stores += acc_store(acc_v, out_v, "DV", "", "acc_v");
  }
  return gl::render(
      R"(void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint j = gid % SKV, hk = (gid / SKV) % HKV, b = gid / (SKV * HKV);
  for (uint d = t; d < D; d += WG) s_k[d] = K[gid * D + d];
${LOAD_V}  barrier();
${ISTART}${ACCS}  for (uint h = hk * REP; h < (hk + 1u) * REP; ++h) {
    uint qrow0 = (b * HQ + h) * SQ;  // row of query 0 of head h
    for (uint i0 = istart; i0 < SQ; i0 += WG) {
      uint i = i0 + t;
      float p = 0.0, ds = 0.0;
      if (i < SQ) {
        uint r = qrow0 + i;
        float lse = LSE[r];
        if (lse != NEG_INF) {  // rows with no visible key contribute nothing
          float a = 0.0;
          for (uint d = 0u; d < D; ++d) a += Q[r * D + d] * s_k[d];
          float s = SCALE * a${MASK};
          if (s != NEG_INF) {
            p = exp(s - lse);
${DS}          }
        }
      }
${PUBLISH}      barrier();
      uint n = min(WG, SQ - i0);
${UPDATES}      barrier();
    }
  }
${STORES}}
)",
      {{"GRID", grid},
       {"LOAD_V", dk ? "  for (uint e = t; e < DV; e += WG) s_v[e] = V[gid * DV + e];\n" : ""},
       {"ISTART", causal ? "  uint istart = uint(clamp(int(j) - CAUSAL_OFF, 0, int(SQ)));  // first query "
                           "that sees key j\n"
                         : "  uint istart = 0u;\n"},
       {"ACCS", (dk ? acc_decl(acc_k, "acc_k") : "") + (dv ? acc_decl(acc_v, "acc_v") : "")},
       {"MASK", has_mask ? " + mask_at(b, h, i, j)" : ""},
       {"DS", dk ? "            float dp = 0.0;\n"
                   "            for (uint e = 0u; e < DV; ++e) dp += DO[r * DV + e] * s_v[e];\n"
                   "            ds = p * (dp - DELTA[r]) * SCALE;  // dS_ij * scale\n"
                 : ""},
       {"PUBLISH", std::string(dv ? "      s_p[t] = p;\n" : "") + (dk ? "      s_ds[t] = ds;\n" : "")},
       {"UPDATES", updates},
       {"STORES", stores}});
}

// attention / attention_lse, vectorized: the row kernel's workgroup per query row and online softmax over
// key tiles of WG (the same m, l and lse arithmetic), with thread t scoring key j0 + t from vec4 loads (all
// D4 in flight; the dims summed in the scalar order, see vec4_dot) and the tile's probabilities applied to V
// by G = WG / DV4 groups of DV4 threads, thread (g, e) owning value vec4 e over the tile's keys g, g + G, ...
// (a coalesced row per group; the loads need no guard, so they issue together); the G partial outputs are
// summed in shared memory at the end. The workgroup and so every reduction order do not depend on which
// outputs are written: o alone, lse alone and both agree bitwise.
std::string forward_vec_main(const std::string& grid, bool out_o, bool out_lse, bool causal, bool has_mask) {
  return gl::render(
      R"(void main() {
${GRID}${ROW}  for (uint c = t; c < D4; c += WG) s_q4[c] = Q4[gid * D4 + c];
  barrier();
  uint g = t / DV4, e = t % DV4;  // this thread's key group and value vec4
  float m = NEG_INF;  // running maximum of the row's scores (uniform across the workgroup)
  float l = 0.0;      // this thread's share of sum_j exp(s_j - m)
  vec4 acc = vec4(0.0);
  for (uint j0 = 0u; j0 < kend; j0 += WG) {
    uint j = j0 + t;
    float s = NEG_INF;
    if (j < kend) {
${DOT}      s = SCALE * dot${MASK};
    }
${STEP}${ACCUMULATE}  }
  l = wg_sum(l);
${STORE_O}${STORE_LSE}}
)",
      {{"GRID", grid},
       {"ROW", row_indices(causal)},
       {"STEP", kOnlineSoftmaxStep},
       {"DOT", vec4_dot("dot", "s_q4[c]", "K4[(kbase + j) * D4 + c]", "D4", "      ")},
       {"MASK", has_mask ? " + mask_at(b, h, i, j)" : ""},
       {"ACCUMULATE", out_o ? R"(    s_p[t] = p;
    barrier();
    uint last = min(WG, kend - j0) - 1u;  // the tile's last visible key
    acc *= alpha;
    if (g < G) {
      [[unroll]] for (uint r = 0u; r < RPG; ++r) {
        uint k = min(g + r * G, WG - 1u);
        float w = g + r * G <= last ? s_p[k] : 0.0;
        acc = fma(vec4(w), V4[(kbase + j0 + min(k, last)) * DV4 + e], acc);
      }
    }
    barrier();
)"
                            : ""},
       {"STORE_O", out_o ? std::string("  if (g < G) s_o[t] = acc;\n") + kSumGroupsStoreO : ""},
       {"STORE_LSE", out_lse ? kStoreLse : ""}});
}

// attention / attention_lse for rows of few keys (at most kWholeKeysPerThread per thread, as in decoding), in
// one pass: every load is issued before the first reduction (this thread's q in registers, its KPT keys' scores,
// then after one maximum and one sum the value rows, all unconditional), so the row costs about one memory
// latency instead of the online kernel's several per key tile. Thread t scores keys t, t + WG, ... (vec4_dot,
// the scalar order); the exact maximum replaces the running one; the probabilities go to shared memory and
// G = WG / DV4 groups of DV4 threads apply V as in forward_vec_main. Value rows past the visible keys are not
// read (weight 0, index clamped to the last visible row), so garbage there (an unwritten cache row) cannot reach
// o. One kernel for o, lse or both: they agree bitwise.
std::string forward_whole_main(const std::string& grid, bool out_o, bool out_lse, bool causal, bool has_mask) {
  return gl::render(
      R"(void main() {
${GRID}${ROW}  vec4 q4[D4];
  [[unroll]] for (uint c = 0u; c < D4; ++c) q4[c] = Q4[gid * D4 + c];
  float s[KPT];  // this thread's scores, of keys t + r WG (-inf past the visible keys)
  float mx = NEG_INF;
  [[unroll]] for (uint r = 0u; r < KPT; ++r) {
    uint j = t + r * WG;
    s[r] = NEG_INF;
    if (j < kend) {
${DOT}      s[r] = SCALE * dot${MASK};
    }
    mx = max(mx, s[r]);
  }
  float m = wg_max(mx);  // the row's maximum (uniform)
  float l = 0.0;         // this thread's share of sum_j exp(s_j - m)
  [[unroll]] for (uint r = 0u; r < KPT; ++r) {
    float p = s[r] == NEG_INF ? 0.0 : exp(s[r] - m);
    l += p;
${PUBLISH}  }
  l = wg_sum(l);  // its barriers also publish s_p
${APPLY}${STORE_LSE}}
)",
      {{"GRID", grid},
       {"ROW", row_indices(causal)},
       {"DOT", vec4_dot("dot", "q4[c]", "K4[(kbase + j) * D4 + c]", "D4", "      ")},
       {"MASK", has_mask ? " + mask_at(b, h, i, j)" : ""},
       {"PUBLISH", out_o ? "    s_p[t + r * WG] = p;\n" : ""},
       {"APPLY", out_o ? R"(  uint g = t / DV4, e = t % DV4;  // this thread's key group and value vec4
  vec4 acc = vec4(0.0);
  if (g < G) {
    if (kend > 0u) {
      [[unroll]] for (uint r = 0u; r < RPG; ++r) {
        uint k = min(g + r * G, kend - 1u);
        float w = g + r * G < kend ? s_p[k] : 0.0;
        acc = fma(vec4(w), V4[(kbase + k) * DV4 + e], acc);
      }
    }
    s_o[t] = acc;
  }
)" + std::string(kSumGroupsStoreO)
                       : ""},
       {"STORE_LSE", out_lse ? kStoreLse : ""}});
}

}  // namespace

uint32_t grad_kv_workgroup(const Dims& d, const DeviceCaps& caps) {
  return workgroup_for(d.Sq, std::max(d.D, d.Dv), caps);
}
uint64_t grad_kv_shared_bytes(const Dims& d, uint32_t wg) {
  return (std::max<uint64_t>(d.D, 1) + std::max<uint64_t>(d.Dv, 1) + 3 * uint64_t(wg)) * 4;
}

namespace {

// The vectorized forward (forward_vec_main) takes head dims of whole vec4s with a value row no wider than the
// workgroup.
bool forward_vec_fits(const Dims& d, const DeviceCaps& caps) {
  const uint32_t wg = workgroup_for(d.Skv, d.Dv, caps);
  return d.D > 0 && d.Dv > 0 && d.D % 4 == 0 && d.Dv % 4 == 0 && d.Dv / 4 <= wg;
}

// Keys per thread up to which the one-pass kernel (forward_whole_main) replaces the online one: its scores stay
// in registers and its value loads are unrolled (RPG = Skv / G of them per thread, at most kWholeValueLoads:
// wide value rows leave fewer groups, so more loads each).
constexpr uint64_t kWholeKeysPerThread = 4, kWholeValueLoads = 32;
bool forward_whole_fits(const Dims& d, const DeviceCaps& caps) {
  const uint64_t wg = workgroup_for(d.Skv, d.Dv, caps), groups = wg / (d.Dv / 4);
  return d.Skv <= kWholeKeysPerThread * wg && div_up(d.Skv, groups) <= kWholeValueLoads;
}

// The vectorized forward kernels: the one-pass form when every thread has at most kWholeKeysPerThread keys
// (`whole`), else the online form over key tiles.
Lowering forward_vec_lowering(const Problem& p, FwdOuts outs, bool whole) {
  const Dims& d = p.d;
  const DeviceCaps& caps = *p.caps;
  const uint32_t wg = workgroup_for(d.Skv, d.Dv, caps);
  const uint64_t d4 = d.D / 4, dv4 = d.Dv / 4, groups = wg / dv4;
  const uint64_t kpt = div_up(d.Skv, wg);  // keys per thread (whole)
  gl::Buffers bufs;
  bufs.add_as("vec4", "Q4", gl::input(0));
  bufs.add_as("vec4", "K4", gl::input(1));
  if (outs.o >= 0) bufs.add_as("vec4", "V4", gl::input(2));
  if (p.mask) bufs.add("MASK", gl::input(3));
  if (outs.o >= 0) bufs.add_as("vec4", "O4", gl::output(outs.o));
  if (outs.lse >= 0) bufs.add("LSE", gl::output(outs.lse));
  check_shared((whole ? kpt * wg + wg * 4 + wg : d4 * 4 + wg + wg * 4 + wg) * 4, p,
               "head dims D " + std::to_string(d.D) + " / Dv " + std::to_string(d.Dv));
  const gl::Grid grid = gl::flat_groups(d.B * d.Hq * d.Sq, caps, p.who);
  const std::string decls =
      whole ? gl::render(R"(const uint D4 = ${D4}, DV4 = ${DV4}, G = ${G}, KPT = ${KPT}, RPG = ${RPG};  // KPT: keys per thread, RPG: per group
shared float s_p[KPT * WG];  // the row's probabilities
shared vec4 s_o[WG];         // the groups' partial outputs
)",
                         {{"D4", u(d4)},
                          {"DV4", u(dv4)},
                          {"G", u(groups)},
                          {"KPT", u(kpt)},
                          {"RPG", u(div_up(d.Skv, groups))}})
            : gl::render(R"(const uint D4 = ${D4}, DV4 = ${DV4}, G = ${G}, RPG = ${RPG};  // RPG: keys per group and tile
shared vec4 s_q4[D4];  // this row's query
shared float s_p[WG];  // the tile's probabilities
shared vec4 s_o[WG];   // the groups' partial outputs
)",
                         {{"D4", u(d4)}, {"DV4", u(dv4)}, {"G", u(groups)}, {"RPG", u(div_up(wg, groups))}});
  Kernel k;
  k.name = p.op + (whole ? "_whole_" : "_vec_") + p.key + "_wg" + std::to_string(wg);
  const std::string apply = std::to_string(groups) + " key groups apply V (WG = " + std::to_string(wg) + ")";
  k.glsl = attention_kernel_glsl(
      p, true, p.op,
      whole ? "workgroup per query row, one pass (" + std::to_string(kpt) +
                  " keys per thread, exact maximum), vec4 scores, " + apply
            : "workgroup per query row, online softmax over key tiles of WG, vec4 scores, " + apply,
      wg, bufs, gl::math_lib() + gl::wg_reduce_lib(wg) + decls,
      whole ? forward_whole_main(grid.glsl, outs.o >= 0, outs.lse >= 0, p.causal, p.mask != nullptr)
            : forward_vec_main(grid.glsl, outs.o >= 0, outs.lse >= 0, p.causal, p.mask != nullptr));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  Lowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace

Lowering row_lowering(const Problem& p, Kind kind, FwdOuts outs) {
  const Dims& d = p.d;
  const DeviceCaps& caps = *p.caps;
  const bool has_mask = p.mask != nullptr;
  const int mask_input = is_forward(kind) ? 3 : 6;
  Lowering l;
  gl::Buffers bufs;
  Shared shared;
  uint32_t wg = 0;
  std::string body, design;
  gl::Grid grid;
  auto grid_for = [&](uint64_t rows) {
    grid = gl::flat_groups(rows, caps, p.who);
    return grid.glsl;
  };
  if (is_forward(kind) && forward_vec_fits(d, caps))
    return forward_vec_lowering(p, outs, forward_whole_fits(d, caps));
  switch (kind) {
    case Kind::Forward:
    case Kind::Lse:
    case Kind::ForwardLse: {
      const bool out_o = outs.o >= 0, out_lse = outs.lse >= 0;
      bufs.add("Q", gl::input(0));
      bufs.add("K", gl::input(1));
      if (out_o) bufs.add("V", gl::input(2));
      if (has_mask) bufs.add("MASK", gl::input(mask_input));
      if (out_o) bufs.add("O", gl::output(outs.o));
      if (out_lse) bufs.add("LSE", gl::output(outs.lse));
      // The workgroup (and so the order of the reductions of m and l) does not depend on which outputs are
      // written: lse alone, o alone and both together agree bitwise.
      wg = workgroup_for(d.Skv, d.Dv, caps);
      shared.add("s_q", d.D, "this row's query");
      if (out_o) shared.add("s_p", wg, "the tile's probabilities");
      body = forward_main(grid_for(d.B * d.Hq * d.Sq), out_o, out_lse, p.causal, has_mask, div_up(d.Dv, wg));
      design = "workgroup per query row, online softmax over key tiles";
      break;
    }
    case Kind::GradQ:
      for (int i = 0; i < 6; ++i)
        bufs.add(std::vector<std::string>{"Q", "K", "V", "O", "DO", "LSE"}[size_t(i)], gl::input(i));
      if (has_mask) bufs.add("MASK", gl::input(mask_input));
      bufs.add("DQ", gl::output());
      wg = workgroup_for(d.Skv, d.D, caps);
      shared.add("s_q", d.D, "this row's query");
      shared.add("s_do", d.Dv, "this row's do");
      shared.add("s_ds", wg, "the tile's dS * scale");
      body = grad_q_main(grid_for(d.B * d.Hq * d.Sq), p.causal, has_mask, div_up(d.D, wg));
      design = "workgroup per query row, key tiles";
      break;
    case Kind::GradK:
      return row_grad_kv_lowering(p, 0, -1);
    case Kind::GradV:
      return row_grad_kv_lowering(p, -1, 0);
  }
  check_shared((shared.words + wg) * 4, p,
               "head dims D " + std::to_string(d.D) + " / Dv " + std::to_string(d.Dv));
  Kernel k;
  k.name = p.op + "_" + p.key + "_wg" + std::to_string(wg);
  k.glsl = attention_kernel_glsl(p, false, p.op, design + " (WG = " + std::to_string(wg) + ")", wg, bufs,
                                 gl::math_lib() + gl::wg_reduce_lib(wg) + shared.decls, body);
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

Lowering row_grad_kv_lowering(const Problem& p, int pk, int pv) {
  const Dims& d = p.d;
  const DeviceCaps& caps = *p.caps;
  const bool dk = pk >= 0, dv = pv >= 0, both = dk && dv;
  const int mask_input = 6;
  Lowering l;
  if (dk) add_delta_kernel(l, p);
  gl::Buffers bufs;
  bufs.add("Q", gl::input(0));
  bufs.add("K", gl::input(1));
  if (dk) bufs.add("V", gl::input(2));
  bufs.add("DO", gl::input(4));
  bufs.add("LSE", gl::input(5));
  if (dk) bufs.add("DELTA", {BindingKind::Scratch, 0, false});
  if (p.mask) bufs.add("MASK", gl::input(mask_input));
  if (dk) bufs.add("DK", gl::output(pk));
  if (dv) bufs.add("DVOUT", gl::output(pv));
  const uint32_t wg = both ? grad_kv_workgroup(d, caps) : workgroup_for(d.Sq, dk ? d.D : d.Dv, caps);
  Shared shared;
  shared.add("s_k", d.D, "this key row");
  if (dk) shared.add("s_v", d.Dv, "this value row");
  if (dv) shared.add("s_p", wg, "the tile's probabilities");
  if (dk) shared.add("s_ds", wg, "the tile's dS * scale");
  check_shared((shared.words + wg) * 4, p,
               "head dims D " + std::to_string(d.D) + " / Dv " + std::to_string(d.Dv));
  const gl::Grid grid = gl::flat_groups(d.B * d.Hkv * d.Skv, caps, p.who);
  const std::string design =
      std::string("workgroup per key row, tiles of the query rows of every query head reading it") +
      (both ? "; P and dS formed once for both" : "");
  const std::string op = both ? "attention_grad_k + attention_grad_v" : p.op;
  Kernel k;
  k.name = (both ? std::string("attention_grad_kv") : p.op) + "_" + p.key + "_wg" + std::to_string(wg);
  k.glsl = attention_kernel_glsl(p, false, op, design + " (WG = " + std::to_string(wg) + ")", wg, bufs,
                                 gl::math_lib() + gl::wg_reduce_lib(wg) + shared.decls,
                                 grad_kv_main(grid.glsl, dk, dv, p.causal, p.mask != nullptr, div_up(d.D, wg),
                                              div_up(d.Dv, wg), "DK", "DVOUT"));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace mgn::codegen::attn
