// The query-tiled attention kernels (KernelOptions::attention; use_query_tiled): attention / attention_lse
// and attention_grad_q with one workgroup per block of WG query rows of one (b, h) and one thread per row.
// Key and value tiles of BK rows are staged in shared memory as vec4s and read by every thread of the block
// (broadcast), so each key row crosses L2 once per block instead of once per query row; each thread keeps
// its vectors and its row's online-softmax state in registers, with no reduction across threads.
#include <algorithm>
#include <string>

#include "codegen/attention_common.h"

namespace mgn::codegen::attn {
namespace {

using gl::u;

constexpr uint32_t kTiledBk = 16;  // key rows per shared tile (and scores per thread in registers)

// A thread keeps its row's vectors in registers as vec4s: head dims that are whole vec4s, up to 128 for
// the forward (q, o) and up to 64 for grad_q (q, do, dq).
bool tiled_fits(const Dims& d, Kind kind) {
  const uint64_t most = kind == Kind::GradQ ? 64 : 128;
  return (is_forward(kind) || kind == Kind::GradQ) && d.D > 0 && d.Dv > 0 && d.D % 4 == 0 && d.Dv % 4 == 0 &&
         d.D <= most && d.Dv <= most;
}

// KernelOptions::attention is a preference: shapes the tiled kernel does not take stay on the row kernel
// (the kernel's name says which ran).
}  // namespace

bool use_query_tiled(const Dims& d, Kind kind, const DeviceCaps& caps, AttentionKernel want) {
  if (want == AttentionKernel::Row || !tiled_fits(d, kind)) return false;
  if (want == AttentionKernel::Tiled) return true;
  // Auto: the forward kernels (attention, attention_lse) and grad_q when there are query rows enough to fill
  // a block and blocks enough to fill a large GPU (the row kernel has a workgroup per row, so it keeps the
  // edge when there are few rows). On an H100 (run 9, seq 1024, 9/3 heads, d 64) the tiled grad_q took
  // 1.60 ms against the row kernel's 2.71 ms, and the tiled forward with lse 0.39 against 1.46.
  const uint32_t wg = tiled_workgroup(caps);
  return d.Sq >= wg && d.B * d.Hq * div_up(d.Sq, wg) >= 128;
}

namespace {

// The start of a query-tiled kernel's main: this thread's row (live: inside Sq), its kv head, the keys the
// block walks [0, kend_blk) and the keys the row sees [0, kend).
std::string tiled_row_setup(const std::string& grid, bool causal) {
  return gl::render(
      R"(void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint qb = gid % NQB, h = (gid / NQB) % HQ, b = gid / (NQB * HQ);
  uint i = qb * WG + t;  // this thread's query row
  bool live = i < SQ;
  uint row = (b * HQ + h) * SQ + i;
  uint kbase = (b * HKV + h / REP) * SKV;  // row of key 0 of this kv head
  uint ilast = min(qb * WG + WG, SQ) - 1u;  // the block's last query row
${KEND})",
      {{"GRID", grid},
       {"KEND", causal ? "  uint kend_blk = uint(clamp(int(ilast) + CAUSAL_OFF + 1, 0, int(SKV)));  // keys "
                         "some row sees\n"
                         "  uint kend = live ? uint(clamp(int(i) + CAUSAL_OFF + 1, 0, int(SKV))) : 0u;  // "
                         "keys [0, kend)\n"
                       : "  uint kend_blk = SKV;\n  uint kend = live ? SKV : 0u;\n"}});
}

// Stage rows j0 .. j0 + BK - 1 of the kv head of X4 (D4 vec4s each) in shared S.
std::string stage_rows(const std::string& s, const std::string& x4, const std::string& d4) {
  return gl::render(R"(    for (uint e = t; e < BK * ${D4}; e += WG) {
      uint j = j0 + e / ${D4};
      ${S}[e] = j < SKV ? ${X4}[(kbase + j) * ${D4} + e % ${D4}] : vec4(0.0);
    }
)",
                    {{"S", s}, {"X4", x4}, {"D4", d4}});
}

// Stage key (and value) rows j0 .. j0 + BK - 1 of the kv head in s_k (s_v) between two barriers.
std::string tiled_stage(bool with_v) {
  return "    barrier();  // the previous tile's readers are done\n" + stage_rows("s_k", "K4", "D4") +
         (with_v ? stage_rows("s_v", "V4", "DV4") : "") + "    barrier();\n";
}

std::string forward_tiled_main(const std::string& grid, bool out_o, bool out_lse, bool causal,
                               bool has_mask) {
  return gl::render(
      R"(${SETUP}  vec4 q[D4];
  [[unroll]] for (uint c = 0u; c < D4; ++c) q[c] = live ? Q4[row * D4 + c] : vec4(0.0);
${O_INIT}  float m = NEG_INF, l = 0.0;  // the row's running maximum and sum of exp(s - m)
  for (uint j0 = 0u; j0 < kend_blk; j0 += BK) {
${STAGE}    float s[BK];
    float mt = NEG_INF;
    [[unroll]] for (uint r = 0u; r < BK; ++r) {
      float a = NEG_INF;
      if (j0 + r < kend) {
${DOT}        a = SCALE * dot${MASK};
      }
      s[r] = a;
      mt = max(mt, a);
    }
    float mn = max(m, mt);
    if (mn != NEG_INF) {  // else nothing of this row is visible yet
      float alpha = m == NEG_INF ? 0.0 : exp(m - mn);
      l *= alpha;
${O_RESCALE}      [[unroll]] for (uint r = 0u; r < BK; ++r) {
        float p = s[r] == NEG_INF ? 0.0 : exp(s[r] - mn);
        l += p;
${O_ADD}      }
      m = mn;
    }
  }
  if (!live) return;
${STORE_O}${STORE_LSE}}
)",
      {{"SETUP", tiled_row_setup(grid, causal)},
       {"O_INIT",
        out_o ? "  vec4 o[DV4];\n  [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] = vec4(0.0);\n" : ""},
       {"STAGE", tiled_stage(out_o)},
       {"DOT", vec4_dot("dot", "q[c]", "s_k[r * D4 + c]", "D4", "        ")},
       {"MASK", has_mask ? " + mask_at(b, h, i, j0 + r)" : ""},
       {"O_RESCALE", out_o ? "      [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] *= alpha;\n" : ""},
       {"O_ADD", out_o
                     ? "        [[unroll]] for (uint c = 0u; c < DV4; ++c) o[c] = fma(vec4(p), s_v[r * DV4 + "
                       "c], o[c]);\n"
                     : ""},
       {"STORE_O",
        out_o ? "  float inv = m == NEG_INF ? 0.0 : 1.0 / l;  // no visible key: o = 0\n"
                "  [[unroll]] for (uint c = 0u; c < DV4; ++c) O4[o_row(row) * DV4 + c] = o[c] * inv;\n"
              : ""},
       {"STORE_LSE", out_lse ? "  LSE[row] = m == NEG_INF ? NEG_INF : m + log(l);\n" : ""}});
}

// attention_grad_q, query-tiled: the row kernel's arithmetic (P from the saved lse, dS, dq over the key
// rows in order) with a thread per query row and the key/value tiles shared by the block.
std::string grad_q_tiled_main(const std::string& grid, bool causal, bool has_mask) {
  return gl::render(R"(${SETUP}  vec4 q[D4], dq[D4], dov[DV4];
  [[unroll]] for (uint c = 0u; c < D4; ++c) {
    q[c] = live ? Q4[row * D4 + c] : vec4(0.0);
    dq[c] = vec4(0.0);
  }
  [[unroll]] for (uint c = 0u; c < DV4; ++c) dov[c] = live ? DO4[row * DV4 + c] : vec4(0.0);
  // D_i = do_i . o_i
${DI}  float lse = live ? LSE[row] : NEG_INF;
  if (lse == NEG_INF) kend = 0u;  // a row with no visible key has no derivative
  for (uint j0 = 0u; j0 < kend_blk; j0 += BK) {
${STAGE}    [[unroll]] for (uint r = 0u; r < BK; ++r) {
      if (j0 + r >= kend) continue;
${DOT}      float s = SCALE * dot${MASK};
      if (s == NEG_INF) continue;
${DP}      float ds = exp(s - lse) * (dp - di) * SCALE;
      [[unroll]] for (uint c = 0u; c < D4; ++c) dq[c] = fma(vec4(ds), s_k[r * D4 + c], dq[c]);
    }
  }
  if (!live) return;
  [[unroll]] for (uint c = 0u; c < D4; ++c) DQ4[row * D4 + c] = dq[c];
}
)",
                    {{"SETUP", tiled_row_setup(grid, causal)},
                     {"DI", vec4_dot("di", "dov[c]", "(live ? O4[row * DV4 + c] : vec4(0.0))", "DV4", "  ")},
                     {"STAGE", tiled_stage(true)},
                     {"DOT", vec4_dot("dot", "q[c]", "s_k[r * D4 + c]", "D4", "      ")},
                     {"MASK", has_mask ? " + mask_at(b, h, i, j0 + r)" : ""},
                     {"DP", vec4_dot("dp", "dov[c]", "s_v[r * DV4 + c]", "DV4", "      ")}});
}

}  // namespace

// The query-tiled kernel of the forward ops (O and/or LSE, written to the dispatch nodes `outs` names) or of
// attention_grad_q (DQ).
Kernel query_tiled(const Problem& p, Kind kind, FwdOuts outs) {
  const Dims& d = p.d;
  const DeviceCaps& caps = *p.caps;
  const uint32_t wg = tiled_workgroup(caps);
  const uint64_t nqb = div_up(d.Sq, wg);
  const bool grad = kind == Kind::GradQ, with_v = kind != Kind::Lse;
  gl::Buffers bufs;
  bufs.add_as("vec4", "Q4", gl::input(0));
  bufs.add_as("vec4", "K4", gl::input(1));
  if (with_v) bufs.add_as("vec4", "V4", gl::input(2));
  if (grad) {
    bufs.add_as("vec4", "O4", gl::input(3));
    bufs.add_as("vec4", "DO4", gl::input(4));
    bufs.add("LSE", gl::input(5));
  }
  if (p.mask) bufs.add("MASK", gl::input(grad ? 6 : 3));
  if (!grad && outs.o >= 0) bufs.add_as("vec4", "O4", gl::output(outs.o));
  if (!grad && outs.lse >= 0) bufs.add("LSE", gl::output(outs.lse));
  if (grad) bufs.add_as("vec4", "DQ4", gl::output());
  const uint64_t shared_bytes = uint64_t(kTiledBk) * (d.D + (with_v ? d.Dv : 0)) * 4;
  check_shared(shared_bytes, p, "the query-tiled kernel (the row attention kernel avoids it) needs");
  gl::Grid grid = gl::flat_groups(d.B * d.Hq * nqb, caps, p.who);
  Kernel k;
  k.name = p.op + "_tiled_" + p.key + "_wg" + std::to_string(wg);
  const std::string decls = gl::render(R"(const uint NQB = ${NQB}, D4 = ${D4}, DV4 = ${DV4}, BK = ${BK};
shared vec4 s_k[BK * D4];
${SHARED_V})",
                                       {{"NQB", u(nqb)},
                                        {"D4", u(d.D / 4)},
                                        {"DV4", u(d.Dv / 4)},
                                        {"BK", u(kTiledBk)},
                                        {"SHARED_V", with_v ? "shared vec4 s_v[BK * DV4];\n" : ""}});
  k.glsl = attention_kernel_glsl(
      p, true, p.op,
      "workgroup per block of WG query rows of one head, a thread per row (its vectors and softmax state in "
      "registers), key/value tiles of BK rows in shared memory (WG = " +
          std::to_string(wg) + ", BK = " + std::to_string(kTiledBk) + ")",
      wg, bufs, decls,
      grad ? grad_q_tiled_main(grid.glsl, p.causal, p.mask != nullptr)
           : forward_tiled_main(grid.glsl, outs.o >= 0, outs.lse >= 0, p.causal, p.mask != nullptr));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  return k;
}

}  // namespace mgn::codegen::attn
