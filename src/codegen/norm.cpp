// layer_norm / rms_norm / group_norm / batch_norm (training statistics) and their input derivatives.
//
// Every norm partitions x into statistic groups of M elements (see the CPU reference kernels_norm.cpp):
//   layer/rms  x [..., F]:    a row of the last axis        element j of group g: g*F + j
//   group      x [N, C, ...]: one (n, channel group)        g*M + j (a group is contiguous)
//   batch      x [N, C, ...]: one channel over N, spatial   (j/S * C + g) * S + j%S
// One workgroup owns one group: it reduces the mean, then the variance around it (two passes: the one-pass
// E[x²]-E[x]² loses digits when |mean| >> std), then writes every element. The *_grad kernels add one more
// pass for mean(g) and mean(g·x̂) (g = dy·weight) and write dx = rstd·(g - mean(g) - x̂·mean(g·x̂));
// rms: dx = r·g - x·r³·mean(g·x).
#include <string>

#include "codegen/glsl.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using gl::u;

enum class Kind { Layer, Rms, Group, Batch };

}  // namespace

Lowering lower_norm(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  Kind kind = Kind::Layer;
  bool grad = false;
  // clang-format off
  switch (n.op) {
    case ir::Op::LayerNorm: kind = Kind::Layer; break;
    case ir::Op::RmsNorm: kind = Kind::Rms; break;
    case ir::Op::GroupNorm: kind = Kind::Group; break;
    case ir::Op::BatchNorm: kind = Kind::Batch; break;
    case ir::Op::LayerNormGrad: kind = Kind::Layer, grad = true; break;
    case ir::Op::RmsNormGrad: kind = Kind::Rms, grad = true; break;
    case ir::Op::GroupNormGrad: kind = Kind::Group, grad = true; break;
    case ir::Op::BatchNormGrad: kind = Kind::Batch, grad = true; break;
#define MGN_FAMILY_Norm
#include "codegen/other_ops.inc"
      throw Error(ctx.graph.describe(n.id) + ": not a norm op");
  }
  // clang-format on
  const Shape& x = ctx.input(0).shape;
  const uint64_t total = gl::numel_u(x);
  uint64_t feat, spatial = 1, groups, m;
  if (kind == Kind::Layer || kind == Kind::Rms) {
    feat = uint64_t(x.back());
    groups = feat ? total / feat : 0;
    m = feat;
  } else {
    feat = uint64_t(x[1]);
    for (size_t i = 2; i < x.size(); ++i) spatial *= uint64_t(x[i]);
    if (kind == Kind::Group) {
      uint64_t cg = uint64_t(n.attrs.i("groups"));
      groups = uint64_t(x[0]) * cg;
      m = feat / cg * spatial;
    } else {
      groups = feat;
      m = uint64_t(x[0]) * spatial;
    }
  }
  if (total == 0) return {};
  const double eps = n.attrs.f("eps");
  const size_t n_in = n.inputs.size();
  // Inputs: forward (x [, weight [, bias]]); grad (x, dy [, weight]).
  const bool has_w = grad ? n_in > 2 : n_in > 1;
  const bool has_b = !grad && n_in > 2;
  const int w_binding = grad ? 2 : 1;

  // Threads per group: enough to cover M without idling most of a big workgroup on a short row.
  uint32_t wg = 32;
  while (wg < 256 && wg < m && wg * 2 <= ctx.caps.max_workgroup_invocations) wg *= 2;

  Kernel k;
  k.name = std::string(ir::op_name(n.op)) + "_wg" + std::to_string(wg);
  const gl::Grid grid = gl::flat_groups(groups, ctx.caps, k.name);
  std::string buffers = gl::buffer(0, "X", DType::F32, true);
  if (grad) buffers += gl::buffer(1, "DY", DType::F32, true);
  if (has_w) buffers += gl::buffer(w_binding, "W", DType::F32, true);
  if (has_b) buffers += gl::buffer(2, "Bias", DType::F32, true);
  buffers += gl::buffer(int(n_in), "Y", DType::F32, false, true);
  // Flat index of element j of group `grp`, and the feature (weight index) of a flat index.
  const std::string elem = kind == Kind::Batch ? "((j / " + u(spatial) + ") * " + u(feat) + " + grp) * " +
                                                     u(spatial) + " + j % " + u(spatial)
                                               : "grp * " + u(m) + " + j";
  const std::string feature =
      kind == Kind::Layer || kind == Kind::Rms ? "f % " + u(feat) : "(f / " + u(spatial) + ") % " + u(feat);
  // The loop over this thread's elements of the group: `f` is the flat index.
  const std::string loop =
      "  for (uint j = t; j < " + u(m) + "; j += " + u(wg) + ") {\n    uint f = elem(gid, j);\n";
  // The mean is taken around the group's first element: with |mean| >> std a plain f32 sum of x rounds
  // away digits of the deviations that the normalized output depends on. rms has none.
  const std::string mean = kind == Kind::Rms
                               ? "  float mean = 0.0;\n"
                               : "  float shift = X[elem(gid, 0u)];\n  float s = 0.0;\n" + loop +
                                     "    s += X[f] - shift;\n  }\n"
                                     "  float mean = shift + reduce2(s, 0.0).x * inv_m;\n";
  const std::string wv = has_w ? " * W[feature(f)]" : "";
  std::string out;
  if (!grad) {
    out = loop + "    Y[f] = (X[f] - mean) * rstd" + wv + (has_b ? " + Bias[feature(f)]" : "") + ";\n  }\n";
  } else {
    out = "  float sg = 0.0, sgx = 0.0;\n" + loop + "    float gv = DY[f]" + wv + ";\n";
    out += kind == Kind::Rms ? "    sg += gv;\n    sgx += gv * X[f];\n  }\n"
                             : "    sg += gv;\n    sgx += gv * (X[f] - mean) * rstd;\n  }\n";
    out += "  vec2 means = reduce2(sg, sgx) * inv_m;\n";
    out += loop + "    float gv = DY[f]" + wv + ";\n";
    out += kind == Kind::Rms ? "    Y[f] = rstd * gv - X[f] * rstd * rstd * rstd * means.y;\n  }\n"
                             : "    Y[f] = rstd * (gv - means.x - (X[f] - mean) * rstd * means.y);\n  }\n";
  }
  // reduce2 sums v0 and v1 over the workgroup (both at once: the grad pass needs two sums).
  k.glsl = gl::render(
      R"(#version 450
// archetype: norm ${OP}: one workgroup per statistic group, ${G} groups of ${M} elements
layout(local_size_x = ${WG}) in;
${BUFFERS}shared float red0[${WG}];
shared float red1[${WG}];
vec2 reduce2(float v0, float v1) {
  uint t = gl_LocalInvocationID.x;
  red0[t] = v0;
  red1[t] = v1;
  barrier();
${REDUCE}  vec2 r = vec2(red0[0], red1[0]);
  barrier();
  return r;
}
uint elem(uint grp, uint j) { return ${ELEM}; }
uint feature(uint f) { return ${FEATURE}; }
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  const float inv_m = 1.0 / float(${MU});
${MEAN}  float q = 0.0;
${LOOP}    float d = X[f] - mean;
    q += d * d;
  }
  float rstd = inversesqrt(reduce2(q, 0.0).x * inv_m + ${EPS});
${OUT}}
)",
      {{"OP", ir::op_name(n.op)},
       {"G", std::to_string(groups)},
       {"M", std::to_string(m)},
       {"WG", std::to_string(wg)},
       {"BUFFERS", buffers},
       {"REDUCE", gl::tree_reduce(wg, " { red0[t] += red0[t + s]; red1[t] += red1[t + s]; }", "  ")},
       {"ELEM", elem},
       {"FEATURE", feature},
       {"GRID", grid.glsl},
       {"MU", u(m)},
       {"MEAN", mean},
       {"LOOP", loop},
       {"EPS", gl::flit(eps)},
       {"OUT", out}});
  for (size_t i = 0; i < n_in; ++i) k.bindings.push_back(gl::input(int(i)));
  k.bindings.push_back(gl::output());
  k.groups = grid.groups;
  return gl::one_kernel(std::move(k));
}

}  // namespace mgn::codegen
