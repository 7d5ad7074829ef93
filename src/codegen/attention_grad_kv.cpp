// The key-tiled dK+dV kernel (KernelOptions::attention = tiled; use_kv_tiled): a workgroup per block of WG
// key rows of one kv head, a thread per key row: its k and v rows sit in shared memory (rows padded by one
// vec4, so the per-thread vec4 reads do not collide on banks), its dk and dv in registers. Tiles of BQ query
// rows (q, do, lse, D_i) of every query head reading the kv head are staged in shared memory and read by the
// whole block, so each query row crosses L2 once per block instead of once per key row. The arithmetic is
// the row kernel's, in its order (dims, then heads, then query rows).
#include <algorithm>
#include <string>

#include "codegen/attention_common.h"

namespace mgn::codegen::attn {
namespace {

using gl::u;

constexpr uint32_t kTiledBq = 16;

bool kv_tiled_fits(const Dims& d) {
  return d.D > 0 && d.Dv > 0 && d.D % 4 == 0 && d.Dv % 4 == 0 && d.D <= 64 && d.Dv <= 64;
}

}  // namespace

bool use_kv_tiled(const Dims& d, AttentionKernel want) {
  if (want == AttentionKernel::Row || !kv_tiled_fits(d)) return false;
  // Auto: the row kernel. The key-tiled one has few blocks (B x Hkv x Skv/WG, 96 at seq 1024 with 3 kv heads,
  // one warp each, every one walking REP x Sq query rows); at that shape on an H100 (run 8) the tiled
  // derivative kernels lost to the row ones (see use_tiled). AttentionKernel::Tiled still selects it.
  return want == AttentionKernel::Tiled;
}

namespace {

// `split`: the block takes one part of the work (part sp: query heads hs * HPS.. of its kv head, query rows
// [qc * QCH, (qc + 1) * QCH)) and writes partial dk, dv to PART4; the reduction kernel sums the parts.
std::string grad_kv_tiled_main(const std::string& grid, bool causal, bool has_mask, bool split) {
  return gl::render(
      R"(void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint kb = gid % NKB, hk = (gid / NKB) % HKV, b = (gid / (NKB * HKV)) % NB, sp = gid / (NKB * HKV * NB);
  uint hs = sp % HSPLIT, qc = sp / HSPLIT;  // this block's query heads and query rows
  uint qlo = qc * QCH, qhi = min(SQ, qlo + QCH);
  uint j = kb * WG + t;  // this thread's key row
  bool live = j < SKV;
  uint krow = (b * HKV + hk) * SKV + j;
  [[unroll]] for (uint c = 0u; c < D4; ++c) s_kt[t * KS + c] = live ? K4[krow * D4 + c] : vec4(0.0);
  [[unroll]] for (uint c = 0u; c < DV4; ++c) s_vt[t * VS + c] = live ? V4[krow * DV4 + c] : vec4(0.0);
${ISTART}  vec4 dk[D4], dv[DV4];
  [[unroll]] for (uint c = 0u; c < D4; ++c) dk[c] = vec4(0.0);
  [[unroll]] for (uint c = 0u; c < DV4; ++c) dv[c] = vec4(0.0);
  for (uint h = hk * REP + hs * HPS; h < hk * REP + (hs + 1u) * HPS; ++h) {
    uint qrow0 = (b * HQ + h) * SQ;  // row of query 0 of head h
    for (uint i0 = max(istart_blk, qlo); i0 < qhi; i0 += BQ) {
      barrier();  // the previous tile's readers are done (and, first, the k/v rows are in)
      for (uint e = t; e < BQ * D4; e += WG) {
        uint i = i0 + e / D4;
        s_q[e] = i < qhi ? Q4[(qrow0 + i) * D4 + e % D4] : vec4(0.0);
      }
      for (uint e = t; e < BQ * DV4; e += WG) {
        uint i = i0 + e / DV4;
        s_do[e] = i < qhi ? DO4[(qrow0 + i) * DV4 + e % DV4] : vec4(0.0);
      }
      for (uint e = t; e < BQ; e += WG) {
        uint i = i0 + e;
        s_lse[e] = i < qhi ? LSE[qrow0 + i] : NEG_INF;
        s_delta[e] = i < qhi ? DELTA[qrow0 + i] : 0.0;
      }
      barrier();
      [[unroll]] for (uint r = 0u; r < BQ; ++r) {
        uint i = i0 + r;
        float lse = s_lse[r];
        if (i < istart || lse == NEG_INF) continue;  // rows past qhi have lse -inf
${DOT}        float s = SCALE * dot${MASK};
        if (s == NEG_INF) continue;
        float p = exp(s - lse);
${DP}        float ds = p * (dp - s_delta[r]) * SCALE;  // dS_ij * scale
        [[unroll]] for (uint c = 0u; c < D4; ++c) dk[c] = fma(vec4(ds), s_q[r * D4 + c], dk[c]);
        [[unroll]] for (uint c = 0u; c < DV4; ++c) dv[c] = fma(vec4(p), s_do[r * DV4 + c], dv[c]);
      }
    }
  }
  if (!live) return;
${STORE}}
)",
      {{"GRID", grid},
       {"ISTART", causal
                      ? "  uint istart_blk = uint(clamp(int(kb * WG) - CAUSAL_OFF, 0, int(SQ)));  // first "
                        "query the block needs\n"
                        "  uint istart = live ? uint(clamp(int(j) - CAUSAL_OFF, 0, int(SQ))) : SQ;  // "
                        "first query that sees j\n"
                      : "  uint istart_blk = 0u;\n  uint istart = live ? 0u : SQ;\n"},
       {"DOT", vec4_dot("dot", "s_q[r * D4 + c]", "s_kt[t * KS + c]", "D4", "        ")},
       {"MASK", has_mask ? " + mask_at(b, h, i, j)" : ""},
       {"DP", vec4_dot("dp", "s_do[r * DV4 + c]", "s_vt[t * VS + c]", "DV4", "        ")},
       {"STORE",
        split
            ? R"(  // partial sums of part sp: dk at [sp][row][D4], then dv at [sp][row][DV4] after every part's dk
  [[unroll]] for (uint c = 0u; c < D4; ++c) PART4[(sp * NROWS + krow) * D4 + c] = dk[c];
  [[unroll]] for (uint c = 0u; c < DV4; ++c)
    PART4[NSP * NROWS * D4 + (sp * NROWS + krow) * DV4 + c] = dv[c];
)"
            : R"(  [[unroll]] for (uint c = 0u; c < D4; ++c) DK4[krow * D4 + c] = dk[c];
  [[unroll]] for (uint c = 0u; c < DV4; ++c) DVOUT4[krow * DV4 + c] = dv[c];
)"}});
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

}  // namespace

// The key-tiled dK+dV kernels: one, or (split work) the partial kernel and the reduction of its parts.
void grad_kv_tiled(Lowering& l, const Problem& p, int pk, int pv) {
  const Dims& d = p.d;
  const DeviceCaps& caps = *p.caps;
  const uint32_t wg = tiled_workgroup(caps);
  const uint64_t nkb = div_up(d.Skv, wg);
  const KvSplit sp = kv_split(d, nkb);
  const bool split = sp.parts() > 1;
  const uint64_t nrows = d.B * d.Hkv * d.Skv, part_vec4s = sp.parts() * nrows * (d.D + d.Dv) / 4;
  if (split) {
    gl::check_32bit(part_vec4s * 4, p.who);
    l.scratch_words.push_back(part_vec4s * 4);  // scratch 1 (scratch 0: D_i)
  }
  gl::Buffers bufs;
  bufs.add_as("vec4", "Q4", gl::input(0));
  bufs.add_as("vec4", "K4", gl::input(1));
  bufs.add_as("vec4", "V4", gl::input(2));
  bufs.add_as("vec4", "DO4", gl::input(4));
  bufs.add("LSE", gl::input(5));
  bufs.add("DELTA", {BindingKind::Scratch, 0, false});
  if (p.mask) bufs.add("MASK", gl::input(6));
  if (split) {
    bufs.add_as("vec4", "PART4", {BindingKind::Scratch, 1, true});
  } else {
    bufs.add_as("vec4", "DK4", gl::output(pk));
    bufs.add_as("vec4", "DVOUT4", gl::output(pv));
  }
  const uint64_t ks = d.D / 4 + 1, vs = d.Dv / 4 + 1;
  const uint64_t shared_bytes = (wg * (ks + vs) + kTiledBq * (d.D + d.Dv) / 4) * 16 + 2 * kTiledBq * 4;
  check_shared(shared_bytes, p, "the key-tiled kernel (the row attention kernel avoids it) needs");
  gl::Grid grid = gl::flat_groups(d.B * d.Hkv * nkb * sp.parts(), caps, p.who);
  Kernel k;
  k.name = "attention_grad_kv_tiled_" + p.key + "_wg" + std::to_string(wg) +
           (split ? "_split" + std::to_string(sp.hsplit) + "x" + std::to_string(sp.qc) : "");
  const std::string decls = gl::render(
      R"(const uint NKB = ${NKB}, D4 = ${D4}, DV4 = ${DV4}, BQ = ${BQ}, KS = ${KS}, VS = ${VS};  // KS, VS: padded row strides of s_kt, s_vt in vec4s
const uint NB = ${NB}, NROWS = ${NROWS}, HSPLIT = ${HSPLIT}, HPS = ${HPS}, QCH = ${QCH}, NSP = ${NSP};  // parts: HSPLIT x (SQ / QCH), HPS query heads each
shared vec4 s_kt[WG * KS];  // the block's key rows
shared vec4 s_vt[WG * VS];  // its value rows
shared vec4 s_q[BQ * D4];
shared vec4 s_do[BQ * DV4];
shared float s_lse[BQ];
shared float s_delta[BQ];
)",
      {{"NKB", u(nkb)},
       {"D4", u(d.D / 4)},
       {"DV4", u(d.Dv / 4)},
       {"BQ", u(kTiledBq)},
       {"KS", u(ks)},
       {"VS", u(vs)},
       {"NB", u(d.B)},
       {"NROWS", u(nrows)},
       {"HSPLIT", u(sp.hsplit)},
       {"HPS", u(d.Hq / d.Hkv / sp.hsplit)},
       {"QCH", u(sp.qch)},
       {"NSP", u(sp.parts())}});
  k.glsl = attention_kernel_glsl(
      p, true, "attention_grad_k + attention_grad_v",
      "workgroup per block of WG key rows of one kv head, a thread per key row (dk, dv in registers), tiles "
      "of BQ "
      "query rows of every query head reading it in shared memory (WG = " +
          std::to_string(wg) + ", BQ = " + std::to_string(kTiledBq) + ")" +
          (split ? "; the query heads in " + std::to_string(sp.hsplit) + " parts and the query rows in " +
                       std::to_string(sp.qc) + ", partial sums out"
                 : std::string()),
      wg, bufs, decls, grad_kv_tiled_main(grid.glsl, p.causal, p.mask != nullptr, split));
  k.bindings = bufs.bindings;
  k.groups = grid.groups;
  l.kernels.push_back(std::move(k));
  if (!split) return;
  // The parts summed in order (deterministic): dk rows, then dv rows, a vec4 per invocation.
  gl::Buffers rb;
  rb.add_as("vec4", "PART4", {BindingKind::Scratch, 1, false});
  rb.add_as("vec4", "DK4", gl::output(pk));
  rb.add_as("vec4", "DVOUT4", gl::output(pv));
  const uint64_t nk = nrows * d.D / 4, nv = nrows * d.Dv / 4;
  const std::string sum_decls =
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
  l.kernels.push_back(gl::elementwise("attention_grad_kv_tiled_sum_" + p.key,
                                      "attention_grad_k + attention_grad_v " + p.key + ": the " +
                                          std::to_string(sp.parts()) +
                                          " parts of the key-tiled kernel summed",
                                      sum_decls, body, nk + nv, rb.bindings, caps));
}

}  // namespace mgn::codegen::attn
