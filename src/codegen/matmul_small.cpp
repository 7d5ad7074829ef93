// matmul's small kernels: for M or N tiny (GEMV-like, e.g. a single token's projection) a block tile would
// waste most of its threads. Either one workgroup reduces K for one output (when the large operand is
// contiguous along K, so the reads coalesce), or one thread computes one output (consecutive threads along
// the large operand's contiguous axis).
#include <algorithm>
#include <string>

#include "codegen/glsl.h"
#include "codegen/matmul_common.h"

namespace mgn::codegen {
namespace {

using gl::u;

std::string decls() {
  return gl::buffer(0, "A", DType::F32, true) + gl::buffer(1, "B", DType::F32, true) +
         gl::buffer(2, "C", DType::F32, false, true);
}

// acc = sum over k (in `loop`, which declares k) of A(m, k) * B(k, n), an fma chain.
std::string k_sum(const GemmShape& s, const std::string& loop) {
  return "  float acc = 0.0;\n" + loop + "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " +
         b_index(s, "k", "n") + "], acc);\n";
}

std::string transposes(const GemmShape& s) {
  return "t" + su(s.transpose_a) + su(s.transpose_b);
}

}  // namespace

Kernel small_gemm_kernel(const GemmShape& s, const DeviceCaps& caps) {
  // The large operand decides the strategy: with M small it is B, with N small it is A.
  const bool b_large = s.m <= s.n;
  const bool large_contig_k = b_large ? s.transpose_b : !s.transpose_a;
  const uint64_t outs = s.m * s.n * batch_count(s);
  const std::string MN = u(s.m * s.n);
  if (large_contig_k || s.k >= 4096) {
    // One workgroup per output: threads stride over K, then a shared-memory tree reduction.
    uint32_t wg = std::max<uint32_t>(32, std::min<uint32_t>(caps.subgroup_size * 2, 128));
    wg = std::min(wg, caps.max_workgroup_invocations);
    uint32_t p2 = 1;
    while (p2 * 2 <= wg) p2 *= 2;
    wg = p2;
    Kernel k;
    k.name = "matmul_small_ksplit_" + transposes(s);
    const gl::Grid grid = gl::flat_groups(outs, caps, k.name);
    k.glsl = gl::render(R"(#version 450
// archetype: matmul small ${T} ${DIMS}: workgroup-per-output K reduction
layout(local_size_x = ${WG}) in;
${DECLS}shared float partial[${WG}];
void main() {
${GRID}  uint t = gl_LocalInvocationID.x;
  uint batch = gid / ${MN}, mn = gid % ${MN};
  uint m = mn / ${N}, n = mn % ${N};
${OFFSETS}${SUM}  partial[t] = acc;
  barrier();
${REDUCE}  if (t == 0u) C[gid] = partial[0];
}
)",
                        {{"T", transposes(s)},
                         {"DIMS", gemm_dims(s)},
                         {"WG", std::to_string(wg)},
                         {"DECLS", decls()},
                         {"GRID", grid.glsl},
                         {"MN", MN},
                         {"N", u(s.n)},
                         {"OFFSETS", batch_offsets(s)},
                         {"SUM", k_sum(s, "  for (uint k = t; k < " + u(s.k) + "; k += " + u(wg) + ")\n")},
                         {"REDUCE", gl::tree_reduce(wg, " partial[t] += partial[t + s];", "  ")}});
    k.bindings = gemm_bindings();
    k.groups = grid.groups;
    return k;
  }
  // One thread per output; consecutive threads take consecutive elements of the large operand's
  // contiguous axis (n for B, m for a transposed A).
  const std::string coords = b_large ? "  uint batch = i / " + MN + ", mn = i % " + MN +
                                           ";\n  uint m = mn / " + u(s.n) + ", n = mn % " + u(s.n) + ";\n"
                                     : "  uint batch = i / " + MN + ", nm = i % " + MN +
                                           ";\n  uint n = nm / " + u(s.m) + ", m = nm % " + u(s.m) + ";\n";
  const std::string body = coords + batch_offsets(s) +
                           k_sum(s, "  for (uint k = 0u; k < " + u(s.k) + "; ++k)\n") + "  C[batch * " + MN +
                           " + m * " + u(s.n) + " + n] = acc;\n";
  return gl::elementwise("matmul_small_thread_" + transposes(s),
                         "matmul small " + transposes(s) + " " + gemm_dims(s) + ": thread-per-output K loop",
                         decls(), body, outs, gemm_bindings(), caps);
}

}  // namespace mgn::codegen
