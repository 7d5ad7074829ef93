// Batched matmul: c[b] = op(a[b']) · op(b[b'']) with numpy-broadcast batch axes and transpose flags.
//
// Kernels:
//  * Tiled (SIMT, the default): a workgroup owns a BM x BN block of C; BK-deep slices of A and B go from
//    global memory to registers and then to two shared-memory buffers in turn, so the loads of slice k+1
//    are in flight while slice k is multiplied and there is one barrier per slice. Both slices are stored
//    k-major as vec4 rows (A transposed on the way in), so every thread reads its fragments as vec4s; each
//    thread accumulates TM x TN values as (TM/4) x (TN/4) 4x4 sub-tiles strided across the block. Sizes
//    are literals: interior blocks carry no bounds checks when M, N, K are tile multiples, and edges clamp
//    the load address (rows past the edge are never stored) or zero the K tail. Small grids split K.
//  * Classic: the first single-buffered SIMT kernel, kept as the baseline the variants are measured against.
//  * CoopMatF16: A and B rounded to zero-padded f16 copies (one packing pass each), then multiplied by
//    GL_NV_cooperative_matrix with f32 accumulation from those copies; Accelerated nodes only, once the
//    device self-test passed.
//  * Small: for M or N tiny (GEMV-like, e.g. a single token's projection) a block tile would waste most of
//    its threads. Either one workgroup reduces K for one output (when the large operand is contiguous along
//    K, so the reads coalesce), or one thread computes one output (consecutive threads along the large
//    operand's contiguous axis).
#include "codegen/matmul.h"

#include <cctype>
#include <functional>
#include <string>

#include "codegen/kernels_common.h"
#include "mgn/types.h"

namespace mgn::codegen {
namespace {

using detail::u;

std::string su(uint64_t v) {
  return std::to_string(v);
}

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
  return s.transpose_a ? "(" + k + ") * " + u(s.m) + " + (" + m + ")"
                       : "(" + m + ") * " + u(s.k) + " + (" + k + ")";
}
std::string b_index(const GemmShape& s, const std::string& k, const std::string& n) {
  return s.transpose_b ? "(" + n + ") * " + u(s.k) + " + (" + k + ")"
                       : "(" + k + ") * " + u(s.n) + " + (" + n + ")";
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

// A storage buffer of float or vec4 words; `restrict` lets the driver use its read-only load path.
std::string buffer_as(int binding, const std::string& type, const std::string& name, bool write) {
  return "layout(std430, set = 0, binding = " + std::to_string(binding) + ") " +
         (write ? "writeonly restrict " : "readonly restrict ") + "buffer B" + std::to_string(binding) +
         " { " + type + " " + name + "[]; };\n";
}

// Maps a flat tile index to (tile row, tile column). With group_m > 1, consecutive workgroups walk
// group_m tile rows down one tile column before moving right, so blocks in flight together share their
// A rows and B columns in L2.
std::string tile_coords(uint64_t tiles_m, uint64_t tiles_n, uint32_t group_m) {
  if (group_m <= 1 || tiles_m <= 1)
    return "  uint tile_m = tile / " + u(tiles_n) + ", tile_n = tile % " + u(tiles_n) + ";\n";
  const uint64_t g = std::min<uint64_t>(group_m, tiles_m);
  return "  uint group_first = (tile / " + u(g * tiles_n) + ") * " + u(g) + ";\n" +
         "  uint group_rows = min(" + u(tiles_m) + " - group_first, " + u(g) + ");\n" +
         "  uint in_group = tile % " + u(g * tiles_n) + ";\n" +
         "  uint tile_m = group_first + in_group % group_rows, tile_n = in_group / group_rows;\n";
}

// ---------------------------------------------------------------------------------------------- split K

// The second kernel of a split-K GEMM: C = the sum of the `splits` partial products in scratch `slot`
// ([split][batch][m][n], `outs` = batch * m * n values each), added in split order (deterministic, no
// atomics).
Kernel splitk_sum_kernel(uint64_t splits, uint64_t outs, int slot, const DeviceCaps& caps) {
  const bool v4 = outs % 4 == 0;
  const std::string T = v4 ? "vec4" : "float";
  const uint64_t count = v4 ? outs / 4 : outs;
  std::string body = "  " + T + " sum = P[i];\n";
  body += "  for (uint p = 1u; p < " + u(splits) + "; ++p) sum += P[p * " + u(count) + " + i];\n";
  body += "  C[i] = sum;\n";
  return detail::elementwise_kernel(
      "matmul_splitk_sum_" + su(splits), buffer_as(0, T, "P", false) + buffer_as(1, T, "C", true), body,
      count, {{BindingKind::Scratch, slot, false}, {BindingKind::Output, 0, true}}, caps);
}

// How many ways to split K: only when the grid of `blocks` would leave most of a big GPU idle (< 128
// blocks) and K is long; doubling while the grid stays within 256 blocks and each split keeps >= 256 of K.
uint64_t auto_splits(const GemmShape& s, uint64_t blocks) {
  uint64_t splits = 1;
  if (blocks < 128 && s.k >= 1024)
    while (splits * 2 * blocks <= 256 && s.k / (splits * 2) >= 256 && splits < 16) splits *= 2;
  return splits;
}

// ------------------------------------------------------------------------------------------- SIMT tiled

struct SimtConfig {
  uint32_t bm, bn, bk, tm, tn, lx, ly, group_m;
  uint64_t k_chunk;  // K range of one split (a multiple of bk); = K rounded up when not split
  uint64_t splits;
};

uint32_t simt_shared_bytes(uint32_t bm, uint32_t bn, uint32_t bk) {
  return 2u * bk * (bm / 4 + 1 + bn / 4 + 1) * 16u;
}

[[noreturn]] void bad_tile(const std::string& what) {
  throw Error("GEMM tile: " + what);
}

// Fills what `want` leaves at 0. Auto: 128x128 blocks with 8x8 per thread (256 threads) when the product
// still has at least 256 such blocks for the device (a big GPU has ~100+ compute units); otherwise 64x64
// blocks with 4x4 per thread (32x32 when even those are few and K is too short to split), or 32x32 on
// devices limited to fewer than 256 invocations. BK = 16 (one
// barrier per 16-deep slice; 33 KiB of shared memory at 128x128). A grid still too small for the device
// splits K when K is long.
SimtConfig pick_simt(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want) {
  SimtConfig c{};
  const uint64_t nb = batch_count(s);
  auto blocks = [&](uint64_t bm, uint64_t bn) { return div_up(s.m, bm) * div_up(s.n, bn) * nb; };
  if (want.bm || want.bn) {
    c.bm = want.bm ? want.bm : want.bn;
    c.bn = want.bn ? want.bn : want.bm;
  } else if (caps.max_workgroup_invocations >= 256 && blocks(128, 128) >= 256) {
    c.bm = c.bn = 128;
  } else if (caps.max_workgroup_invocations >= 256) {
    c.bm = c.bn = 64;
    // A short K cannot be split profitably: smaller blocks are then the only way to fill the device.
    if (blocks(64, 64) < 128 && s.k < 1024 && blocks(32, 32) > blocks(64, 64)) c.bm = c.bn = 32;
  } else {
    c.bm = c.bn = 32;
  }
  c.tm = want.tm ? want.tm : (c.bm >= 128 && c.bn >= 64 ? 8 : 4);
  c.tn = want.tn ? want.tn : (c.bn >= 128 && c.bm >= 64 ? 8 : 4);
  if (c.tm % 4 || c.tn % 4 || c.bm % c.tm || c.bn % c.tn)
    bad_tile("the per-thread tile must be multiples of 4 dividing the block (" + su(c.bm) + "x" + su(c.bn) +
             " block, " + su(c.tm) + "x" + su(c.tn) + " per thread)");
  const uint32_t tx = c.bn / c.tn, ty = c.bm / c.tm, nt = tx * ty;
  if (nt > caps.max_workgroup_invocations)
    bad_tile(su(nt) + " threads exceed the device's " + su(caps.max_workgroup_invocations));
  // K slice: 8 for 128x128 blocks (H200 sweep, bench/results/2026-12-03-h200-run4: 36.9 TFLOP/s at 4096^3,
  // 74% of cuBLAS, against 29.6 with 16: half the shared memory doubles the blocks per SM), else 16.
  c.bk = want.bk ? want.bk : (c.bm >= 128 && c.bn >= 128 ? 8 : 16);
  if (!want.bk)
    while (c.bk > 4 && simt_shared_bytes(c.bm, c.bn, c.bk) > caps.max_shared_bytes) c.bk /= 2;
  if (simt_shared_bytes(c.bm, c.bn, c.bk) > caps.max_shared_bytes)
    bad_tile(su(simt_shared_bytes(c.bm, c.bn, c.bk)) + " bytes of shared memory exceed the device's " +
             su(caps.max_shared_bytes));
  // Lanes of one subgroup: by default a full row of threads along N (tx x 32/tx), i.e. the plain order.
  c.lx = want.lx ? want.lx : std::min<uint32_t>(tx, 32);
  c.ly = want.ly ? want.ly : std::max<uint32_t>(1, std::min<uint32_t>(ty, 32 / c.lx));
  if (tx % c.lx || ty % c.ly || nt % (c.lx * c.ly))
    bad_tile("lane layout " + su(c.lx) + "x" + su(c.ly) + " does not tile the " + su(tx) + "x" + su(ty) +
             " threads");
  c.group_m = want.group_m ? want.group_m : 8;
  // Split K when the grid would leave most of a big GPU idle and each split still has >= 256 of K.
  const uint64_t splits = want.splits ? want.splits : auto_splits(s, blocks(c.bm, c.bn));
  c.k_chunk = div_up(div_up(s.k, std::max<uint64_t>(splits, 1)), c.bk) * c.bk;
  c.splits = div_up(s.k, c.k_chunk);  // no empty split
  return c;
}

// One operand's tile loader. The tile holds `outer` (BM of A, BN of B) x BK values; an item is 4
// consecutive outer indices at one k, stored as one vec4 of the k-major shared tile. Consecutive threads
// take consecutive items along the operand's contiguous axis, so global loads coalesce: one vec4 load when
// the operand is contiguous along `outer` and its row length is a multiple of 4, else 4 scalar loads.
struct TileLoader {
  std::string name;     // "a" / "b"
  std::string buf;      // "A" / "B": global buffer (float) or buf + "4" (vec4)
  std::string shared;   // "As" / "Bs"
  std::string o0;       // "m0" / "n0"
  std::string off;      // "a_off" / "b_off"
  uint64_t outer_dim;   // M / N
  uint32_t outer_tile;  // BM / BN
  bool contig_outer;    // A transposed / B not transposed
  bool vec;             // vec4 global loads
  std::function<std::string(const std::string&, const std::string&)> index;  // (outer, k) -> word index
};

std::string emit_loader(const TileLoader& L, const GemmShape& s, uint32_t bk, uint32_t nt) {
  const uint64_t items = uint64_t(L.outer_tile) * bk / 4, per = div_up(items, nt);
  const bool guard = items % nt != 0;
  const bool o_edge = L.outer_dim % L.outer_tile != 0, k_edge = s.k % bk != 0;
  const std::string q4 = u(L.outer_tile / 4);
  auto coords = [&](const std::string& pad) {
    std::string g = pad + "uint e = tid + it * " + u(nt) + ";\n";
    if (L.contig_outer)
      g += pad + "uint q = e % " + q4 + ", kk = e / " + q4 + ";\n";
    else
      g += pad + "uint kk = e % " + u(bk) + ", q = e / " + u(bk) + ";\n";
    return g;
  };
  std::string g = "void load_" + L.name + "(uint k0) {\n";
  g += "  [[unroll]] for (uint it = 0u; it < " + u(per) + "; ++it) {\n" + coords("    ");
  if (guard) g += "    if (e >= " + u(items) + ") break;\n";
  g += "    uint k = k0 + kk;\n";
  g += std::string("    uint kr = ") + (k_edge ? "min(k, " + u(s.k - 1) + ")" : "k") + ";\n";
  if (L.vec) {
    g += "    uint o = " + L.o0 + " + 4u * q;\n";
    if (o_edge) g += "    o = min(o, " + u(L.outer_dim - 4) + ");\n";
    g += "    vec4 v = " + L.buf + "4[(" + L.off + " >> 2) + kr * " + u(L.outer_dim / 4) + " + (o >> 2)];\n";
  } else {
    g += "    vec4 v;\n";
    g += "    [[unroll]] for (uint c = 0u; c < 4u; ++c) {\n";
    g += "      uint o = " + L.o0 + " + 4u * q + c;\n";
    if (o_edge) g += "      o = min(o, " + u(L.outer_dim - 1) + ");\n";
    g += "      v[c] = " + L.buf + "[" + L.off + " + " + L.index("o", "kr") + "];\n    }\n";
  }
  if (k_edge) g += "    if (k >= " + u(s.k) + ") v = vec4(0.0);\n";
  g += "    r" + L.name + "[it] = v;\n  }\n}\n";
  g += "void store_" + L.name + "(uint buf) {\n";
  g += "  [[unroll]] for (uint it = 0u; it < " + u(per) + "; ++it) {\n" + coords("    ");
  if (guard) g += "    if (e >= " + u(items) + ") break;\n";
  g += "    " + L.shared + "[buf][kk][q] = r" + L.name + "[it];\n  }\n}\n";
  return g;
}

Lowering simt_gemm(const GemmShape& s, const DeviceCaps& caps, const SimtConfig& c) {
  const uint32_t tx = c.bn / c.tn, ty = c.bm / c.tm, nt = tx * ty, sm = c.tm / 4, sn = c.tn / 4;
  const uint64_t nb = batch_count(s), tiles_m = div_up(s.m, c.bm), tiles_n = div_up(s.n, c.bn);
  const uint64_t tiles = tiles_m * tiles_n, total = tiles * nb * c.splits;
  const bool split = c.splits > 1;
  detail::Grid grid = detail::flat_grid(total, caps);
  const bool a_vec = s.transpose_a && s.m % 4 == 0, b_vec = !s.transpose_b && s.n % 4 == 0;
  const bool c_vec = s.n % 4 == 0;
  const bool m_edge = s.m % c.bm != 0, n_edge = s.n % c.bn != 0;
  const std::string key = su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + "_" + su(c.tm) + "x" + su(c.tn) +
                          "_l" + su(c.lx) + "x" + su(c.ly) + "_g" + su(c.group_m) +
                          (split ? "_s" + su(c.splits) : "") + (a_vec ? "_va" : "") + (b_vec ? "_vb" : "") +
                          "_t" + su(s.transpose_a) + su(s.transpose_b);

  std::string g = "#version 450\n#extension GL_EXT_control_flow_attributes : require\n";
  g += "// matmul tiled (SIMT, double-buffered) " + key + ": " + su(c.bm) + "x" + su(c.bn) + " block, " +
       su(c.bk) + "-deep K slices, " + su(c.tm) + "x" + su(c.tn) + " per thread as " + su(sm) + "x" + su(sn) +
       " 4x4 sub-tiles\n";
  g += "// M=" + su(s.m) + " N=" + su(s.n) + " K=" + su(s.k) + " batch=" + su(nb) +
       (split ? " K split " + su(c.splits) + " ways of " + su(c.k_chunk) : "") + "\n";
  g += "layout(local_size_x = " + su(nt) + ") in;\n";
  g += a_vec ? buffer_as(0, "vec4", "A4", false) : buffer_as(0, "float", "A", false);
  g += b_vec ? buffer_as(1, "vec4", "B4", false) : buffer_as(1, "float", "B", false);
  g += c_vec ? buffer_as(2, "vec4", "C4", true) : buffer_as(2, "float", "C", true);
  g += "const uint M = " + u(s.m) + ", N = " + u(s.n) + ", K = " + u(s.k) + ";\n";
  g += "const uint BM = " + u(c.bm) + ", BN = " + u(c.bn) + ", BK = " + u(c.bk) + ";\n";
  g += "const uint TX = " + u(tx) + ", TY = " + u(ty) + ";  // threads along N, M\n";
  // k-major tiles of vec4s; the extra vec4 per row keeps the 4-row transposing stores of A conflict-free.
  g += "shared vec4 As[2][BK][BM / 4u + 1u];\nshared vec4 Bs[2][BK][BN / 4u + 1u];\n";
  const uint64_t items_a = uint64_t(c.bm) * c.bk / 4, items_b = uint64_t(c.bn) * c.bk / 4;
  g += "vec4 ra[" + su(div_up(items_a, nt)) + "], rb[" + su(div_up(items_b, nt)) + "];\n";
  g += "vec4 acc[" + su(c.tm * sn) + "];  // row i*4+r of the thread tile, column group j: acc[(i*4+r)*" +
       su(sn) + "+j]\n";
  g += "uint tid, tx, ty, m0, n0, a_off, b_off;  // a_off, b_off: word offsets of this batch's matrices\n";
  TileLoader la{"a",     "A",
                "As",    "m0",
                "a_off", s.m,
                c.bm,    s.transpose_a,
                a_vec,   [&](const std::string& o, const std::string& k) { return a_index(s, o, k); }};
  TileLoader lb{"b",     "B",
                "Bs",    "n0",
                "b_off", s.n,
                c.bn,    !s.transpose_b,
                b_vec,   [&](const std::string& o, const std::string& k) { return b_index(s, k, o); }};
  g += emit_loader(la, s, c.bk, nt) + emit_loader(lb, s, c.bk, nt);
  g += "void compute(uint buf) {\n";
  g += "  [[unroll]] for (uint kk = 0u; kk < BK; ++kk) {\n";
  g += "    vec4 a[" + su(sm) + "], b[" + su(sn) + "];\n";
  g += "    [[unroll]] for (uint i = 0u; i < " + u(sm) + "; ++i) a[i] = As[buf][kk][i * TY + ty];\n";
  g += "    [[unroll]] for (uint j = 0u; j < " + u(sn) + "; ++j) b[j] = Bs[buf][kk][j * TX + tx];\n";
  g += "    [[unroll]] for (uint i = 0u; i < " + u(sm) + "; ++i)\n";
  g += "      [[unroll]] for (uint r = 0u; r < 4u; ++r)\n";
  g += "        [[unroll]] for (uint j = 0u; j < " + u(sn) + "; ++j)\n";
  g += "          acc[(i * 4u + r) * " + u(sn) + " + j] = fma(vec4(a[i][r]), b[j], acc[(i * 4u + r) * " +
       u(sn) + " + j]);\n  }\n}\n";

  g += "void main() {\n" + grid.glsl;
  g += "  uint split = gid / " + u(tiles * nb) + ", batch = (gid / " + u(tiles) + ") % " + u(nb) +
       ", tile = gid % " + u(tiles) + ";\n";
  g += tile_coords(tiles_m, tiles_n, c.group_m);
  g += "  m0 = tile_m * BM;\n  n0 = tile_n * BN;\n";
  g += batch_offsets(s);
  g += "  a_off = aoff;\n  b_off = boff;\n";
  g += "  tid = gl_LocalInvocationIndex;\n";
  // Subgroup lanes laid out lx x ly over the thread grid (the sweep's knob on shared-memory broadcast).
  const uint32_t lanes = c.lx * c.ly, warps_x = tx / c.lx;
  g += "  { uint lane = tid % " + u(lanes) + ", w = tid / " + u(lanes) + ";\n";
  g += "    tx = (w % " + u(warps_x) + ") * " + u(c.lx) + " + lane % " + u(c.lx) + ";\n";
  g += "    ty = (w / " + u(warps_x) + ") * " + u(c.ly) + " + lane / " + u(c.lx) + "; }\n";
  g += "  [[unroll]] for (uint i = 0u; i < " + u(c.tm * sn) + "; ++i) acc[i] = vec4(0.0);\n";
  const std::string kbeg = split ? "split * " + u(c.k_chunk) : "0u";
  if (split)
    g += "  uint kbeg = " + kbeg + ";\n  uint ntiles = (min(" + u(c.k_chunk) +
         ", K - kbeg) + BK - 1u) / BK;\n";
  else
    g += "  const uint kbeg = 0u, ntiles = " + u(div_up(s.k, c.bk)) + ";\n";
  g += "  load_a(kbeg);\n  load_b(kbeg);\n  store_a(0u);\n  store_b(0u);\n  barrier();\n";
  // One barrier per slice: slice t+1 goes to the other buffer, whose last readers (slice t-1) all passed
  // the previous barrier; its global loads are issued before the FMAs of slice t and stored after them.
  g += "  for (uint t = 0u; t < ntiles; ++t) {\n";
  g += "    uint cur = t & 1u;\n";
  g += "    bool more = t + 1u < ntiles;\n";
  g += "    if (more) { load_a(kbeg + (t + 1u) * BK); load_b(kbeg + (t + 1u) * BK); }\n";
  g += "    compute(cur);\n";
  g += "    if (more) { store_a(cur ^ 1u); store_b(cur ^ 1u); }\n";
  g += "    barrier();\n  }\n";
  // Epilogue: thread (tx, ty) owns rows i*4*TY + 4*ty + r and columns j*4*TX + 4*tx + 0..3.
  g += "  uint coff = " +
       (split ? "(split * " + u(nb) + " + batch) * " + u(s.m * s.n) : "batch * " + u(s.m * s.n)) + ";\n";
  g += "  [[unroll]] for (uint i = 0u; i < " + u(sm) + "; ++i)\n";
  g += "    [[unroll]] for (uint r = 0u; r < 4u; ++r) {\n";
  g += "      uint m = m0 + i * 4u * TY + 4u * ty + r;\n";
  if (m_edge) g += "      if (m >= M) continue;\n";
  g += "      [[unroll]] for (uint j = 0u; j < " + u(sn) + "; ++j) {\n";
  g += "        uint n = n0 + j * 4u * TX + 4u * tx;\n";
  g += "        vec4 v = acc[(i * 4u + r) * " + u(sn) + " + j];\n";
  if (c_vec) {
    if (n_edge) g += "        if (n >= N) continue;\n";
    g += "        C4[(coff >> 2) + m * (N / 4u) + (n >> 2)] = v;\n";
  } else {
    g += "        [[unroll]] for (uint q = 0u; q < 4u; ++q)\n";
    g += "          if (n + q < N) C[coff + m * N + n + q] = v[q];\n";
  }
  g += "      }\n    }\n}\n";

  Lowering l;
  Kernel k;
  k.name = "matmul_tiled_" + key;
  k.glsl = g;
  k.groups = grid.groups;
  if (!split) {
    k.bindings = gemm_bindings();
    l.kernels.push_back(std::move(k));
    return l;
  }
  // Split K: partial products to scratch [split][batch][m][n], then one pass sums them in split order
  // (deterministic, no atomics).
  k.bindings = {
      {BindingKind::Input, 0, false}, {BindingKind::Input, 1, false}, {BindingKind::Scratch, 0, true}};
  l.scratch_words.push_back(c.splits * nb * s.m * s.n);
  l.kernels.push_back(std::move(k));
  l.kernels.push_back(splitk_sum_kernel(c.splits, nb * s.m * s.n, 0, caps));
  return l;
}

// ------------------------------------------------------------------------------ f16 cooperative matrix
//
// Two steps. First one pass per operand rounds it to f16 into a scratch copy, zero-padded to whole blocks
// (rows and columns of the operand's global layout rounded up to the block tile and K slice), packed
// 8 halves to a uvec4: the GEMM then reads half the bytes of the f32 operand, 16 bytes per load, with no
// bounds checks. Then the GEMM: BK-deep slices of both copies go global -> registers -> shared memory (one
// or two buffers) as uvec4s, and each subgroup multiplies its WM x WN tile with GL_NV_cooperative_matrix,
// accumulating in f32. Only the output stores of edge blocks check bounds.

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
      buffer_as(0, v4 ? "vec4" : "float", v4 ? "X4" : "X", false) + buffer_as(1, "uvec4", "P", true);
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
  return detail::elementwise_kernel(
      std::string("matmul_f16_pack_") + which + "_" + su(p.rows) + "x" + su(p.cols), decls, body,
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
  detail::Grid grid = detail::flat_grid(tiles * nb * c.splits, caps);
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
  g += buffer_as(0, "uvec4", "A16", false) + buffer_as(1, "uvec4", "B16", false);
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
  g += tile_coords(tiles_m, tiles_n, c.group_m);
  g += "  m0 = tile_m * BM;\n  n0 = tile_n * BN;\n";
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

// The whole f16 lowering: pack A, pack B (scratch 0 and 1), multiply.
Lowering coop_gemm(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate) {
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

// ------------------------------------------------------------------------------------------------ small

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
    g += "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " + b_index(s, "k", "n") +
         "], acc);\n";
    g += "  partial[gl_LocalInvocationID.x] = acc;\n  barrier();\n";
    g += "  for (uint w = " + u(wg / 2) + "; w > 0u; w >>= 1) {\n";
    g += "    if (gl_LocalInvocationID.x < w) partial[gl_LocalInvocationID.x] += "
         "partial[gl_LocalInvocationID.x + w];\n";
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
  body +=
      "    acc = fma(A[aoff + " + a_index(s, "m", "k") + "], B[boff + " + b_index(s, "k", "n") + "], acc);\n";
  body += "  C[batch * " + u(s.m * s.n) + " + m * " + u(s.n) + " + n] = acc;\n";
  return detail::elementwise_kernel(
      "matmul_small_thread_t" + std::to_string(s.transpose_a) + std::to_string(s.transpose_b), decls(), body,
      outs, gemm_bindings(), caps);
}

// The cooperative-matrix kernel assumes 32-lane subgroups (NVIDIA's warps).
bool caps_allow_coopmat(const DeviceCaps& caps) {
  return caps.cooperative_matrix_nv && caps.subgroup_size == 32;
}

}  // namespace

Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant) {
  GemmOptions o;
  o.variant = variant;
  o.mma = caps.coopmat_mma;
  return lower_gemm(s, caps, o);
}

Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmOptions& options) {
  if (s.a_stride.size() != s.batch.size() || s.b_stride.size() != s.batch.size())
    throw Error("matmul: batch strides do not match the batch rank");
  GemmVariant variant = options.variant;
  if (variant == GemmVariant::Auto)
    variant = (s.m <= 8 || s.n <= 8) ? GemmVariant::Small : GemmVariant::Tiled;
  if (s.k == 0) {  // empty contraction: C is all zeros
    Lowering l;
    l.output_zero_filled = true;
    return l;
  }
  switch (variant) {
    case GemmVariant::Auto:
    case GemmVariant::Tiled:
      return simt_gemm(s, caps, pick_simt(s, caps, options.tile));
    case GemmVariant::Small: {
      Lowering l;
      l.kernels.push_back(small_kernel(s, caps));
      return l;
    }
    case GemmVariant::CoopMatF16: {
      return coop_gemm(s, caps, pick_coop(s, caps, options.coopmat_tile, options.mma, options.coopmat_ablate),
                       false);
    }
  }
  throw Error("internal: unknown GEMM variant");
}

Lowering lower_gemm_coopmat(const GemmShape& s, const DeviceCaps& caps, const GemmTile& tile,
                            const CoopMatShape& mma, bool emulate, GemmAblation ablate) {
  if (s.a_stride.size() != s.batch.size() || s.b_stride.size() != s.batch.size())
    throw Error("matmul: batch strides do not match the batch rank");
  Lowering l;
  if (s.k == 0) {
    l.output_zero_filled = true;
    return l;
  }
  return coop_gemm(s, caps, pick_coop(s, caps, tile, mma, ablate), emulate);
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
  const KernelOptions& ko = ctx.options.kernels;
  GemmOptions o;
  o.variant = ko.gemm == GemmKernel::Tiled ? GemmVariant::Tiled
              : ko.gemm == GemmKernel::Small ? GemmVariant::Small
                                             : GemmVariant::Auto;
  o.tile = ko.gemm_tile;
  o.coopmat_tile = ko.f16_tile;
  o.coopmat_ablate = ko.f16_ablation;
  o.mma = ctx.caps.coopmat_mma;
  // f16 inputs are only for nodes that allow reduced precision, on a device whose self-test passed.
  if (ctx.precision() == Precision::Accelerated && ko.f16_gemm && caps_allow_coopmat(ctx.caps) &&
      ctx.caps.coopmat_f16_verified && s.m > 8 && s.n > 8)
    o.variant = GemmVariant::CoopMatF16;
  return lower_gemm(s, ctx.caps, o);
}

}  // namespace mgn::codegen
