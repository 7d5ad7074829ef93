// matmul's tiled SIMT kernel, an instantiation of the tiled GEMM emitter (gemm_tiled.h, schedule
// DoubleBufferedVec4): the tile choice, the operand loaders (prologue) and the C stores (epilogue). A
// workgroup owns a BM x BN block of C; BK-deep slices of A and B go global -> registers -> shared memory,
// both k-major as vec4 rows (A transposed on the way in). Sizes are literals: interior blocks carry no bounds
// checks when M, N, K are tile multiples, and edges clamp the load address (rows past the edge are never
// stored) or zero the K tail. Small grids split K.
#include <algorithm>
#include <string>

#include "codegen/gemm_tiled.h"
#include "codegen/glsl.h"
#include "codegen/matmul_common.h"

namespace mgn::codegen {
namespace {

using gl::u;

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
  // Split K when the grid would leave most of a big GPU idle and each split keeps enough of K (kSimtSplits).
  const uint64_t splits = want.splits ? want.splits : auto_splits(s, blocks(c.bm, c.bn), kSimtSplits);
  c.k_chunk = div_up(div_up(s.k, std::max<uint64_t>(splits, 1)), c.bk) * c.bk;
  c.splits = div_up(s.k, c.k_chunk);  // no empty split
  return c;
}

// One operand's tile loader. The tile holds `outer` (BM of A, BN of B) x BK values; consecutive threads take
// consecutive items along the operand's contiguous axis, so global loads coalesce. Contiguous along `outer`:
// an item is 4 consecutive outer indices at one k, one vec4 load when the row length is a multiple of 4 (else
// 4 scalar loads), stored as one vec4 of the k-major shared tile. Contiguous along K (A not transposed, B
// transposed): with K a multiple of 4 (`kvec`) an item is 4 consecutive k at one outer index, one vec4 load
// transposed into 4 scalar stores; otherwise 4 scalar loads down the outer axis.
struct TileLoader {
  std::string name;     // "a" / "b"
  std::string buf;      // "A" / "B": global buffer (float) or buf + "4" (vec4)
  std::string shared;   // "As" / "Bs"
  std::string o0;       // "m0" / "n0"
  std::string off;      // "a_off" / "b_off"
  uint64_t outer_dim;   // M / N
  uint32_t outer_tile;  // BM / BN
  bool contig_outer;    // A transposed / B not transposed
  bool vec;             // vec4 global loads along `outer`
  bool kvec;            // vec4 global loads along K (!contig_outer)
  std::string index;    // GLSL word index of (o, kr) within one matrix
  bool grouped =
      false;  // a grouped GEMM's B: read through ld<buf>(i) / ld<buf>4(i), which pick the block's product
  // The load of word `i` (or of vec4 `i`) of this operand.
  std::string at(bool vec4, const std::string& i) const {
    const std::string b = buf + (vec4 ? "4" : "");
    return grouped ? "ld" + b + "(" + i + ")" : b + "[" + i + "]";
  }
};

// Statements locating this thread's item `it` of a K slice: its number e (< items, over nt threads) and, by
// `coords`, its place in the tile.
std::string tile_item(const std::string& coords, uint64_t items, uint32_t nt) {
  return gl::render(R"(    uint e = tid + it * ${NT};
    ${COORDS}
${GUARD})",
                    {{"NT", u(nt)}, {"COORDS", coords}, {"GUARD", items % nt != 0 ? "    if (e >= " + u(items) + ") break;\n" : ""}});
}

// The kvec loader: the item's 4 k values at one outer index go to 4 shared vec4s, one component each.
// Items are numbered k-quad fastest when BK holds at most 2 quads (a warp then reads whole 32-byte sectors
// and its stores fall on distinct banks: rows of the tile are BM + 4 words apart, 4 mod 32), else outer
// fastest (distinct banks again; each lane reads 16 bytes of its own row).
std::string emit_kvec_loader(const TileLoader& L, const GemmShape& s, uint32_t bk, uint32_t nt) {
  const uint64_t items = uint64_t(L.outer_tile) * bk / 4, per = div_up(items, nt);
  const bool o_edge = L.outer_dim % L.outer_tile != 0, k_edge = s.k % bk != 0;
  const uint32_t quads = bk / 4;
  const std::string coords = quads <= 2 ? "uint kq = e % " + u(quads) + ", ol = e / " + u(quads) + ";"
                                        : "uint ol = e % " + u(L.outer_tile) + ", kq = e / " + u(L.outer_tile) + ";";
  const std::string item = tile_item(coords, items, nt);
  return gl::render(R"(void load_${X}(uint k0) {
  [[unroll]] for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    uint k = k0 + 4u * kq;
    uint kr = ${KR};
    uint o = ${O0} + ol;
${O_EDGE}    vec4 v = ${LOAD};
${K_EDGE}    r${X}[it] = v;
  }
}
void store_${X}(uint buf) {
  [[unroll]] for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    [[unroll]] for (uint c = 0u; c < 4u; ++c) ${SHARED}[buf][4u * kq + c][ol >> 2][ol & 3u] = r${X}[it][c];
  }
}
)",
                    {{"X", L.name},
                     {"PER", u(per)},
                     {"ITEM", item},
                     {"KR", k_edge ? "min(k, " + u(s.k - 4) + ")" : "k"},
                     {"O0", L.o0},
                     {"O_EDGE", o_edge ? "    o = min(o, " + u(L.outer_dim - 1) + ");\n" : ""},
                     {"LOAD", L.at(true, "(" + L.off + " + " + L.index + ") >> 2")},
                     {"K_EDGE", k_edge ? "    if (k >= " + u(s.k) + ") v = vec4(0.0);\n" : ""},
                     {"SHARED", L.shared}});
}

std::string emit_loader(const TileLoader& L, const GemmShape& s, uint32_t bk, uint32_t nt) {
  if (L.kvec) return emit_kvec_loader(L, s, bk, nt);
  const uint64_t items = uint64_t(L.outer_tile) * bk / 4, per = div_up(items, nt);
  const bool o_edge = L.outer_dim % L.outer_tile != 0, k_edge = s.k % bk != 0;
  const std::string q4 = u(L.outer_tile / 4);
  // This thread's item `it`: e, and its place in the tile (q: vec4 along outer, kk: k).
  const std::string item = tile_item(L.contig_outer ? "uint q = e % " + q4 + ", kk = e / " + q4 + ";"
                                                    : "uint kk = e % " + u(bk) + ", q = e / " + u(bk) + ";",
                                     items, nt);
  std::string fetch;
  if (L.vec)
    fetch = gl::render(
        R"(    uint o = ${O0} + 4u * q;
${O_EDGE}    vec4 v = ${LOAD};
)",
        {{"O0", L.o0},
         {"O_EDGE", o_edge ? "    o = min(o, " + u(L.outer_dim - 4) + ");\n" : ""},
         {"LOAD", L.at(true, "(" + L.off + " >> 2) + kr * " + u(L.outer_dim / 4) + " + (o >> 2)")}});
  else
    fetch = gl::render(R"(    vec4 v;
    [[unroll]] for (uint c = 0u; c < 4u; ++c) {
      uint o = ${O0} + 4u * q + c;
${O_EDGE}      v[c] = ${LOAD};
    }
)",
                       {{"O0", L.o0},
                        {"O_EDGE", o_edge ? "      o = min(o, " + u(L.outer_dim - 1) + ");\n" : ""},
                        {"LOAD", L.at(false, L.off + " + " + L.index)}});
  return gl::render(R"(void load_${X}(uint k0) {
  [[unroll]] for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    uint k = k0 + kk;
    uint kr = ${KR};
${FETCH}${K_EDGE}    r${X}[it] = v;
  }
}
void store_${X}(uint buf) {
  [[unroll]] for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    ${SHARED}[buf][kk][q] = r${X}[it];
  }
}
)",
                    {{"X", L.name},
                     {"PER", u(per)},
                     {"ITEM", item},
                     {"KR", k_edge ? "min(k, " + u(s.k - 1) + ")" : "k"},
                     {"FETCH", fetch},
                     {"K_EDGE", k_edge ? "    if (k >= " + u(s.k) + ") v = vec4(0.0);\n" : ""},
                     {"SHARED", L.shared}});
}

}  // namespace

GemmTile resolve_simt_tile(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want) {
  const SimtConfig c = pick_simt(s, caps, want);
  GemmTile t;
  t.bm = c.bm, t.bn = c.bn, t.bk = c.bk, t.tm = c.tm, t.tn = c.tn, t.lx = c.lx, t.ly = c.ly;
  t.group_m = c.group_m;
  t.splits = uint32_t(c.splits);
  return t;
}

namespace {

// The block tile of a grouped GEMM: the heuristics' (or `want`'s) for the whole shape, narrowed until the
// block width divides every product's N, so that each block lies inside one product.
SimtConfig pick_grouped(const GemmShape& s, const std::vector<uint64_t>& seg_n, const DeviceCaps& caps,
                        const GemmTile& want) {
  SimtConfig c = pick_simt(s, caps, want);
  auto divides = [&](uint32_t bn) {
    return std::all_of(seg_n.begin(), seg_n.end(), [&](uint64_t n) { return n % bn == 0; });
  };
  for (uint32_t bn = c.bn; !divides(c.bn); bn /= 2) {
    if (bn < 32) throw Error("internal: no GEMM block width divides the grouped products' N");
    if (!divides(bn)) continue;
    GemmTile w = want;
    w.bm = std::min(c.bm, bn), w.bn = bn, w.tm = w.tn = 0;
    c = pick_simt(s, caps, w);
  }
  return c;
}

// The grouped GEMM's kernels (simt_gemm_grouped) from the SIMT GEMM `g` of the whole shape: B is product
// `seg`'s weight (W<seg>, read through ldB / ldB4), C its output (C<seg>) or its part of the split-K scratch,
// where each split holds the products' [batch][m][n] one after another.
Lowering grouped_gemm(TiledGemm g, const GemmShape& s, const std::vector<uint64_t>& seg_n,
                      const SimtConfig& c, const std::string& a_buffer, bool b4, bool fixup,
                      const DeviceCaps& caps) {
  const size_t count = seg_n.size();
  const uint64_t nb = batch_count(s);
  const bool split = c.splits > 1;
  const std::string T = b4 ? "vec4" : "float", ld = b4 ? "ldB4" : "ldB";
  std::string n0s, ns, bases, seg_of = "  seg = 0u", loads, stores;
  std::vector<uint64_t> outs;
  uint64_t n0 = 0, base = 0;
  g.buffers = a_buffer;
  g.bindings = {{BindingKind::Input, 0, false, 0}};
  for (size_t j = 0; j < count; ++j) {
    const std::string J = su(j), last = j + 1 == count ? "" : "if (seg == " + u(j) + ") ";
    g.buffers += gl::buffer_as(int(1 + j), T, "W" + J, "readonly restrict ");
    g.bindings.push_back({BindingKind::Input, 1, false, int(j)});
    n0s += (j ? ", " : "") + u(n0);
    ns += (j ? ", " : "") + u(seg_n[j]);
    bases += (j ? ", " : "") + u(base);
    if (j) seg_of += " + uint(n0 >= " + u(n0) + ")";
    loads += "  " + last + "return W" + J + "[i];\n";
    stores += "        " + std::string(j ? "else " : "") + last + "C" + J + "[ci >> 2] = v;\n";
    outs.push_back(nb * s.m * seg_n[j]);
    n0 += seg_n[j];
    base += outs.back();
  }
  int next = int(1 + count);
  if (split) {
    g.buffers += gl::buffer_as(next++, "vec4", "P", fixup ? "coherent restrict " : "writeonly restrict ");
    g.bindings.push_back({BindingKind::Scratch, 0, true});
    if (fixup) {
      g.buffers += gl::buffer_as(next++, "uint", "CNT", "coherent restrict ");
      g.bindings.push_back({BindingKind::Counters, 0, true});
    }
  }
  if (!split || fixup) {
    for (size_t j = 0; j < count; ++j) {
      g.buffers += gl::buffer_as(next++, "vec4", "C" + su(j), "writeonly restrict ");
      g.bindings.push_back(gl::output(int(j)));
    }
  }
  const std::string C = su(count);
  g.constants +=
      "// the products side by side: first column, N, first word of a split's partial products\n"
      "const uint SEG_N0[" +
      C + "] = uint[](" + n0s + ");\nconst uint SEG_N[" + C + "] = uint[](" + ns +
      ");\nconst uint SEG_BASE[" + C + "] = uint[](" + bases + ");\n";
  g.state += "uint seg, seg_n0, seg_w;  // the block's product, its first column, its N\n" + T + " " + ld +
             "(uint i) {\n" + loads + "}\n";
  g.setup = batch_offsets(s) + "  a_off = aoff;\n  b_off = boff;\n" + seg_of +
            ";\n  seg_n0 = SEG_N0[seg];\n  seg_w = SEG_N[seg];\n  uint coff = " +
            (split ? "split * " + u(base) + " + SEG_BASE[seg] + " : std::string()) + "batch * " + u(s.m) +
            " * seg_w;\n";
  g.store =
      "        uint ci = coff + m * seg_w + (n - seg_n0);\n" + (split ? "        P[ci >> 2] = v;\n" : stores);
  Lowering l;
  if (split &&
      fixup) {  // the last block of a tile to arrive sums its partials in split order (as the sum kernel)
    const uint64_t tiles = div_up(s.m, c.bm) * div_up(s.n, c.bn);
    g.name += "_fx";
    g.counter = "CNT[batch * " + u(tiles) + " + tile]";
    g.splits = c.splits;
    l.counter_words = nb * tiles;
    g.fixup = gl::render(R"(        uint i0 = SEG_BASE[seg] + batch * ${M} * seg_w + m * seg_w + (n - seg_n0);
        vec4 v = P[i0 >> 2];
        for (uint p = 1u; p < ${SPLITS}; ++p) v += P[(p * ${BASE} + i0) >> 2];
        uint ci = i0 - SEG_BASE[seg];
)",
                         {{"M", u(s.m)}, {"SPLITS", u(c.splits)}, {"BASE", u(base)}}) +
              stores;
  }
  l.kernels.push_back(emit_tiled_gemm(g, caps));
  if (split) {
    l.scratch_words.push_back(c.splits * base);
    if (!fixup) l.kernels.push_back(splitk_sum_grouped_kernel(c.splits, outs, 0, caps));
  }
  return l;
}

// The SIMT GEMM; `seg_n` non-empty: a grouped GEMM (simt_gemm_grouped), s.n their sum.
Lowering simt_impl(const GemmShape& s, const std::vector<uint64_t>& seg_n, const DeviceCaps& caps,
                   const GemmTile& want, const GemmEpilogue* epilogue, GemmOperands k_vec4, bool fixup) {
  const bool grouped = !seg_n.empty();
  const SimtConfig c = grouped ? pick_grouped(s, seg_n, caps, want) : pick_simt(s, caps, want);
  const uint32_t tx = c.bn / c.tn, ty = c.bm / c.tm, nt = tx * ty, sm = c.tm / 4, sn = c.tn / 4;
  const uint64_t nb = batch_count(s), tiles = div_up(s.m, c.bm) * div_up(s.n, c.bn);
  const bool split = c.splits > 1;
  const bool a_vec = s.transpose_a && s.m % 4 == 0, b_vec = !s.transpose_b && s.n % 4 == 0;
  // Vec4 loads along K where they measured faster (run 19 on an H100, bench/results/2026-12-07-h100-run19,
  // kernel options KernelOptions::gemm_k_vec4 off / A / B / both): only behind 8-deep K slices (the 128x128 tile;
  // with 16-deep slices, SmolLM2's 32x32 and 64x64 kernels took 10-18% longer), for one operand when the other
  // is read as vec4s along its rows (12000x384x1536 with B [K, N]: 0.656 -> 0.551 ms, 4096^3 4.61 -> 3.84), and
  // for both operands of a short contraction (K <= 128: the attention scores 48x1500x1500x64, 0.533 -> 0.473);
  // with both operands along K and a long K it was 1-11% slower (4096^3 3.71 -> 3.92).
  const bool k_slices_fit = c.bk <= 8 && s.k % 4 == 0, short_k = s.k <= 128;
  const bool a_kvec = (uint8_t(k_vec4) & uint8_t(GemmOperands::A)) && !s.transpose_a && k_slices_fit &&
                      (b_vec || short_k);
  const bool b_kvec = (uint8_t(k_vec4) & uint8_t(GemmOperands::B)) && s.transpose_b && k_slices_fit &&
                      (a_vec || short_k);
  const bool c_vec = s.n % 4 == 0;
  const std::string key =
      su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + "_" + su(c.tm) + "x" + su(c.tn) + "_l" + su(c.lx) + "x" +
      su(c.ly) + "_g" + su(c.group_m) + (split ? "_s" + su(c.splits) : "") + (a_vec ? "_va" : "") +
      (b_vec ? "_vb" : "") + (a_kvec ? "_ka" : "") + (b_kvec ? "_kb" : "") +
      (grouped ? "_x" + su(seg_n.size()) : "") + "_t" + su(s.transpose_a) + su(s.transpose_b);
  auto buffer = [](int binding, bool vec, const std::string& name, bool write) {
    return gl::buffer_as(binding, vec ? "vec4" : "float", vec ? name + "4" : name,
                         write ? "writeonly restrict " : "readonly restrict ");
  };
  const TileLoader la{"a", "A", "As", "m0", "a_off", s.m, c.bm, s.transpose_a, a_vec, a_kvec, a_index(s, "o", "kr")};
  const TileLoader lb{"b",
                      "B",
                      "Bs",
                      "n0",
                      "b_off",
                      s.n,
                      c.bn,
                      !s.transpose_b,
                      b_vec,
                      b_kvec,
                      b_index(s, "kr", grouped ? "o - seg_n0" : "o"),
                      grouped};
  const uint64_t items_a = uint64_t(c.bm) * c.bk / 4, items_b = uint64_t(c.bn) * c.bk / 4;

  TiledGemm g;
  g.name = (grouped ? "matmul_grouped_" : "matmul_tiled_") + key;
  g.header = gl::render(
      R"(// archetype: matmul tiled (SIMT, double-buffered) ${KEY}: ${BM}x${BN} block, ${BK}-deep K slices, ${TM}x${TN} per thread as ${SM}x${SN} 4x4 sub-tiles
// ${DIMS}${SPLIT}
)",
      {{"KEY", key},
       {"BM", su(c.bm)},
       {"BN", su(c.bn)},
       {"BK", su(c.bk)},
       {"TM", su(c.tm)},
       {"TN", su(c.tn)},
       {"SM", su(sm)},
       {"SN", su(sn)},
       {"DIMS", gemm_dims(s) + (grouped ? " (" + su(seg_n.size()) + " products side by side along N)" : "")},
       {"SPLIT", split ? " K split " + su(c.splits) + " ways of " + su(c.k_chunk) : ""}});
  g.schedule = GemmSchedule::DoubleBufferedVec4;
  g.m = s.m, g.n = s.n, g.k = s.k, g.outer = nb * c.splits;
  g.bm = c.bm, g.bn = c.bn, g.bk = c.bk, g.tm = c.tm, g.tn = c.tn, g.tx = tx, g.ty = ty;
  g.lane_x = c.lx, g.lane_y = c.ly;
  g.k_chunk = split ? c.k_chunk : 0;
  g.order = TileOrder::RowMajor, g.group_m = c.group_m;
  g.buffers = buffer(0, a_vec || a_kvec, "A", false) + buffer(1, b_vec || b_kvec, "B", false) + buffer(2, c_vec, "C", true);
  g.state =
      "vec4 ra[" + su(div_up(items_a, nt)) + "], rb[" + su(div_up(items_b, nt)) +
      "];  // this thread's items of the next K slice\nuint a_off, b_off;  // word offsets of this batch's "
      "matrices\n";
  g.loaders = emit_loader(la, s, c.bk, nt) + emit_loader(lb, s, c.bk, nt) +
              "void load_slice(uint k0) {\n  load_a(k0);\n  load_b(k0);\n}\n"
              "void stage_slice(uint buf) {\n  store_a(buf);\n  store_b(buf);\n}\n";
  g.outer_index = "  uint split = gid / " + u(tiles * nb) + ", batch = (gid / " + u(tiles) + ") % " + u(nb) +
                  ", tile = gid % " + u(tiles) + ";\n";
  // Split K: this split's partial product, [split][batch][m][n] in scratch.
  g.setup = batch_offsets(s) + "  a_off = aoff;\n  b_off = boff;\n  uint coff = " +
            (split ? "(split * " + u(nb) + " + batch) * " + u(s.m * s.n) : "batch * " + u(s.m * s.n)) + ";\n";
  if (c_vec)
    g.store = std::string(s.n % c.bn != 0 ? "        if (n >= N) continue;\n" : "") +
              "        C4[(coff >> 2) + m * (N / 4u) + (n >> 2)] = v;\n";
  else
    g.store =
        "        [[unroll]] for (uint q = 0u; q < 4u; ++q)\n"
        "          if (n + q < N) C[coff + m * N + n + q] = v[q];\n";
  Lowering l;
  if (grouped)
    return grouped_gemm(g, s, seg_n, c, buffer(0, a_vec || a_kvec, "A", false), b_vec || b_kvec, fixup, caps);
  const std::vector<Binding> operands = epilogue ? std::vector<Binding>{epilogue->operand(0), epilogue->operand(1)}
                                                 : std::vector<Binding>{gl::input(0), gl::input(1)};
  if (!split) {
    g.bindings = gemm_bindings();
    if (epilogue) {  // each of the 4 columns' values through the epilogue at its element, instead of C's store
      const PointwiseBody b = epilogue->body(operands, "ei");
      g.name += "_e" + su(epilogue->nodes.size() - 1);
      g.header += "// epilogue: " + b.ops + "\n";
      g.buffers = buffer(0, a_vec || a_kvec, "A", false) + buffer(1, b_vec || b_kvec, "B", false) + b.decls + gl::math_lib();
      g.store = "        [[unroll]] for (uint q = 0u; q < 4u; ++q) {\n"
                "          if (n + q >= N) break;\n"
                "          uint ei = coff + m * N + n + q;\n" +
                epilogue->code(b, "v[q]") + "        }\n";
      g.bindings = b.bindings;
    }
    l.kernels.push_back(emit_tiled_gemm(g, caps));
    return l;
  }
  // Split K: partial products to scratch [split][batch][m][n], summed in split order (deterministic) and
  // stored to C, or evaluated by the epilogue: by the last block of each tile to arrive (fixup), or by a
  // second kernel.
  g.bindings = operands;
  g.bindings.push_back({BindingKind::Scratch, 0, true});
  l.scratch_words.push_back(simt_scratch_words(s, c.splits));
  const uint64_t outs = nb * s.m * s.n;
  // A long epilogue (an optimizer's update of a weight gradient) stays in the sum kernel: the fixup is
  // unrolled over a thread's accumulators like the store (kStoreEpilogueNodes, kernel.h).
  if (!fixup || (epilogue && epilogue->nodes.size() - 1 > kStoreEpilogueNodes)) {
    l.kernels.push_back(emit_tiled_gemm(g, caps));
    l.kernels.push_back(splitk_sum_kernel(c.splits, outs, 0, caps, epilogue));
    return l;
  }
  g.name += "_fx";
  g.buffers = buffer(0, a_vec || a_kvec, "A", false) + buffer(1, b_vec || b_kvec, "B", false) +
              gl::buffer_as(2, c_vec ? "vec4" : "float", c_vec ? "C4" : "C", "coherent restrict ") +
              gl::buffer_as(3, "uint", "CNT", "coherent restrict ");
  g.bindings.push_back({BindingKind::Counters, 0, true});
  g.counter = "CNT[batch * " + u(tiles) + " + tile]";
  g.splits = c.splits;
  l.counter_words = nb * tiles;
  // The 4 columns n.. of row m: their partial products' sum in split order (as splitk_sum_kernel adds them).
  const std::string sum4 =
      gl::render(R"(        uint i0 = batch * ${MN} + m * N + n;
        vec4 v = C4[i0 >> 2];
        for (uint p = 1u; p < ${SPLITS}; ++p) v += C4[p * ${OUTS4} + (i0 >> 2)];
)",
                 {{"MN", u(s.m * s.n)}, {"SPLITS", u(c.splits)}, {"OUTS4", u(outs / 4)}});
  const std::string sum1 = gl::render(R"(            uint i0 = batch * ${MN} + m * N + n + q;
            float v = C[i0];
            for (uint p = 1u; p < ${SPLITS}; ++p) v += C[p * ${OUTS} + i0];
)",
                                      {{"MN", u(s.m * s.n)}, {"SPLITS", u(c.splits)}, {"OUTS", u(outs)}});
  const std::string edge = s.n % c.bn != 0 ? "        if (n >= N) continue;\n" : "";
  if (!epilogue) {
    g.buffers += buffer(4, c_vec, "O", true);
    g.bindings.push_back(gl::output());
    g.fixup = c_vec ? edge + sum4 + "        O4[i0 >> 2] = v;\n"
                    : "        [[unroll]] for (uint q = 0u; q < 4u; ++q)\n          if (n + q < N) {\n" +
                          sum1 + "            O[i0] = v;\n          }\n";
  } else {
    const PointwiseBody b = epilogue->body(g.bindings, "ei");
    g.name += "_e" + su(epilogue->nodes.size() - 1);
    g.header += "// epilogue (in the split-K fixup): " + b.ops + "\n";
    g.buffers += b.decls + gl::math_lib();
    g.bindings = b.bindings;
    g.fixup = c_vec
                  ? edge + sum4 +
                        "        [[unroll]] for (uint q = 0u; q < 4u; ++q) {\n          uint ei = i0 + q;\n" +
                        epilogue->code(b, "v[q]") + "        }\n"
                  : "        [[unroll]] for (uint q = 0u; q < 4u; ++q)\n          if (n + q < N) {\n" + sum1 +
                        "            uint ei = i0;\n" + epilogue->code(b, "v") + "          }\n";
  }
  l.kernels.push_back(emit_tiled_gemm(g, caps));
  return l;
}

}  // namespace

Lowering simt_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                   const GemmEpilogue* epilogue, GemmOperands k_vec4, bool fixup) {
  return simt_impl(s, {}, caps, want, epilogue, k_vec4, fixup);
}

Lowering simt_gemm_grouped(const GemmShape& s, const std::vector<uint64_t>& seg_n, const DeviceCaps& caps,
                           const GemmTile& want, GemmOperands k_vec4, bool fixup) {
  if (seg_n.size() < 2 || !s.transpose_b ||
      std::any_of(s.b_stride.begin(), s.b_stride.end(), [](uint64_t x) { return x != 0; }))
    throw Error("internal: a grouped GEMM needs 2+ products with transposed, unbatched right operands");
  uint64_t n = 0;
  for (uint64_t x : seg_n) n += x;
  if (n != s.n) throw Error("internal: the grouped products' N do not add up to the shape's");
  return simt_impl(s, seg_n, caps, want, nullptr, k_vec4, fixup);
}

}  // namespace mgn::codegen
