// matmul's f16 cooperative-matrix kernels (Accelerated nodes, once the device self-test passed).
//
// Two steps. First one pass per operand rounds it to f16 into a scratch copy, zero-padded to whole blocks
// (rows and columns of the operand's global layout rounded up to the block tile and K slice), packed
// 8 halves to a uvec4: the GEMM then reads half the bytes of the f32 operand, 16 bytes per load, with no
// bounds checks. Then the GEMM: BK-deep slices of both copies go global -> registers -> shared memory (one
// or two buffers) as uvec4s, and each subgroup multiplies its WM x WN tile with GL_NV_cooperative_matrix,
// accumulating in f32. Only the output stores of edge blocks check bounds.

#include <algorithm>
#include <string>

#include "codegen/gemm_tiled.h"
#include "codegen/glsl.h"
#include "codegen/matmul_common.h"

namespace mgn::codegen {
namespace {

using gl::u;

struct CoopConfig {
  uint32_t bm, bn, bk, wm, wn, group_m, buffers;
  uint32_t depth;    // K slices in flight in registers (1 or 2; 2 needs two shared buffers)
  uint32_t direct;   // bit 0: A's fragments load from global memory (no shared tile), bit 1: B's
  uint64_t k_chunk;  // K range of one split (a multiple of bk)
  uint64_t splits;   // > 1: partial products to scratch 2, then summed (split K)
  CoopMatShape mma;
  // GemmOptions::coopmat_ablate (mgn::GemmAblation), for the benchmark's time decomposition only (results
  // are wrong): "noload" keeps multiplying the first K slice (no global loads after it: the
  // multiply-and-shared-read ceiling); "nomma" drops the multiplies (global -> shared streaming alone);
  // "mmaonly" loads the first step's fragments once and only multiplies (the cooperative multiplies'
  // ceiling); "fragonly" reloads the first slice's fragments from shared memory every slice and multiplies,
  // with a shared-memory fence per slice instead of a barrier (noload minus the barriers).
  std::string ablate;
};

// An operand's f16 copy: `count` matrices of rows x cols halves (the global layout, padded), made from
// src_rows x src_cols f32 values.
struct PackedOperand {
  uint64_t count, rows, cols, src_rows, src_cols;
  uint64_t words() const { return count * rows * cols / 2; }
  uint64_t vec8() const { return rows * cols / 8; }  // uvec4s per matrix
};

uint64_t round_up(uint64_t v, uint64_t to) {
  return div_up(v, to) * to;
}

// Matrices of an operand: its batch strides are those of a packed array, so the last one is at
// sum((batch[d] - 1) * stride[d]).
uint64_t operand_matrices(const GemmShape& s, const std::vector<uint64_t>& stride) {
  uint64_t last = 0;
  for (size_t d = 0; d < s.batch.size(); ++d) last += (s.batch[d] - 1) * stride[d];
  return last + 1;
}

PackedOperand packed_a(const GemmShape& s, const CoopConfig& c) {
  const uint64_t n = operand_matrices(s, s.a_stride);
  if (s.transpose_a) return {n, round_up(s.k, c.bk), round_up(s.m, c.bm), s.k, s.m};
  return {n, round_up(s.m, c.bm), round_up(s.k, c.bk), s.m, s.k};
}
PackedOperand packed_b(const GemmShape& s, const CoopConfig& c) {
  const uint64_t n = operand_matrices(s, s.b_stride);
  if (s.transpose_b) return {n, round_up(s.n, c.bn), round_up(s.k, c.bk), s.n, s.k};
  return {n, round_up(s.k, c.bk), round_up(s.n, c.bn), s.k, s.n};
}

// Shared tiles keep the global layout ([m][k] or [k][m] for A, [k][n] or [n][k] for B), rows padded by
// 8 halves = 16 bytes so the cooperative loads' rows start on different banks and stay 16-byte aligned.
uint32_t coop_a_stride(const GemmShape& s, const CoopConfig& c) {
  return (s.transpose_a ? c.bm : c.bk) + 8;
}
uint32_t coop_b_stride(const GemmShape& s, const CoopConfig& c) {
  return (s.transpose_b ? c.bk : c.bn) + 8;
}
bool coop_direct_a(const CoopConfig& c) {
  return (c.direct & 1u) != 0;
}
bool coop_direct_b(const CoopConfig& c) {
  return (c.direct & 2u) != 0;
}
// Halves of one shared tile of an operand (0 for an operand read straight from global memory).
uint32_t coop_a_halves(const GemmShape& s, const CoopConfig& c) {
  return coop_direct_a(c) ? 0u : coop_a_stride(s, c) * (s.transpose_a ? c.bk : c.bm);
}
uint32_t coop_b_halves(const GemmShape& s, const CoopConfig& c) {
  return coop_direct_b(c) ? 0u : coop_b_stride(s, c) * (s.transpose_b ? c.bn : c.bk);
}
bool coop_direct_store(const GemmShape& s, const CoopConfig& c) {
  return s.m % c.bm == 0 && s.n % c.bn == 0;
}
// Edge blocks stage each f32 fragment through shared memory (a 4-byte-per-element tile per subgroup): in
// the A tiles, free once the K loop is done, when they are large enough, else in an array of its own.
uint32_t coop_staging_bytes(const CoopConfig& c) {
  return (c.bm / c.wm) * (c.bn / c.wn) * c.mma.m * c.mma.n * 4u;
}
bool coop_stage_in_a(const GemmShape& s, const CoopConfig& c) {
  return c.buffers * 2u * coop_a_halves(s, c) >= coop_staging_bytes(c);
}
// Shared bytes: `buffers` copies of each operand's tile, plus the edge staging tiles where they do not fit
// in the A tiles.
uint32_t coop_shared_bytes(const GemmShape& s, const CoopConfig& c) {
  return c.buffers * 2u * (coop_a_halves(s, c) + coop_b_halves(s, c)) +
         (coop_direct_store(s, c) || coop_stage_in_a(s, c) ? 0u : coop_staging_bytes(c));
}

// Auto: 128x128 blocks of 8 subgroups, each a 64x32 tile (4x2 multiplies of 16x16 per 16-deep step),
// BK = 32, two shared buffers; 64x64 blocks of 4 subgroups (32x32 each) when the grid of 128x128 blocks
// is small.
CoopConfig pick_coop(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                     const CoopMatShape& mma, GemmAblation ablation = GemmAblation::None) {
  CoopConfig c{};
  c.mma = mma;
  const uint64_t nb = batch_count(s);
  const bool small = div_up(s.m, 128) * div_up(s.n, 128) * nb < 128;
  c.bm = want.bm ? want.bm : (small ? 64 : 128);
  c.bn = want.bn ? want.bn : (small ? 64 : 128);
  c.bk = want.bk ? want.bk : 32;
  c.wm = want.wm ? want.wm : std::min<uint32_t>(c.bm, c.bm >= 128 ? 64 : 32);
  c.wn = want.wn ? want.wn : std::min<uint32_t>(c.bn, 32);
  c.group_m = want.group_m ? want.group_m : 8;
  c.buffers = want.buffers ? want.buffers : 2;
  c.depth = want.depth ? want.depth : 1;
  c.direct = want.direct >= 0 ? static_cast<uint32_t>(want.direct) : 0u;
  c.ablate = gemm_ablation_name(ablation);
  if ((c.ablate == "noload" || c.ablate == "mmaonly" || c.ablate == "fragonly") && c.direct)
    throw Error("f16 GEMM ablation " + c.ablate +
                " keeps shared tiles resident; it does not apply to operands read straight from global "
                "memory (the tile's d field)");
  auto bad = [](const std::string& what) { throw Error("f16 GEMM tile: " + what); };
  if (c.direct > 3) bad("d: a, b, ab or 0");
  if (c.bm % c.wm || c.bn % c.wn || c.wm % mma.m || c.wn % mma.n || c.bk % mma.k || c.bk % 8 || c.bm % 8 ||
      c.bn % 8)
    bad("block " + su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + " / subgroup tile " + su(c.wm) + "x" +
        su(c.wn) + " do not tile into " + su(mma.m) + "x" + su(mma.n) + "x" + su(mma.k) + " multiplies");
  if (c.buffers > 2) bad("b" + su(c.buffers) + ": one or two shared buffers");
  if (c.depth > 2 || (c.depth == 2 && c.buffers != 2))
    bad("p" + su(c.depth) + ": one or two slices in flight, two only with two shared buffers");
  const uint32_t threads = (c.bm / c.wm) * (c.bn / c.wn) * 32;
  if (threads > caps.max_workgroup_invocations) bad(su(threads) + " threads exceed the device limit");
  if (!want.bk)
    while (c.bk > mma.k && c.bk > 8 && coop_shared_bytes(s, c) > caps.max_shared_bytes) c.bk /= 2;
  if (coop_shared_bytes(s, c) > caps.max_shared_bytes)
    bad(su(coop_shared_bytes(s, c)) + " bytes of shared memory exceed the device's " +
        su(caps.max_shared_bytes));
  // Split K as the SIMT kernel does (the small-M, long-K shapes of a language model's head gradient).
  const uint64_t blocks = div_up(s.m, c.bm) * div_up(s.n, c.bn) * nb;
  const uint64_t splits = want.splits ? want.splits : auto_splits(s, blocks);
  c.k_chunk = div_up(div_up(s.k, splits), c.bk) * c.bk;
  c.splits = div_up(s.k, c.k_chunk);  // no empty split
  return c;
}

// One operand to its f16 copy (scratch `slot`): invocation i writes 8 halves of row r, columns 8c..8c+7,
// zero outside the src_rows x src_cols matrix.
Kernel coop_pack_kernel(const char* which, int input, int slot, const PackedOperand& p,
                        const DeviceCaps& caps) {
  const bool v4 = p.src_cols % 4 == 0;
  const uint64_t per_row = p.cols / 8, src_mat = p.src_rows * p.src_cols;
  std::string decls =
      gl::buffer_as(0, v4 ? "vec4" : "float", v4 ? "X4" : "X", "readonly restrict ") +
      gl::buffer_as(1, "uvec4", "P", "writeonly restrict ");
  std::string body = "  uint mat = i / " + u(p.vec8()) + ", rest = i % " + u(p.vec8()) + ";\n";
  body += "  uint r = rest / " + u(per_row) + ", c = (rest % " + u(per_row) + ") * 8u;\n";
  body += "  vec4 lo = vec4(0.0), hi = vec4(0.0);\n";
  body += "  if (r < " + u(p.src_rows) + ") {\n";
  body += "    uint src = mat * " + u(src_mat) + " + r * " + u(p.src_cols) + " + c;\n";
  if (v4) {
    // src_cols and c are multiples of 4: each vec4 lies wholly inside the row or wholly past its end.
    body += "    if (c < " + u(p.src_cols) + ") lo = X4[src >> 2];\n";
    body += "    if (c + 4u < " + u(p.src_cols) + ") hi = X4[(src >> 2) + 1u];\n";
  } else {
    body += "    for (uint q = 0u; q < 4u; ++q) {\n";
    body += "      if (c + q < " + u(p.src_cols) + ") lo[q] = X[src + q];\n";
    body += "      if (c + 4u + q < " + u(p.src_cols) + ") hi[q] = X[src + 4u + q];\n    }\n";
  }
  body += "  }\n";
  body +=
      "  P[i] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));\n";
  const std::string name = std::string("matmul_f16_pack_") + which + "_" + su(p.rows) + "x" + su(p.cols);
  return gl::elementwise(
      name, "matmul f16 copy of " + std::string(which) + ", zero-padded to whole blocks", decls, body,
      p.count * p.vec8(), {{BindingKind::Input, input, false}, {BindingKind::Scratch, slot, true}}, caps);
}

// `emulate`: the same kernel with every cooperative-matrix operation spelled out per invocation over
// virtual 32-lane subgroups (a fragment is its shared-memory offset; accumulators are 8 floats a lane),
// so a device without GL_NV_cooperative_matrix can check the tiling, staging and edge logic.
Kernel coop_kernel(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate) {
  const CoopMatShape& mma = c.mma;
  // The emulation is for tests on software devices, where unrolled code only costs JIT time.
  const std::string unroll = emulate ? "" : "[[unroll]] ";
  const uint32_t warps_n = c.bn / c.wn, warps = (c.bm / c.wm) * warps_n, nt = warps * 32;
  const uint32_t fi = c.wm / mma.m, fj = c.wn / mma.n, per_lane = mma.m * mma.n / 32;
  const uint64_t nb = batch_count(s), tiles_m = div_up(s.m, c.bm), tiles_n = div_up(s.n, c.bn);
  const uint64_t tiles = tiles_m * tiles_n;
  const bool split = c.splits > 1;
  const gl::Grid grid = gl::flat_groups(tiles * nb * c.splits, caps, "matmul_coopmat_f16");
  const uint32_t sa = coop_a_stride(s, c), sb = coop_b_stride(s, c);
  const uint32_t ah = coop_a_halves(s, c), bh = coop_b_halves(s, c);
  const PackedOperand pa = packed_a(s, c), pb = packed_b(s, c);
  const bool direct = coop_direct_store(s, c);
  const std::string key =
      su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + "_w" + su(c.wm) + "x" + su(c.wn) + "_m" + su(mma.m) + "x" +
      su(mma.n) + "x" + su(mma.k) + "_g" + su(c.group_m) + "_b" + su(c.buffers) + "_p" + su(c.depth) +
      (c.direct ? std::string("_d") + (coop_direct_a(c) ? "a" : "") + (coop_direct_b(c) ? "b" : "") : "") +
      (split ? "_s" + su(c.splits) : "") + (direct ? "" : "_edge") + "_t" + su(s.transpose_a) +
      su(s.transpose_b) + (c.ablate.empty() ? "" : "_ABLATED_" + c.ablate);

  std::string g = "#version 450\n#extension GL_EXT_control_flow_attributes : require\n";
  if (!emulate)
    g += "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
         "#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\n"
         "#extension GL_KHR_shader_subgroup_basic : require\n";
  g += std::string("// matmul f16 cooperative matrix") + (emulate ? " (EMULATED, for tests)" : "") + " " +
       key + ": f16 copies of A and B in, f32 accumulation\n";
  g += "// M=" + su(s.m) + " N=" + su(s.n) + " K=" + su(s.k) + " batch=" + su(nb) + "; " + su(warps) +
       " subgroups of 32, each " + su(c.wm) + "x" + su(c.wn) + " as " + su(fi) + "x" + su(fj) +
       " multiplies; " +
       (c.direct == 3 ? std::string("fragments straight from global memory, no shared tiles")
                      : su(c.buffers) + " shared buffer(s)" +
                            (c.direct ? std::string("; ") + (coop_direct_a(c) ? "A" : "B") +
                                            "'s fragments straight from global memory"
                                      : "")) +
       (split ? "; K split " + su(c.splits) + " ways of " + su(c.k_chunk) + " (partial products out)" : "") +
       "\n";
  g += "layout(local_size_x = " + su(nt) + ") in;\n";
  g += "// A16, B16: the operands' f16 copies, 8 halves per uvec4, " +
       std::string(s.transpose_a ? "[k][m]" : "[m][k]") + " " + su(pa.rows) + "x" + su(pa.cols) + " and " +
       (s.transpose_b ? "[n][k]" : "[k][n]") + " " + su(pb.rows) + "x" + su(pb.cols) +
       " halves per matrix (zero padding)\n";
  g += gl::buffer_as(0, "uvec4", "A16", "readonly restrict ") + gl::buffer_as(1, "uvec4", "B16", "readonly restrict ");
  g += "layout(std430, set = 0, binding = 2) buffer B2 { float C[]; };\n";
  g += "const uint M = " + u(s.m) + ", N = " + u(s.n) + ";\n";
  g += "const uint BM = " + u(c.bm) + ", BN = " + u(c.bn) + ", BK = " + u(c.bk) + ";\n";
  g += "const uint SA = " + u(sa) + ", SB = " + u(sb) + ";  // shared row strides in halves\n";
  g += "const uint GA = " + u(pa.cols) + ", GB = " + u(pb.cols) +
       ";  // the f16 copies' row strides in halves\n";
  g += std::string("// A tile ") + (s.transpose_a ? "[k][m]" : "[m][k]") + ", B tile " +
       (s.transpose_b ? "[n][k]" : "[k][n]") + " (the global layouts), 8 halves per uvec4\n";
  if (ah) g += "shared uvec4 As[" + su(c.buffers * ah / 8) + "];\n";
  if (bh) g += "shared uvec4 Bs[" + su(c.buffers * bh / 8) + "];\n";
  const bool stage_in_a = coop_stage_in_a(s, c);
  if (!direct && !stage_in_a) g += "shared float Cs[" + su(warps * mma.m * mma.n) + "];\n";
  const std::string MM = su(mma.m), MN = su(mma.n), MK = su(mma.k);
  const std::string tA = "fcoopmatNV<16, gl_ScopeSubgroup, " + MM + ", " + MK + ">";
  const std::string tB = "fcoopmatNV<16, gl_ScopeSubgroup, " + MK + ", " + MN + ">";
  const std::string tC = "fcoopmatNV<32, gl_ScopeSubgroup, " + MM + ", " + MN + ">";
  const uint64_t items_a = uint64_t(c.bm) * c.bk / 8, items_b = uint64_t(c.bn) * c.bk / 8;
  const uint64_t per_a = div_up(items_a, nt), per_b = div_up(items_b, nt);
  const bool da = coop_direct_a(c), db = coop_direct_b(c);
  for (uint32_t r = 0; r < c.depth; ++r) {
    if (!da) g += "uvec4 ra" + su(r) + "[" + su(per_a) + "];  // a K slice of A in flight\n";
    if (!db) g += "uvec4 rb" + su(r) + "[" + su(per_b) + "];  // a K slice of B in flight\n";
  }
  g += "uint tid, warp, lane, wm0, wn0, m0, n0, a_off, b_off;  // a_off, b_off in uvec4s\n";
  if (emulate) {
    g += "float acc[" + su(fi * fj) + "][" + su(per_lane) +
         "];  // lane's elements idx = lane + 32 * e, row-major\n";
    // Half h of a shared tile (8 halves per uvec4, 2 per word, the lower address in the low bits).
    for (const char* t : {da ? "A16" : "As", db ? "B16" : "Bs"})
      g += std::string("float half_") + t + "(uint h) {\n  vec2 v = unpackHalf2x16(" + t +
           "[h >> 3u][(h >> 1u) & 3u]);\n  return (h & 1u) != 0u ? v.y : v.x;\n}\n";
    // Row-major element (r, c) of a fragment at `off`: off + r * stride + c; column-major: off + c * stride +
    // r.
    g += "void mma_emul(uint ia, uint ib, uint fa, uint fb) {\n";
    g += "  " + unroll + "for (uint e = 0u; e < " + u(per_lane) + "; ++e) {\n";
    g += "    uint idx = lane + 32u * e, r = idx / " + u(mma.n) + ", cc = idx % " + u(mma.n) + ";\n";
    g += "    float sum = acc[ia * " + u(fj) + " + ib][e];\n";
    g += "    for (uint kk = 0u; kk < " + u(mma.k) + "; ++kk)\n";
    const std::string ra = da ? "half_A16" : "half_As", rs = da ? "GA" : "SA";
    const std::string rb = db ? "half_B16" : "half_Bs", rt = db ? "GB" : "SB";
    g += "      sum = fma(" + ra + "(fa + " +
         (s.transpose_a ? "kk * " + rs + " + r" : "r * " + rs + " + kk") + "), " + rb + "(fb + " +
         (s.transpose_b ? "cc * " + rt + " + kk" : "kk * " + rt + " + cc") + "), sum);\n";
    g += "    acc[ia * " + u(fj) + " + ib][e] = sum;\n  }\n}\n";
  } else {
    g += tC + " acc[" + su(fi * fj) + "];\n";
  }

  // Global -> registers -> shared: an item is 8 consecutive halves along the copy's contiguous axis.
  auto loader = [&](const std::string& name, bool contig_k, uint32_t outer_tile, const std::string& o0,
                    const PackedOperand& p, uint64_t items, uint64_t per, uint32_t stride, uint32_t halves) {
    const bool guard = items % nt != 0;
    const std::string src = name == "a" ? "A16" : "B16", dst = name == "a" ? "As" : "Bs";
    const uint64_t cols8 = p.cols / 8;
    auto coords = [&](const std::string& pad) {
      std::string t = pad + "uint e = tid + it * " + u(nt) + ";\n";
      if (contig_k)
        t += pad + "uint k8 = e % " + u(c.bk / 8) + ", o = e / " + u(c.bk / 8) + ";\n";
      else
        t += pad + "uint o8 = e % " + u(outer_tile / 8) + ", kk = e / " + u(outer_tile / 8) + ";\n";
      return t;
    };
    std::string t;
    for (uint32_t r = 0; r < c.depth; ++r) {
      const std::string set = su(r);
      t += "void load_" + name + set + "(uint k0) {\n";
      t += "  " + unroll + "for (uint it = 0u; it < " + u(per) + "; ++it) {\n" + coords("    ");
      if (guard) t += "    if (e >= " + u(items) + ") break;\n";
      t += "    r" + name + set + "[it] = " + src + "[" + name + "_off + " +
           (contig_k ? "(" + o0 + " + o) * " + u(cols8) + " + k0 / 8u + k8"
                     : "(k0 + kk) * " + u(cols8) + " + " + o0 + " / 8u + o8") +
           "];\n  }\n}\n";
      t += "void store_" + name + set + "(uint buf) {\n";
      t += "  " + unroll + "for (uint it = 0u; it < " + u(per) + "; ++it) {\n" + coords("    ");
      if (guard) t += "    if (e >= " + u(items) + ") break;\n";
      t += "    " + dst + "[buf * " + u(halves / 8) + " + " +
           (contig_k ? "o * " + u(stride / 8) + " + k8" : "kk * " + u(stride / 8) + " + o8") + "] = r" +
           name + set + "[it];\n  }\n}\n";
    }
    return t;
  };
  if (!da) g += loader("a", !s.transpose_a, c.bm, "m0", pa, items_a, per_a, sa, ah);
  if (!db) g += loader("b", s.transpose_b, c.bn, "n0", pb, items_b, per_b, sb, bh);

  // One subgroup's multiplies on shared buffer `buf`. Fragment (i, j) covers rows wm0 + i*MM and columns
  // wn0 + j*MN of the block; offsets in halves (multiples of 8).
  // A direct operand's fragment sits in its f16 copy: rows (m0 | n0) + wm0/wn0 + i*MM of the matrix, K
  // index k0 + kk, offsets in halves from the copy's start (a_off, b_off are in uvec4s).
  auto a_frag = [&](const std::string& i, const std::string& kk) {
    if (da)
      return s.transpose_a ? "(k0 + " + kk + ") * GA + m0 + wm0 + " + i + " * " + u(mma.m)
                           : "(m0 + wm0 + " + i + " * " + u(mma.m) + ") * GA + k0 + " + kk;
    return s.transpose_a ? kk + " * SA + wm0 + " + i + " * " + u(mma.m)
                         : "(wm0 + " + i + " * " + u(mma.m) + ") * SA + " + kk;
  };
  auto b_frag = [&](const std::string& j, const std::string& kk) {
    if (db)
      return s.transpose_b ? "(n0 + wn0 + " + j + " * " + u(mma.n) + ") * GB + k0 + " + kk
                           : "(k0 + " + kk + ") * GB + n0 + wn0 + " + j + " * " + u(mma.n);
    return s.transpose_b ? "(wn0 + " + j + " * " + u(mma.n) + ") * SB + " + kk
                         : kk + " * SB + wn0 + " + j + " * " + u(mma.n);
  };
  // Declares fa/fb and loads one multiply-K step's fragments (kk into the tiles at abase/bbase halves),
  // and the multiplies of one step: shared by compute() and the mmaonly ablation.
  auto frag_loads = [&](const std::string& ind, const std::string& abase, const std::string& bbase,
                        const std::string& kk) {
    std::string t = ind + tA + " fa[" + su(fi) + "];\n" + ind + tB + " fb[" + su(fj) + "];\n";
    t += ind + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
    t += ind + std::string("  coopMatLoadNV(fa[i], ") + (da ? "A16" : "As") + ", (" + abase + " + " +
         a_frag("i", kk) + ") / 8u, " + (da ? "GA" : "SA") + " / 8u, " + (s.transpose_a ? "true" : "false") +
         ");\n";
    t += ind + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j)\n";
    t += ind + std::string("  coopMatLoadNV(fb[j], ") + (db ? "B16" : "Bs") + ", (" + bbase + " + " +
         b_frag("j", kk) + ") / 8u, " + (db ? "GB" : "SB") + " / 8u, " + (s.transpose_b ? "true" : "false") +
         ");\n";
    return t;
  };
  auto step_mmas = [&](const std::string& ind, const std::string& abase, const std::string& bbase,
                       const std::string& kk) {
    std::string t = ind + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
    t += ind + "  " + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j)\n" + ind + "    ";
    if (emulate)
      t += "mma_emul(i, j, " + abase + " + " + a_frag("i", kk) + ", " + bbase + " + " + b_frag("j", kk) +
           ");\n";
    else if (c.ablate != "nomma")
      t += "acc[i * " + u(fj) + " + j] = coopMatMulAddNV(fa[i], fb[j], acc[i * " + u(fj) + " + j]);\n";
    else
      t += "{}  // ABLATED: no multiply\n";
    return t;
  };
  // Both operands direct with two steps in flight: fragment sets 0 and 1 alternate, so one multiply-K
  // step's loads are issued before the previous step's multiplies (software pipelining in registers); it
  // replaces compute() below.
  const bool frag_pipe = da && db && c.depth == 2;
  if (!frag_pipe) {
    g += "void compute(uint buf, uint k0) {\n";
    g += "  uint abase = " + (da ? std::string("a_off * 8u") : "buf * " + u(ah)) +
         ", bbase = " + (db ? std::string("b_off * 8u") : "buf * " + u(bh)) + ";\n";
    g += "  " + unroll + "for (uint kk = 0u; kk < BK; kk += " + u(mma.k) + ") {\n";
    if (!emulate) g += frag_loads("    ", "abase", "bbase", "kk");
    g += step_mmas("    ", "abase", "bbase", "kk");
    g += "  }\n}\n";
  } else {
    for (const char* set : {"0", "1"}) {
      const std::string S = set;
      if (emulate) {
        g +=
            "uint fa" + S + "[" + su(fi) + "], fb" + S + "[" + su(fj) + "];  // fragment offsets in halves\n";
      } else {
        g += tA + " fa" + S + "[" + su(fi) + "];\n" + tB + " fb" + S + "[" + su(fj) + "];\n";
      }
      // Operand X's fragments (fX<set>[idx], idx < count) at halves offset `frag` of its copy.
      auto load = [&](const std::string& x, const std::string& idx, uint32_t count, const std::string& frag,
                      bool transposed) {
        const std::string X = x == "a" ? "A" : "B", f = "f" + x + S + "[" + idx + "]";
        return "  " + unroll + "for (uint " + idx + " = 0u; " + idx + " < " + u(count) + "; ++" + idx +
               ")\n    " +
               (emulate ? f + " = " + x + "_off * 8u + " + frag + ";\n"
                        : "coopMatLoadNV(" + f + ", " + X + "16, " + x + "_off + (" + frag + ") / 8u, G" + X +
                              " / 8u, " + (transposed ? "true" : "false") + ");\n");
      };
      g += "void frags" + S + "(uint k0) {\n" + load("a", "i", fi, a_frag("i", "0u"), s.transpose_a) +
           load("b", "j", fj, b_frag("j", "0u"), s.transpose_b);
      g += "}\nvoid mma" + S + "() {\n";
      g += "  " + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
      g += "    " + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j)\n";
      if (emulate)
        g += "      mma_emul(i, j, fa" + S + "[i], fb" + S + "[j]);\n";
      else if (c.ablate != "nomma")
        g += "      acc[i * " + u(fj) + " + j] = coopMatMulAddNV(fa" + S + "[i], fb" + S + "[j], acc[i * " +
             u(fj) + " + j]);\n";
      else
        g += "      {}  // ABLATED: no multiply\n";
      g += "}\n";
    }
  }

  g += "void main() {\n" + grid.glsl;
  g += "  uint split = gid / " + u(tiles * nb) + ", batch = (gid / " + u(tiles) + ") % " + u(nb) +
       ", tile = gid % " + u(tiles) + ";\n";
  g += block_origin(TileOrder::RowMajor, tiles_m, tiles_n, c.group_m);
  // Which matrix of each copy this batch reads (broadcast operands have stride 0).
  g += "  uint amat = 0u, bmat = 0u, rest = batch;\n";
  for (size_t d = s.batch.size(); d-- > 0;) {
    if (s.batch[d] == 1) continue;
    g += "  { uint idx = rest % " + u(s.batch[d]) + "; rest /= " + u(s.batch[d]) + "; amat += idx * " +
         u(s.a_stride[d]) + "; bmat += idx * " + u(s.b_stride[d]) + "; }\n";
  }
  g += "  a_off = amat * " + u(pa.vec8()) + ";\n  b_off = bmat * " + u(pb.vec8()) + ";\n";
  g += "  tid = gl_LocalInvocationIndex;\n";
  g += emulate ? "  warp = tid / 32u;\n  lane = tid % 32u;\n"
               : "  warp = gl_SubgroupID;\n  lane = gl_SubgroupInvocationID;\n";
  g += "  wm0 = (warp / " + u(warps_n) + ") * " + u(c.wm) + ";\n  wn0 = (warp % " + u(warps_n) + ") * " +
       u(c.wn) + ";\n";
  if (emulate)
    g += "  " + unroll + "for (uint i = 0u; i < " + u(fi * fj) + "; ++i)\n    " + unroll +
         "for (uint e = 0u; e < " + u(per_lane) + "; ++e) acc[i][e] = 0.0;\n";
  else
    g += "  " + unroll + "for (uint i = 0u; i < " + u(fi * fj) + "; ++i) acc[i] = " + tC + "(0.0);\n";
  if (split)
    g += "  uint kbeg = split * " + u(c.k_chunk) + ";\n  uint ntiles = (min(" + u(c.k_chunk) + ", " + u(s.k) +
         " - kbeg) + BK - 1u) / BK;\n";
  else
    g += "  const uint kbeg = 0u, ntiles = " + u(div_up(s.k, c.bk)) + ";\n";
  // LOADS is false only in the "noload" ablation: every slice after the first is skipped.
  g += std::string("  const bool LOADS = ") + (c.ablate == "noload" ? "false;  // ABLATED\n" : "true;\n");
  // Only the operands staged through shared memory are fetched and put.
  auto fetch = [&](const std::string& set, const std::string& k0) {
    return (da ? "" : "load_a" + set + "(" + k0 + "); ") + (db ? "" : "load_b" + set + "(" + k0 + ");");
  };
  auto put = [&](const std::string& set, const std::string& buf) {
    return (da ? "" : "store_a" + set + "(" + buf + "); ") + (db ? "" : "store_b" + set + "(" + buf + ");");
  };
  if (c.ablate == "mmaonly") {
    // ABLATED: the first slice's fragments are loaded once; the loop then only multiplies (no loads, no
    // barriers), as many multiply-K steps as the real kernel makes. Its time is the ceiling of the driver's
    // cooperative multiplies at this subgroup tile, whatever feeds them.
    g += "  " + fetch("0", "kbeg") + "\n  " + put("0", "0u") + "\n  barrier();\n";
    if (!emulate) g += frag_loads("  ", "0u", "0u", "0u");
    g += "  for (uint st = 0u; st < ntiles * " + u(c.bk / mma.k) + "; ++st) {\n";
    g += step_mmas("    ", "0u", "0u", "0u") + "  }\n";
  } else if (c.ablate == "fragonly") {
    // ABLATED: the first slice stays in buffer 0; every slice reloads its fragments from there and multiplies
    // them, with no global loads, no stores and no barriers. The fence after each slice keeps the compiler
    // from hoisting the (otherwise loop-invariant) shared loads out of the loop; it synchronizes nothing.
    // Its time against noload's is the barriers' share.
    g += "  " + fetch("0", "kbeg") + "\n  " + put("0", "0u") + "\n  barrier();\n";
    g += "  for (uint t = 0u; t < ntiles; ++t) {\n    compute(0u, kbeg);\n    memoryBarrierShared();\n  }\n";
  } else if (frag_pipe) {
    // The copies are padded to whole slices, so every step of the split's ntiles slices is in bounds.
    g += "  uint steps = ntiles * " + u(c.bk / mma.k) + ", k = kbeg;\n";
    g += "  frags0(k);\n";
    g += "  for (uint st = 0u; st < steps; st += 2u, k += " + u(2 * mma.k) + ") {\n";
    g += "    if (st + 1u < steps) frags1(k + " + u(mma.k) + ");\n";
    g += "    mma0();\n";
    g += "    if (st + 1u >= steps) break;\n";
    g += "    if (st + 2u < steps) frags0(k + " + u(2 * mma.k) + ");\n";
    g += "    mma1();\n  }\n";
  } else if (da && db) {
    // No shared tiles: the subgroups run independently (no barrier), each reading its fragments from the
    // f16 copies through the caches.
    g += "  for (uint t = 0u; t < ntiles; ++t) compute(0u, kbeg + t * BK);\n";
  } else {
    g += "  " + fetch("0", "kbeg") + "\n  " + put("0", "0u") + "\n  barrier();\n";
  }
  if ((da && db) || c.ablate == "mmaonly" || c.ablate == "fragonly") {
  } else if (c.depth == 1) {
    // Slice t+1 is loaded into registers before slice t is multiplied. With two buffers it is stored to
    // the other one right after (whose last readers, slice t-1, all passed the previous barrier): one
    // barrier per slice. With one, everyone finishes reading it before it is overwritten: two.
    g += "  for (uint t = 0u; t < ntiles; ++t) {\n";
    g += "    bool more = LOADS && t + 1u < ntiles;\n";
    g += "    if (more) { " + fetch("0", "kbeg + (t + 1u) * BK") + " }\n";
    if (c.buffers == 2)
      g += "    uint cur = t & 1u;\n    compute(cur, kbeg + t * BK);\n    if (more) { " +
           put("0", "cur ^ 1u") + " }\n";
    else
      g += "    compute(0u, kbeg + t * BK);\n    barrier();\n    if (more) { " + put("0", "0u") + " }\n";
    g += "    barrier();\n  }\n";
  } else {
    // Two slices in flight: register set 0 holds the odd slices, set 1 the even ones (after slice 0), so
    // a slice's global loads are issued two multiplies before its store to shared memory needs them. Even
    // slices sit in buffer 0, odd ones in buffer 1; the loop body covers two slices so that every register
    // index is a constant.
    g += "  if (LOADS && ntiles > 1u) { " + fetch("0", "kbeg + BK") + " }\n";
    g += "  if (LOADS && ntiles > 2u) { " + fetch("1", "kbeg + 2u * BK") + " }\n";
    g += "  for (uint t = 0u; t < ntiles; t += 2u) {\n";
    g += "    compute(0u, kbeg + t * BK);\n";
    g += "    if (LOADS && t + 1u < ntiles) { " + put("0", "1u") + " }\n";
    g += "    barrier();\n";
    g += "    if (LOADS && t + 3u < ntiles) { " + fetch("0", "kbeg + (t + 3u) * BK") + " }\n";
    g += "    if (t + 1u >= ntiles) break;\n";
    g += "    compute(1u, kbeg + (t + 1u) * BK);\n";
    g += "    if (LOADS && t + 2u < ntiles) { " + put("1", "0u") + " }\n";
    g += "    barrier();\n";
    g += "    if (LOADS && t + 4u < ntiles) { " + fetch("1", "kbeg + (t + 4u) * BK") + " }\n";
    g += "  }\n";
  }
  // Split K: this split's partial product, [split][batch][m][n] in scratch 2.
  g += "  uint coff = " + (split ? "(split * " + u(nb) + " + batch)" : std::string("batch")) + " * " +
       u(s.m * s.n) + ";\n";
  if (direct && !emulate) {
    g += "  " + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
    g += "    " + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j)\n";
    g += "      coopMatStoreNV(acc[i * " + u(fj) + " + j], C, coff + (m0 + wm0 + i * " + u(mma.m) +
         ") * N + n0 + wn0 + j * " + u(mma.n) + ", N, false);\n";
  } else if (direct) {
    g += "  " + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
    g += "    " + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j)\n";
    g += "      " + unroll + "for (uint e = 0u; e < " + u(per_lane) + "; ++e) {\n";
    g += "        uint idx = lane + 32u * e;\n";
    g += "        C[coff + (m0 + wm0 + i * " + u(mma.m) + " + idx / " + u(mma.n) + ") * N + n0 + wn0 + j * " +
         u(mma.n) + " + idx % " + u(mma.n) + "] = acc[i * " + u(fj) + " + j][e];\n      }\n";
  } else {
    // Edge blocks: each fragment goes through the subgroup's staging tile, stored with bounds checks. The
    // tile is either Cs or, as raw f32 bits 4 to a uvec4, the A tiles (the K loop ended on a barrier).
    const std::string cs = "warp * " + u(mma.m * mma.n);
    auto staged = [&](const std::string& idx) {
      return stage_in_a ? "As[(" + idx + ") >> 2u][(" + idx + ") & 3u]" : "Cs[" + idx + "]";
    };
    if (stage_in_a) g += "  // edge staging in the A tiles: " + su(coop_staging_bytes(c)) + " bytes\n";
    g += "  " + unroll + "for (uint i = 0u; i < " + u(fi) + "; ++i)\n";
    g += "    " + unroll + "for (uint j = 0u; j < " + u(fj) + "; ++j) {\n";
    if (emulate)
      g += "      " + unroll + "for (uint e = 0u; e < " + u(per_lane) + "; ++e) " +
           staged(cs + " + lane + 32u * e") + " = " + (stage_in_a ? "floatBitsToUint(" : "(") + "acc[i * " +
           u(fj) + " + j][e]);\n";
    else if (stage_in_a)
      g += "      coopMatStoreNV(acc[i * " + u(fj) + " + j], As, (" + cs + ") / 4u, " + u(mma.n / 4) +
           ", false);\n";
    else
      g += "      coopMatStoreNV(acc[i * " + u(fj) + " + j], Cs, " + cs + ", " + u(mma.n) + ", false);\n";
    g += "      barrier();\n";
    g += "      " + unroll + "for (uint e = 0u; e < " + u(per_lane) + "; ++e) {\n";
    g += "        uint idx = lane + 32u * e;\n";
    g += "        uint m = m0 + wm0 + i * " + u(mma.m) + " + idx / " + u(mma.n) + ", n = n0 + wn0 + j * " +
         u(mma.n) + " + idx % " + u(mma.n) + ";\n";
    g += "        if (m < M && n < N) C[coff + m * N + n] = " +
         (stage_in_a ? "uintBitsToFloat(" + staged(cs + " + idx") + ")" : staged(cs + " + idx")) +
         ";\n      }\n";
    g += "      barrier();\n    }\n";
  }
  g += "}\n";

  Kernel k;
  k.name = std::string("matmul_coopmat_f16_") + (emulate ? "emul_" : "") + key;
  k.glsl = g;
  k.bindings = {{BindingKind::Scratch, 0, false},
                {BindingKind::Scratch, 1, false},
                split ? codegen::Binding{BindingKind::Scratch, 2, true}
                      : codegen::Binding{BindingKind::Output, 0, true}};
  k.groups = grid.groups;
  return k;
}

}  // namespace

// The whole f16 lowering: pack A, pack B (scratch 0 and 1), multiply.
Lowering coopmat_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want, const CoopMatShape& mma,
                      GemmAblation ablation, bool emulate) {
  const CoopConfig c = pick_coop(s, caps, want, mma, ablation);
  Lowering l;
  const PackedOperand pa = packed_a(s, c), pb = packed_b(s, c);
  l.scratch_words = {pa.words(), pb.words()};
  l.kernels.push_back(coop_pack_kernel("a", 0, 0, pa, caps));
  l.kernels.push_back(coop_pack_kernel("b", 1, 1, pb, caps));
  l.kernels.push_back(coop_kernel(s, caps, c, emulate));
  if (c.splits > 1) {
    const uint64_t outs = batch_count(s) * s.m * s.n;
    l.scratch_words.push_back(c.splits * outs);
    l.kernels.push_back(splitk_sum_kernel(c.splits, outs, 2, caps));
  }
  return l;
}


}  // namespace mgn::codegen
