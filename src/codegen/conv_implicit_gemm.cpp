// The convolutions as implicit GEMMs (conv_implicit_gemm.h): the tiles, the K splits, the instantiation of
// the tiled GEMM emitter and the im2col gather, then conv2d; its derivatives are in
// conv_implicit_gemm_grad.cpp. conv.cpp has the overview.
#include "codegen/conv_implicit_gemm.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>

#include "codegen/conv_common.h"
#include "codegen/gemm_tiled.h"
#include "codegen/glsl.h"
#include "codegen/tuning.h"
#include "mgn/types.h"

namespace mgn::codegen::igemm {

using gl::u;

namespace {

uint64_t pow2_at_least(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

uint32_t shared_bytes(uint32_t bp, uint32_t bq, uint32_t bk) {
  return 4u * bk * (bp + 1 + bq + 1);
}

}  // namespace

// Threads: TX = min(16, BP/4), TY = min(16, BQ/4) (4x4 per thread up to 64x64, 8x8 at 128x128), fewer
// when the device allows fewer invocations. BK shrinks for a short K and until the tiles fit shared
// memory; it never goes below 8, which keeps BK x BP >= the thread count for the row-wise loads.
Tile make_tile(uint32_t bp, uint32_t bq, uint32_t bk, uint64_t k, const DeviceCaps& caps) {
  Tile t{bp, bq, bk, std::min<uint32_t>(16, bp / 4), std::min<uint32_t>(16, bq / 4)};
  while (t.nt() > caps.max_workgroup_invocations && t.nt() > 32) {
    if (t.ty >= t.tx && t.ty > 1)
      t.ty /= 2;
    else
      t.tx /= 2;
  }
  t.bk = uint32_t(std::min<uint64_t>(t.bk, std::max<uint64_t>(8, pow2_at_least(k))));
  while (t.bk > 8 && shared_bytes(t.bp, t.bq, t.bk) > caps.max_shared_bytes) t.bk /= 2;
  if (shared_bytes(t.bp, t.bq, t.bk) > caps.max_shared_bytes)
    throw Error("conv2d: the implicit-GEMM tile needs " + std::to_string(shared_bytes(t.bp, t.bq, t.bk)) +
                " bytes of shared memory, the device has " + std::to_string(caps.max_shared_bytes));
  return t;
}

// KernelOptions::conv_tile (BPxBQxBK, e.g. 128x64x16) pins the tile of every implicit-GEMM conv kernel: for
// tests (every configuration runs on lavapipe whatever the shape) and for benchmarking tile choices.
// A measured choice (CodegenOptions::conv_tuned, docs/tuning.md) counts as pinned for this node.
std::optional<Tile> forced_tile(uint64_t k, const LowerContext& ctx) {
  ConvTile t = ctx.options.kernels.conv_tile;
  if (t.is_auto() && !ctx.options.conv_tuned.empty()) {
    auto it = ctx.options.conv_tuned.find(tunable_conv_key(ctx));
    if (it != ctx.options.conv_tuned.end()) t = it->second;
  }
  if (t.is_auto()) return std::nullopt;
  // The text form is checked when parsed (parse_conv_tile); a tile built in code is checked here.
  const ConvTile checked = parse_conv_tile(conv_tile_str(t), "KernelOptions::conv_tile");
  return make_tile(checked.bp, checked.bq, checked.bk, k, ctx.caps);
}

// The largest power-of-two tile edge in [lo, hi] whose padded extent stays within 25% of the smallest
// padded extent any edge in that range gives (70 channels: 32, not 128 with 45% of it empty).
uint64_t fit_edge(uint64_t extent, uint64_t lo, uint64_t hi) {
  uint64_t best = ~0ull;
  for (uint64_t b = lo; b <= hi; b *= 2) best = std::min(best, div_up(extent, b) * b);
  uint64_t edge = lo;
  for (uint64_t b = lo; b <= hi; b *= 2)
    if (4 * div_up(extent, b) * b <= 5 * best) edge = b;
  return edge;
}

namespace {

// The tile for a GEMM of P x Q (K deep) repeated `outer` times: the largest of 128x128, 128x64, 64x64 that
// still gives the grid enough workgroups, else 32x32; each edge fitted to P (at least 32) and Q (at least
// 16) by fit_edge so a small or awkward channel count does not leave much of a tile empty.
Tile pick_tile(uint64_t P, uint64_t Q, uint64_t K, uint64_t outer, const LowerContext& ctx) {
  const DeviceCaps& caps = ctx.caps;
  if (auto t = forced_tile(K, ctx)) return *t;
  struct Level {
    uint64_t bp, bq, min_groups;
  };
  const Level ladder[] = {
      {128, 128, kWantGroups}, {128, 64, kWantGroups}, {64, 64, kWantGroups / 2}, {32, 32, 0}};
  for (const Level& l : ladder) {
    const uint64_t bp = fit_edge(P, 32, l.bp), bq = fit_edge(Q, 16, l.bq);
    if (outer * div_up(P, bp) * div_up(Q, bq) < l.min_groups) continue;
    return make_tile(uint32_t(bp), uint32_t(bq), bp * bq >= 128 * 64 ? 16 : 32, K, caps);
  }
  throw Error("conv2d: no implicit-GEMM tile");  // unreachable: the last level always fits
}

}  // namespace

// `splits` ways or fewer: each split at least `min_slices` K slices, the partial outputs (splits x out_numel
// words) at most 64 MiB and one binding.
Split make_split(uint64_t splits, uint64_t K, uint32_t bk, uint64_t min_slices, uint64_t out_numel,
                 const DeviceCaps& caps) {
  const uint64_t max_scratch_words = std::min<uint64_t>(16ull << 20, caps.max_storage_buffer_range / 4);
  splits = std::min(splits, std::max<uint64_t>(1, K / (min_slices * bk)));
  splits = std::max<uint64_t>(1, std::min(splits, max_scratch_words / std::max<uint64_t>(out_numel, 1)));
  Split s;
  if (splits < 2) return s;
  s.chunk = div_up(div_up(K, splits), bk) * bk;
  s.splits = div_up(K, s.chunk);
  if (s.splits < 2) s = Split{};
  return s;
}

namespace {

// The automatic split of a tile: where its grid has fewer than half the workgroups a large GPU wants,
// enough splits to reach them, each at least 8 slices long.
Split auto_split(const Tile& t, uint64_t P, uint64_t Q, uint64_t K, uint64_t outer, uint64_t out_numel,
                 const DeviceCaps& caps) {
  const uint64_t groups = outer * div_up(P, t.bp) * div_up(Q, t.bq);
  if (groups >= kWantGroups / 2) return {};
  return make_split(div_up(kWantGroups, groups), K, t.bk, 8, out_numel, caps);
}

}  // namespace

// The tile and K split of a conv2d / conv2d_grad_input GEMM. Auto: the tile ladder of pick_tile, except that
// where the 64x64 level has too few workgroups and K is deep enough to split, K is split over 64x64 tiles
// rather than the tile shrunk to 32x32 (64 threads a workgroup: ResNet-50's 3x3 convs at 7x7 and 14x14 ran at
// 4-7 TFLOP/s on an H100 that way). A pinned or measured tile takes the automatic split of its own grid.
std::pair<Tile, Split> pick_tile_split(uint64_t P, uint64_t Q, uint64_t K, uint64_t outer, uint64_t out_numel,
                                       const LowerContext& ctx) {
  const uint32_t forced_splits = ctx.options.kernels.conv_splits;
  auto split_of = [&](const Tile& t) {
    if (forced_splits == 1) return Split{};
    if (forced_splits >= 2) return make_split(forced_splits, K, t.bk, 1, out_numel, ctx.caps);
    return auto_split(t, P, Q, K, outer, out_numel, ctx.caps);
  };
  if (forced_tile(K, ctx) || forced_splits != 0) {
    const Tile t = pick_tile(P, Q, K, outer, ctx);
    return {t, split_of(t)};
  }
  // The ladder's 64x64 level (each edge fitted); its grid under the count is where the ladder goes to 32x32.
  const Tile t64 = make_tile(uint32_t(fit_edge(P, 32, 64)), uint32_t(fit_edge(Q, 16, 64)), 32, K, ctx.caps);
  const Split s = auto_split(t64, P, Q, K, outer, out_numel, ctx.caps);
  if (s.splits > 1) return {t64, s};
  return {pick_tile(P, Q, K, outer, ctx), Split{}};
}

namespace {

// The second kernel of a split K: out[i] = the sum of the splits' partials PART[s * numel + i], from 0.0 in
// split order (matmul's split-K sum starts from the first part, so the two differ in the sign of a zero sum).
Kernel split_sum(const std::string& op, const std::string& what, uint64_t splits, uint64_t numel,
                 const DeviceCaps& caps) {
  const std::string body = gl::render(R"(    float sum = 0.0;
    for (uint s = 0u; s < ${SPLITS}; ++s) sum += PART[s * ${NUMEL} + i];
    Y[i] = sum;
)",
                                      {{"SPLITS", u(splits)}, {"NUMEL", u(numel)}});
  return gl::elementwise(
      op + "_split_sum_s" + std::to_string(splits),
      "conv " + op + " split-K sum of " + std::to_string(splits) + " partial " + what + " of " +
          std::to_string(numel) + " elements, in split order",
      gl::buffer(0, "PART", DType::F32, true) + gl::buffer(1, "Y", DType::F32, false, true), body, numel,
      {{BindingKind::Scratch, 0, false}, gl::output()}, caps);
}

}  // namespace

void set_split(ConvGemm& s, const Split& sp, uint64_t outer, const std::string& in0, const std::string& in1) {
  s.outer = outer * sp.splits;
  s.k_chunk = sp.chunk;
  const bool split = sp.splits > 1;
  if (split) {
    s.name += "_split" + std::to_string(sp.splits);
    s.comment += ", split " + std::to_string(sp.splits) + " ways";
  }
  s.buffers = gl::buffer(0, in0, DType::F32, true) + gl::buffer(1, in1, DType::F32, true) +
              gl::buffer(2, split ? "PART" : "Y", DType::F32, false, true);
  s.bindings = {gl::input(0), gl::input(1), {split ? BindingKind::Scratch : BindingKind::Output, 0, true}};
}

// `index`: the output element's flat index; the store into Y, or into this split's part of PART.
std::string out_store(const Split& sp, const std::string& index, uint64_t numel) {
  return sp.splits > 1 ? "PART[split * " + u(numel) + " + " + index + "] = v;" : "Y[" + index + "] = v;";
}

// A split GEMM's lowering: the GEMM, then the sum of its partial outputs.
Lowering with_split_sum(Kernel gemm, const Split& sp, const std::string& op, const std::string& what,
                        uint64_t numel, const DeviceCaps& caps) {
  Lowering l;
  l.kernels.push_back(std::move(gemm));
  if (sp.splits > 1) {
    l.scratch_words.push_back(sp.splits * numel);
    l.kernels.push_back(split_sum(op, what, sp.splits, numel, caps));
  }
  return l;
}

namespace {

// How one operand's BK x T slice is spread over the threads: thread `tid` loads RA rows x RC k indices.
// Row-wise (consecutive threads take consecutive rows of the slice: the gathered image operands, whose
// rows are neighbouring pixels) or k-wise (consecutive threads take consecutive k: operands contiguous
// along k). `guard`: some threads fall past the last row (k-wise with fewer rows than threads per k).
struct Slots {
  uint32_t ra = 1, rc = 1;
  std::string row, kk;  // GLSL expressions in tid, a, c
  bool guard = false;
};

Slots make_slots(bool k_wise, uint32_t rows, uint32_t bk, uint32_t nt) {
  Slots s;
  if (!k_wise) {
    const uint32_t share = std::max<uint32_t>(1, nt / rows);  // threads on one row
    s.ra = std::max<uint32_t>(1, rows / nt);
    s.rc = bk / share;
    s.row = "tid % " + u(rows) + " + a * " + u(nt);
    s.kk = "tid / " + u(rows) + " + c * " + u(share);
  } else {
    const uint32_t share = std::max<uint32_t>(1, nt / bk);  // rows covered by one pass of the threads
    s.ra = std::max<uint32_t>(1, rows / share);
    s.rc = std::max<uint32_t>(1, bk / nt);
    s.row = "tid / " + u(bk) + " + a * " + u(share);
    s.kk = "tid % " + u(bk) + " + c * " + u(nt);
    s.guard = rows < share;
  }
  return s;
}

}  // namespace

// The tiled GEMM emitter's single-buffered scalar schedule with the convolution's operand registers: thread
// `tid` holds P_RA x P_RC values of the P slice and Q_RA x Q_RC of the Q slice (Slots), staged k-major.
Kernel implicit_gemm(const ConvGemm& s, const DeviceCaps& caps) {
  const Tile& t = s.t;
  const uint32_t nt = t.nt(), tp = t.bp / t.tx, tq = t.bq / t.ty;
  const Slots ps = make_slots(s.p_k_wise, t.bp, t.bk, nt), qs = make_slots(s.q_k_wise, t.bq, t.bk, nt);
  TiledGemm g;
  g.name = s.name + "_" + std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk);
  g.header = "// archetype: conv " + s.comment + "\n// implicit GEMM (P rows = M, Q columns = N), tile " +
             std::to_string(t.bp) + "x" + std::to_string(t.bq) + "x" + std::to_string(t.bk) + ", " +
             std::to_string(tp) + "x" + std::to_string(tq) + " per thread, " + std::to_string(s.outer) +
             " independent GEMM(s)\n";
  g.schedule = GemmSchedule::SingleBufferedScalar;
  g.m = s.P, g.n = s.Q, g.k = s.K, g.outer = s.outer, g.k_chunk = s.k_chunk;
  g.bm = t.bp, g.bn = t.bq, g.bk = t.bk, g.tm = tp, g.tn = tq, g.tx = t.tx, g.ty = t.ty;
  // Neighbouring workgroups share the Q block (weights / dy rows) and read neighbouring pixels.
  g.order = TileOrder::ColumnMajor;
  g.buffers = s.buffers;
  g.constants = s.consts + gl::const_uint("P_RA", ps.ra) + gl::const_uint("P_RC", ps.rc) +
                gl::const_uint("Q_RA", qs.ra) + gl::const_uint("Q_RC", qs.rc);
  g.state = gl::render(R"(uint z;
float p_reg[P_RA][P_RC], q_reg[Q_RA][Q_RC];
uint p_row(uint a) { return ${PROW}; }
uint p_kk(uint c) { return ${PKK}; }
uint q_row(uint a) { return ${QROW}; }
uint q_kk(uint c) { return ${QKK}; }
)",
                       {{"PROW", ps.row}, {"PKK", ps.kk}, {"QROW", qs.row}, {"QKK", qs.kk}}) +
            s.state;
  g.loaders = gl::render(
      R"(// Global -> registers: this thread's share of the K slice [k0, k0 + BK).
void load_slice(uint k0) {
${LOAD}}
void stage_slice() {
  for (uint a = 0u; a < P_RA; ++a)
    for (uint c = 0u; c < P_RC; ++c) As[p_kk(c)][p_row(a)] = p_reg[a][c];
  for (uint a = 0u; a < Q_RA; ++a)
${QSTAGE}}
)",
      {{"LOAD", s.load},
       {"QSTAGE", qs.guard ? "    if (q_row(a) < BN)\n"
                             "      for (uint c = 0u; c < Q_RC; ++c) Bs[q_kk(c)][q_row(a)] = q_reg[a][c];\n"
                           : "    for (uint c = 0u; c < Q_RC; ++c) Bs[q_kk(c)][q_row(a)] = q_reg[a][c];\n"}});
  g.outer_index = "  z = gid / " + u(gemm_tiles(g)) + ";\n  uint tile = gid % " + u(gemm_tiles(g)) + ";\n" +
                  s.outer_index;
  g.setup = s.setup;
  g.store = s.store;
  g.bindings = s.bindings;
  return emit_tiled_gemm(g, caps);
}

namespace {

// Bounds test of an input row/column index that the padding can push outside the image. Without padding
// on either side of an axis every tap of a real output lies inside the input (the output size formula
// guarantees it), so the test is left out.
std::string in_bounds(const std::string& idx, const std::string& extent, bool padded) {
  return padded ? " && uint(" + idx + ") < " + extent : "";
}

// The im2col operand of conv2d and conv2d_grad_weight, gathered from X into p_reg (the P operand, loaded
// row-wise or k-wise): element (pixel, tap) = X[b, g*CG + ci, oh*SH - PT + kh*DH, ow*SW - PL + kw*DW],
// zero in the padding, with pixel = (b, oh, ow) an output pixel and tap = (ci, kh, kw) a filter tap of
// group g. One of the two indexes the P rows and the other K: conv2d has rows of pixels (K = taps),
// conv2d_grad_weight rows of taps (K = pixels). Each index contributes a term of the flat offset into X
// and of the input row/column; the row's terms (with the padding, and whether the row is real) are
// computed once in the setup, the k index's in every load.
struct Im2colAxis {
  std::string what;    // for the GLSL comments
  std::string split;   // GLSL statement decomposing `v` into its coordinates
  std::string offset;  // its term of the flat offset into X
  std::string ih, iw;  // its terms of the input row and column (int)
};

Im2colAxis im2col_axis(bool pixel, const std::string& v) {
  if (pixel)
    return {"output pixel (b, oh, ow)", "uint b = " + v + " / OHW, pix = " + v + " % OHW;", "b * C * HW",
            "int((pix / OW) * SH)", "int((pix % OW) * SW)"};
  return {"filter tap (ci, kh, kw)", "uint ci = " + v + " / KHW, r = " + v + " % KHW;", "(g * CG + ci) * HW",
          "int((r / KW) * DH)", "int((r % KW) * DW)"};
}

}  // namespace

// `pixel_rows`: the P rows are pixels (conv2d), else taps (conv2d_grad_weight). `then`: appended to the
// body of the loop over this thread's k indices (sees k, k_ok and the k index's coordinates).
Im2colGather im2col_gather(const ir::Node& n, bool pixel_rows, const std::string& then) {
  const auto& pad = n.attrs.ints("padding");
  const bool pad_h = pad[0] != 0 || pad[2] != 0, pad_w = pad[1] != 0 || pad[3] != 0;
  const Im2colAxis row = im2col_axis(pixel_rows, "m"), kx = im2col_axis(!pixel_rows, "k");
  Im2colGather s;
  s.state = R"(// im2col gather: the row terms of this thread's P rows (x_ok: a real row)
uint x_base[P_RA];
int x_ih[P_RA], x_iw[P_RA];
bool x_ok[P_RA];
)";
  s.setup = gl::render(
      R"(  for (uint a = 0u; a < P_RA; ++a) {
    uint m = m0 + p_row(a);  // ${WHAT}
    ${SPLIT}
    x_ok[a] = m < M;
    x_base[a] = ${OFFSET};
    x_ih[a] = ${IH} - PT;
    x_iw[a] = ${IW} - PL;
  }
)",
      {{"WHAT", row.what}, {"SPLIT", row.split}, {"OFFSET", row.offset}, {"IH", row.ih}, {"IW", row.iw}});
  s.load = gl::render(R"(  for (uint c = 0u; c < P_RC; ++c) {
    uint k = k0 + p_kk(c);  // ${WHAT}
    ${SPLIT}
    bool k_ok = k < k_end;
    uint xk = ${OFFSET};
    int ihk = ${IH}, iwk = ${IW};
    for (uint a = 0u; a < P_RA; ++a) {
      int ih = x_ih[a] + ihk, iw = x_iw[a] + iwk;
      bool ok = k_ok && x_ok[a]${BOUNDS};
      p_reg[a][c] = ok ? X[x_base[a] + xk + uint(ih) * W + uint(iw)] : 0.0;
    }
${THEN}  }
)",
                      {{"WHAT", kx.what},
                       {"SPLIT", kx.split},
                       {"OFFSET", kx.offset},
                       {"IH", kx.ih},
                       {"IW", kx.iw},
                       {"BOUNDS", in_bounds("ih", "H", pad_h) + in_bounds("iw", "W", pad_w)},
                       {"THEN", then}});
  return s;
}

}  // namespace mgn::codegen::igemm

namespace mgn::codegen {

using namespace igemm;

// conv2d: y[b, g*OG + q, pix] = sum_k im2col(x)[m, k] * w[g*OG + q, k] with m = (b, oh, ow) and
// k = (ci, kh, kw); P = N*OH*OW pixels (gathered row-wise, padding/stride/dilation in the load),
// Q = OG output channels, one GEMM per group.
Lowering conv_forward(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  ConvDims d = conv_dims(n, ctx.input(0).shape, ctx.input(1).shape, n.shape);
  Win w = window(n, d.KH, d.KW, true);
  if (d.Og == 1) return conv_forward_direct(ctx, d, w);
  ConvGemm s;
  s.name = "conv2d_igemm";
  s.comment =
      "conv2d " + conv_key(d, w) + ": P = N*OH*OW output pixels, Q = output channels per group, K = CG*KH*KW";
  s.P = d.N * d.OH * d.OW, s.Q = d.Og, s.K = d.Cg * d.KH * d.KW;
  const uint64_t numel_y = d.N * d.O * d.OH * d.OW;
  const auto [tile, sp] = pick_tile_split(s.P, s.Q, s.K, d.groups, numel_y, ctx);
  s.t = tile;
  set_split(s, sp, d.groups, "X", "Wt");
  s.p_k_wise = false, s.q_k_wise = true;
  s.consts = conv_constants(d, w);
  const Im2colGather x = im2col_gather(n, /*pixel_rows=*/true, "");
  s.state = "uint g, split;\n" + x.state;
  s.outer_index = "  g = z % GROUPS;\n  split = z / GROUPS;\n";
  s.setup = x.setup;
  s.load = x.load;
  s.load += R"(  for (uint c = 0u; c < Q_RC; ++c) {
    uint k = k0 + q_kk(c);
    for (uint a = 0u; a < Q_RA; ++a) {
      uint o = n0 + q_row(a);
      q_reg[a][c] = (k < k_end && o < OG) ? Wt[(g * OG + o) * K + k] : 0.0;
    }
  }
)";
  s.store = "      " + out_store(sp, "((m / OHW) * O + g * OG + n) * OHW + m % OHW", numel_y) + "\n";
  return with_split_sum(implicit_gemm(s, ctx.caps), sp, "conv2d", "outputs", numel_y, ctx.caps);
}

}  // namespace mgn::codegen
