// matmul's f16 cooperative-matrix lowering (Accelerated nodes, once the device self-test passed): the
// configuration, the packing kernels and the kernel sequence.
//
// Two steps (three with operand scaling: matmul_coopmat_scale.cpp's max |x| passes come first, and the
// packing multiplies each scaled operand by its power of two). First one pass per operand rounds it to f16
// into a scratch copy, zero-padded to whole blocks
// (rows and columns of the operand's global layout rounded up to the block tile and K slice), packed
// 8 halves to a uvec4: the GEMM then reads half the bytes of the f32 operand, 16 bytes per load, with no
// bounds checks. Then the GEMM (matmul_coopmat_kernel.cpp) multiplies the copies with
// GL_NV_cooperative_matrix, accumulating in f32.
#include "codegen/matmul_coopmat.h"

#include <algorithm>
#include <string>

#include "codegen/glsl.h"

namespace mgn::codegen {

using gl::u;

namespace {

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

}  // namespace

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
// Halves of one shared tile of an operand.
uint32_t coop_a_halves(const GemmShape& s, const CoopConfig& c) {
  return coop_a_stride(s, c) * (s.transpose_a ? c.bk : c.bm);
}
uint32_t coop_b_halves(const GemmShape& s, const CoopConfig& c) {
  return coop_b_stride(s, c) * (s.transpose_b ? c.bn : c.bk);
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
  return kCoopBuffers * 2u * coop_a_halves(s, c) >= coop_staging_bytes(c);
}
namespace {

// Shared bytes: two copies of each operand's tile, plus the edge staging tiles where they do not fit in the A
// tiles.
uint32_t coop_shared_bytes(const GemmShape& s, const CoopConfig& c) {
  return kCoopBuffers * 2u * (coop_a_halves(s, c) + coop_b_halves(s, c)) +
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
  c.ablate = gemm_ablation_name(ablation);
  auto bad = [](const std::string& what) { throw Error("f16 GEMM tile: " + what); };
  if (c.bm % c.wm || c.bn % c.wn || c.wm % mma.m || c.wn % mma.n || c.bk % mma.k || c.bk % 8 || c.bm % 8 ||
      c.bn % 8)
    bad("block " + su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + " / subgroup tile " + su(c.wm) + "x" +
        su(c.wn) + " do not tile into " + su(mma.m) + "x" + su(mma.n) + "x" + su(mma.k) + " multiplies");
  const uint32_t threads = (c.bm / c.wm) * (c.bn / c.wn) * 32;
  if (threads > caps.max_workgroup_invocations) bad(su(threads) + " threads exceed the device limit");
  if (!want.bk)
    while (c.bk > mma.k && c.bk > 8 && coop_shared_bytes(s, c) > caps.max_shared_bytes) c.bk /= 2;
  if (coop_shared_bytes(s, c) > caps.max_shared_bytes)
    bad(su(coop_shared_bytes(s, c)) + " bytes of shared memory exceed the device's " +
        su(caps.max_shared_bytes));
  // Split K as the SIMT kernel does (the small-M, long-K shapes of a language model's head gradient).
  const uint64_t blocks = div_up(s.m, c.bm) * div_up(s.n, c.bn) * nb;
  const uint64_t splits = want.splits ? want.splits : auto_splits(s, blocks, kCoopmatSplits);
  c.k_chunk = div_up(div_up(s.k, splits), c.bk) * c.bk;
  c.splits = div_up(s.k, c.k_chunk);  // no empty split
  return c;
}

// One operand to its f16 copy (scratch `slot`): invocation i writes 8 halves of row r, columns 8c..8c+7,
// zero outside the src_rows x src_cols matrix.
// `sc` on and `scaled`: the values are multiplied by the operand's power-of-two scale first, which each
// workgroup reduces from the max pass's maxima (coop_scale_prologue); `writes_header`: this kernel's workgroup
// 0 also writes the multiply's unscaling factor.
Kernel coop_pack_kernel(const char* which, int input, int slot, const PackedOperand& p, const DeviceCaps& caps,
                        const CoopScale& sc, bool scaled, bool writes_header) {
  const bool v4 = p.src_cols % 4 == 0;
  const uint64_t per_row = p.cols / 8, src_mat = p.src_rows * p.src_cols;
  const std::string decls =
      gl::buffer_as(0, v4 ? "vec4" : "float", v4 ? "X4" : "X", "readonly restrict ") +
      gl::buffer_as(1, "uvec4", "P", "writeonly restrict ") +
      (scaled ? gl::buffer_as(2, "uint", "S", writes_header ? "restrict " : "readonly restrict ") : "");
  // v4: src_cols and c are multiples of 4, so each vec4 lies wholly inside the row or wholly past its end.
  const std::string load = v4 ? gl::render(R"(    if (c < ${SC}) lo = X4[src >> 2];
    if (c + 4u < ${SC}) hi = X4[(src >> 2) + 1u];
)",
                                           {{"SC", u(p.src_cols)}})
                              : gl::render(R"(    for (uint q = 0u; q < 4u; ++q) {
      if (c + q < ${SC}) lo[q] = X[src + q];
      if (c + 4u + q < ${SC}) hi[q] = X[src + 4u + q];
    }
)",
                                           {{"SC", u(p.src_cols)}});
  const std::string body = gl::render(R"(  uint mat = i / ${VEC8}, rest = i % ${VEC8};
  uint r = rest / ${PER_ROW}, c = (rest % ${PER_ROW}) * 8u;
  vec4 lo = vec4(0.0), hi = vec4(0.0);
  if (r < ${SR}) {
    uint src = mat * ${SRC_MAT} + r * ${SC} + c;
${LOAD}  }
${SCALE}  P[i] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy), packHalf2x16(hi.zw));
)",
                                      {{"VEC8", u(p.vec8())},
                                       {"PER_ROW", u(per_row)},
                                       {"SR", u(p.src_rows)},
                                       {"SRC_MAT", u(src_mat)},
                                       {"SC", u(p.src_cols)},
                                       {"LOAD", load},
                                       {"SCALE", scaled ? "  lo *= s;\n  hi *= s;\n" : ""}});
  const std::string name = std::string("matmul_f16_pack_") + which + (scaled ? "_scaled_" : "_") + su(p.rows) +
                           "x" + su(p.cols);
  const std::string comment =
      "matmul f16 copy of " + std::string(which) + (scaled ? ", scaled by 2^k," : "") + " zero-padded to whole blocks";
  std::vector<Binding> bindings = {{BindingKind::Input, input, false}, {BindingKind::Scratch, slot, true}};
  if (!scaled) return gl::elementwise(name, comment, decls, body, p.count * p.vec8(), std::move(bindings), caps);
  bindings.push_back({BindingKind::Scratch, sc.slot, writes_header});
  // The scale's reduction has barriers, so it runs before the invocations past the end return.
  const uint64_t total = p.count * p.vec8();
  gl::check_32bit(total, name);
  const uint32_t wg = std::min<uint32_t>(256, caps.max_workgroup_invocations);
  const gl::Grid grid = gl::flat_groups(div_up(total, uint64_t(wg)), caps, name);
  Kernel k;
  k.name = name;
  k.glsl = gl::render(R"(#version 450
// archetype: ${COMMENT}
layout(local_size_x = ${WG}) in;
${DECLS}${FUNCS}void main() {
${GRID}${PROLOGUE}  uint i = gid * ${WG}u + gl_LocalInvocationID.x;
  if (i >= ${TOTAL}) return;
${BODY}}
)",
                      {{"COMMENT", comment},
                       {"WG", su(wg)},
                       {"DECLS", decls},
                       {"FUNCS", coop_scale_functions(wg)},
                       {"GRID", grid.glsl},
                       {"PROLOGUE", coop_scale_prologue(sc, *which == 'a', writes_header)},
                       {"TOTAL", u(total)},
                       {"BODY", body}});
  k.bindings = std::move(bindings);
  k.groups = grid.groups;
  return k;
}

}  // namespace

// The whole f16 lowering: [max pass,] pack A, pack B (scratch 0 and 1), multiply [, split-K sum]. The
// scale buffer is the last scratch buffer (2, or 3 after split K's partial products).
Lowering coopmat_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                      const CoopMatShape& mma, GemmAblation ablation, bool emulate, F16Scaling scaling) {
  const CoopConfig c = pick_coop(s, caps, want, mma, ablation);
  Lowering l;
  const PackedOperand pa = packed_a(s, c), pb = packed_b(s, c);
  const uint64_t outs = batch_count(s) * s.m * s.n;
  l.scratch_words = {pa.words(), pb.words()};
  if (c.splits > 1) l.scratch_words.push_back(c.splits * outs);
  const CoopScale sc = coop_scale(s, c, scaling, int(l.scratch_words.size()));
  if (sc.on()) l.scratch_words.push_back(sc.words());
  for (Kernel& k : coop_scale_kernels(s, c, sc, caps)) l.kernels.push_back(std::move(k));
  // The first scaled packing kernel writes the multiply's unscaling factor.
  l.kernels.push_back(coop_pack_kernel("a", 0, 0, pa, caps, sc, sc.which.a, sc.which.a));
  l.kernels.push_back(coop_pack_kernel("b", 1, 1, pb, caps, sc, sc.which.b, sc.which.b && !sc.which.a));
  l.kernels.push_back(coop_kernel(s, caps, c, emulate, sc));
  if (c.splits > 1) l.kernels.push_back(splitk_sum_kernel(c.splits, outs, 2, caps));
  return l;
}

}  // namespace mgn::codegen
