// Exact power-of-two scaling of the f16 GEMM's operands (matmul_coopmat.h, KernelOptions::
// f16_operand_scaling). f16 covers 6e-8 (subnormal; 6.1e-5 normal) to 65504: gradients of a loss averaged
// over many values (~1e-6) lose most of their bits or flush to zero on the way into the GEMM, large
// activations overflow. So one pass before the packing kernels finds max |x| of each scaled operand:
// `groups_a + groups_b` workgroups of 256 (at most 256 per operand), each a strided share of one operand,
// write their maximum to the scale buffer. Each workgroup of a scaled packing kernel then reduces its
// operand's maxima itself (one word per invocation, coop_scale_prologue) to s = 2^(14 - e) for max |x| in
// [2^(e-1), 2^e) (the copy's largest value then lies in [2^13, 2^14), well inside f16), and workgroup 0 of the
// first scaled packing kernel writes 1 / (s_a * s_b) for the multiply's epilogue: no third dispatch.
// Maxima are taken over the f32 bit patterns with the sign cleared: ordered like the magnitudes, with every
// NaN above inf above every finite value, and order-independent (deterministic, no atomics). A max of 0 or
// non-finite gives s = 1, so zeros, NaN and inf reach the result as they would unscaled. The exponent shift is
// clamped to [-63, 63] so s, 1/s and 1 / (s_a * s_b) are normal f32 values: scaling and unscaling are exact.
#include <algorithm>
#include <string>

#include "codegen/glsl.h"
#include "codegen/matmul_coopmat.h"

namespace mgn::codegen {

using gl::u;

namespace {

constexpr uint32_t kScaleThreads = 256;

// The f32 values of an operand: all its matrices (the packing kernels' source).
uint64_t source_values(const PackedOperand& p) {
  return p.count * p.src_rows * p.src_cols;
}

// Workgroups of the max pass over n values: at least 16 vec4s (or floats) per thread, at most kScaleThreads
// groups (so that a packing workgroup reduces the maxima with one load per invocation).
uint64_t max_groups(uint64_t n) {
  const uint64_t items = n % 4 == 0 ? n / 4 : n;
  return std::clamp<uint64_t>(div_up(items, uint64_t(kScaleThreads) * 16), 1, kScaleThreads);
}

// Pass 1's loop over one operand: this workgroup's strided share, into `m`.
std::string share_loop(const std::string& x, uint64_t n, uint64_t groups, const std::string& g) {
  const bool v4 = n % 4 == 0;
  return gl::render(
      R"(    for (uint i = ${G} * ${NT}u + t; i < ${ITEMS}; i += ${STEP}) m = max(m, ${ABS});
)",
      {{"G", g},
       {"NT", su(kScaleThreads)},
       {"ITEMS", u(v4 ? n / 4 : n)},
       {"STEP", u(groups * kScaleThreads)},
       {"ABS", v4 ? "absmax4(" + x + "[i])" : "(floatBitsToUint(" + x + "[i]) & 0x7fffffffu)"}});
}

// A workgroup's tree reduction of `red` (max), leaving the result in red[0].
const char* kTreeMax = R"(  barrier();
  for (uint w = 128u; w > 0u; w >>= 1u) {
    if (t < w) red[t] = max(red[t], red[t + w]);
    barrier();
  }
)";

Kernel absmax_kernel(const GemmShape& s, const CoopConfig& c, const CoopScale& sc, const DeviceCaps& caps) {
  const uint64_t na = source_values(packed_a(s, c)), nb = source_values(packed_b(s, c));
  std::string decls;
  std::vector<Binding> bindings;
  if (sc.which.a) {
    decls += gl::buffer_as(int(bindings.size()), na % 4 == 0 ? "vec4" : "float", "XA", "readonly restrict ");
    bindings.push_back(gl::input(0));
  }
  if (sc.which.b) {
    decls += gl::buffer_as(int(bindings.size()), nb % 4 == 0 ? "vec4" : "float", "XB", "readonly restrict ");
    bindings.push_back(gl::input(1));
  }
  decls += gl::buffer_as(int(bindings.size()), "uint", "S", "writeonly restrict ");
  bindings.push_back({BindingKind::Scratch, sc.slot, true});
  const std::string name = "matmul_f16_absmax";
  const gl::Grid grid = gl::flat_groups(sc.groups_a + sc.groups_b, caps, name);
  std::string body;
  if (sc.which.a && sc.which.b)
    body = "  if (gid < " + u(sc.groups_a) + ") {\n" + share_loop("XA", na, sc.groups_a, "gid") +
           "  } else {\n" + share_loop("XB", nb, sc.groups_b, "(gid - " + u(sc.groups_a) + ")") + "  }\n";
  else
    body = "  {\n" + (sc.which.a ? share_loop("XA", na, sc.groups_a, "gid") : share_loop("XB", nb, sc.groups_b, "gid")) +
           "  }\n";
  Kernel k;
  k.name = name + std::string(sc.which.a ? "_a" : "") + (sc.which.b ? "_b" : "") + "_" + su(sc.groups_a) + "x" +
           su(sc.groups_b);
  k.glsl = gl::render(R"(#version 450
// archetype: matmul f16 operand scaling, pass 1 of 2: per-workgroup max |x| (as f32 bits, sign cleared) of
// ${WHICH} (${GA} + ${GB} workgroups), to the scale buffer after its ${HEAD}-word header
layout(local_size_x = ${NT}) in;
${DECLS}shared uint red[${NT}];
uint absmax4(vec4 v) {
  uvec4 b = floatBitsToUint(v) & uvec4(0x7fffffffu);
  return max(max(b.x, b.y), max(b.z, b.w));
}
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint m = 0u;
${BODY}  red[t] = m;
${TREE}  if (t == 0u) S[${HEAD}u + gid] = red[0];
}
)",
                      {{"WHICH", sc.which.a && sc.which.b ? "A and B" : sc.which.a ? "A" : "B"},
                       {"GA", su(sc.groups_a)},
                       {"GB", su(sc.groups_b)},
                       {"HEAD", su(kScaleHeaderWords)},
                       {"NT", su(kScaleThreads)},
                       {"DECLS", decls},
                       {"GRID", grid.glsl},
                       {"BODY", body},
                       {"TREE", kTreeMax}});
  k.bindings = std::move(bindings);
  k.groups = grid.groups;
  return k;
}

}  // namespace

CoopScale coop_scale(const GemmShape& s, const CoopConfig& c, F16Scaling which, int slot) {
  CoopScale sc;
  if (!which.any()) return sc;
  sc.which = which;
  sc.slot = slot;
  sc.groups_a = which.a ? max_groups(source_values(packed_a(s, c))) : 0;
  sc.groups_b = which.b ? max_groups(source_values(packed_b(s, c))) : 0;
  return sc;
}

std::vector<Kernel> coop_scale_kernels(const GemmShape& s, const CoopConfig& c, const CoopScale& sc,
                                       const DeviceCaps& caps) {
  if (!sc.on()) return {};
  return {absmax_kernel(s, c, sc, caps)};
}

std::string coop_scale_functions(uint32_t threads) {
  return gl::render(R"(shared uint scale_red[${NT}];
// The exponent shift k (s = 2^k) for a max given as f32 bits: max in [2^(E-127), 2^(E-126)) for a biased
// exponent E, so e = E - 126 and k = 14 - e; 0 for a max of 0 or not finite; clamped to [-63, 63].
int scale_shift(uint bits) {
  if (bits == 0u || bits >= 0x7f800000u) return 0;
  return clamp(140 - int(bits >> 23u), -63, 63);
}
// The workgroup's max of S[first .. first + count) (every invocation of the workgroup calls it).
uint scale_max(uint first, uint count) {
  uint t = gl_LocalInvocationID.x, m = 0u;
  for (uint j = t; j < count; j += ${NT}u) m = max(m, S[first + j]);
  barrier();
  scale_red[t] = m;
  barrier();
  for (uint w = ${HALF}u; w > 0u; w >>= 1u) {
    if (t < w) scale_red[t] = max(scale_red[t], scale_red[t + w]);
    barrier();
  }
  return scale_red[0];
}
)",
                    {{"NT", su(threads)}, {"HALF", su(threads / 2)}});
}

std::string coop_scale_prologue(const CoopScale& sc, bool a, bool writes_header) {
  std::string p;
  const std::string ma = "scale_max(" + su(kScaleHeaderWords) + "u, " + su(sc.groups_a) + "u)";
  const std::string mb = "scale_max(" + su(kScaleHeaderWords + sc.groups_a) + "u, " + su(sc.groups_b) + "u)";
  // A packing kernel that does not write the header needs its own operand's shift only.
  const bool need_a = sc.which.a && (a || writes_header), need_b = sc.which.b && (!a || writes_header);
  p += "  int ka = " + (need_a ? "scale_shift(" + ma + ")" : std::string("0")) + ";\n";
  p += "  int kb = " + (need_b ? "scale_shift(" + mb + ")" : std::string("0")) + ";\n";
  p += std::string("  float s = uintBitsToFloat(uint(127 + ") + (a ? "ka" : "kb") + ") << 23u);  // exact: 2^k\n";
  if (writes_header)
    p += R"(  if (gid == 0u && gl_LocalInvocationID.x == 0u) {  // for the multiply's epilogue
    S[0] = uint(127 + ka) << 23u;
    S[1] = uint(127 + kb) << 23u;
    S[2] = uint(127 - ka - kb) << 23u;
  }
)";
  return p;
}

}  // namespace mgn::codegen
