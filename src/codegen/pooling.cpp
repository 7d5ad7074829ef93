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
  const Win w = window(n, uint64_t(k[0]), uint64_t(k[1]), true);
  const std::string key = "x" + shape_str(xs) + " " + window_key(w);
  if (n.op == ir::Op::MaxPool2d) {
    const PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]),
                     uint64_t(n.shape[3])};
    const std::string body = gl::unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}}, "    ") +
                             "    int a = window_argmax(p, oh, ow);\n"
                             "    Y[i] = a < 0 ? uintBitsToFloat(0xff800000u) : X[uint(a)];\n";
    return gl::one_kernel(gl::elementwise(
        "max_pool2d", "conv max_pool2d " + key + ": an invocation per output",
        conv_buffers({"X"}) + argmax_fn(w, d), body, d.NC * d.OH * d.OW, conv_bindings(1), ctx.caps));
  }
  // max_pool2d_grad(x, dy) -> dx: each input element collects dy of the windows whose argmax it is.
  const Shape& ys = ctx.input(1).shape;
  const PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]),
                   uint64_t(ys[3])};
  const std::string tap = "        if (window_argmax(p, oh, ow) == int(i)) acc += DY[(p * " + u(d.OH) +
                          " + oh) * " + u(d.OW) + " + ow];\n";
  const std::string body = gl::unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}}, "    ") +
                           "    float acc = 0.0;\n" + containing_windows(w, d.OH, d.OW, tap, "    ") +
                           "    Y[i] = acc;\n";
  return gl::one_kernel(gl::elementwise(
      "max_pool2d_grad", "conv max_pool2d_grad " + key + ": an invocation per input",
      conv_buffers({"X", "DY"}) + argmax_fn(w, d), body, d.NC * d.H * d.W, conv_bindings(2), ctx.caps));
}

Lowering avg_pool(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const auto& k = n.attrs.ints("kernel");
  const Win w = window(n, uint64_t(k[0]), uint64_t(k[1]), false);
  const std::string div = avg_divisor(n, w);
  if (n.op == ir::Op::AvgPool2d) {
    const Shape& xs = ctx.input(0).shape;
    const PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(n.shape[2]),
                     uint64_t(n.shape[3])};
    const std::string body = gl::unflatten("i", {{"p", d.NC}, {"oh", d.OH}, {"ow", d.OW}}, "    ") +
                             "    uint pb = p * " + u(d.H * d.W) +
                             ";\n    float s = 0.0;\n    uint count = 0u;\n" +
                             window_loop(w, d, "        s += X[xi];\n        count += 1u;\n", "    ") +
                             "    Y[i] = s / " + div + ";\n";
    return gl::one_kernel(gl::elementwise(
        "avg_pool2d",
        "conv avg_pool2d x" + shape_str(xs) + " " + window_key(w) + ": an invocation per output",
        conv_buffers({"X"}), body, d.NC * d.OH * d.OW, conv_bindings(1), ctx.caps));
  }
  // avg_pool2d_grad(dy) -> dx [input_shape]: each input element collects dy / divisor of its windows.
  const Shape& ys = ctx.input(0).shape;
  const Shape& xs = n.shape;
  const PoolDims d{uint64_t(xs[0] * xs[1]), uint64_t(xs[2]), uint64_t(xs[3]), uint64_t(ys[2]),
                   uint64_t(ys[3])};
  const bool count_pad = n.attrs.i("count_include_pad") != 0;
  const std::string tap = std::string(count_pad ? "" : "        uint count = window_count(oh, ow);\n") +
                          "        acc += DY[(p * " + u(d.OH) + " + oh) * " + u(d.OW) + " + ow] / " + div +
                          ";\n";
  const std::string body = gl::unflatten("i", {{"p", d.NC}, {"ih", d.H}, {"iw", d.W}}, "    ") +
                           "    float acc = 0.0;\n" + containing_windows(w, d.OH, d.OW, tap, "    ") +
                           "    Y[i] = acc;\n";
  return gl::one_kernel(gl::elementwise(
      "avg_pool2d_grad",
      "conv avg_pool2d_grad x" + shape_str(xs) + " " + window_key(w) + ": an invocation per input",
      conv_buffers({"DY"}) + (count_pad ? "" : count_fn(w, d)), body, d.NC * d.H * d.W, conv_bindings(1),
      ctx.caps));
}

Lowering upsample(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const auto& s = n.attrs.ints("scale");
  const uint64_t sh = uint64_t(s[0]), sw = uint64_t(s[1]);
  const std::string scale = " scale " + std::to_string(sh) + "x" + std::to_string(sw);
  if (n.op == ir::Op::Upsample2d) {
    const Shape& xs = ctx.input(0).shape;
    const uint64_t NC = uint64_t(xs[0] * xs[1]), H = uint64_t(xs[2]), W = uint64_t(xs[3]);
    const uint64_t OH = uint64_t(n.shape[2]), OW = uint64_t(n.shape[3]);
    const std::string body = gl::unflatten("i", {{"p", NC}, {"oh", OH}, {"ow", OW}}, "    ") +
                             "    Y[i] = X[(p * " + u(H) + " + oh / " + u(sh) + ") * " + u(W) + " + ow / " +
                             u(sw) + "];\n";
    return gl::one_kernel(
        gl::elementwise("upsample_nearest2d",
                        "conv upsample_nearest2d x" + shape_str(xs) + scale + ": an invocation per output",
                        conv_buffers({"X"}), body, NC * OH * OW, conv_bindings(1), ctx.caps));
  }
  const Shape& ys = ctx.input(0).shape;
  const uint64_t NC = uint64_t(n.shape[0] * n.shape[1]), H = uint64_t(n.shape[2]), W = uint64_t(n.shape[3]);
  const uint64_t OH = uint64_t(ys[2]), OW = uint64_t(ys[3]);
  const std::string body =
      gl::render(R"(${COORDS}    float acc = 0.0;
    for (uint a = 0u; a < ${SH}; ++a) {
      uint oh = ih * ${SH} + a;
      if (oh >= ${OH}) break;
      for (uint c = 0u; c < ${SW}; ++c) {
        uint ow = iw * ${SW} + c;
        if (ow >= ${OW}) break;
        acc += DY[(p * ${OH} + oh) * ${OW} + ow];
      }
    }
    Y[i] = acc;
)",
                 {{"COORDS", gl::unflatten("i", {{"p", NC}, {"ih", H}, {"iw", W}}, "    ")},
                  {"SH", u(sh)},
                  {"OH", u(OH)},
                  {"SW", u(sw)},
                  {"OW", u(OW)}});
  return gl::one_kernel(
      gl::elementwise("upsample_nearest2d_grad",
                      "conv upsample_nearest2d_grad dy" + shape_str(ys) + scale + ": an invocation per input",
                      conv_buffers({"DY"}), body, NC * H * W, conv_bindings(1), ctx.caps));
}

}  // namespace mgn::codegen
