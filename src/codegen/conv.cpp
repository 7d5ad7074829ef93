// Convolution family on Vulkan: conv2d (+ input and weight derivatives), max/avg pooling (+ derivatives),
// nearest upsampling (+ derivative). NCHW, padding [top, left, bottom, right]; the semantics are those of
// the CPU reference (src/backend/cpu/kernels_conv.cpp), including PyTorch's first-maximum rule for max
// pooling and NaN winning a window.
//
// Kernels, all "gather" form so that no output element is written by two invocations (no atomics):
//   conv2d              one invocation per output element; four output channels of one pixel at a time
//                       when the group has that many (the input taps are loaded once for all four)
//   conv2d_grad_input   one invocation per input element, visiting the (o, kh, kw) taps that read it
//   conv2d_grad_weight  one workgroup per weight element, reducing dy·x over N×OH×OW in shared memory
//   pool / upsample     one invocation per output element (forward) or per input element (derivative,
//                       visiting the windows that contain it; max pooling recomputes each window's argmax)
//
// This is direct convolution. The implicit-GEMM generator (register-tiled like matmul.cpp) is the
// planned replacement for large channel counts; docs/perf-notes.md tracks where these kernels stand.
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
      s += "    uint " + dims[i].first + " = r_ % " + u(dims[i].second) + ";\n    r_ /= " + u(dims[i].second) + ";\n";
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

Lowering conv_forward(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  ConvDims d = conv_dims(n, ctx.input(0).shape, ctx.input(1).shape, n.shape);
  Win w = window(n, d.KH, d.KW, true);
  // Output channels per invocation: 4 when every group's channels split into fours.
  const uint64_t vec = d.Og % 4 == 0 ? 4 : 1;
  const uint64_t items = d.N * (d.O / vec) * d.OH * d.OW;
  std::string b = unflatten("i", {{"b", d.N}, {"oq", d.O / vec}, {"oh", d.OH}, {"ow", d.OW}});
  b += "    uint o0 = oq * " + u(vec) + ";\n    uint c0 = (o0 / " + u(d.Og) + ") * " + u(d.Cg) + ";\n";
  b += vec == 4 ? "    vec4 acc = vec4(0.0);\n" : "    float acc = 0.0;\n";
  b += "    for (uint ci = 0u; ci < " + u(d.Cg) + "; ++ci) {\n";
  b += "      uint xb = (b * " + u(d.C) + " + c0 + ci) * " + u(d.H * d.W) + ";\n";
  b += "      for (uint ki = 0u; ki < " + u(d.KH) + "; ++ki) {\n";
  b += "        int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  b += "        if (ih < 0 || ih >= " + std::to_string(d.H) + ") continue;\n";
  b += "        for (uint kj = 0u; kj < " + u(d.KW) + "; ++kj) {\n";
  b += "          int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  b += "          if (iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  b += "          float xv = X[xb + uint(ih) * " + u(d.W) + " + uint(iw)];\n";
  b += "          uint wi = (o0 * " + u(d.Cg) + " + ci) * " + u(d.KH * d.KW) + " + ki * " + u(d.KW) + " + kj;\n";
  if (vec == 4) {
    const std::string ws = u(d.Cg * d.KH * d.KW);
    b += "          acc += xv * vec4(Wt[wi], Wt[wi + " + ws + "], Wt[wi + 2u * " + ws + "], Wt[wi + 3u * " + ws + "]);\n";
  } else {
    b += "          acc += xv * Wt[wi];\n";
  }
  b += "        }\n      }\n    }\n";
  b += "    uint yo = ((b * " + u(d.O) + " + o0) * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow;\n";
  if (vec == 4) {
    const std::string ps = u(d.OH * d.OW);
    b += "    Y[yo] = acc.x;\n    Y[yo + " + ps + "] = acc.y;\n    Y[yo + 2u * " + ps + "] = acc.z;\n    Y[yo + 3u * " + ps +
         "] = acc.w;\n";
  } else {
    b += "    Y[yo] = acc;\n";
  }
  std::string name = "conv2d_direct_o" + std::to_string(vec);
  return one(detail::elementwise_kernel(name, decls({"X", "Wt"}), b, items, bind(2), ctx.caps));
}

Lowering conv_grad_input(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  // Inputs: dy [N, O, OH, OW], w; output dx [N, C, H, W].
  ConvDims d = conv_dims(n, n.shape, ctx.input(1).shape, ctx.input(0).shape);
  Win w = window(n, d.KH, d.KW, true);
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
  b += "          acc += DY[((b * " + u(d.O) + " + o) * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] * Wt[((o * " +
       u(d.Cg) + " + ci) * " + u(d.KH) + " + ki) * " + u(d.KW) + " + kj];\n";
  b += "        }\n      }\n    }\n    Y[i] = acc;\n";
  return one(detail::elementwise_kernel("conv2d_grad_input_direct", decls({"DY", "Wt"}), b, d.N * d.C * d.H * d.W,
                                        bind(2), ctx.caps));
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
  std::string g = "#version 450\n// conv2d_grad_weight: one workgroup per (o, ci), all " + std::to_string(taps) +
                  " taps, rows of dy split over the threads\n";
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
  g += "          int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  g += "          if (iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  g += "          acc[ki * " + u(d.KW) + " + kj] += dv * X[xb + uint(ih) * " + u(d.W) + " + uint(iw)];\n";
  g += "        }\n      }\n    }\n  }\n";
  g += "  for (uint k = 0u; k < " + u(taps) + "; ++k) red[k * " + u(wg) + " + t] = acc[k];\n  barrier();\n";
  g += "  for (uint s = " + u(wg / 2) + "; s > 0u; s >>= 1) {\n    if (t < s)\n      for (uint k = 0u; k < " + u(taps) +
       "; ++k) red[k * " + u(wg) + " + t] += red[k * " + u(wg) + " + t + s];\n    barrier();\n  }\n";
  g += "  for (uint k = t; k < " + u(taps) + "; k += " + u(wg) + ") Y[gid * " + u(taps) + " + k] = red[k * " + u(wg) +
       "];\n}\n";
  Kernel k;
  k.name = "conv2d_grad_weight_rows_wg" + std::to_string(wg);
  k.glsl = g;
  k.bindings = bind(2);
  k.groups = grid.groups;
  return one(std::move(k));
}

Lowering conv_grad_weight(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  // Inputs: x [N, C, H, W], dy [N, O, OH, OW]; output dw [O, Cg, KH, KW].
  ConvDims d = conv_dims(n, ctx.input(0).shape, n.shape, ctx.input(1).shape);
  Win w = window(n, d.KH, d.KW, true);
  // Small filters: the row kernel above. Large ones (accumulators would not fit registers and shared
  // memory): one workgroup per weight element.
  if (d.KH * d.KW <= 25 && 32 * d.KH * d.KW * 4 <= ctx.caps.max_shared_bytes) return conv_grad_weight_rows(ctx, d, w);
  const uint64_t m = d.N * d.OH * d.OW;  // terms per weight element
  const uint64_t elems = d.O * d.Cg * d.KH * d.KW;
  uint32_t wg = 32;
  while (wg < 256 && wg < m && wg * 2 <= ctx.caps.max_workgroup_invocations) wg *= 2;
  detail::Grid grid = detail::flat_grid(elems, ctx.caps);
  std::string g = "#version 450\n// conv2d_grad_weight: one workgroup per weight element, reducing dy * x over "
                  "N x OH x OW\n";
  g += "layout(local_size_x = " + std::to_string(wg) + ") in;\n" + decls({"X", "DY"});
  g += "shared float red[" + std::to_string(wg) + "];\n";
  g += "void main() {\n" + grid.glsl + "  uint t = gl_LocalInvocationID.x;\n";
  g += unflatten("gid", {{"o", d.O}, {"ci", d.Cg}, {"ki", d.KH}, {"kj", d.KW}});
  g += "  uint c = (o / " + u(d.Og) + ") * " + u(d.Cg) + " + ci;\n  float acc = 0.0;\n";
  g += "  for (uint e = t; e < " + u(m) + "; e += " + u(wg) + ") {\n";
  g += "    uint ow = e % " + u(d.OW) + ";\n    uint oh = (e / " + u(d.OW) + ") % " + u(d.OH) + ";\n    uint b = e / " +
       u(d.OH * d.OW) + ";\n";
  g += "    int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  g += "    int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
  g += "    if (ih < 0 || ih >= " + std::to_string(d.H) + " || iw < 0 || iw >= " + std::to_string(d.W) + ") continue;\n";
  g += "    acc += DY[((b * " + u(d.O) + " + o) * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] * X[((b * " + u(d.C) +
       " + c) * " + u(d.H) + " + uint(ih)) * " + u(d.W) + " + uint(iw)];\n  }\n";
  g += "  red[t] = acc;\n  barrier();\n";
  g += "  for (uint s = " + u(wg / 2) + "; s > 0u; s >>= 1) {\n    if (t < s) red[t] += red[t + s];\n    barrier();\n  }\n";
  g += "  if (t == 0u) Y[gid] = red[0];\n}\n";
  Kernel k;
  k.name = "conv2d_grad_weight_wg" + std::to_string(wg);
  k.glsl = g;
  k.bindings = bind(2);
  k.groups = grid.groups;
  return one(std::move(k));
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
  s += indent + "  int ih = int(oh * " + u(w.sh) + " + ki * " + u(w.dh) + ") - " + std::to_string(w.pt) + ";\n";
  s += indent + "  if (ih < 0 || ih >= " + std::to_string(d.H) + ") continue;\n";
  s += indent + "  for (uint kj = 0u; kj < " + u(w.kw) + "; ++kj) {\n";
  s += indent + "    int iw = int(ow * " + u(w.sw) + " + kj * " + u(w.dw) + ") - " + std::to_string(w.pl) + ";\n";
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
  s += window_loop(w, d,
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
    PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]), uint64_t(n.shape[3])};
    std::string b = unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}});
    b += "    int a = window_argmax(p, oh, ow);\n    Y[i] = a < 0 ? uintBitsToFloat(0xff800000u) : X[uint(a)];\n";
    std::string dc = decls({"X"}) + argmax_fn(w, d);
    return one(detail::elementwise_kernel("max_pool2d", dc, b, d.NC * d.OH * d.OW, bind(1), ctx.caps));
  }
  // max_pool2d_grad(x, dy) -> dx: each input element collects dy of the windows whose argmax it is.
  const Shape& ys = ctx.input(1).shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}});
  b += "    float acc = 0.0;\n";
  b += containing_windows(w, d,
                          "        if (window_argmax(p, oh, ow) == int(i)) acc += DY[(p * " + u(d.OH) + " + oh) * " +
                              u(d.OW) + " + ow];\n");
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
    PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]), uint64_t(n.shape[3])};
    std::string b = unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}});
    b += "    uint pb = p * " + u(d.H * d.W) + ";\n    float s = 0.0;\n    uint count = 0u;\n";
    b += window_loop(w, d, "        s += X[xi];\n        count += 1u;\n", "    ");
    b += "    Y[i] = s / " + div + ";\n";
    return one(detail::elementwise_kernel("avg_pool2d", decls({"X"}), b, d.NC * d.OH * d.OW, bind(1), ctx.caps));
  }
  // avg_pool2d_grad(dy) -> dx [input_shape]: each input element collects dy / divisor of its windows.
  const Shape& ys = ctx.input(0).shape;
  const Shape& xs = n.shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}});
  b += "    float acc = 0.0;\n";
  std::string body = n.attrs.i("count_include_pad") != 0 ? "" : "        uint count = window_count(oh, ow);\n";
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
    return one(detail::elementwise_kernel("upsample_nearest2d", decls({"X"}), b, NC * OH * OW, bind(1), ctx.caps));
  }
  const Shape& ys = ctx.input(0).shape;
  const uint64_t NC = uint64_t(n.shape[0] * n.shape[1]), H = uint64_t(n.shape[2]), W = uint64_t(n.shape[3]);
  const uint64_t OH = uint64_t(ys[2]), OW = uint64_t(ys[3]);
  std::string b = unflatten("i", {{"p", NC}, {"ih", H}, {"iw", W}});
  b += "    float acc = 0.0;\n";
  b += "    for (uint a = 0u; a < " + u(sh) + "; ++a) {\n      uint oh = ih * " + u(sh) + " + a;\n      if (oh >= " + u(OH) +
       ") break;\n";
  b += "      for (uint c = 0u; c < " + u(sw) + "; ++c) {\n        uint ow = iw * " + u(sw) + " + c;\n        if (ow >= " +
       u(OW) + ") break;\n";
  b += "        acc += DY[(p * " + u(OH) + " + oh) * " + u(OW) + " + ow];\n      }\n    }\n    Y[i] = acc;\n";
  return one(detail::elementwise_kernel("upsample_nearest2d_grad", decls({"DY"}), b, NC * H * W, bind(1), ctx.caps));
}

}  // namespace

Lowering lower_conv(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  if (detail::numel_u(n.shape) == 0) return {};
  switch (n.op) {
    case ir::Op::Conv2d: return conv_forward(ctx);
    case ir::Op::Conv2dGradInput: return conv_grad_input(ctx);
    case ir::Op::Conv2dGradWeight: return conv_grad_weight(ctx);
    case ir::Op::MaxPool2d:
    case ir::Op::MaxPool2dGrad: return max_pool(ctx);
    case ir::Op::AvgPool2d:
    case ir::Op::AvgPool2dGrad: return avg_pool(ctx);
    case ir::Op::Upsample2d:
    case ir::Op::Upsample2dGrad: return upsample(ctx);
    default: break;
  }
  throw Error(ctx.graph.describe(n.id) + ": not a convolution-family op");
}

}  // namespace mgn::codegen
