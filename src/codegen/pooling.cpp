// Pooling and nearest upsampling, with their derivatives: one invocation per output element (forward) or
// per input element (derivative, visiting the windows that contain it; max pooling recomputes each window's
// argmax, PyTorch's first-maximum rule with NaN winning a window). Gather form: no atomics.
#include <string>

#include "codegen/conv_common.h"
#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::u;

struct PoolDims {
  uint64_t NC, H, W, OH, OW;
};

// Loops (at `indent`) over the taps of window (oh, ow) that lie inside the input; `tap` sees `uint xi`
// (flat input index, plane base `pb`) and may use `ih`, `iw`.
std::string window_loop(const Win& w, const PoolDims& d, const std::string& tap, const std::string& indent) {
  return window_taps(w, d.H, d.W, indent + "    uint xi = pb + uint(ih) * " + u(d.W) + " + uint(iw);\n" + tap,
                     indent);
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
  return n.attrs.i("count_include_pad") != 0 ? gl::flit(double(w.kh * w.kw)) : "float(count)";
}

// Taps of window (oh, ow) inside the input (the avg-pool divisor without count_include_pad).
std::string count_fn(const Win& w, const PoolDims& d) {
  std::string s = "uint window_count(uint oh, uint ow) {\n  uint pb = 0u;\n  uint count = 0u;\n";
  s += window_loop(w, d, "      count += 1u;\n", "  ");
  s += "  return count;\n}\n";
  return s;
}

}  // namespace

Lowering max_pool(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& xs = ctx.input(0).shape;
  const auto& k = n.attrs.ints("kernel");
  Win w = window(n, uint64_t(k[0]), uint64_t(k[1]), true);
  if (n.op == ir::Op::MaxPool2d) {
    PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]),
               uint64_t(n.shape[3])};
    std::string b = gl::unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}}, "    ");
    b += "    int a = window_argmax(p, oh, ow);\n"
         "    Y[i] = a < 0 ? uintBitsToFloat(0xff800000u) : X[uint(a)];\n";
    std::string dc = conv_buffers({"X"}) + argmax_fn(w, d);
    return gl::one_kernel(gl::elementwise("max_pool2d", "conv max_pool2d: an invocation per element", dc, b, d.NC * d.OH * d.OW, conv_bindings(1), ctx.caps));
  }
  // max_pool2d_grad(x, dy) -> dx: each input element collects dy of the windows whose argmax it is.
  const Shape& ys = ctx.input(1).shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = gl::unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}}, "    ");
  b += "    float acc = 0.0;\n";
  b += containing_windows(w, d.OH, d.OW,
                          "        if (window_argmax(p, oh, ow) == int(i)) acc += DY[(p * " + u(d.OH) +
                              " + oh) * " + u(d.OW) + " + ow];\n",
                          "    ");
  b += "    Y[i] = acc;\n";
  std::string dc = conv_buffers({"X", "DY"}) + argmax_fn(w, d);
  return gl::one_kernel(gl::elementwise("max_pool2d_grad", "conv max_pool2d_grad: an invocation per element", dc, b, d.NC * d.H * d.W, conv_bindings(2), ctx.caps));
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
    std::string b = gl::unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}}, "    ");
    b += "    uint pb = p * " + u(d.H * d.W) + ";\n    float s = 0.0;\n    uint count = 0u;\n";
    b += window_loop(w, d, "        s += X[xi];\n        count += 1u;\n", "    ");
    b += "    Y[i] = s / " + div + ";\n";
    return gl::one_kernel(
        gl::elementwise("avg_pool2d", "conv avg_pool2d: an invocation per element", conv_buffers({"X"}), b, d.NC * d.OH * d.OW, conv_bindings(1), ctx.caps));
  }
  // avg_pool2d_grad(dy) -> dx [input_shape]: each input element collects dy / divisor of its windows.
  const Shape& ys = ctx.input(0).shape;
  const Shape& xs = n.shape;
  PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]), uint64_t(ys[3])};
  std::string b = gl::unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}}, "    ");
  b += "    float acc = 0.0;\n";
  std::string body =
      n.attrs.i("count_include_pad") != 0 ? "" : "        uint count = window_count(oh, ow);\n";
  body += "        acc += DY[(p * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] / " + div + ";\n";
  b += containing_windows(w, d.OH, d.OW, body, "    ");
  b += "    Y[i] = acc;\n";
  std::string dc = conv_buffers({"DY"});
  if (n.attrs.i("count_include_pad") == 0) dc += count_fn(w, d);
  return gl::one_kernel(gl::elementwise("avg_pool2d_grad", "conv avg_pool2d_grad: an invocation per element", dc, b, d.NC * d.H * d.W, conv_bindings(1), ctx.caps));
}

Lowering upsample(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const auto& s = n.attrs.ints("scale");
  const uint64_t sh = uint64_t(s[0]), sw = uint64_t(s[1]);
  if (n.op == ir::Op::Upsample2d) {
    const Shape& xs = ctx.input(0).shape;
    const uint64_t NC = uint64_t(xs[0] * xs[1]), H = uint64_t(xs[2]), W = uint64_t(xs[3]);
    const uint64_t OH = uint64_t(n.shape[2]), OW = uint64_t(n.shape[3]);
    std::string b = gl::unflatten("i", {{"p", NC}, {"oh", OH}, {"ow", OW}}, "    ");
    b += "    Y[i] = X[(p * " + u(H) + " + oh / " + u(sh) + ") * " + u(W) + " + ow / " + u(sw) + "];\n";
    return gl::one_kernel(
        gl::elementwise("upsample_nearest2d", "conv upsample_nearest2d: an invocation per element", conv_buffers({"X"}), b, NC * OH * OW, conv_bindings(1), ctx.caps));
  }
  const Shape& ys = ctx.input(0).shape;
  const uint64_t NC = uint64_t(n.shape[0] * n.shape[1]), H = uint64_t(n.shape[2]), W = uint64_t(n.shape[3]);
  const uint64_t OH = uint64_t(ys[2]), OW = uint64_t(ys[3]);
  std::string b = gl::unflatten("i", {{"p", NC}, {"ih", H}, {"iw", W}}, "    ");
  b += "    float acc = 0.0;\n";
  b += "    for (uint a = 0u; a < " + u(sh) + "; ++a) {\n      uint oh = ih * " + u(sh) +
       " + a;\n      if (oh >= " + u(OH) + ") break;\n";
  b += "      for (uint c = 0u; c < " + u(sw) + "; ++c) {\n        uint ow = iw * " + u(sw) +
       " + c;\n        if (ow >= " + u(OW) + ") break;\n";
  b += "        acc += DY[(p * " + u(OH) + " + oh) * " + u(OW) + " + ow];\n      }\n    }\n    Y[i] = acc;\n";
  return gl::one_kernel(
      gl::elementwise("upsample_nearest2d_grad", "conv upsample_nearest2d_grad: an invocation per element", conv_buffers({"DY"}), b, NC * H * W, conv_bindings(1), ctx.caps));
}


}  // namespace mgn::codegen
