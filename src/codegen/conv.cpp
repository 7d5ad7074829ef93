// Convolution family on Vulkan: conv2d (+ input and weight derivatives), max/avg pooling (+ derivatives),
// nearest upsampling (+ derivative). NCHW, padding [top, left, bottom, right]; the semantics are those of
// the CPU reference (src/backend/cpu/kernels_conv.cpp), including PyTorch's first-maximum rule for max
// pooling and NaN winning a window.
//
// Kernels, all "gather" form so that no output element is written by two invocations (no atomics):
//   conv2d              implicit GEMM (below): P = N*OH*OW output pixels x Q = output channels per group,
//                       K = (C/groups)*KH*KW, the im2col operand gathered from x in the load (padding,
//                       stride and dilation included), one GEMM per group in the grid
//   conv2d_grad_input   implicit GEMM per (stride phase, group): P = the input pixels of one phase
//                       (h % SH, w % SW), Q = C/groups, K = (O/groups) x the taps that can reach that
//                       phase, dy gathered; every other tap is never visited (stride 1: one phase)
//   conv2d_grad_weight  implicit GEMM: P = (C/groups)*KH*KW filter taps x Q = O/groups, K = N*OH*OW;
//                       split-K over S workgroups when the filter alone does not fill the device, partial
//                       tiles in a scratch buffer summed by a second kernel in split order (deterministic)
//   depthwise-like      where the GEMM would be one column wide (one output channel per group for conv2d
//                       and grad_weight, one input channel per group for grad_input) the direct kernels:
//                       one invocation per output / input element, grad_weight one workgroup per (o, ci)
//                       (or per weight element for filters over 25 taps) reducing in shared memory
//   pool / upsample     one invocation per output element (forward) or per input element (derivative,
//                       visiting the windows that contain it; max pooling recomputes each window's argmax)
//
// Implicit-GEMM tiles: 128x128x16 (8x8 per thread), 128x64x16, 64x64x32 (4x4) or 32x32x32 (64 threads),
// the largest that still gives ~256 workgroups (grad_weight: the largest that fits the filter, split-K
// making up the count), each edge narrowed when the channel count would leave much of it empty;
// KernelOptions::conv_tile pins one (tests, benchmarks). Bias is not part of these ops: conv2d(..., bias)
// is conv2d + add in the graph.
// docs/perf-notes.md ("Convolution as implicit GEMM") has the reasoning and the H200 expectations.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>

#include "codegen/kernels_common.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using detail::u;

struct Win {
  uint64_t kh, kw, sh, sw, pt, pl, dh, dw;
};

Win window(const ir::Node& n, uint64_t kh, uint64_t kw, bool dilation) {
  const auto& st = n.attrs.ints("stride");
  const auto& pd = n.attrs.ints("padding");
  Win w{kh, kw, uint64_t(st[0]), uint64_t(st[1]), uint64_t(pd[0]), uint64_t(pd[1]), 1, 1};
  if (dilation) {
    w.dh = uint64_t(n.attrs.ints("dilation")[0]);
    w.dw = uint64_t(n.attrs.ints("dilation")[1]);
  }
  return w;
}

std::vector<Binding> bind(size_t n_inputs) {
  std::vector<Binding> b;
  for (size_t i = 0; i < n_inputs; ++i) b.push_back({BindingKind::Input, int(i), false});
  b.push_back({BindingKind::Output, 0, true});
  return b;
}

std::string decls(const std::vector<std::string>& inputs) {
  std::string d;
  for (size_t i = 0; i < inputs.size(); ++i) d += detail::buffer_decl(int(i), inputs[i], false);
  d += detail::buffer_decl(int(inputs.size()), "Y", true, false);
  return d;
}

// Splits a flat NCHW index `var` into named coordinates (GLSL), outermost first.
std::string unflatten(const std::string& var, const std::vector<std::pair<std::string, uint64_t>>& dims) {
  std::string s = "    uint r_ = " + var + ";\n";
  for (size_t i = dims.size(); i-- > 0;) {
    if (i == 0) {
      s += "    uint " + dims[i].first + " = r_;\n";
    } else {
      s += "    uint " + dims[i].first + " = r_ % " + u(dims[i].second) +
           ";\n    r_ /= " + u(dims[i].second) + ";\n";
    }
  }
  return s;
}

Lowering one(Kernel k) {
  Lowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

// ---- convolution -------------------------------------------------------------------------------------

struct ConvDims {
  uint64_t N, C, H, W, O, Cg, KH, KW, OH, OW, groups, Og;
};

ConvDims conv_dims(const ir::Node& n, const Shape& xs, const Shape& ws, const Shape& ys) {
  ConvDims d{};
  d.N = uint64_t(xs[0]), d.C = uint64_t(xs[1]), d.H = uint64_t(xs[2]), d.W = uint64_t(xs[3]);
  d.O = uint64_t(ws[0]), d.Cg = uint64_t(ws[1]), d.KH = uint64_t(ws[2]), d.KW = uint64_t(ws[3]);
  d.OH = uint64_t(ys[2]), d.OW = uint64_t(ys[3]);
  d.groups = uint64_t(n.attrs.i("groups"));
  d.Og = d.O / d.groups;
  return d;
}

std::string cu(const std::string& name, uint64_t v) {
  return "const uint " + name + " = " + u(v) + ";\n";
}
std::string ci(const std::string& name, int64_t v) {
  return "const int " + name + " = " + std::to_string(v) + ";\n";
}

// The geometry every conv kernel bakes in, as named GLSL constants.
std::string conv_constants(const ConvDims& d, const Win& w) {
  std::string s = "// convolution geometry (NCHW; padding top/left; OG/CG channels per group)\n";
  s += cu("NB", d.N) + cu("C", d.C) + cu("H", d.H) + cu("W", d.W) + cu("O", d.O) + cu("GROUPS", d.groups);
  s += cu("CG", d.Cg) + cu("OG", d.Og) + cu("KH", d.KH) + cu("KW", d.KW) + cu("OH", d.OH) + cu("OW", d.OW);
  s += cu("SH", w.sh) + cu("SW", w.sw) + cu("DH", w.dh) + cu("DW", w.dw) + ci("PT", int64_t(w.pt)) +
       ci("PL", int64_t(w.pl));
  s += cu("HW", d.H * d.W) + cu("KHW", d.KH * d.KW) + cu("OHW", d.OH * d.OW);
  return s;
}

// Bounds test of an input row/column index that the padding can push outside the image. Without padding
// on either side of an axis every tap of a real output lies inside the input (the output size formula
// guarantees it), so the test is left out.
std::string in_bounds(const std::string& idx, const std::string& extent, bool padded) {
  return padded ? " && uint(" + idx + ") < " + extent : "";
}

// Direct kernels, kept where the implicit GEMM would be one column wide (depthwise / one channel per group).
Lowering conv_forward_direct(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t items = d.N * d.O * d.OH * d.OW;
  std::string b = unflatten("i", {{"b", d.N}, {"o", d.O}, {"oh", d.OH}, {"ow", d.OW}});
  b += "    uint c0 = (o / " + u(d.Og) + ") * " + u(d.Cg) + ";\n    float acc = 0.0;\n";
  b += "    for (uint ci = 0u; ci < " + u(d.Cg) + "; ++ci) {\n";
  b += "      uint xb = (b * " + u(d.C) + " + c0 + ci) * " + u(d.H * d.W) + ";\n";
  b += "      for (uint ki = 0u; ki < " + u(d.KH) + "; ++ki) {\n";
  b += "        int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  b += "        if (ih < 0 || ih >= " + std::to_string(d.H) + ") continue;\n";
  b += "        for (uint kj = 0u; kj < " + u(d.KW) + "; ++kj) {\n";
  b +=
      "          int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  b += "          if (iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  b += "          acc += X[xb + uint(ih) * " + u(d.W) + " + uint(iw)] * Wt[((o * " + u(d.Cg) + " + ci) * " +
       u(d.KH) + " + ki) * " + u(d.KW) + " + kj];\n";
  b += "        }\n      }\n    }\n    Y[i] = acc;\n";
  return one(detail::elementwise_kernel("conv2d_direct", decls({"X", "Wt"}), b, items, bind(2), ctx.caps));
}

Lowering conv_grad_input_direct(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  std::string b = unflatten("i", {{"b", d.N}, {"c", d.C}, {"ih", d.H}, {"iw", d.W}});
  b += "    uint grp = c / " + u(d.Cg) + ";\n    uint ci = c % " + u(d.Cg) + ";\n    float acc = 0.0;\n";
  // Tap (ki, kj) of output (oh, ow) reads (ih, iw) iff oh*sh + ki*dh - pt == ih.
  b += "    for (uint ki = 0u; ki < " + u(d.KH) + "; ++ki) {\n";
  b += "      int th = int(ih + " + u(w.pt) + ") - int(ki * " + u(w.dh) + ");\n";
  b += "      if (th < 0 || th % " + std::to_string(w.sh) + " != 0) continue;\n";
  b += "      uint oh = uint(th) / " + u(w.sh) + ";\n      if (oh >= " + u(d.OH) + ") continue;\n";
  b += "      for (uint kj = 0u; kj < " + u(d.KW) + "; ++kj) {\n";
  b += "        int tw = int(iw + " + u(w.pl) + ") - int(kj * " + u(w.dw) + ");\n";
  b += "        if (tw < 0 || tw % " + std::to_string(w.sw) + " != 0) continue;\n";
  b += "        uint ow = uint(tw) / " + u(w.sw) + ";\n        if (ow >= " + u(d.OW) + ") continue;\n";
  b += "        for (uint og = 0u; og < " + u(d.Og) + "; ++og) {\n";
  b += "          uint o = grp * " + u(d.Og) + " + og;\n";
  b += "          acc += DY[((b * " + u(d.O) + " + o) * " + u(d.OH) + " + oh) * " + u(d.OW) +
       " + ow] * Wt[((o * " + u(d.Cg) + " + ci) * " + u(d.KH) + " + ki) * " + u(d.KW) + " + kj];\n";
  b += "        }\n      }\n    }\n    Y[i] = acc;\n";
  return one(detail::elementwise_kernel("conv2d_grad_input_direct", decls({"DY", "Wt"}), b,
                                        d.N * d.C * d.H * d.W, bind(2), ctx.caps));
}

// One workgroup per (o, ci) pair owns all KH×KW taps of that filter slice: each thread walks whole output
// rows (b, oh) so the inner loop over ow needs no division, loads each dy once for every tap, and keeps one
// accumulator per tap; a shared-memory tree then reduces each tap over the workgroup.
Lowering conv_grad_weight_rows(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t taps = d.KH * d.KW, rows = d.N * d.OH;
  uint32_t wg = 32;
  while (wg < 128 && wg < rows && wg * 2 * taps * 4 <= ctx.caps.max_shared_bytes &&
         wg * 2 <= ctx.caps.max_workgroup_invocations)
    wg *= 2;
  detail::Grid grid = detail::flat_grid(d.O * d.Cg, ctx.caps);
  std::string g = "#version 450\n// conv2d_grad_weight: one workgroup per (o, ci), all " +
                  std::to_string(taps) + " taps, rows of dy split over the threads\n";
  g += "layout(local_size_x = " + std::to_string(wg) + ") in;\n" + decls({"X", "DY"});
  g += "shared float red[" + std::to_string(wg * taps) + "];\n";
  g += "void main() {\n" + grid.glsl + "  uint t = gl_LocalInvocationID.x;\n";
  g += "  uint o = gid / " + u(d.Cg) + ";\n  uint ci = gid % " + u(d.Cg) + ";\n";
  g += "  uint c = (o / " + u(d.Og) + ") * " + u(d.Cg) + " + ci;\n";
  g += "  float acc[" + std::to_string(taps) + "];\n";
  g += "  for (uint k = 0u; k < " + u(taps) + "; ++k) acc[k] = 0.0;\n";
  g += "  for (uint r = t; r < " + u(rows) + "; r += " + u(wg) + ") {\n";
  g += "    uint b = r / " + u(d.OH) + ";\n    uint oh = r % " + u(d.OH) + ";\n";
  g += "    uint dyb = ((b * " + u(d.O) + " + o) * " + u(d.OH) + " + oh) * " + u(d.OW) + ";\n";
  g += "    uint xb = (b * " + u(d.C) + " + c) * " + u(d.H * d.W) + ";\n";
  g += "    for (uint ow = 0u; ow < " + u(d.OW) + "; ++ow) {\n      float dv = DY[dyb + ow];\n";
  g += "      for (uint ki = 0u; ki < " + u(d.KH) + "; ++ki) {\n";
  g += "        int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  g += "        if (ih < 0 || ih >= " + std::to_string(d.H) + ") continue;\n";
  g += "        for (uint kj = 0u; kj < " + u(d.KW) + "; ++kj) {\n";
  g +=
      "          int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  g += "          if (iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  g += "          acc[ki * " + u(d.KW) + " + kj] += dv * X[xb + uint(ih) * " + u(d.W) + " + uint(iw)];\n";
  g += "        }\n      }\n    }\n  }\n";
  g += "  for (uint k = 0u; k < " + u(taps) + "; ++k) red[k * " + u(wg) + " + t] = acc[k];\n  barrier();\n";
  g += "  for (uint s = " + u(wg / 2) + "; s > 0u; s >>= 1) {\n    if (t < s)\n      for (uint k = 0u; k < " +
       u(taps) + "; ++k) red[k * " + u(wg) + " + t] += red[k * " + u(wg) +
       " + t + s];\n    barrier();\n  }\n";
  g += "  for (uint k = t; k < " + u(taps) + "; k += " + u(wg) + ") Y[gid * " + u(taps) + " + k] = red[k * " +
       u(wg) + "];\n}\n";
  Kernel k;
  k.name = "conv2d_grad_weight_rows_wg" + std::to_string(wg);
  k.glsl = g;
  k.bindings = bind(2);
  k.groups = grid.groups;
  return one(std::move(k));
}

// Large filters (the per-tap accumulators would not fit registers and shared memory): one workgroup per
// weight element.
Lowering conv_grad_weight_elements(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t m = d.N * d.OH * d.OW;  // terms per weight element
  const uint64_t elems = d.O * d.Cg * d.KH * d.KW;
  uint32_t wg = 32;
  while (wg < 256 && wg < m && wg * 2 <= ctx.caps.max_workgroup_invocations) wg *= 2;
  detail::Grid grid = detail::flat_grid(elems, ctx.caps);
  std::string g =
      "#version 450\n"
      "// conv2d_grad_weight: one workgroup per weight element, reducing dy * x over N x OH x OW\n";
  g += "layout(local_size_x = " + std::to_string(wg) + ") in;\n" + decls({"X", "DY"});
  g += "shared float red[" + std::to_string(wg) + "];\n";
  g += "void main() {\n" + grid.glsl + "  uint t = gl_LocalInvocationID.x;\n";
  g += unflatten("gid", {{"o", d.O}, {"ci", d.Cg}, {"ki", d.KH}, {"kj", d.KW}});
  g += "  uint c = (o / " + u(d.Og) + ") * " + u(d.Cg) + " + ci;\n  float acc = 0.0;\n";
  g += "  for (uint e = t; e < " + u(m) + "; e += " + u(wg) + ") {\n";
  g += "    uint ow = e % " + u(d.OW) + ";\n    uint oh = (e / " + u(d.OW) + ") % " + u(d.OH) +
       ";\n    uint b = e / " + u(d.OH * d.OW) + ";\n";
  g += "    int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  g += "    int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  g += "    if (ih < 0 || ih >= " + std::to_string(d.H) + " || iw < 0 || iw >= " + std::to_string(d.W) +
       ") continue;\n";
  g += "    acc += DY[((b * " + u(d.O) + " + o) * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] * X[((b * " +
       u(d.C) + " + c) * " + u(d.H) + " + uint(ih)) * " + u(d.W) + " + uint(iw)];\n  }\n";
  g += "  red[t] = acc;\n  barrier();\n";
  g += "  for (uint s = " + u(wg / 2) +
       "; s > 0u; s >>= 1) {\n    if (t < s) red[t] += red[t + s];\n    barrier();\n  }\n";
  g += "  if (t == 0u) Y[gid] = red[0];\n}\n";
  Kernel k;
  k.name = "conv2d_grad_weight_wg" + std::to_string(wg);
  k.glsl = g;
  k.bindings = bind(2);
  k.groups = grid.groups;
  return one(std::move(k));
}

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
std::optional<Tile> forced_tile(uint64_t k, const LowerContext& ctx) {
  const ConvTile& t = ctx.options.kernels.conv_tile;
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

struct GemmSpec {
  std::string name, comment;
  uint64_t P = 0, Q = 0, K = 0, outer = 1;
  Tile t{};
  bool p_k_wise = false, q_k_wise = true;
  std::string buffers;  // buffer declarations (bindings in order)
  std::string consts;   // problem constants
  std::string state;    // per-invocation state the setup hoists out of the K loop
  std::string
      setup;  // main(), before the K loop: sees z (the outer index), p0, q0, tid; may narrow k_begin/k_end
  std::string load;   // body of load_slice(uint k0): fills p_reg[a][c], q_reg[a][c] (zero outside k_end)
  std::string store;  // epilogue for one element: sees uint p < GP, q < GQ, float v
  std::vector<Binding> bindings;
};

Kernel implicit_gemm(const GemmSpec& s, const DeviceCaps& caps) {
  const Tile& t = s.t;
  const uint32_t nt = t.nt(), tp = t.bp / t.tx, tq = t.bq / t.ty;
  const Slots ps = make_slots(s.p_k_wise, t.bp, t.bk, nt), qs = make_slots(s.q_k_wise, t.bq, t.bk, nt);
  const uint64_t tiles_p = div_up(s.P, t.bp), tiles_q = div_up(s.Q, t.bq);
  detail::Grid grid = detail::flat_grid(s.outer * tiles_p * tiles_q, caps);

  std::string g = "#version 450\n// " + s.comment + "\n";
  g += "// implicit GEMM, tile " + std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" +
       std::to_string(t.bk) + ", " + std::to_string(tp) + "x" + std::to_string(tq) + " per thread, " +
       std::to_string(s.outer) + " independent GEMM(s)\n";
  g += "layout(local_size_x = " + std::to_string(t.tx) + ", local_size_y = " + std::to_string(t.ty) +
       ") in;\n";
  g += s.buffers + s.consts;
  g += "// GEMM C[p, q] = sum_k P[p, k] * Q[q, k]\n";
  g += cu("GP", s.P) + cu("GQ", s.Q) + cu("GK", s.K);
  g += cu("BP", t.bp) + cu("BQ", t.bq) + cu("BK", t.bk) + cu("TX", t.tx) + cu("TY", t.ty) + cu("TP", tp) +
       cu("TQ", tq);
  g += cu("P_RA", ps.ra) + cu("P_RC", ps.rc) + cu("Q_RA", qs.ra) + cu("Q_RC", qs.rc);
  // +1 column: the k-wise stores would otherwise hit one bank.
  g += "shared float Ps[BK][BP + 1u];\nshared float Qs[BK][BQ + 1u];\n";
  g += "uint tid, p0, q0, z, k_begin, k_end;\n";
  g += "float p_reg[P_RA][P_RC], q_reg[Q_RA][Q_RC];\n";
  g += "uint p_row(uint a) { return " + ps.row + "; }\nuint p_kk(uint c) { return " + ps.kk + "; }\n";
  g += "uint q_row(uint a) { return " + qs.row + "; }\nuint q_kk(uint c) { return " + qs.kk + "; }\n";
  g += s.state;
  g += "// Global -> registers: this thread's share of the K slice [k0, k0 + BK).\n";
  g += "void load_slice(uint k0) {\n" + s.load + "}\n";
  g += "void stage_slice() {\n";
  g += "  for (uint a = 0u; a < P_RA; ++a)\n"
       "    for (uint c = 0u; c < P_RC; ++c) Ps[p_kk(c)][p_row(a)] = p_reg[a][c];\n";
  g += "  for (uint a = 0u; a < Q_RA; ++a)\n";
  g += qs.guard ? "    if (q_row(a) < BQ)\n"
                  "      for (uint c = 0u; c < Q_RC; ++c) Qs[q_kk(c)][q_row(a)] = q_reg[a][c];\n"
                : "    for (uint c = 0u; c < Q_RC; ++c) Qs[q_kk(c)][q_row(a)] = q_reg[a][c];\n";
  g += "}\n";
  g += "void main() {\n" + grid.glsl;
  g += "  z = gid / " + u(tiles_p * tiles_q) + ";\n  uint tile = gid % " + u(tiles_p * tiles_q) + ";\n";
  // Neighbouring workgroups share the Q block (weights / dy rows) and read neighbouring pixels.
  g += "  p0 = (tile % " + u(tiles_p) + ") * BP;\n  q0 = (tile / " + u(tiles_p) + ") * BQ;\n";
  g += "  tid = gl_LocalInvocationIndex;\n  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;\n";
  g += "  k_begin = 0u;\n  k_end = GK;\n";
  g += s.setup;
  g += "  float acc[TP][TQ];\n  for (uint i = 0u; i < TP; ++i)\n"
       "    for (uint j = 0u; j < TQ; ++j) acc[i][j] = 0.0;\n";
  g += "  if (k_begin < k_end) {\n    load_slice(k_begin);\n";
  g += "    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {\n      stage_slice();\n      barrier();\n";
  g += "      if (k0 + BK < k_end) load_slice(k0 + BK);  // in flight while this slice is multiplied\n";
  g += "      for (uint kk = 0u; kk < BK; ++kk) {\n        float pv[TP], qv[TQ];\n";
  g += "        for (uint i = 0u; i < TP; ++i) pv[i] = Ps[kk][tx + i * TX];\n";
  g += "        for (uint j = 0u; j < TQ; ++j) qv[j] = Qs[kk][ty + j * TY];\n";
  g += "        for (uint i = 0u; i < TP; ++i)\n";
  g += "          for (uint j = 0u; j < TQ; ++j) acc[i][j] = fma(pv[i], qv[j], acc[i][j]);\n";
  g += "      }\n      barrier();\n    }\n  }\n";
  g += "  for (uint i = 0u; i < TP; ++i) {\n    uint p = p0 + tx + i * TX;\n    if (p >= GP) break;\n";
  g += "    for (uint j = 0u; j < TQ; ++j) {\n      uint q = q0 + ty + j * TY;\n"
       "      if (q >= GQ) continue;\n";
  g += "      float v = acc[i][j];\n" + s.store + "    }\n  }\n}\n";

  Kernel k;
  k.name = s.name + "_" + std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk);
  k.glsl = g;
  k.bindings = s.bindings;
  k.groups = grid.groups;
  return k;
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
  s.state =
      "// im2col gather: the row terms of this thread's P rows (x_ok: a real row)\n"
      "uint x_base[P_RA];\nint x_ih[P_RA], x_iw[P_RA];\nbool x_ok[P_RA];\n";
  s.setup = "  for (uint a = 0u; a < P_RA; ++a) {\n    uint m = p0 + p_row(a);  // " + row.what + "\n";
  s.setup += "    " + row.split + "\n    x_ok[a] = m < GP;\n    x_base[a] = " + row.offset + ";\n";
  s.setup += "    x_ih[a] = " + row.ih + " - PT;\n    x_iw[a] = " + row.iw + " - PL;\n  }\n";
  s.load = "  for (uint c = 0u; c < P_RC; ++c) {\n    uint k = k0 + p_kk(c);  // " + kx.what + "\n";
  s.load += "    " + kx.split + "\n    bool k_ok = k < k_end;\n    uint xk = " + kx.offset + ";\n";
  s.load += "    int ihk = " + kx.ih + ", iwk = " + kx.iw + ";\n";
  s.load += "    for (uint a = 0u; a < P_RA; ++a) {\n      int ih = x_ih[a] + ihk, iw = x_iw[a] + iwk;\n";
  s.load +=
      "      bool ok = k_ok && x_ok[a]" + in_bounds("ih", "H", pad_h) + in_bounds("iw", "W", pad_w) + ";\n";
  s.load += "      p_reg[a][c] = ok ? X[x_base[a] + xk + uint(ih) * W + uint(iw)] : 0.0;\n    }\n";
  s.load += then + "  }\n";
  return s;
}

// conv2d: y[b, g*OG + q, pix] = sum_k im2col(x)[m, k] * w[g*OG + q, k] with m = (b, oh, ow) and
// k = (ci, kh, kw); P = N*OH*OW pixels (gathered row-wise, padding/stride/dilation in the load),
// Q = OG output channels, one GEMM per group.
Lowering conv_forward(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  ConvDims d = conv_dims(n, ctx.input(0).shape, ctx.input(1).shape, n.shape);
  Win w = window(n, d.KH, d.KW, true);
  if (d.Og == 1) return conv_forward_direct(ctx, d, w);
  GemmSpec s;
  s.name = "conv2d_igemm";
  s.comment = "conv2d: P = N*OH*OW output pixels, Q = output channels per group, K = CG*KH*KW";
  s.P = d.N * d.OH * d.OW, s.Q = d.Og, s.K = d.Cg * d.KH * d.KW, s.outer = d.groups;
  s.t = pick_tile(s.P, s.Q, s.K, s.outer, ctx);
  s.p_k_wise = false, s.q_k_wise = true;
  s.buffers = decls({"X", "Wt"});
  s.bindings = bind(2);
  s.consts = conv_constants(d, w);
  const Im2colGather x = im2col_gather(n, /*pixel_rows=*/true, "");
  s.state = "uint g;\n" + x.state;
  s.setup = "  g = z;\n" + x.setup;
  s.load = x.load;
  s.load += "  for (uint c = 0u; c < Q_RC; ++c) {\n    uint k = k0 + q_kk(c);\n";
  s.load += "    for (uint a = 0u; a < Q_RA; ++a) {\n      uint o = q0 + q_row(a);\n";
  s.load += "      q_reg[a][c] = (k < k_end && o < OG) ? Wt[(g * OG + o) * GK + k] : 0.0;\n    }\n  }\n";
  s.store = "      Y[((p / OHW) * O + g * OG + q) * OHW + p % OHW] = v;\n";
  return one(implicit_gemm(s, ctx.caps));
}

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
  return cu("Q" + axis, p.q) + cu("STEP_" + axis, p.step) + cu("J" + axis + "M", p.jmax) +
         const_array("uint", "K" + axis + "0", k0) + const_array("uint", "J" + axis, count) +
         const_array("int", "BASE_" + axis, base);
}

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
  GemmSpec s;
  s.name = "conv2d_grad_input_igemm";
  s.comment =
      "conv2d_grad_input: per stride phase and group, P = pixels of the phase, Q = input channels per "
      "group, K = OG * contributing taps";
  s.P = d.N * HH * WW, s.Q = d.Cg, s.K = d.Og * ph.jmax * pw.jmax, s.outer = w.sh * w.sw * d.groups;
  s.t = pick_tile(s.P, s.Q, s.K, s.outer, ctx);
  s.p_k_wise = false, s.q_k_wise = true;
  s.buffers = decls({"DY", "Wt"});
  s.bindings = bind(2);
  s.consts = conv_constants(d, w) + "// stride phases: pixel (ph + SH*hh, pw + SW*ww)\n" + cu("HH", HH) +
             cu("WW", WW) + phase_constants("H", ph) + phase_constants("W", pw) +
             cu("JHW", ph.jmax * pw.jmax);
  s.state =
      "uint g, ph, pw, jh_n, jw_n;\nuint d_base[P_RA];\nint d_oh[P_RA], d_ow[P_RA];\nbool d_ok[P_RA];\n";
  s.setup =
      "  g = z % GROUPS;\n  ph = (z / GROUPS) / SW;\n  pw = (z / GROUPS) % SW;\n  jh_n = JH[ph];\n"
      "  jw_n = JW[pw];\n";
  s.setup += "  for (uint a = 0u; a < P_RA; ++a) {\n    uint m = p0 + p_row(a);\n";
  s.setup += "    uint b = m / (HH * WW), r = m % (HH * WW);\n    uint hh = r / WW, ww = r % WW;\n";
  s.setup += "    d_ok[a] = m < GP && ph + hh * SH < H && pw + ww * SW < W;\n";
  s.setup += "    d_base[a] = (b * O + g * OG) * OHW;\n";
  s.setup += "    d_oh[a] = int(hh) + BASE_H[ph];\n    d_ow[a] = int(ww) + BASE_W[pw];\n  }\n";
  const std::string tap =
      "    uint og = k / JHW, r = k % JHW;\n    uint jh = r / JWM, jw = r % JWM;\n"
      "    bool k_ok = k < k_end && jh < jh_n && jw < jw_n;\n";
  s.load = "  for (uint c = 0u; c < P_RC; ++c) {\n    uint k = k0 + p_kk(c);\n" + tap;
  s.load += "    int dh = int(jh * STEP_H), dw = int(jw * STEP_W);\n";
  s.load += "    for (uint a = 0u; a < P_RA; ++a) {\n      int oh = d_oh[a] - dh, ow = d_ow[a] - dw;\n";
  s.load += "      bool ok = k_ok && d_ok[a] && uint(oh) < OH && uint(ow) < OW;\n";
  s.load +=
      "      p_reg[a][c] = ok ? DY[d_base[a] + og * OHW + uint(oh) * OW + uint(ow)] : 0.0;\n    }\n  }\n";
  s.load += "  for (uint c = 0u; c < Q_RC; ++c) {\n    uint k = k0 + q_kk(c);\n" + tap;
  s.load += "    uint wb = (g * OG + og) * CG * KHW + (KH0[ph] + jh * QH) * KW + KW0[pw] + jw * QW;\n";
  s.load += "    for (uint a = 0u; a < Q_RA; ++a) {\n      uint ci = q0 + q_row(a);\n";
  s.load += "      q_reg[a][c] = (k_ok && ci < CG) ? Wt[wb + ci * KHW] : 0.0;\n    }\n  }\n";
  s.store = "      uint r = p % (HH * WW);\n      uint h = ph + (r / WW) * SH, w = pw + (r % WW) * SW;\n";
  s.store += "      if (h < H && w < W) Y[(((p / (HH * WW)) * C + g * CG + q) * H + h) * W + w] = v;\n";
  return one(implicit_gemm(s, ctx.caps));
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
  if (d.Og == 1) {
    if (d.KH * d.KW <= 25 && 32 * d.KH * d.KW * 4 <= ctx.caps.max_shared_bytes)
      return conv_grad_weight_rows(ctx, d, w);
    return conv_grad_weight_elements(ctx, d, w);
  }
  GemmSpec s;
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
  s.comment =
      "conv2d_grad_weight: P = CG*KH*KW filter taps, Q = output channels per group, K = N*OH*OW, split " +
      std::to_string(splits) + " ways";
  s.outer = d.groups * splits;
  s.p_k_wise = true, s.q_k_wise = true;
  s.buffers = detail::buffer_decl(0, "X", false) + detail::buffer_decl(1, "DY", false) +
              detail::buffer_decl(2, splits > 1 ? "PART" : "Y", true, false);
  s.bindings = {{BindingKind::Input, 0, false},
                {BindingKind::Input, 1, false},
                {splits > 1 ? BindingKind::Scratch : BindingKind::Output, 0, true}};
  s.consts = conv_constants(d, w) + cu("KCHUNK", chunk) + cu("DW_SIZE", numel_dw);
  // Both operands are k-wise with the same BK and thread count, so p_kk(c) == q_kk(c) and one pixel
  // decomposition (b, pix of the gather's k loop) serves both: the dy load goes in that loop.
  std::string dy = "    uint dyk = (b * O + g * OG) * OHW + pix;\n";
  dy += "    for (uint a = 0u; a < Q_RA; ++a) {\n      uint o = q0 + q_row(a);\n";
  dy += "      q_reg[a][c] = (k_ok && o < OG) ? DY[dyk + o * OHW] : 0.0;\n    }\n";
  const Im2colGather x = im2col_gather(n, /*pixel_rows=*/false, dy);
  s.state = "uint g, split;\n" + x.state;
  s.setup =
      "  g = z % GROUPS;\n  split = z / GROUPS;\n  k_begin = split * KCHUNK;\n"
      "  k_end = min(GK, k_begin + KCHUNK);\n";
  s.setup += x.setup;
  s.load = x.load;
  s.store = splits > 1 ? "      PART[split * DW_SIZE + (g * OG + q) * GP + p] = v;\n"
                       : "      Y[(g * OG + q) * GP + p] = v;\n";
  Lowering l;
  l.kernels.push_back(implicit_gemm(s, ctx.caps));
  if (splits > 1) {
    l.scratch_words.push_back(splits * numel_dw);
    std::string b = "    float sum = 0.0;\n";
    b += "    for (uint s = 0u; s < " + u(splits) + "; ++s) sum += PART[s * " + u(numel_dw) + " + i];\n";
    b += "    Y[i] = sum;\n";
    std::string dc = detail::buffer_decl(0, "PART", false) + detail::buffer_decl(1, "Y", true, false);
    l.kernels.push_back(detail::elementwise_kernel(
        "conv2d_grad_weight_split_sum_s" + std::to_string(splits), dc, b, numel_dw,
        {{BindingKind::Scratch, 0, false}, {BindingKind::Output, 0, true}}, ctx.caps));
  }
  return l;
}

// ---- pooling -----------------------------------------------------------------------------------------

struct PoolDims {
  uint64_t NC, H, W, OH, OW;
};

// Loops over the taps of window (oh, ow) that lie inside the input; `tap` sees `uint xi` (flat input
// index, plane base `pb`) and may use `ih`, `iw`.
std::string window_loop(const Win& w, const PoolDims& d, const std::string& tap, const std::string& indent) {
  std::string s;
  s += indent + "for (uint ki = 0u; ki < " + u(w.kh) + "; ++ki) {\n";
  s += indent + "  int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) +
       ";\n";
  s += indent + "  if (ih < 0 || ih >= " + std::to_string(d.H) + ") continue;\n";
  s += indent + "  for (uint kj = 0u; kj < " + u(w.kw) + "; ++kj) {\n";
  s += indent + "    int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) +
       ";\n";
  s += indent + "    if (iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  s += indent + "    uint xi = pb + uint(ih) * " + u(d.W) + " + uint(iw);\n";
  s += tap;
  s += indent + "  }\n" + indent + "}\n";
  return s;
}

// Loops over the windows (oh, ow) that contain input element (ih, iw) of its plane.
std::string containing_windows(const Win& w, const PoolDims& d, const std::string& body) {
  std::string s;
  s += "    for (uint ki = 0u; ki < " + u(w.kh) + "; ++ki) {\n";
  s += "      int th = int(ih + " + u(w.pt) + ") - int(ki * " + u(w.dh) + ");\n";
  s += "      if (th < 0 || th % " + std::to_string(w.sh) + " != 0) continue;\n";
  s += "      uint oh = uint(th) / " + u(w.sh) + ";\n      if (oh >= " + u(d.OH) + ") continue;\n";
  s += "      for (uint kj = 0u; kj < " + u(w.kw) + "; ++kj) {\n";
  s += "        int tw = int(iw + " + u(w.pl) + ") - int(kj * " + u(w.dw) + ");\n";
  s += "        if (tw < 0 || tw % " + std::to_string(w.sw) + " != 0) continue;\n";
  s += "        uint ow = uint(tw) / " + u(w.sw) + ";\n        if (ow >= " + u(d.OW) + ") continue;\n";
  s += body;
  s += "      }\n    }\n";
  return s;
}

// GLSL function returning the flat input index of the first maximum of window (p, oh, ow), or -1.
std::string argmax_fn(const Win& w, const PoolDims& d) {
  std::string s = "int window_argmax(uint p, uint oh, uint ow) {\n  uint pb = p * " + u(d.H * d.W) + ";\n";
  s += "  int arg = -1;\n  float best = 0.0;\n";
  s += window_loop(
      w, d,
      "      float v = X[xi];\n"
      "      if (arg < 0 || v > best || (isnan(v) && !isnan(best))) { arg = int(xi); best = v; }\n",
      "  ");
  s += "  return arg;\n}\n";
  return s;
}

std::string avg_divisor(const ir::Node& n, const Win& w) {
  return n.attrs.i("count_include_pad") != 0 ? detail::flit(double(w.kh * w.kw)) : "float(count)";
}

// Taps of window (oh, ow) inside the input (the avg-pool divisor without count_include_pad).
std::string count_fn(const Win& w, const PoolDims& d) {
  std::string s = "uint window_count(uint oh, uint ow) {\n  uint pb = 0u;\n  uint count = 0u;\n";
  s += window_loop(w, d, "      count += 1u;\n", "  ");
  s += "  return count;\n}\n";
  return s;
}

Lowering max_pool(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  const auto& k = n.attrs.ints("kernel");
  Win w = window(n, uint64_t(k[0]), uint64_t(k[1]), true);
  if (n.op == ir::Op::MaxPool2d) {
    PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]),
               uint64_t(n.shape[3])};
    std::string b = unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}});
    b += "    int a = window_argmax(p, oh, ow);\n"
         "    Y[i] = a < 0 ? uintBitsToFloat(0xff800000u) : X[uint(a)];\n";
    std::string dc = decls({"X"}) + argmax_fn(w, d);
    return one(detail::elementwise_kernel("max_pool2d", dc, b, d.NC * d.OH * d.OW, bind(1), ctx.caps));
  }
  // max_pool2d_grad(x, dy) -> dx: each input element collects dy of the windows whose argmax it is.
  const Shape& ys = ctx.input(1).shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}});
  b += "    float acc = 0.0;\n";
  b += containing_windows(w, d,
                          "        if (window_argmax(p, oh, ow) == int(i)) acc += DY[(p * " + u(d.OH) +
                              " + oh) * " + u(d.OW) + " + ow];\n");
  b += "    Y[i] = acc;\n";
  std::string dc = decls({"X", "DY"}) + argmax_fn(w, d);
  return one(detail::elementwise_kernel("max_pool2d_grad", dc, b, d.NC * d.H * d.W, bind(2), ctx.caps));
}

Lowering avg_pool(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const auto& k = n.attrs.ints("kernel");
  Win w = window(n, uint64_t(k[0]), uint64_t(k[1]), false);
  const std::string div = avg_divisor(n, w);
  if (n.op == ir::Op::AvgPool2d) {
    const Shape& xs = ctx.input(0).shape;
    PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]),
               uint64_t(n.shape[3])};
    std::string b = unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}});
    b += "    uint pb = p * " + u(d.H * d.W) + ";\n    float s = 0.0;\n    uint count = 0u;\n";
    b += window_loop(w, d, "        s += X[xi];\n        count += 1u;\n", "    ");
    b += "    Y[i] = s / " + div + ";\n";
    return one(
        detail::elementwise_kernel("avg_pool2d", decls({"X"}), b, d.NC * d.OH * d.OW, bind(1), ctx.caps));
  }
  // avg_pool2d_grad(dy) -> dx [input_shape]: each input element collects dy / divisor of its windows.
  const Shape& ys = ctx.input(0).shape;
  const Shape& xs = n.shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}});
  b += "    float acc = 0.0;\n";
  std::string body =
      n.attrs.i("count_include_pad") != 0 ? "" : "        uint count = window_count(oh, ow);\n";
  body += "        acc += DY[(p * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] / " + div + ";\n";
  b += containing_windows(w, d, body);
  b += "    Y[i] = acc;\n";
  std::string dc = decls({"DY"});
  if (n.attrs.i("count_include_pad") == 0) dc += count_fn(w, d);
  return one(detail::elementwise_kernel("avg_pool2d_grad", dc, b, d.NC * d.H * d.W, bind(1), ctx.caps));
}

Lowering upsample(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const auto& s = n.attrs.ints("scale");
  const uint64_t sh = uint64_t(s[0]), sw = uint64_t(s[1]);
  if (n.op == ir::Op::Upsample2d) {
    const Shape& xs = ctx.input(0).shape;
    const uint64_t NC = uint64_t(xs[0] * xs[1]), H = uint64_t(xs[2]), W = uint64_t(xs[3]);
    const uint64_t OH = uint64_t(n.shape[2]), OW = uint64_t(n.shape[3]);
    std::string b = unflatten("i", {{"p", NC}, {"oh", OH}, {"ow", OW}});
    b += "    Y[i] = X[(p * " + u(H) + " + oh / " + u(sh) + ") * " + u(W) + " + ow / " + u(sw) + "];\n";
    return one(
        detail::elementwise_kernel("upsample_nearest2d", decls({"X"}), b, NC * OH * OW, bind(1), ctx.caps));
  }
  const Shape& ys = ctx.input(0).shape;
  const uint64_t NC = uint64_t(n.shape[0] * n.shape[1]), H = uint64_t(n.shape[2]), W = uint64_t(n.shape[3]);
  const uint64_t OH = uint64_t(ys[2]), OW = uint64_t(ys[3]);
  std::string b = unflatten("i", {{"p", NC}, {"ih", H}, {"iw", W}});
  b += "    float acc = 0.0;\n";
  b += "    for (uint a = 0u; a < " + u(sh) + "; ++a) {\n      uint oh = ih * " + u(sh) +
       " + a;\n      if (oh >= " + u(OH) + ") break;\n";
  b += "      for (uint c = 0u; c < " + u(sw) + "; ++c) {\n        uint ow = iw * " + u(sw) +
       " + c;\n        if (ow >= " + u(OW) + ") break;\n";
  b += "        acc += DY[(p * " + u(OH) + " + oh) * " + u(OW) + " + ow];\n      }\n    }\n    Y[i] = acc;\n";
  return one(
      detail::elementwise_kernel("upsample_nearest2d_grad", decls({"DY"}), b, NC * H * W, bind(1), ctx.caps));
}

}  // namespace

Lowering lower_conv(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  if (detail::numel_u(n.shape) == 0) return {};
  switch (n.op) {
    case ir::Op::Conv2d:
      return conv_forward(ctx);
    case ir::Op::Conv2dGradInput:
      return conv_grad_input(ctx);
    case ir::Op::Conv2dGradWeight:
      return conv_grad_weight(ctx);
    case ir::Op::MaxPool2d:
    case ir::Op::MaxPool2dGrad:
      return max_pool(ctx);
    case ir::Op::AvgPool2d:
    case ir::Op::AvgPool2dGrad:
      return avg_pool(ctx);
    case ir::Op::Upsample2d:
    case ir::Op::Upsample2dGrad:
      return upsample(ctx);
    default:
      break;
  }
  throw Error(ctx.graph.describe(n.id) + ": not a convolution-family op");
}

}  // namespace mgn::codegen
