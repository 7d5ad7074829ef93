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

#include "codegen/kernels_common.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using detail::u;

enum class Kind { Layer, Rms, Group, Batch };

}  // namespace

Lowering lower_norm(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  Kind kind;
  bool grad = false;
  switch (n.op) {
    case ir::Op::LayerNorm: kind = Kind::Layer; break;
    case ir::Op::RmsNorm: kind = Kind::Rms; break;
    case ir::Op::GroupNorm: kind = Kind::Group; break;
    case ir::Op::BatchNorm: kind = Kind::Batch; break;
    case ir::Op::LayerNormGrad: kind = Kind::Layer, grad = true; break;
    case ir::Op::RmsNormGrad: kind = Kind::Rms, grad = true; break;
    case ir::Op::GroupNormGrad: kind = Kind::Group, grad = true; break;
    case ir::Op::BatchNormGrad: kind = Kind::Batch, grad = true; break;
    default: throw Error(ctx.graph.describe(n.id) + ": not a norm op");
  }
  const Shape& x = ctx.input(0).shape;
  const uint64_t total = detail::numel_u(x);
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

  std::string g = "#version 450\n// " + std::string(ir::op_name(n.op)) + ": one workgroup per statistic group\n";
  g += "layout(local_size_x = " + std::to_string(wg) + ") in;\n";
  g += detail::buffer_decl(0, "X", false);
  if (grad) g += detail::buffer_decl(1, "DY", false);
  if (has_w) g += detail::buffer_decl(w_binding, "W", false);
  if (has_b) g += detail::buffer_decl(2, "Bias", false);
  const int out_binding = int(n_in);
  g += detail::buffer_decl(out_binding, "Y", true, false);
  g += "shared float red0[" + std::to_string(wg) + "];\nshared float red1[" + std::to_string(wg) + "];\n";
  // Sums v0 and v1 over the workgroup (both at once: the grad pass needs two sums).
  g += "vec2 reduce2(float v0, float v1) {\n  uint t = gl_LocalInvocationID.x;\n  red0[t] = v0;\n  red1[t] = v1;\n"
       "  barrier();\n  for (uint w = " + u(wg / 2) + "; w > 0u; w >>= 1) {\n"
       "    if (t < w) { red0[t] += red0[t + w]; red1[t] += red1[t + w]; }\n    barrier();\n  }\n"
       "  vec2 r = vec2(red0[0], red1[0]);\n  barrier();\n  return r;\n}\n";
  // Flat index of element j of group `grp`, and the feature (weight index) of a flat index.
  if (kind == Kind::Batch)
    g += "uint elem(uint grp, uint j) { return ((j / " + u(spatial) + ") * " + u(feat) + " + grp) * " +
         u(spatial) + " + j % " + u(spatial) + "; }\n";
  else
    g += "uint elem(uint grp, uint j) { return grp * " + u(m) + " + j; }\n";
  if (kind == Kind::Layer || kind == Kind::Rms)
    g += "uint feature(uint f) { return f % " + u(feat) + "; }\n";
  else
    g += "uint feature(uint f) { return (f / " + u(spatial) + ") % " + u(feat) + "; }\n";

  detail::Grid grid = detail::flat_grid(groups, ctx.caps);
  g += "void main() {\n" + grid.glsl;
  g += "  uint t = gl_LocalInvocationID.x;\n";
  g += "  const float inv_m = 1.0 / float(" + u(m) + ");\n";
  const std::string loop = "  for (uint j = t; j < " + u(m) + "; j += " + u(wg) + ") {\n    uint f = elem(gid, j);\n";
  if (kind == Kind::Rms) {
    g += "  float mean = 0.0;\n";
  } else {
    // The sum is taken around the group's first element: with |mean| >> std a plain f32 sum of x rounds
    // away digits of the deviations that the normalized output depends on.
    g += "  float shift = X[elem(gid, 0u)];\n  float s = 0.0;\n" + loop + "    s += X[f] - shift;\n  }\n"
         "  float mean = shift + reduce2(s, 0.0).x * inv_m;\n";
  }
  g += "  float q = 0.0;\n" + loop + "    float d = X[f] - mean;\n    q += d * d;\n  }\n";
  g += "  float rstd = inversesqrt(reduce2(q, 0.0).x * inv_m + " + detail::flit(eps) + ");\n";
  const std::string wv = has_w ? " * W[feature(f)]" : "";
  if (!grad) {
    g += loop + "    Y[f] = (X[f] - mean) * rstd" + wv + (has_b ? " + Bias[feature(f)]" : "") + ";\n  }\n";
  } else {
    g += "  float sg = 0.0, sgx = 0.0;\n" + loop + "    float gv = DY[f]" + wv + ";\n";
    g += kind == Kind::Rms ? "    sg += gv;\n    sgx += gv * X[f];\n  }\n"
                           : "    sg += gv;\n    sgx += gv * (X[f] - mean) * rstd;\n  }\n";
    g += "  vec2 means = reduce2(sg, sgx) * inv_m;\n";
    g += loop + "    float gv = DY[f]" + wv + ";\n";
    g += kind == Kind::Rms ? "    Y[f] = rstd * gv - X[f] * rstd * rstd * rstd * means.y;\n  }\n"
                           : "    Y[f] = rstd * (gv - means.x - (X[f] - mean) * rstd * means.y);\n  }\n";
  }
  g += "}\n";

  Kernel k;
  k.name = std::string(ir::op_name(n.op)) + "_wg" + std::to_string(wg);
  k.glsl = g;
  for (size_t i = 0; i < n_in; ++i) k.bindings.push_back({BindingKind::Input, int(i), false});
  k.bindings.push_back({BindingKind::Output, 0, true});
  k.groups = grid.groups;
  Lowering l;
  l.kernels.push_back(std::move(k));
  return l;
}

}  // namespace mgn::codegen
