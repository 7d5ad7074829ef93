// The convolutions as implicit GEMMs: conv2d, conv2d_grad_input and conv2d_grad_weight instantiate the tiled
// GEMM emitter (gemm_tiled.h, schedule SingleBufferedScalar) with their own operand gathers (prologue) and
// output index maps (epilogue); tile choice and split K are decided here. conv.cpp has the overview.
#include <algorithm>
#include <numeric>
#include <optional>
#include <string>

#include "codegen/conv_common.h"
#include "codegen/gemm_tiled.h"
#include "codegen/glsl.h"
#include "codegen/tuning.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using gl::u;

// ---- implicit GEMM ------------------------------------------------------------------------------------
//
// The three convolutions are GEMMs C[p, q] = sum_k P[p, k] * Q[q, k] whose operands are gathered from the
// tensors on the fly (nothing is materialized). The p axis runs along the threads' x so the stores of
// neighbouring threads are neighbouring words; `outer` independent GEMMs (groups, stride phases, K
// splits) share one flat grid. A workgroup owns a BP x BQ block, stages BK-deep slices of both operands
// through shared memory (the next slice is loaded into registers while the current one is multiplied)
// and each thread accumulates a TP x TQ register tile with strided ownership (p = tx + i*TX,
// q = ty + j*TY), which keeps shared-memory reads conflict-free, like matmul.cpp.

struct Tile {
  uint32_t bp, bq, bk, tx, ty;
  uint32_t nt() const { return tx * ty; }
};

uint64_t pow2_at_least(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

uint32_t shared_bytes(uint32_t bp, uint32_t bq, uint32_t bk) {
  return 4u * bk * (bp + 1 + bq + 1);
}

// Threads: TX = min(16, BP/4), TY = min(16, BQ/4) (4x4 per thread up to 64x64, 8x8 at 128x128), fewer
// when the device allows fewer invocations. BK shrinks for a short K and until the tiles fit shared
// memory; it never goes below 8, which keeps BK x BP >= the thread count for the row-wise loads.
Tile make_tile(uint32_t bp, uint32_t bq, uint32_t bk, uint64_t k, const DeviceCaps& caps) {
  Tile t{bp, bq, bk, std::min<uint32_t>(16, bp / 4), std::min<uint32_t>(16, bq / 4)};
  while (t.nt() > caps.max_workgroup_invocations && t.nt() > 32) {
    if (t.ty >= t.tx && t.ty > 1)
      t.ty /= 2;
    else
      t.tx /= 2;
  }
  t.bk = uint32_t(std::min<uint64_t>(t.bk, std::max<uint64_t>(8, pow2_at_least(k))));
  while (t.bk > 8 && shared_bytes(t.bp, t.bq, t.bk) > caps.max_shared_bytes) t.bk /= 2;
  if (shared_bytes(t.bp, t.bq, t.bk) > caps.max_shared_bytes)
    throw Error("conv2d: the implicit-GEMM tile needs " + std::to_string(shared_bytes(t.bp, t.bq, t.bk)) +
                " bytes of shared memory, the device has " + std::to_string(caps.max_shared_bytes));
  return t;
}

// KernelOptions::conv_tile (BPxBQxBK, e.g. 128x64x16) pins the tile of every implicit-GEMM conv kernel: for
// tests (every configuration runs on lavapipe whatever the shape) and for benchmarking tile choices.
// A measured choice (CodegenOptions::conv_tuned, docs/tuning.md) counts as pinned for this node.
std::optional<Tile> forced_tile(uint64_t k, const LowerContext& ctx) {
  ConvTile t = ctx.options.kernels.conv_tile;
  if (t.is_auto() && !ctx.options.conv_tuned.empty()) {
    auto it = ctx.options.conv_tuned.find(tunable_conv_key(ctx));
    if (it != ctx.options.conv_tuned.end()) t = it->second;
  }
  if (t.is_auto()) return std::nullopt;
  // The text form is checked when parsed (parse_conv_tile); a tile built in code is checked here.
  const ConvTile checked = parse_conv_tile(conv_tile_str(t), "KernelOptions::conv_tile");
  return make_tile(checked.bp, checked.bq, checked.bk, k, ctx.caps);
}

constexpr uint64_t kWantGroups = 256;  // enough workgroups for a large GPU (the H200 has 132 SMs)

// The largest power-of-two tile edge in [lo, hi] whose padded extent stays within 25% of the smallest
// padded extent any edge in that range gives (70 channels: 32, not 128 with 45% of it empty).
uint64_t fit_edge(uint64_t extent, uint64_t lo, uint64_t hi) {
  uint64_t best = ~0ull;
  for (uint64_t b = lo; b <= hi; b *= 2) best = std::min(best, div_up(extent, b) * b);
  uint64_t edge = lo;
  for (uint64_t b = lo; b <= hi; b *= 2)
    if (4 * div_up(extent, b) * b <= 5 * best) edge = b;
  return edge;
}

// The tile for a GEMM of P x Q (K deep) repeated `outer` times: the largest of 128x128, 128x64, 64x64 that
// still gives the grid enough workgroups, else 32x32; each edge fitted to P (at least 32) and Q (at least
// 16) by fit_edge so a small or awkward channel count does not leave much of a tile empty.
Tile pick_tile(uint64_t P, uint64_t Q, uint64_t K, uint64_t outer, const LowerContext& ctx) {
  const DeviceCaps& caps = ctx.caps;
  if (auto t = forced_tile(K, ctx)) return *t;
  struct Level {
    uint64_t bp, bq, min_groups;
  };
  const Level ladder[] = {
      {128, 128, kWantGroups}, {128, 64, kWantGroups}, {64, 64, kWantGroups / 2}, {32, 32, 0}};
  for (const Level& l : ladder) {
    const uint64_t bp = fit_edge(P, 32, l.bp), bq = fit_edge(Q, 16, l.bq);
    if (outer * div_up(P, bp) * div_up(Q, bq) < l.min_groups) continue;
    return make_tile(uint32_t(bp), uint32_t(bq), bp * bq >= 128 * 64 ? 16 : 32, K, caps);
  }
  throw Error("conv2d: no implicit-GEMM tile");  // unreachable: the last level always fits
}

// How one operand's BK x T slice is spread over the threads: thread `tid` loads RA rows x RC k indices.
// Row-wise (consecutive threads take consecutive rows of the slice: the gathered image operands, whose
// rows are neighbouring pixels) or k-wise (consecutive threads take consecutive k: operands contiguous
// along k). `guard`: some threads fall past the last row (k-wise with fewer rows than threads per k).
struct Slots {
  uint32_t ra = 1, rc = 1;
  std::string row, kk;  // GLSL expressions in tid, a, c
  bool guard = false;
};

Slots make_slots(bool k_wise, uint32_t rows, uint32_t bk, uint32_t nt) {
  Slots s;
  if (!k_wise) {
    const uint32_t share = std::max<uint32_t>(1, nt / rows);  // threads on one row
    s.ra = std::max<uint32_t>(1, rows / nt);
    s.rc = bk / share;
    s.row = "tid % " + u(rows) + " + a * " + u(nt);
    s.kk = "tid / " + u(rows) + " + c * " + u(share);
  } else {
    const uint32_t share = std::max<uint32_t>(1, nt / bk);  // rows covered by one pass of the threads
    s.ra = std::max<uint32_t>(1, rows / share);
    s.rc = std::max<uint32_t>(1, bk / nt);
    s.row = "tid / " + u(bk) + " + a * " + u(share);
    s.kk = "tid % " + u(bk) + " + c * " + u(nt);
    s.guard = rows < share;
  }
  return s;
}

// One convolution GEMM: P = rows (M of the emitter), Q = columns (N), its operands gathered by `load`.
struct ConvGemm {
  std::string name, comment;
  uint64_t P = 0, Q = 0, K = 0, outer = 1;
  uint64_t k_chunk = 0;  // > 0: K split (outer_index declares `split`)
  Tile t{};
  bool p_k_wise = false, q_k_wise = true;
  std::string buffers;      // buffer declarations (bindings in order)
  std::string consts;       // problem constants
  std::string state;        // per-invocation state the setup hoists out of the K loop (declares `uint z`)
  std::string outer_index;  // main(): decodes z (which GEMM of the grid) for the setup and the K range
  std::string setup;        // main(), before the K loop: sees z, m0, n0, tid
  std::string load;   // body of load_slice(uint k0): fills p_reg[a][c], q_reg[a][c] (zero outside k_end)
  std::string store;  // epilogue for one element: sees uint m < M, n < N, float v
  std::vector<Binding> bindings;
};

// The tiled GEMM emitter's single-buffered scalar schedule with the convolution's operand registers: thread
// `tid` holds P_RA x P_RC values of the P slice and Q_RA x Q_RC of the Q slice (Slots), staged k-major.
Kernel implicit_gemm(const ConvGemm& s, const DeviceCaps& caps) {
  const Tile& t = s.t;
  const uint32_t nt = t.nt(), tp = t.bp / t.tx, tq = t.bq / t.ty;
  const Slots ps = make_slots(s.p_k_wise, t.bp, t.bk, nt), qs = make_slots(s.q_k_wise, t.bq, t.bk, nt);
  TiledGemm g;
  g.name = s.name + "_" + std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk);
  g.header = "// archetype: conv " + s.comment + "\n// implicit GEMM (P rows = M, Q columns = N), tile " +
             std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk) + ", " +
             std::to_string(tp) + "x" + std::to_string(tq) + " per thread, " + std::to_string(s.outer) +
             " independent GEMM(s)\n";
  g.schedule = GemmSchedule::SingleBufferedScalar;
  g.m = s.P, g.n = s.Q, g.k = s.K, g.outer = s.outer, g.k_chunk = s.k_chunk;
  g.bm = t.bp, g.bn = t.bq, g.bk = t.bk, g.tm = tp, g.tn = tq, g.tx = t.tx, g.ty = t.ty;
  // Neighbouring workgroups share the Q block (weights / dy rows) and read neighbouring pixels.
  g.order = TileOrder::ColumnMajor;
  g.buffers = s.buffers;
  g.constants = s.consts + gl::const_uint("P_RA", ps.ra) + gl::const_uint("P_RC", ps.rc) +
                gl::const_uint("Q_RA", qs.ra) + gl::const_uint("Q_RC", qs.rc);
  g.state = gl::render(R"(uint z;
float p_reg[P_RA][P_RC], q_reg[Q_RA][Q_RC];
uint p_row(uint a) { return ${PROW}; }
uint p_kk(uint c) { return ${PKK}; }
uint q_row(uint a) { return ${QROW}; }
uint q_kk(uint c) { return ${QKK}; }
)",
                       {{"PROW", ps.row}, {"PKK", ps.kk}, {"QROW", qs.row}, {"QKK", qs.kk}}) +
            s.state;
  g.loaders = gl::render(
      R"(// Global -> registers: this thread's share of the K slice [k0, k0 + BK).
void load_slice(uint k0) {
${LOAD}}
void stage_slice() {
  for (uint a = 0u; a < P_RA; ++a)
    for (uint c = 0u; c < P_RC; ++c) As[p_kk(c)][p_row(a)] = p_reg[a][c];
  for (uint a = 0u; a < Q_RA; ++a)
${QSTAGE}}
)",
      {{"LOAD", s.load},
       {"QSTAGE", qs.guard ? "    if (q_row(a) < BN)\n"
                             "      for (uint c = 0u; c < Q_RC; ++c) Bs[q_kk(c)][q_row(a)] = q_reg[a][c];\n"
                           : "    for (uint c = 0u; c < Q_RC; ++c) Bs[q_kk(c)][q_row(a)] = q_reg[a][c];\n"}});
  g.outer_index = "  z = gid / " + u(gemm_tiles(g)) + ";\n  uint tile = gid % " + u(gemm_tiles(g)) + ";\n" +
                  s.outer_index;
  g.setup = s.setup;
  g.store = s.store;
  g.bindings = s.bindings;
  return emit_tiled_gemm(g, caps);
}

// Bounds test of an input row/column index that the padding can push outside the image. Without padding
// on either side of an axis every tap of a real output lies inside the input (the output size formula
// guarantees it), so the test is left out.
std::string in_bounds(const std::string& idx, const std::string& extent, bool padded) {
  return padded ? " && uint(" + idx + ") < " + extent : "";
}

// The im2col operand of conv2d and conv2d_grad_weight, gathered from X into p_reg (the P operand, loaded
// row-wise or k-wise): element (pixel, tap) = X[b, g*CG + ci, oh*SH - PT + kh*DH, ow*SW - PL + kw*DW],
// zero in the padding, with pixel = (b, oh, ow) an output pixel and tap = (ci, kh, kw) a filter tap of
// group g. One of the two indexes the P rows and the other K: conv2d has rows of pixels (K = taps),
// conv2d_grad_weight rows of taps (K = pixels). Each index contributes a term of the flat offset into X
// and of the input row/column; the row's terms (with the padding, and whether the row is real) are
// computed once in the setup, the k index's in every load.
struct Im2colAxis {
  std::string what;    // for the GLSL comments
  std::string split;   // GLSL statement decomposing `v` into its coordinates
  std::string offset;  // its term of the flat offset into X
  std::string ih, iw;  // its terms of the input row and column (int)
};

Im2colAxis im2col_axis(bool pixel, const std::string& v) {
  if (pixel)
    return {"output pixel (b, oh, ow)", "uint b = " + v + " / OHW, pix = " + v + " % OHW;", "b * C * HW",
            "int((pix / OW) * SH)", "int((pix % OW) * SW)"};
  return {"filter tap (ci, kh, kw)", "uint ci = " + v + " / KHW, r = " + v + " % KHW;", "(g * CG + ci) * HW",
          "int((r / KW) * DH)", "int((r % KW) * DW)"};
}

struct Im2colGather {
  std::string state, setup, load;  // GemmSpec pieces; the setup needs g, the load closes its k loop
};

// `pixel_rows`: the P rows are pixels (conv2d), else taps (conv2d_grad_weight). `then`: appended to the
// body of the loop over this thread's k indices (sees k, k_ok and the k index's coordinates).
Im2colGather im2col_gather(const ir::Node& n, bool pixel_rows, const std::string& then) {
  const auto& pad = n.attrs.ints("padding");
  const bool pad_h = pad[0] != 0 || pad[2] != 0, pad_w = pad[1] != 0 || pad[3] != 0;
  const Im2colAxis row = im2col_axis(pixel_rows, "m"), kx = im2col_axis(!pixel_rows, "k");
  Im2colGather s;
  s.state = R"(// im2col gather: the row terms of this thread's P rows (x_ok: a real row)
uint x_base[P_RA];
int x_ih[P_RA], x_iw[P_RA];
bool x_ok[P_RA];
)";
  s.setup = gl::render(
      R"(  for (uint a = 0u; a < P_RA; ++a) {
    uint m = m0 + p_row(a);  // ${WHAT}
    ${SPLIT}
    x_ok[a] = m < M;
    x_base[a] = ${OFFSET};
    x_ih[a] = ${IH} - PT;
    x_iw[a] = ${IW} - PL;
  }
)",
      {{"WHAT", row.what}, {"SPLIT", row.split}, {"OFFSET", row.offset}, {"IH", row.ih}, {"IW", row.iw}});
  s.load = gl::render(R"(  for (uint c = 0u; c < P_RC; ++c) {
    uint k = k0 + p_kk(c);  // ${WHAT}
    ${SPLIT}
    bool k_ok = k < k_end;
    uint xk = ${OFFSET};
    int ihk = ${IH}, iwk = ${IW};
    for (uint a = 0u; a < P_RA; ++a) {
      int ih = x_ih[a] + ihk, iw = x_iw[a] + iwk;
      bool ok = k_ok && x_ok[a]${BOUNDS};
      p_reg[a][c] = ok ? X[x_base[a] + xk + uint(ih) * W + uint(iw)] : 0.0;
    }
${THEN}  }
)",
                      {{"WHAT", kx.what},
                       {"SPLIT", kx.split},
                       {"OFFSET", kx.offset},
                       {"IH", kx.ih},
                       {"IW", kx.iw},
                       {"BOUNDS", in_bounds("ih", "H", pad_h) + in_bounds("iw", "W", pad_w)},
                       {"THEN", then}});
  return s;
}

}  // namespace

// conv2d: y[b, g*OG + q, pix] = sum_k im2col(x)[m, k] * w[g*OG + q, k] with m = (b, oh, ow) and
// k = (ci, kh, kw); P = N*OH*OW pixels (gathered row-wise, padding/stride/dilation in the load),
// Q = OG output channels, one GEMM per group.
Lowering conv_forward(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  ConvDims d = conv_dims(n, ctx.input(0).shape, ctx.input(1).shape, n.shape);
  Win w = window(n, d.KH, d.KW, true);
  if (d.Og == 1) return conv_forward_direct(ctx, d, w);
  ConvGemm s;
  s.name = "conv2d_igemm";
  s.comment =
      "conv2d " + conv_key(d, w) + ": P = N*OH*OW output pixels, Q = output channels per group, K = CG*KH*KW";
  s.P = d.N * d.OH * d.OW, s.Q = d.Og, s.K = d.Cg * d.KH * d.KW, s.outer = d.groups;
  s.t = pick_tile(s.P, s.Q, s.K, s.outer, ctx);
  s.p_k_wise = false, s.q_k_wise = true;
  s.buffers = conv_buffers({"X", "Wt"});
  s.bindings = conv_bindings(2);
  s.consts = conv_constants(d, w);
  const Im2colGather x = im2col_gather(n, /*pixel_rows=*/true, "");
  s.state = "uint g;\n" + x.state;
  s.setup = "  g = z;\n" + x.setup;
  s.load = x.load;
  s.load += R"(  for (uint c = 0u; c < Q_RC; ++c) {
    uint k = k0 + q_kk(c);
    for (uint a = 0u; a < Q_RA; ++a) {
      uint o = n0 + q_row(a);
      q_reg[a][c] = (k < k_end && o < OG) ? Wt[(g * OG + o) * K + k] : 0.0;
    }
  }
)";
  s.store = "      Y[((m / OHW) * O + g * OG + n) * OHW + m % OHW] = v;\n";
  return gl::one_kernel(implicit_gemm(s, ctx.caps));
}

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
// K = OG * JHM * JWM over (og, jh, jw), the taps that can reach a pixel of the phase. Phases with fewer
// taps than JHM/JWM load zeros for the rest; no pixel visits a tap that is not divisible by the stride.
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
  s.P = d.N * HH * WW, s.Q = d.Cg, s.K = d.Og * ph.jmax * pw.jmax, s.outer = w.sh * w.sw * d.groups;
  s.t = pick_tile(s.P, s.Q, s.K, s.outer, ctx);
  s.p_k_wise = false, s.q_k_wise = true;
  s.buffers = conv_buffers({"DY", "Wt"});
  s.bindings = conv_bindings(2);
  s.consts = conv_constants(d, w) + "// stride phases: pixel (ph + SH*hh, pw + SW*ww)\n" +
             gl::const_uint("HH", HH) + gl::const_uint("WW", WW) + phase_constants("H", ph) +
             phase_constants("W", pw) + gl::const_uint("JHW", ph.jmax * pw.jmax);
  s.state = R"(uint g, ph, pw, jh_n, jw_n;
uint d_base[P_RA];
int d_oh[P_RA], d_ow[P_RA];
bool d_ok[P_RA];
)";
  s.setup = R"(  g = z % GROUPS;
  ph = (z / GROUPS) / SW;
  pw = (z / GROUPS) % SW;
  jh_n = JH[ph];
  jw_n = JW[pw];
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
  s.load = gl::render(R"(  for (uint c = 0u; c < P_RC; ++c) {
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
                      {{"TAP",
                        "    uint og = k / JHW, r = k % JHW;\n    uint jh = r / JWM, jw = r % JWM;\n"
                        "    bool k_ok = k < k_end && jh < jh_n && jw < jw_n;\n"}});
  s.store = R"(      uint r = m % (HH * WW);
      uint h = ph + (r / WW) * SH, w = pw + (r % WW) * SW;
      if (h < H && w < W) Y[(((m / (HH * WW)) * C + g * CG + n) * H + h) * W + w] = v;
)";
  return gl::one_kernel(implicit_gemm(s, ctx.caps));
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
  const uint64_t max_scratch_words = std::min<uint64_t>(16ull << 20, ctx.caps.max_storage_buffer_range / 4);
  uint64_t splits = div_up(kWantGroups, tiles);
  splits = std::min(splits, std::max<uint64_t>(1, s.K / (4 * s.t.bk)));
  splits = std::max<uint64_t>(1, std::min(splits, max_scratch_words / numel_dw));
  uint64_t chunk = s.K;
  if (splits > 1) {
    chunk = div_up(div_up(s.K, splits), s.t.bk) * s.t.bk;
    splits = div_up(s.K, chunk);
  }
  s.name =
      splits > 1 ? "conv2d_grad_weight_igemm_split" + std::to_string(splits) : "conv2d_grad_weight_igemm";
  s.comment = "conv2d_grad_weight " + conv_key(d, w) +
              ": P = CG*KH*KW filter taps, Q = output channels per group, K = N*OH*OW, split " +
              std::to_string(splits) + " ways";
  s.outer = d.groups * splits;
  s.p_k_wise = true, s.q_k_wise = true;
  s.buffers = gl::buffer(0, "X", DType::F32, true) + gl::buffer(1, "DY", DType::F32, true) +
              gl::buffer(2, splits > 1 ? "PART" : "Y", DType::F32, false, true);
  s.bindings = {{BindingKind::Input, 0, false},
                {BindingKind::Input, 1, false},
                {splits > 1 ? BindingKind::Scratch : BindingKind::Output, 0, true}};
  s.consts = conv_constants(d, w) + gl::const_uint("DW_SIZE", numel_dw);
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
  s.k_chunk = splits > 1 ? chunk : 0;
  s.setup = x.setup;
  s.load = x.load;
  s.store = splits > 1 ? "      PART[split * DW_SIZE + (g * OG + n) * M + m] = v;\n"
                       : "      Y[(g * OG + n) * M + m] = v;\n";
  Lowering l;
  l.kernels.push_back(implicit_gemm(s, ctx.caps));
  if (splits > 1) {
    // Summed from 0.0 in split order (matmul's split-K sum starts from the first part, so the two differ
    // in the sign of a zero sum).
    l.scratch_words.push_back(splits * numel_dw);
    const std::string body = gl::render(R"(    float sum = 0.0;
    for (uint s = 0u; s < ${SPLITS}; ++s) sum += PART[s * ${NUMEL} + i];
    Y[i] = sum;
)",
                                        {{"SPLITS", u(splits)}, {"NUMEL", u(numel_dw)}});
    l.kernels.push_back(
        gl::elementwise("conv2d_grad_weight_split_sum_s" + std::to_string(splits),
                        "conv conv2d_grad_weight split-K sum of " + std::to_string(splits) +
                            " partial filters of " + std::to_string(numel_dw) + " weights, in split order",
                        gl::buffer(0, "PART", DType::F32, true) + gl::buffer(1, "Y", DType::F32, false, true),
                        body, numel_dw, {{BindingKind::Scratch, 0, false}, gl::output()}, ctx.caps));
  }
  return l;
}

}  // namespace mgn::codegen
