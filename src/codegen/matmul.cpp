// Batched matmul: c[b] = op(a[b']) · op(b[b'']) with numpy-broadcast batch axes and transpose flags.
//
// Two kernels:
//  * Tiled (SIMT, register-tiled): a workgroup owns a BM x BN block of C, stages BK-deep slices of A and B
//    through shared memory and each thread accumulates a TM x TN register tile. Edges are bounds-checked
//    loads (zero fill) and stores, so no shape needs to be a multiple of the tile.
//  * Small: for M or N tiny (GEMV-like, e.g. a single token's projection) a block tile would waste most of
//    its threads. Either one workgroup reduces K for one output (when the large operand is contiguous along
//    K, so the reads coalesce), or one thread computes one output (consecutive threads along the large
//    operand's contiguous axis).
#include "codegen/matmul.h"

#include <string>

#include "codegen/kernels_common.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using detail::u;

// Emits `uint aoff, boff` (word offsets of this batch's matrices) from the flat batch index `batch`.
std::string batch_offsets(const GemmShape& s) {
  std::string out = "  uint aoff = 0u, boff = 0u;\n  uint rest = batch;\n";
  for (size_t d = s.batch.size(); d-- > 0;) {
    if (s.batch[d] == 1) continue;
    out += "  { uint idx = rest % " + u(s.batch[d]) + "; rest /= " + u(s.batch[d]) + "; aoff += idx * " +
           u(s.a_stride[d] * s.m * s.k) + "; boff += idx * " + u(s.b_stride[d] * s.k * s.n) + "; }\n";
  }
  return out;
}

// GLSL index of A(m, k) and B(k, n) within one matrix, honoring the transposes.
std::string a_index(const GemmShape& s, const std::string& m, const std::string& k) {
  return s.transpose_a ? "(" + k + ") * " + u(s.m) + " + (" + m + ")" : "(" + m + ") * " + u(s.k) + " + (" + k + ")";
}
std::string b_index(const GemmShape& s, const std::string& k, const std::string& n) {
  return s.transpose_b ? "(" + n + ") * " + u(s.k) + " + (" + k + ")" : "(" + k + ") * " + u(s.n) + " + (" + n + ")";
}

uint64_t batch_count(const GemmShape& s) {
  uint64_t b = 1;
  for (uint64_t d : s.batch) b *= d;
  return b;
}

std::string decls() {
  return detail::buffer_decl(0, "A", false) + detail::buffer_decl(1, "B", false) +
         detail::buffer_decl(2, "C", true, false);
}

std::vector<Binding> gemm_bindings() {
  return {{BindingKind::Input, 0, false}, {BindingKind::Input, 1, false}, {BindingKind::Output, 0, true}};
}

struct TileConfig {
  uint32_t bm, bn, bk, tx, ty;  // block tile, K slice, threads (tx along N, ty along M)
};

// 128x128 blocks with 256 threads (8x8 registers each) when the product still has at least 256 such
// blocks to spread over the device (a big GPU has ~100+ compute units); otherwise 64x64 blocks (4x4 per
// thread), or 32x32 on devices limited to fewer than 256 invocations. The K slice doubles when shared
// memory allows it (fewer barriers per K).
TileConfig pick_tile(const GemmShape& s, const DeviceCaps& caps) {
  TileConfig t{64, 64, 16, 16, 16};
  uint64_t big_tiles = div_up(s.m, 128) * div_up(s.n, 128) * batch_count(s);
  if (caps.max_workgroup_invocations >= 256 && big_tiles >= 256) t = {128, 128, 8, 16, 16};
  if (caps.max_workgroup_invocations < 256) t = {32, 32, 16, 8, 8};
  auto shared_bytes = [](const TileConfig& c) { return 4u * c.bk * (c.bm + 1 + c.bn + 1); };
  if (t.bm <= 64 && shared_bytes({t.bm, t.bn, 32, t.tx, t.ty}) <= caps.max_shared_bytes / 2) t.bk = 32;
  if (t.bm == 128 && shared_bytes({t.bm, t.bn, 16, t.tx, t.ty}) <= caps.max_shared_bytes / 2) t.bk = 16;
  while (shared_bytes(t) > caps.max_shared_bytes && t.bk > 4) t.bk /= 2;
  return t;
}

Kernel tiled_kernel(const GemmShape& s, const DeviceCaps& caps) {
  const TileConfig t = pick_tile(s, caps);
  const uint32_t tm = t.bm / t.ty, tn = t.bn / t.tx, nt = t.tx * t.ty;
  const uint64_t tiles_m = div_up(s.m, t.bm), tiles_n = div_up(s.n, t.bn);
  const uint64_t total = tiles_m * tiles_n * batch_count(s);
  detail::Grid grid = detail::flat_grid(total, caps);
  const std::string BM = u(t.bm), BN = u(t.bn), BK = u(t.bk);

  std::string g = "#version 450\n";
  g += "// matmul tiled " + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" + std::to_string(t.bk) +
       ", " + std::to_string(tm) + "x" + std::to_string(tn) + " per thread\n";
  g += "layout(local_size_x = " + std::to_string(t.tx) + ", local_size_y = " + std::to_string(t.ty) + ") in;\n";
  g += decls();
  // +1 column: the loads below write along the k index, which would otherwise hit one bank.
  g += "shared float As[" + std::to_string(t.bk) + "][" + std::to_string(t.bm + 1) + "];\n";
  g += "shared float Bs[" + std::to_string(t.bk) + "][" + std::to_string(t.bn + 1) + "];\n";
  g += "void main() {\n" + grid.glsl;
  g += "  uint batch = gid / " + u(tiles_m * tiles_n) + ";\n";
  g += "  uint tile = gid % " + u(tiles_m * tiles_n) + ";\n";
  g += "  uint m0 = (tile / " + u(tiles_n) + ") * " + BM + ", n0 = (tile % " + u(tiles_n) + ") * " + BN + ";\n";
  g += batch_offsets(s);
  g += "  uint coff = batch * " + u(s.m * s.n) + ";\n";
  g += "  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y, tid = gl_LocalInvocationIndex;\n";
  g += "  float acc[" + std::to_string(tm) + "][" + std::to_string(tn) + "];\n";
  g += "  for (uint i = 0u; i < " + u(tm) + "; ++i)\n    for (uint j = 0u; j < " + u(tn) +
       "; ++j) acc[i][j] = 0.0;\n";
  g += "  for (uint k0 = 0u; k0 < " + u(s.k) + "; k0 += " + BK + ") {\n";
  // Consecutive threads walk the operand's contiguous axis so the global loads coalesce.
  g += "    for (uint e = tid; e < " + u(uint64_t(t.bm) * t.bk) + "; e += " + u(nt) + ") {\n";
  if (s.transpose_a)
    g += "      uint kk = e / " + BM + ", mm = e % " + BM + ";\n";
  else
    g += "      uint mm = e / " + BK + ", kk = e % " + BK + ";\n";
  g += "      uint m = m0 + mm, k = k0 + kk;\n";
  g += "      As[kk][mm] = (m < " + u(s.m) + " && k < " + u(s.k) + ") ? A[aoff + " + a_index(s, "m", "k") +
       "] : 0.0;\n    }\n";
  g += "    for (uint e = tid; e < " + u(uint64_t(t.bn) * t.bk) + "; e += " + u(nt) + ") {\n";
  if (s.transpose_b)
    g += "      uint nn = e / " + BK + ", kk = e % " + BK + ";\n";
  else
    g += "      uint kk = e / " + BN + ", nn = e % " + BN + ";\n";
  g += "      uint n = n0 + nn, k = k0 + kk;\n";
  g += "      Bs[kk][nn] = (n < " + u(s.n) + " && k < " + u(s.k) + ") ? B[boff + " + b_index(s, "k", "n") +
       "] : 0.0;\n    }\n";
  g += "    barrier();\n";
  g += "    for (uint kk = 0u; kk < " + BK + "; ++kk) {\n";
  g += "      float ar[" + std::to_string(tm) + "], br[" + std::to_string(tn) + "];\n";
  // Strided ownership (row ty + i*TY, column tx + j*TX): neighbours read neighbouring words of Bs and
  // write neighbouring words of C.
  g += "      for (uint i = 0u; i < " + u(tm) + "; ++i) ar[i] = As[kk][ty + i * " + u(t.ty) + "];\n";
  g += "      for (uint j = 0u; j < " + u(tn) + "; ++j) br[j] = Bs[kk][tx + j * " + u(t.tx) + "];\n";
  g += "      for (uint i = 0u; i < " + u(tm) + "; ++i)\n        for (uint j = 0u; j < " + u(tn) +
       "; ++j) acc[i][j] = fma(ar[i], br[j], acc[i][j]);\n";
  g += "    }\n    barrier();\n  }\n";
  g += "  for (uint i = 0u; i < " + u(tm) + "; ++i) {\n    uint m = m0 + ty + i * " + u(t.ty) + ";\n";
  g += "    if (m >= " + u(s.m) + ") break;\n";
  g += "    for (uint j = 0u; j < " + u(tn) + "; ++j) {\n      uint n = n0 + tx + j * " + u(t.tx) + ";\n";
  g += "      if (n < " + u(s.n) + ") C[coff + m * " + u(s.n) + " + n] = acc[i][j];\n    }\n  }\n}\n";

  Kernel k;
  k.name = "matmul_tiled_" + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" + std::to_string(t.bk) +
           "_t" + std::to_string(s.transpose_a) + std::to_string(s.transpose_b);
  k.glsl = g;
  k.bindings = gemm_bindings();
  k.groups = grid.groups;
  return k;
}

Kernel small_kernel(const GemmShape& s, const DeviceCaps& caps) {
  // The large operand decides the strategy: with M small it is B, with N small it is A.
  const bool b_large = s.m <= s.n;
  const bool large_contig_k = b_large ? s.transpose_b : !s.transpose_a;
  const uint64_t outs = s.m * s.n * batch_count(s);
  Kernel k;
  k.bindings = gemm_bindings();
  if (large_contig_k || s.k >= 4096) {
    // One workgroup per output: threads stride over K, then a shared-memory tree reduction.
    uint32_t wg = std::max<uint32_t>(32, std::min<uint32_t>(caps.subgroup_size * 2, 128));
    wg = std::min(wg, caps.max_workgroup_invocations);
    uint32_t p2 = 1;
    while (p2 * 2 <= wg) p2 *= 2;
    wg = p2;
    detail::Grid grid = detail::flat_grid(outs, caps);
    std::string g = "#version 450\n// matmul small: workgroup-per-output K reduction\n";
    g += "layout(local_size_x = " + std::to_string(wg) + ") in;\n" + decls();
    g += "shared float partial[" + std::to_string(wg) + "];\n";
    g += "void main() {\n" + grid.glsl;
    g += "  uint batch = gid / " + u(s.m * s.n) + ", mn = gid % " + u(s.m * s.n) + ";\n";
    g += "  uint m = mn / " + u(s.n) + ", n = mn % " + u(s.n) + ";\n";
    g += batch_offsets(s);
    g += "  float acc = 0.0;\n";
    g += "  for (uint k = gl_LocalInvocationID.x; k < " + u(s.k) + "; k += " + u(wg) + ")\n";
    g += "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " + b_index(s, "k", "n") + "], acc);\n";
    g += "  partial[gl_LocalInvocationID.x] = acc;\n  barrier();\n";
    g += "  for (uint w = " + u(wg / 2) + "; w > 0u; w >>= 1) {\n";
    g += "    if (gl_LocalInvocationID.x < w) partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + w];\n";
    g += "    barrier();\n  }\n";
    g += "  if (gl_LocalInvocationID.x == 0u) C[gid] = partial[0];\n}\n";
    k.name = "matmul_small_ksplit_t" + std::to_string(s.transpose_a) + std::to_string(s.transpose_b);
    k.glsl = g;
    k.groups = grid.groups;
    return k;
  }
  // One thread per output; consecutive threads take consecutive elements of the large operand's
  // contiguous axis (n for B, m for a transposed A).
  std::string body = b_large ? "  uint batch = i / " + u(s.m * s.n) + ", mn = i % " + u(s.m * s.n) +
                                   ";\n  uint m = mn / " + u(s.n) + ", n = mn % " + u(s.n) + ";\n"
                             : "  uint batch = i / " + u(s.m * s.n) + ", nm = i % " + u(s.m * s.n) +
                                   ";\n  uint n = nm / " + u(s.m) + ", m = nm % " + u(s.m) + ";\n";
  body += batch_offsets(s);
  body += "  float acc = 0.0;\n  for (uint k = 0u; k < " + u(s.k) + "; ++k)\n";
  body += "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " + b_index(s, "k", "n") + "], acc);\n";
  body += "  C[batch * " + u(s.m * s.n) + " + m * " + u(s.n) + " + n] = acc;\n";
  return detail::elementwise_kernel(
      "matmul_small_thread_t" + std::to_string(s.transpose_a) + std::to_string(s.transpose_b), decls(), body, outs,
      gemm_bindings(), caps);
}

}  // namespace

Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant) {
  if (s.a_stride.size() != s.batch.size() || s.b_stride.size() != s.batch.size())
    throw Error("matmul: batch strides do not match the batch rank");
  if (variant == GemmVariant::Auto) variant = (s.m <= 8 || s.n <= 8) ? GemmVariant::Small : GemmVariant::Tiled;
  Lowering l;
  if (s.k == 0) {  // empty contraction: C is all zeros
    l.output_zero_filled = true;
    return l;
  }
  l.kernels.push_back(variant == GemmVariant::Tiled ? tiled_kernel(s, caps) : small_kernel(s, caps));
  return l;
}

Lowering lower_matmul(const LowerContext& ctx) {
  const Shape& as = ctx.input(0).shape;
  const Shape& bs = ctx.input(1).shape;
  const Shape& out = ctx.node.shape;
  GemmShape s;
  s.transpose_a = ctx.node.attrs.i("transpose_a") != 0;
  s.transpose_b = ctx.node.attrs.i("transpose_b") != 0;
  s.m = uint64_t(out[out.size() - 2]);
  s.n = uint64_t(out.back());
  s.k = uint64_t(s.transpose_a ? as[as.size() - 2] : as.back());
  const size_t nb = out.size() - 2, na = as.size() - 2, nbb = bs.size() - 2;
  s.batch.assign(out.begin(), out.end() - 2);
  s.a_stride.assign(nb, 0);
  s.b_stride.assign(nb, 0);
  // Right-aligned broadcast: an operand's batch dim of size 1 (or missing) has stride 0.
  uint64_t sa = 1, sb = 1;
  for (size_t d = nb; d-- > 0;) {
    size_t off = nb - d;  // 1-based position from the right
    if (off <= na) {
      uint64_t dim = uint64_t(as[na - off]);
      s.a_stride[d] = dim == 1 ? 0 : sa;
      sa *= dim;
    }
    if (off <= nbb) {
      uint64_t dim = uint64_t(bs[nbb - off]);
      s.b_stride[d] = dim == 1 ? 0 : sb;
      sb *= dim;
    }
  }
  if (numel(out) == 0) return {};
  return lower_gemm(s, ctx.caps);
}

}  // namespace mgn::codegen
