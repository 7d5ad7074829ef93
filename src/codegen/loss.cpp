// Loss archetype: cross-entropy over the last axis with ignore_index and label smoothing, reduced to a true
// scalar on the GPU (per-row losses in a workgroup each, then one workgroup sums rows in a fixed order), and
// its gradient. A label outside [0, C) that is not ignore_index makes the result NaN (the GPU cannot raise;
// the CPU reference throws).
#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::flit;
using gl::u;

struct Rows {
  uint64_t rows, classes;
};

Rows rows_of(const Shape& logits) {
  uint64_t c = uint64_t(logits.back());
  return {gl::numel_u(logits) / c, c};
}

// Statements computing, for row `row` of `z`, m (max), s (sum exp(z - m)) with the workgroup reductions.
std::string row_stats(const std::string& C, const std::string& W) {
  return "  uint base = row * " + C +
         ";\n  float m = uintBitsToFloat(0xff800000u);\n  for (uint c = t; c < " + C + "; c += " + W +
         ") { float e = z[base + c]; m = (isnan(m) || isnan(e)) ? mgn_nan() : max(m, e); }\n"
         "  m = wg_max(m);\n  float s = 0.0, sz = 0.0;\n  for (uint c = t; c < " +
         C + "; c += " + W +
         ") { float e = z[base + c]; s += exp(e - m); sz += e; }\n  s = wg_sum(s);\n  sz = wg_sum(sz);\n";
}

// One workgroup sums `count` values of a buffer in a fixed order; result in `total` on every thread.
std::string sum_rows(const std::string& buf, const std::string& count, const std::string& stride,
                     const std::string& offset, const std::string& W, const std::string& total) {
  return "  float " + total + " = 0.0;\n  for (uint r = t; r < " + count + "; r += " + W + ") " + total +
         " += " + buf + "[r * " + stride + " + " + offset + "];\n  " + total + " = wg_sum(" + total + ");\n";
}

std::string header(const std::string& what, uint32_t wg) {
  return "#version 450\n// archetype: loss " + what + "\nlayout(local_size_x = " + std::to_string(wg) +
         ") in;\n";
}

}  // namespace

Lowering lower_loss(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  const Shape& zs = ctx.input(0).shape;
  Rows r = rows_of(zs);
  gl::check_32bit(gl::numel_u(zs), ctx.graph.describe(n.id));
  const int64_t ignore = n.attrs.i("ignore_index");
  const double eps = n.attrs.f("label_smoothing");
  const std::string C = u(r.classes), R = u(r.rows), IGN = std::to_string(ignore);
  const std::string key = shape_str(zs) + " ignore " + IGN + " smoothing " + flit(eps);
  const uint32_t wg = gl::row_workgroup(r.classes, ctx.caps);
  const uint32_t wg_rows = gl::row_workgroup(r.rows, ctx.caps);
  const std::string W = u(wg), WR = u(wg_rows);
  const std::string lib = gl::math_lib();
  gl::Grid grid = gl::flat_groups(r.rows, ctx.caps, ctx.graph.describe(n.id));
  // label check shared by both: valid (counted) unless ignore_index; out of range poisons with NaN
  const std::string label = "  int y = labels[row];\n  bool counted = y != " + IGN +
                            ";\n  bool bad = counted && (y < 0 || y >= " + std::to_string(r.classes) + ");\n";
  Lowering l;
  if (n.op == ir::Op::CrossEntropy) {
    l.scratch_words = {2 * r.rows};  // per row: loss, counted (0/1)
    Kernel k1;
    k1.name = "xent_rows_" + shape_str(zs);
    k1.glsl = gl::render(
        R"(${HEADER}${BUFFERS}${LIB}void main() {
${GRID}  uint row = gid, t = gl_LocalInvocationID.x;
${STATS}${LABEL}  if (t != 0u) return;
  float lse = m + log(s);
  float loss = 0.0;
  if (bad) loss = mgn_nan();
  else if (counted)
    loss = ${KEEP} * (lse - z[base + uint(y)]) - ${EPS} * (sz - ${CLASSES} * lse) / ${CLASSES};
  part[2u * row] = loss;
  part[2u * row + 1u] = counted ? 1.0 : 0.0;
}
)",
        {{"HEADER", header("cross_entropy rows " + key + " workgroup-per-row", wg)},
         {"BUFFERS", gl::buffer(0, "z", DType::F32, true) + gl::buffer(1, "labels", DType::I32, true) +
                         gl::buffer(2, "part", DType::F32, false, true)},
         {"LIB", lib + gl::wg_reduce_lib(wg)},
         {"GRID", grid.glsl},
         {"STATS", row_stats(C, W)},
         {"LABEL", label},
         {"KEEP", flit(1.0 - eps)},
         {"EPS", flit(eps)},
         {"CLASSES", flit(double(r.classes))}});
    k1.bindings = {{BindingKind::Input, 0}, {BindingKind::Input, 1}, {BindingKind::Scratch, 0, true}};
    k1.groups = grid.groups;
    Kernel k2;
    k2.name = "xent_mean_" + shape_str(zs);
    k2.glsl = gl::render(R"(${HEADER}${BUFFERS}${LIB}void main() {
  uint t = gl_LocalInvocationID.x;
${TOTAL}${COUNT}  if (t == 0u) out_[0] = count > 0.0 ? total / count : mgn_nan();
}
)",
                         {{"HEADER", header("cross_entropy mean over " + R + " rows", wg_rows)},
                          {"BUFFERS", gl::buffer(0, "part", DType::F32, true) +
                                          gl::buffer(1, "out_", DType::F32, false, true)},
                          {"LIB", lib + gl::wg_reduce_lib(wg_rows)},
                          {"TOTAL", sum_rows("part", R, "2u", "0u", WR, "total")},
                          {"COUNT", sum_rows("part", R, "2u", "1u", WR, "count")}});
    k2.bindings = {{BindingKind::Scratch, 0}, {BindingKind::Output, 0, true}};
    k2.groups = {1, 1, 1};
    l.kernels = {std::move(k1), std::move(k2)};
    return l;
  }
  if (n.op != ir::Op::CrossEntropyGrad)
    throw Error("internal: " + ctx.graph.describe(n.id) + " is not a loss");
  l.scratch_words = {1};  // number of counted rows
  Kernel k1;
  k1.name = "xent_grad_count_" + shape_str(zs);
  k1.glsl = gl::render(
      R"(${HEADER}${BUFFERS}${LIB}void main() {
  uint t = gl_LocalInvocationID.x;
  float c = 0.0;
  for (uint r = t; r < ${R}; r += ${WR}) if (labels[r] != ${IGN}) c += 1.0;
  c = wg_sum(c);
  if (t == 0u) cnt[0] = c;
}
)",
      {{"HEADER", header("cross_entropy_grad count " + key, wg_rows)},
       {"BUFFERS", gl::buffer(0, "labels", DType::I32, true) + gl::buffer(1, "cnt", DType::F32, false, true)},
       {"LIB", lib + gl::wg_reduce_lib(wg_rows)},
       {"R", R},
       {"WR", WR},
       {"IGN", IGN}});
  k1.bindings = {{BindingKind::Input, 1}, {BindingKind::Scratch, 0, true}};
  k1.groups = {1, 1, 1};
  Kernel k2;
  k2.name = "xent_grad_" + shape_str(zs);
  k2.glsl = gl::render(
      R"(${HEADER}${BUFFERS}${LIB}void main() {
${GRID}  uint row = gid, t = gl_LocalInvocationID.x;
${STATS}${LABEL}  float scale = cnt[0] > 0.0 ? dl[0] / cnt[0] : 0.0;
  for (uint c = t; c < ${C}; c += ${W}) {
    float g = 0.0;
    if (bad) g = mgn_nan();
    else if (counted) {
      float p = exp(z[base + c] - m) / s;
      float target = (int(c) == y ? ${KEEP} : 0.0) + ${SPREAD};
      g = scale * (p - target);
    }
    dz[base + c] = g;
  }
}
)",
      {{"HEADER", header("cross_entropy_grad " + key + " workgroup-per-row", wg)},
       {"BUFFERS", gl::buffer(0, "z", DType::F32, true) + gl::buffer(1, "labels", DType::I32, true) +
                       gl::buffer(2, "dl", DType::F32, true) + gl::buffer(3, "cnt", DType::F32, true) +
                       gl::buffer(4, "dz", DType::F32, false, true)},
       {"LIB", lib + gl::wg_reduce_lib(wg)},
       {"GRID", grid.glsl},
       {"STATS", row_stats(C, W)},
       {"LABEL", label},
       {"C", C},
       {"W", W},
       {"KEEP", flit(1.0 - eps)},
       {"SPREAD", flit(eps / double(r.classes))}});
  k2.bindings = {{BindingKind::Input, 0},
                 {BindingKind::Input, 1},
                 {BindingKind::Input, 2},
                 {BindingKind::Scratch, 0},
                 {BindingKind::Output, 0, true}};
  k2.groups = grid.groups;
  l.kernels = {std::move(k1), std::move(k2)};
  return l;
}

}  // namespace mgn::codegen
