// The derivatives of conv2d as implicit GEMMs (conv_implicit_gemm.h): conv2d_grad_input per stride phase,
// conv2d_grad_weight with its own K split. conv.cpp has the overview.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "codegen/conv_common.h"
#include "codegen/conv_implicit_gemm.h"
#include "codegen/glsl.h"
#include "mgn/types.h"

namespace mgn::codegen {

using gl::u;
using namespace igemm;

namespace {

// Stride phases of one axis for the input derivative. Input row h = ph + s*hh (phase ph) is read by tap
// kh of output row oh iff h + pad - kh*dil = oh*s, so per phase the contributing taps are
// kh = k0[ph] + j*q (j < count[ph], q = s / gcd(s, dil)) and then oh = hh + base[ph] - j*step
// (step = dil / gcd(s, dil)). A phase no tap reaches has count 0 (its dx rows are zero).
struct Phases {
  uint64_t q = 1, step = 1, jmax = 1;
  std::vector<uint64_t> k0, count;
  std::vector<int64_t> base;
};

Phases phases(uint64_t taps, uint64_t stride, uint64_t dil, uint64_t pad) {
  Phases p;
  const uint64_t g = std::gcd(stride, dil);
  p.q = stride / g;
  p.step = dil / g;
  p.jmax = 1;  // at least 1 so the decomposition of k never divides by zero
  for (uint64_t ph = 0; ph < stride; ++ph) {
    uint64_t k0 = 0, count = 0;
    int64_t base = 0;
    for (uint64_t kh = 0; kh < std::min(taps, p.q); ++kh) {
      const int64_t t = int64_t(ph + pad) - int64_t(kh * dil);
      if (((t % int64_t(stride)) + int64_t(stride)) % int64_t(stride) != 0) continue;
      k0 = kh;
      count = (taps - 1 - kh) / p.q + 1;
      base = t / int64_t(stride);  // exact
      break;
    }
    p.k0.push_back(k0);
    p.count.push_back(count);
    p.base.push_back(base);
    p.jmax = std::max(p.jmax, count);
  }
  return p;
}

std::string const_array(const std::string& type, const std::string& name, const std::vector<std::string>& v) {
  std::string s = "const " + type + " " + name + "[" + std::to_string(v.size()) + "] = " + type + "[](";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s + ");\n";
}

std::string phase_constants(const std::string& axis, const Phases& p) {
  std::vector<std::string> k0, count, base;
  for (size_t i = 0; i < p.k0.size(); ++i) {
    k0.push_back(u(p.k0[i]));
    count.push_back(u(p.count[i]));
    base.push_back(std::to_string(p.base[i]));
  }
  return gl::const_uint("Q" + axis, p.q) + gl::const_uint("STEP_" + axis, p.step) +
         gl::const_uint("J" + axis + "M", p.jmax) + const_array("uint", "K" + axis + "0", k0) +
         const_array("uint", "J" + axis, count) + const_array("int", "BASE_" + axis, base);
}

}  // namespace

// conv2d_grad_input (gather form, no atomics): dx[b, g*CG + q, h, w] = sum_k dy-gather[m, k] * w[., q, tap].
// One GEMM per (stride phase, group): P = the N*ceil(H/SH)*ceil(W/SW) pixels of one phase, Q = CG,
// K = OG * JHM * JWM over (og, jh, jw), the taps that can reach a pixel of the phase (where phases differ in
// their taps, each phase's own count; a phase no tap reaches runs no K loop); no pixel visits a tap that is
// not divisible by the stride.
Lowering conv_grad_input(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  // Inputs: dy [N, O, OH, OW], w; output dx [N, C, H, W].
  ConvDims d = conv_dims(n, n.shape, ctx.input(1).shape, ctx.input(0).shape);
  Win w = window(n, d.KH, d.KW, true);
  if (d.Cg == 1) return conv_grad_input_direct(ctx, d, w);
  const Phases ph = phases(d.KH, w.sh, w.dh, w.pt), pw = phases(d.KW, w.sw, w.dw, w.pl);
  const uint64_t HH = div_up(d.H, w.sh), WW = div_up(d.W, w.sw);
  ConvGemm s;
  s.name = "conv2d_grad_input_igemm";
  s.comment = "conv2d_grad_input " + conv_key(d, w) +
              ": per stride phase and group, P = pixels of the phase, Q = input channels per "
              "group, K = OG * contributing taps";
  s.P = d.N * HH * WW, s.Q = d.Cg, s.K = d.Og * ph.jmax * pw.jmax;
  const uint64_t numel_dx = d.N * d.C * d.H * d.W;
  const auto [tile, sp] = pick_tile_split(s.P, s.Q, s.K, w.sh * w.sw * d.groups, numel_dx, ctx);
  s.t = tile;
  set_split(s, sp, w.sh * w.sw * d.groups, "DY", "Wt");
  s.p_k_wise = false, s.q_k_wise = true;
  s.consts = conv_constants(d, w) + "// stride phases: pixel (ph + SH*hh, pw + SW*ww)\n" +
             gl::const_uint("HH", HH) + gl::const_uint("WW", WW) + phase_constants("H", ph) +
             phase_constants("W", pw) + gl::const_uint("JHW", ph.jmax * pw.jmax);
  // Phases reached by different numbers of taps (a 3x3 stride-2 conv: 2 x 2, 2 x 1, 1 x 2 and 1 x 1): each
  // phase's GEMM runs K = OG x its own taps, decomposing k by its counts, instead of visiting JHM x JWM taps
  // and loading zeros for those past its count (7 of the 16 tap slots of such a conv's K).
  bool uneven = false;
  for (uint64_t a : ph.count)
    for (uint64_t b : pw.count) uneven |= a * b != 0 && a * b != ph.jmax * pw.jmax;
  s.state = R"(uint g, ph, pw, jh_n, jw_n, taps_n, split;
uint d_base[P_RA];
int d_oh[P_RA], d_ow[P_RA];
bool d_ok[P_RA];
)";
  s.outer_index = "  split = z / (SH * SW * GROUPS);\n  z = z % (SH * SW * GROUPS);\n";
  // A phase no tap reaches (a 1x1 stride-2 conv's odd rows and columns: 3 of its 4 phases) skips the K loop
  // and stores its zeros.
  s.setup = R"(  g = z % GROUPS;
  ph = (z / GROUPS) / SW;
  pw = (z / GROUPS) % SW;
  jh_n = JH[ph];
  jw_n = JW[pw];
  taps_n = jh_n * jw_n;
  k_end = min(k_end, OG * taps_n);  // below k_begin: no K loop (a phase no tap reaches, or this split past its K)
  for (uint a = 0u; a < P_RA; ++a) {
    uint m = m0 + p_row(a);
    uint b = m / (HH * WW), r = m % (HH * WW);
    uint hh = r / WW, ww = r % WW;
    d_ok[a] = m < M && ph + hh * SH < H && pw + ww * SW < W;
    d_base[a] = (b * O + g * OG) * OHW;
    d_oh[a] = int(hh) + BASE_H[ph];
    d_ow[a] = int(ww) + BASE_W[pw];
  }
)";
  // Both loads decompose k into (og, jh, jw) and skip the taps past this phase's count.
  s.load = gl::render(
      R"(  for (uint c = 0u; c < P_RC; ++c) {
    uint k = k0 + p_kk(c);
${TAP}    int dh = int(jh * STEP_H), dw = int(jw * STEP_W);
    for (uint a = 0u; a < P_RA; ++a) {
      int oh = d_oh[a] - dh, ow = d_ow[a] - dw;
      bool ok = k_ok && d_ok[a] && uint(oh) < OH && uint(ow) < OW;
      p_reg[a][c] = ok ? DY[d_base[a] + og * OHW + uint(oh) * OW + uint(ow)] : 0.0;
    }
  }
  for (uint c = 0u; c < Q_RC; ++c) {
    uint k = k0 + q_kk(c);
${TAP}    uint wb = (g * OG + og) * CG * KHW + (KH0[ph] + jh * QH) * KW + KW0[pw] + jw * QW;
    for (uint a = 0u; a < Q_RA; ++a) {
      uint ci = n0 + q_row(a);
      q_reg[a][c] = (k_ok && ci < CG) ? Wt[wb + ci * KHW] : 0.0;
    }
  }
)",
      {{"TAP", uneven ? "    uint og = k / taps_n, r = k % taps_n;\n    uint jh = r / jw_n, jw = r % jw_n;\n"
                        "    bool k_ok = k < k_end;\n"
                      : "    uint og = k / JHW, r = k % JHW;\n    uint jh = r / JWM, jw = r % JWM;\n"
                        "    bool k_ok = k < k_end && jh < jh_n && jw < jw_n;\n"}});
  s.store = R"(      uint r = m % (HH * WW);
      uint h = ph + (r / WW) * SH, w = pw + (r % WW) * SW;
      if (h < H && w < W) )" +
            out_store(sp, "(((m / (HH * WW)) * C + g * CG + n) * H + h) * W + w", numel_dx) + "\n";
  return with_split_sum(implicit_gemm(s, ctx.caps), sp, "conv2d_grad_input", "input gradients", numel_dx,
                        ctx.caps);
}

// conv2d_grad_weight: dw[g*OG + q, p] = sum_k im2col(x)[k, p] * dy[b, g*OG + q, pix] with p = (ci, kh, kw),
// k = (b, oh, ow); P = CG*KH*KW, Q = OG, K = N*OH*OW, both operands loaded k-wise (contiguous along the
// pixels). K is long and P x Q small, so K is split over S workgroups per tile when the tiles alone do
// not fill the device: each split writes its partial tile to scratch and a second kernel sums the S
// partials of every element in split order, so the result does not depend on scheduling.
Lowering conv_grad_weight(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  // Inputs: x [N, C, H, W], dy [N, O, OH, OW]; output dw [O, Cg, KH, KW].
  ConvDims d = conv_dims(n, ctx.input(0).shape, n.shape, ctx.input(1).shape);
  Win w = window(n, d.KH, d.KW, true);
  if (d.Og == 1) return conv_grad_weight_direct(ctx, d, w);
  ConvGemm s;
  s.P = d.Cg * d.KH * d.KW, s.Q = d.Og, s.K = d.N * d.OH * d.OW;
  // The largest tile covering the filter (no count requirement: split-K supplies the workgroups).
  const uint64_t bp = fit_edge(s.P, 32, 128), bq = fit_edge(s.Q, 16, 128);
  if (auto t = forced_tile(s.K, ctx))
    s.t = *t;
  else
    s.t = make_tile(uint32_t(bp), uint32_t(bq), bp * bq >= 128 * 64 ? 16 : 32, s.K, ctx.caps);
  // Splits: enough workgroups in all, each split at least 4 K slices long, scratch at most 64 MiB.
  const uint64_t numel_dw = d.O * s.P;
  const uint64_t tiles = d.groups * div_up(s.P, s.t.bp) * div_up(s.Q, s.t.bq);
  const Split sp = make_split(div_up(kWantGroups, tiles), s.K, s.t.bk, 4, numel_dw, ctx.caps);
  s.name = "conv2d_grad_weight_igemm";
  s.comment = "conv2d_grad_weight " + conv_key(d, w) +
              ": P = CG*KH*KW filter taps, Q = output channels per group, K = N*OH*OW";
  set_split(s, sp, d.groups, "X", "DY");
  s.p_k_wise = true, s.q_k_wise = true;
  s.consts = conv_constants(d, w);
  // Both operands are k-wise with the same BK and thread count, so p_kk(c) == q_kk(c) and one pixel
  // decomposition (b, pix of the gather's k loop) serves both: the dy load goes in that loop.
  const std::string dy = R"(    uint dyk = (b * O + g * OG) * OHW + pix;
    for (uint a = 0u; a < Q_RA; ++a) {
      uint o = n0 + q_row(a);
      q_reg[a][c] = (k_ok && o < OG) ? DY[dyk + o * OHW] : 0.0;
    }
)";
  const Im2colGather x = im2col_gather(n, /*pixel_rows=*/false, dy);
  s.state = "uint g, split;\n" + x.state;
  s.outer_index = "  g = z % GROUPS;\n  split = z / GROUPS;\n";
  s.setup = x.setup;
  s.load = x.load;
  s.store = "      " + out_store(sp, "(g * OG + n) * M + m", numel_dw) + "\n";
  return with_split_sum(implicit_gemm(s, ctx.caps), sp, "conv2d_grad_weight", "filters", numel_dw, ctx.caps);
}

}  // namespace mgn::codegen
