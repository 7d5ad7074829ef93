// The direct convolution kernels, kept where the implicit GEMM (conv_implicit_gemm.cpp) would be one
// column wide: one output channel per group (depthwise and the like) for conv2d and conv2d_grad_weight, one
// input channel per group for conv2d_grad_input. conv2d and grad_input: one invocation per output / input
// element; grad_weight: one workgroup per (o, ci) reducing in shared memory (or per weight element for
// filters over 25 taps).
#include <string>

#include "codegen/conv_common.h"
#include "codegen/glsl.h"

namespace mgn::codegen {

using gl::u;

Lowering conv_forward_direct(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t items = d.N * d.O * d.OH * d.OW;
  const std::string tap = "          acc += X[xb + uint(ih) * " + u(d.W) + " + uint(iw)] * Wt[((o * " +
                          u(d.Cg) + " + ci) * " + u(d.KH) + " + ki) * " + u(d.KW) + " + kj];\n";
  const std::string body = gl::render(
      R"(${COORDS}    uint c0 = (o / ${OG}) * ${CG};
    float acc = 0.0;
    for (uint ci = 0u; ci < ${CG}; ++ci) {
      uint xb = (b * ${C} + c0 + ci) * ${HW};
${TAPS}    }
    Y[i] = acc;
)",
      {{"COORDS", gl::unflatten("i", {{"b", d.N}, {"o", d.O}, {"oh", d.OH}, {"ow", d.OW}}, "    ")},
       {"OG", u(d.Og)},
       {"CG", u(d.Cg)},
       {"C", u(d.C)},
       {"HW", u(d.H * d.W)},
       {"TAPS", window_taps(w, d.H, d.W, tap, "      ")}});
  return gl::one_kernel(gl::elementwise(
      "conv2d_direct", "conv conv2d_direct " + conv_key(d, w) + ": an invocation per output element",
      conv_buffers({"X", "Wt"}), body, items, conv_bindings(2), ctx.caps));
}

Lowering conv_grad_input_direct(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const std::string tap = gl::render(R"(        for (uint og = 0u; og < ${OG}; ++og) {
          uint o = grp * ${OG} + og;
          acc += DY[((b * ${O} + o) * ${OH} + oh) * ${OW} + ow] * Wt[((o * ${CG} + ci) * ${KH} + ki) * ${KW} + kj];
        }
)",
                                     {{"OG", u(d.Og)},
                                      {"O", u(d.O)},
                                      {"OH", u(d.OH)},
                                      {"OW", u(d.OW)},
                                      {"CG", u(d.Cg)},
                                      {"KH", u(d.KH)},
                                      {"KW", u(d.KW)}});
  const std::string body =
      gl::render(R"(${COORDS}    uint grp = c / ${CG};
    uint ci = c % ${CG};
    float acc = 0.0;
${WINDOWS}    Y[i] = acc;
)",
                 {{"COORDS", gl::unflatten("i", {{"b", d.N}, {"c", d.C}, {"ih", d.H}, {"iw", d.W}}, "    ")},
                  {"CG", u(d.Cg)},
                  {"WINDOWS", containing_windows(w, d.OH, d.OW, tap, "    ")}});
  return gl::one_kernel(
      gl::elementwise("conv2d_grad_input_direct",
                      "conv conv2d_grad_input_direct " + conv_key(d, w) + ": an invocation per input element",
                      conv_buffers({"DY", "Wt"}), body, d.N * d.C * d.H * d.W, conv_bindings(2), ctx.caps));
}

namespace {

// One workgroup per (o, ci) pair owns all KH×KW taps of that filter slice: each thread walks whole output
// rows (b, oh) so the inner loop over ow needs no division, loads each dy once for every tap, and keeps one
// accumulator per tap; a shared-memory tree then reduces each tap over the workgroup.
Lowering grad_weight_rows(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t taps = d.KH * d.KW, rows = d.N * d.OH;
  uint32_t wg = 32;
  while (wg < 128 && wg < rows && wg * 2 * taps * 4 <= ctx.caps.max_shared_bytes &&
         wg * 2 <= ctx.caps.max_workgroup_invocations)
    wg *= 2;
  Kernel k;
  k.name = "conv2d_grad_weight_rows_wg" + std::to_string(wg);
  const gl::Grid grid = gl::flat_groups(d.O * d.Cg, ctx.caps, k.name);
  const std::string tap =
      "          acc[ki * " + u(d.KW) + " + kj] += dv * X[xb + uint(ih) * " + u(d.W) + " + uint(iw)];\n";
  k.glsl =
      gl::render(R"(#version 450
// archetype: conv conv2d_grad_weight ${KEY}: one workgroup per (o, ci), all ${TAPS} taps, rows of dy split over the threads
layout(local_size_x = ${WG}) in;
${BUFFERS}shared float red[${RED}];
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint o = gid / ${CG};
  uint ci = gid % ${CG};
  uint c = (o / ${OG}) * ${CG} + ci;
  float acc[${TAPS}];
  for (uint k = 0u; k < ${TAPSU}; ++k) acc[k] = 0.0;
  for (uint r = t; r < ${ROWS}; r += ${WGU}) {
    uint b = r / ${OH};
    uint oh = r % ${OH};
    uint dyb = ((b * ${O} + o) * ${OH} + oh) * ${OW};
    uint xb = (b * ${C} + c) * ${HW};
    for (uint ow = 0u; ow < ${OW}; ++ow) {
      float dv = DY[dyb + ow];
${LOOP}    }
  }
  for (uint k = 0u; k < ${TAPSU}; ++k) red[k * ${WGU} + t] = acc[k];
  barrier();
${REDUCE}  for (uint k = t; k < ${TAPSU}; k += ${WGU}) Y[gid * ${TAPSU} + k] = red[k * ${WGU}];
}
)",
                 {{"KEY", conv_key(d, w)},
                  {"TAPS", std::to_string(taps)},
                  {"WG", std::to_string(wg)},
                  {"BUFFERS", conv_buffers({"X", "DY"})},
                  {"RED", std::to_string(wg * taps)},
                  {"GRID", grid.glsl},
                  {"CG", u(d.Cg)},
                  {"OG", u(d.Og)},
                  {"TAPSU", u(taps)},
                  {"ROWS", u(rows)},
                  {"WGU", u(wg)},
                  {"OH", u(d.OH)},
                  {"O", u(d.O)},
                  {"OW", u(d.OW)},
                  {"C", u(d.C)},
                  {"HW", u(d.H * d.W)},
                  {"LOOP", window_taps(w, d.H, d.W, tap, "      ")},
                  {"REDUCE", gl::tree_reduce(wg,
                                             "\n      for (uint k = 0u; k < " + u(taps) + "; ++k) red[k * " +
                                                 u(wg) + " + t] += red[k * " + u(wg) + " + t + s];",
                                             "  ")}});
  k.bindings = conv_bindings(2);
  k.groups = grid.groups;
  return gl::one_kernel(std::move(k));
}

// Large filters (the per-tap accumulators would not fit registers and shared memory): one workgroup per
// weight element.
Lowering grad_weight_elements(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  const uint64_t m = d.N * d.OH * d.OW;  // terms per weight element
  const uint64_t elems = d.O * d.Cg * d.KH * d.KW;
  uint32_t wg = 32;
  while (wg < 256 && wg < m && wg * 2 <= ctx.caps.max_workgroup_invocations) wg *= 2;
  Kernel k;
  k.name = "conv2d_grad_weight_wg" + std::to_string(wg);
  const gl::Grid grid = gl::flat_groups(elems, ctx.caps, k.name);
  k.glsl = gl::render(
      R"(#version 450
// archetype: conv conv2d_grad_weight ${KEY}: one workgroup per weight element, reducing dy * x over N x OH x OW
layout(local_size_x = ${WG}) in;
${BUFFERS}shared float red[${WG}];
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
${COORDS}  uint c = (o / ${OG}) * ${CG} + ci;
  float acc = 0.0;
  for (uint e = t; e < ${M}; e += ${WGU}) {
    uint ow = e % ${OW};
    uint oh = (e / ${OW}) % ${OH};
    uint b = e / ${OHW};
    int ih = int(oh * ${SH} + ki * ${DH}) - ${PT};
    int iw = int(ow * ${SW} + kj * ${DW}) - ${PL};
    if (ih < 0 || ih >= ${H} || iw < 0 || iw >= ${W}) continue;
    acc += DY[((b * ${O} + o) * ${OH} + oh) * ${OW} + ow] * X[((b * ${C} + c) * ${HU} + uint(ih)) * ${WU} + uint(iw)];
  }
  red[t] = acc;
  barrier();
${REDUCE}  if (t == 0u) Y[gid] = red[0];
}
)",
      {{"KEY", conv_key(d, w)},
       {"WG", std::to_string(wg)},
       {"BUFFERS", conv_buffers({"X", "DY"})},
       {"GRID", grid.glsl},
       {"COORDS", gl::unflatten("gid", {{"o", d.O}, {"ci", d.Cg}, {"ki", d.KH}, {"kj", d.KW}}, "  ")},
       {"OG", u(d.Og)},
       {"CG", u(d.Cg)},
       {"M", u(m)},
       {"WGU", u(wg)},
       {"OW", u(d.OW)},
       {"OH", u(d.OH)},
       {"OHW", u(d.OH * d.OW)},
       {"SH", u(w.sh)},
       {"DH", u(w.dh)},
       {"PT", std::to_string(w.pt)},
       {"SW", u(w.sw)},
       {"DW", u(w.dw)},
       {"PL", std::to_string(w.pl)},
       {"H", std::to_string(d.H)},
       {"W", std::to_string(d.W)},
       {"O", u(d.O)},
       {"C", u(d.C)},
       {"HU", u(d.H)},
       {"WU", u(d.W)},
       {"REDUCE", gl::tree_reduce(wg, " red[t] += red[t + s];", "  ")}});
  k.bindings = conv_bindings(2);
  k.groups = grid.groups;
  return gl::one_kernel(std::move(k));
}

}  // namespace

Lowering conv_grad_weight_direct(const LowerContext& ctx, const ConvDims& d, const Win& w) {
  if (d.KH * d.KW <= 25 && 32 * d.KH * d.KW * 4 <= ctx.caps.max_shared_bytes)
    return grad_weight_rows(ctx, d, w);
  return grad_weight_elements(ctx, d, w);
}

}  // namespace mgn::codegen
