// What the convolution-family generators share (helper-private): windows, convolution geometry, buffer
// layouts and the window loops of the direct kernels and pooling. NCHW, padding [top, left, bottom, right];
// the semantics are those of the CPU reference (src/backend/cpu/kernels_conv.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen {

// A sliding window: taps, stride, padding (top, left), dilation.
struct Win {
  uint64_t kh, kw, sh, sw, pt, pl, dh, dw;
};
Win window(const ir::Node& n, uint64_t kh, uint64_t kw, bool dilation);

struct ConvDims {
  uint64_t N, C, H, W, O, Cg, KH, KW, OH, OW, groups, Og;
};
ConvDims conv_dims(const ir::Node& n, const Shape& xs, const Shape& ws, const Shape& ys);
// The geometry every conv kernel bakes in, as named GLSL constants.
std::string conv_constants(const ConvDims& d, const Win& w);

// The specialization key of a convolution kernel: x, w and y dims, stride, padding, dilation, groups.
std::string conv_key(const ConvDims& d, const Win& w);
// A window's key: taps, stride, padding, dilation.
std::string window_key(const Win& w);

// Buffers `inputs` (read, bindings 0..) then Y (written), and the matching bindings.
std::string conv_buffers(const std::vector<std::string>& inputs);
std::vector<Binding> conv_bindings(size_t n_inputs);

// Loops (at `indent`) over the taps (ki, kj) of the window at output (oh, ow) that lie inside an H x W
// input, declaring `int ih, iw`; `body` runs for each.
std::string window_taps(const Win& w, uint64_t H, uint64_t W, const std::string& body,
                        const std::string& indent);
// Loops (at `indent`) over the windows (oh, ow) of an OH x OW output that contain input element (ih, iw),
// with the tap (ki, kj) that reads it; `body` runs for each.
std::string containing_windows(const Win& w, uint64_t OH, uint64_t OW, const std::string& body,
                               const std::string& indent);

// The kernels, by family (conv_direct.cpp, conv_implicit_gemm.cpp, pooling.cpp).
Lowering conv_forward_direct(const LowerContext& ctx, const ConvDims& d, const Win& w);
Lowering conv_grad_input_direct(const LowerContext& ctx, const ConvDims& d, const Win& w);
Lowering conv_grad_weight_direct(const LowerContext& ctx, const ConvDims& d, const Win& w);
Lowering conv_forward(const LowerContext& ctx);
Lowering conv_grad_input(const LowerContext& ctx);
Lowering conv_grad_weight(const LowerContext& ctx);
Lowering max_pool(const LowerContext& ctx);
Lowering avg_pool(const LowerContext& ctx);
Lowering upsample(const LowerContext& ctx);

}  // namespace mgn::codegen
