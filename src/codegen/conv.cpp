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
#include "codegen/conv_common.h"

#include "codegen/glsl.h"
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

std::string window_taps(const Win& w, uint64_t H, uint64_t W, const std::string& body, const std::string& indent) {
  return gl::render(R"(${I}for (uint ki = 0u; ki < ${KH}; ++ki) {
${I}  int ih = int(oh * ${SH} + ki * ${DH}) - ${PT};
${I}  if (ih < 0 || ih >= ${H}) continue;
${I}  for (uint kj = 0u; kj < ${KW}; ++kj) {
${I}    int iw = int(ow * ${SW} + kj * ${DW}) - ${PL};
${I}    if (iw < 0 || iw >= ${W}) continue;
${BODY}${I}  }
${I}}
)",
                    {{"I", indent},
                     {"KH", u(w.kh)},
                     {"SH", u(w.sh)},
                     {"DH", u(w.dh)},
                     {"PT", std::to_string(w.pt)},
                     {"H", std::to_string(H)},
                     {"KW", u(w.kw)},
                     {"SW", u(w.sw)},
                     {"DW", u(w.dw)},
                     {"PL", std::to_string(w.pl)},
                     {"W", std::to_string(W)},
                     {"BODY", body}});
}

std::string containing_windows(const Win& w, uint64_t OH, uint64_t OW, const std::string& body,
                               const std::string& indent) {
  // Tap (ki, kj) of output (oh, ow) reads (ih, iw) iff oh*sh + ki*dh - pt == ih.
  return gl::render(R"(${I}for (uint ki = 0u; ki < ${KH}; ++ki) {
${I}  int th = int(ih + ${PT}) - int(ki * ${DH});
${I}  if (th < 0 || th % ${SHI} != 0) continue;
${I}  uint oh = uint(th) / ${SH};
${I}  if (oh >= ${OH}) continue;
${I}  for (uint kj = 0u; kj < ${KW}; ++kj) {
${I}    int tw = int(iw + ${PL}) - int(kj * ${DW});
${I}    if (tw < 0 || tw % ${SWI} != 0) continue;
${I}    uint ow = uint(tw) / ${SW};
${I}    if (ow >= ${OW}) continue;
${BODY}${I}  }
${I}}
)",
                    {{"I", indent},
                     {"KH", u(w.kh)},
                     {"PT", u(w.pt)},
                     {"DH", u(w.dh)},
                     {"SHI", std::to_string(w.sh)},
                     {"SH", u(w.sh)},
                     {"OH", u(OH)},
                     {"KW", u(w.kw)},
                     {"PL", u(w.pl)},
                     {"DW", u(w.dw)},
                     {"SWI", std::to_string(w.sw)},
                     {"SW", u(w.sw)},
                     {"OW", u(OW)},
                     {"BODY", body}});
}

Lowering lower_conv(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  if (gl::numel_u(n.shape) == 0) return {};
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
#define MGN_FAMILY_Conv
#include "codegen/other_ops.inc"
      break;
  }
  throw Error(ctx.graph.describe(n.id) + ": not a convolution-family op");
}

}  // namespace mgn::codegen
