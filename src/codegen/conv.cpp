// Convolution family on Vulkan: conv2d (+ input and weight derivatives), max/avg pooling (+ derivatives),
// nearest upsampling (+ derivative). NCHW, padding [top, left, bottom, right]; the semantics are those of
// the CPU reference (src/backend/cpu/kernels_conv.cpp), including PyTorch's first-maximum rule for max
// pooling and NaN winning a window.
//
// This file routes the family and holds what its kernels share (conv_common.h); the kernels live in
// conv_implicit_gemm.cpp, conv_direct.cpp and pooling.cpp.
//
// Kernels, all "gather" form so that no output element is written by two invocations (no atomics):
//   conv2d              implicit GEMM (below): P = N*OH*OW output pixels x Q = output channels per group,
//                       K = (C/groups)*KH*KW, the im2col operand gathered from x in the load (padding,
//                       stride and dilation included), one GEMM per group in the grid
//   conv2d_grad_input   implicit GEMM per (stride phase, group): P = the input pixels of one phase
//                       (h % SH, w % SW), Q = C/groups, K = (O/groups) x the taps that can reach that
//                       phase, dy gathered; every other tap is never visited (stride 1: one phase), and a
//                       phase no tap reaches skips its K loop (stores zeros)
//   (both)              where 64x64 tiles leave the device under-filled (deep, narrow layers), K split over
//                       several workgroups per tile like grad_weight's (KernelOptions::conv_splits)
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
#include "codegen/conv_common.h"
#include "codegen/glsl.h"
#include "codegen/tuning.h"
#include "mgn/types.h"

namespace mgn::codegen {

using gl::u;

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

ConvDims conv_dims(const ir::Node& n, const Shape& xs, const Shape& ws, const Shape& ys) {
  ConvDims d{};
  d.N = uint64_t(xs[0]), d.C = uint64_t(xs[1]), d.H = uint64_t(xs[2]), d.W = uint64_t(xs[3]);
  d.O = uint64_t(ws[0]), d.Cg = uint64_t(ws[1]), d.KH = uint64_t(ws[2]), d.KW = uint64_t(ws[3]);
  d.OH = uint64_t(ys[2]), d.OW = uint64_t(ys[3]);
  d.groups = uint64_t(n.attrs.i("groups"));
  d.Og = d.O / d.groups;
  return d;
}

std::string conv_constants(const ConvDims& d, const Win& w) {
  using gl::const_uint;
  std::string s = "// convolution geometry (NCHW; padding top/left; OG/CG channels per group)\n";
  s += const_uint("NB", d.N) + const_uint("C", d.C) + const_uint("H", d.H) + const_uint("W", d.W) +
       const_uint("O", d.O) + const_uint("GROUPS", d.groups);
  s += const_uint("CG", d.Cg) + const_uint("OG", d.Og) + const_uint("KH", d.KH) + const_uint("KW", d.KW) +
       const_uint("OH", d.OH) + const_uint("OW", d.OW);
  s += const_uint("SH", w.sh) + const_uint("SW", w.sw) + const_uint("DH", w.dh) + const_uint("DW", w.dw) +
       gl::const_int("PT", int64_t(w.pt)) + gl::const_int("PL", int64_t(w.pl));
  s += const_uint("HW", d.H * d.W) + const_uint("KHW", d.KH * d.KW) + const_uint("OHW", d.OH * d.OW);
  return s;
}

std::string window_key(const Win& w) {
  auto pair = [](uint64_t a, uint64_t b) { return std::to_string(a) + "x" + std::to_string(b); };
  return "taps " + pair(w.kh, w.kw) + " stride " + pair(w.sh, w.sw) + " pad " + pair(w.pt, w.pl) +
         " dilation " + pair(w.dh, w.dw);
}

std::string conv_key(const ConvDims& d, const Win& w) {
  const Shape x{int64_t(d.N), int64_t(d.C), int64_t(d.H), int64_t(d.W)},
      wt{int64_t(d.O), int64_t(d.Cg), int64_t(d.KH), int64_t(d.KW)},
      y{int64_t(d.N), int64_t(d.O), int64_t(d.OH), int64_t(d.OW)};
  return "x" + shape_str(x) + " w" + shape_str(wt) + " y" + shape_str(y) + " " + window_key(w) + " groups " +
         std::to_string(d.groups);
}

std::string conv_buffers(const std::vector<std::string>& inputs) {
  std::string d;
  for (size_t i = 0; i < inputs.size(); ++i) d += gl::buffer(int(i), inputs[i], DType::F32, true);
  return d + gl::buffer(int(inputs.size()), "Y", DType::F32, false, true);
}

std::vector<Binding> conv_bindings(size_t n_inputs) {
  std::vector<Binding> b;
  for (size_t i = 0; i < n_inputs; ++i) b.push_back(gl::input(int(i)));
  b.push_back(gl::output());
  return b;
}

namespace {

// One axis of a window: its tap index (ki / kj), output and input coordinates (oh / ow, ih / iw), stride,
// dilation, padding and extents.
struct WindowAxis {
  std::string k, o, i;
  uint64_t taps, stride, dil, pad, out, in;
};
WindowAxis axis_h(const Win& w, uint64_t out, uint64_t in) {
  return {"ki", "oh", "ih", w.kh, w.sh, w.dh, w.pt, out, in};
}
WindowAxis axis_w(const Win& w, uint64_t out, uint64_t in) {
  return {"kj", "ow", "iw", w.kw, w.sw, w.dw, w.pl, out, in};
}

// Two nested loops (at `indent`) over the taps (ki, kj); each axis runs `step(axis, indent)` (declarations
// and `continue`s) at the top of its loop, then `body` runs.
template <typename Step>
std::string tap_loops(const WindowAxis& h, const WindowAxis& w, Step step, const std::string& body,
                      const std::string& indent) {
  const std::string in2 = indent + "  ";
  return indent + "for (uint ki = 0u; ki < " + u(h.taps) + "; ++ki) {\n" + step(h, in2) + in2 +
         "for (uint kj = 0u; kj < " + u(w.taps) + "; ++kj) {\n" + step(w, in2 + "  ") + body + in2 + "}\n" +
         indent + "}\n";
}

// The input coordinate the tap reads from the output coordinate; taps in the padding are skipped.
std::string input_of_tap(const WindowAxis& a, const std::string& in) {
  return gl::render(R"(${I}int ${IC} = int(${OC} * ${S} + ${K} * ${D}) - ${P};
${I}if (${IC} < 0 || ${IC} >= ${N}) continue;
)",
                    {{"I", in},
                     {"IC", a.i},
                     {"OC", a.o},
                     {"S", u(a.stride)},
                     {"K", a.k},
                     {"D", u(a.dil)},
                     {"P", std::to_string(a.pad)},
                     {"N", std::to_string(a.in)}});
}

// The output coordinate whose window reads the input coordinate through the tap (oh*sh + ki*dh - pt ==
// ih); taps that reach no output are skipped.
std::string output_of_tap(const WindowAxis& a, const std::string& in) {
  const std::string t = "t" + a.i.substr(1);
  return gl::render(R"(${I}int ${T} = int(${IC} + ${P}) - int(${K} * ${D});
${I}if (${T} < 0 || ${T} % ${SI} != 0) continue;
${I}uint ${OC} = uint(${T}) / ${S};
${I}if (${OC} >= ${N}) continue;
)",
                    {{"I", in},
                     {"T", t},
                     {"IC", a.i},
                     {"P", u(a.pad)},
                     {"K", a.k},
                     {"D", u(a.dil)},
                     {"SI", std::to_string(a.stride)},
                     {"OC", a.o},
                     {"S", u(a.stride)},
                     {"N", u(a.out)}});
}

}  // namespace

std::string window_taps(const Win& w, uint64_t H, uint64_t W, const std::string& body,
                        const std::string& indent) {
  return tap_loops(axis_h(w, 0, H), axis_w(w, 0, W), input_of_tap, body, indent);
}

std::string containing_windows(const Win& w, uint64_t OH, uint64_t OW, const std::string& body,
                               const std::string& indent) {
  return tap_loops(axis_h(w, OH, 0), axis_w(w, OW, 0), output_of_tap, body, indent);
}

std::string tunable_conv_key(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const bool conv = n.op == ir::Op::Conv2d || n.op == ir::Op::Conv2dGradInput || n.op == ir::Op::Conv2dGradWeight;
  if (!conv || !ctx.options.kernels.conv_tile.is_auto() || gl::numel_u(n.shape) == 0) return "";
  auto dims = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
    return s;
  };
  return std::string(ir::op_info(n.op).name) + "/" + dtype_name(n.dtype) + "/" +
         (ctx.precision() == Precision::Accelerated ? "accelerated" : "strict") + "/" + dims(ctx.input(0).shape) +
         "/" + dims(ctx.input(1).shape) + "/" + dims(n.shape) + "/s" + dims(n.attrs.ints("stride")) + "/p" +
         dims(n.attrs.ints("padding")) + "/d" + dims(n.attrs.ints("dilation")) + "/g" +
         std::to_string(n.attrs.i("groups"));
}

std::vector<ConvTile> conv_tune_candidates() {
  return {{}, {32, 32, 32}, {64, 64, 32}, {128, 64, 16}, {128, 128, 16}};
}

Lowering lower_conv(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  if (gl::numel_u(n.shape) == 0) return {};
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
#define MGN_FAMILY_Conv
#include "codegen/other_ops.inc"
      break;
  }
  throw Error(ctx.graph.describe(n.id) + ": not a convolution-family op");
}

}  // namespace mgn::codegen
