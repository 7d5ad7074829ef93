// The f16 cooperative-matrix GEMM kernel (matmul_coopmat.h): BK-deep slices of the f16 copies go global ->
// registers -> one of two shared buffers in turn as uvec4s (slice t+1's loads in flight while slice t is
// multiplied, one barrier per slice); each subgroup multiplies its WM x WN tile with GL_NV_cooperative_matrix,
// accumulating in f32. Only the output stores of edge blocks check bounds.
//
// `emulate`: the same kernel with every cooperative-matrix operation spelled out per invocation over
// virtual 32-lane subgroups (a fragment is its shared-memory offset; accumulators are 8 floats a lane),
// so a device without GL_NV_cooperative_matrix can check the tiling, staging and edge logic.
#include <string>

#include "codegen/gemm_tiled.h"
#include "codegen/glsl.h"
#include "codegen/matmul_coopmat.h"

namespace mgn::codegen {
namespace {

using gl::u;

class CoopKernel {
 public:
  CoopKernel(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate, const CoopScale& sc)
      : s_(s),
        c_(c),
        sc_(sc),
        mma_(c.mma),
        emulate_(emulate),
        unroll_(emulate ? "" : "[[unroll]] "),
        warps_n_(c.bn / c.wn),
        warps_((c.bm / c.wm) * warps_n_),
        nt_(warps_ * 32),
        fi_(c.wm / mma_.m),
        fj_(c.wn / mma_.n),
        per_lane_(mma_.m * mma_.n / 32),
        nb_(batch_count(s)),
        tiles_m_(div_up(s.m, c.bm)),
        tiles_n_(div_up(s.n, c.bn)),
        split_(c.splits > 1),
        grid_(gl::flat_groups(tiles_m_ * tiles_n_ * nb_ * c.splits, caps, "matmul_coopmat_f16")),
        ah_(coop_a_halves(s, c)),
        bh_(coop_b_halves(s, c)),
        pa_(packed_a(s, c)),
        pb_(packed_b(s, c)),
        direct_store_(coop_direct_store(s, c)),
        stage_in_a_(coop_stage_in_a(s, c)) {
    const std::string MM = su(mma_.m), MN = su(mma_.n), MK = su(mma_.k);
    t_a_ = "fcoopmatNV<16, gl_ScopeSubgroup, " + MM + ", " + MK + ">";
    t_b_ = "fcoopmatNV<16, gl_ScopeSubgroup, " + MK + ", " + MN + ">";
    t_c_ = "fcoopmatNV<32, gl_ScopeSubgroup, " + MM + ", " + MN + ">";
  }

  Kernel kernel() const {
    Kernel k;
    k.name = std::string("matmul_coopmat_f16_") + (emulate_ ? "emul_" : "") + key();
    k.glsl = gl::render(
        R"(#version 450
#extension GL_EXT_control_flow_attributes : require
${EXTENSIONS}${HEADER}layout(local_size_x = ${NT}) in;
${DECLARATIONS}${EMULATION}${LOADERS}${COMPUTE}void main() {
${GRID}${SETUP}${K_LOOP}${EPILOGUE}}
)",
        {{"EXTENSIONS", emulate_ ? ""
                                 : "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
                                   "#extension GL_NV_cooperative_matrix : require\n"
                                   "#extension GL_KHR_memory_scope_semantics : require\n"
                                   "#extension GL_KHR_shader_subgroup_basic : require\n"},
         {"HEADER", header()},
         {"NT", su(nt_)},
         {"DECLARATIONS", declarations()},
         {"EMULATION", emulate_ ? emulation_lib() : t_c_ + " acc[" + su(fi_ * fj_) + "];\n"},
         {"LOADERS", loader(true) + loader(false)},
         {"COMPUTE", compute()},
         {"GRID", grid_.glsl},
         {"SETUP", setup()},
         {"K_LOOP", k_loop()},
         {"EPILOGUE", epilogue()}});
    k.bindings = {{BindingKind::Scratch, 0, false},
                  {BindingKind::Scratch, 1, false},
                  split_ ? Binding{BindingKind::Scratch, 2, true} : Binding{BindingKind::Output, 0, true}};
    if (sc_.on()) k.bindings.push_back({BindingKind::Scratch, sc_.slot, false});
    k.groups = grid_.groups;
    return k;
  }

 private:
  std::string key() const {
    const CoopConfig& c = c_;
    return su(c.bm) + "x" + su(c.bn) + "x" + su(c.bk) + "_w" + su(c.wm) + "x" + su(c.wn) + "_m" + su(mma_.m) +
           "x" + su(mma_.n) + "x" + su(mma_.k) + "_g" + su(c.group_m) + (split_ ? "_s" + su(c.splits) : "") + (direct_store_ ? "" : "_edge") + "_t" + su(s_.transpose_a) +
           su(s_.transpose_b) + (sc_.on() ? "_scaled" : "") + (c.ablate.empty() ? "" : "_ABLATED_" + c.ablate);
  }

  std::string header() const {
    const CoopConfig& c = c_;
    const std::string staging = su(kCoopBuffers) + " shared buffer(s)";
    return gl::render(
        R"(// archetype: matmul f16 cooperative matrix${EMULATED} ${KEY}: f16 copies of A and B in, f32 accumulation
// ${DIMS}; ${WARPS} subgroups of 32, each ${WM}x${WN} as ${FI}x${FJ} multiplies; ${STAGING}${SPLIT}
)",
        {{"EMULATED", emulate_ ? " (EMULATED, for tests)" : ""},
         {"KEY", key()},
         {"DIMS", gemm_dims(s_)},
         {"WARPS", su(warps_)},
         {"WM", su(c.wm)},
         {"WN", su(c.wn)},
         {"FI", su(fi_)},
         {"FJ", su(fj_)},
         {"STAGING", staging},
         {"SPLIT", split_
                       ? "; K split " + su(c.splits) + " ways of " + su(c.k_chunk) + " (partial products out)"
                       : ""}});
  }

  std::string declarations() const {
    const CoopConfig& c = c_;
    const std::string a_layout = s_.transpose_a ? "[k][m]" : "[m][k]",
                      b_layout = s_.transpose_b ? "[n][k]" : "[k][n]";
    const std::string registers = "uvec4 ra0[" + su(per_item(true)) + "];  // a K slice of A in flight\n" +
                                  "uvec4 rb0[" + su(per_item(false)) + "];  // a K slice of B in flight\n";
    return gl::render(
        R"(// A16, B16: the operands' f16 copies, 8 halves per uvec4, ${AL} ${AR}x${AC} and ${BL} ${BR}x${BC} halves per matrix (zero padding)
${BUFFERS}layout(std430, set = 0, binding = 2) buffer Blk2 { float C[]; };
${SCALES}const uint M = ${MU}, N = ${NU};
const uint BM = ${BM}, BN = ${BN}, BK = ${BK};
const uint SA = ${SA}, SB = ${SB};  // shared row strides in halves
const uint GA = ${GA}, GB = ${GB};  // the f16 copies' row strides in halves
// A tile ${AL}, B tile ${BL} (the global layouts), 8 halves per uvec4
${SHARED}${REGISTERS}uint tid, warp, lane, wm0, wn0, m0, n0, a_off, b_off;  // a_off, b_off in uvec4s
)",
        {{"AL", a_layout},
         {"AR", su(pa_.rows)},
         {"AC", su(pa_.cols)},
         {"BL", b_layout},
         {"BR", su(pb_.rows)},
         {"BC", su(pb_.cols)},
         {"BUFFERS", gl::buffer_as(0, "uvec4", "A16", "readonly restrict ") +
                         gl::buffer_as(1, "uvec4", "B16", "readonly restrict ")},
         {"SCALES", sc_.on() ? "// the operand scales; word 2 is 1 / (s_a * s_b), a power of two\n" +
                                   gl::buffer_as(3, "uint", "S", "readonly restrict ")
                             : ""},
         {"MU", u(s_.m)},
         {"NU", u(s_.n)},
         {"BM", u(c.bm)},
         {"BN", u(c.bn)},
         {"BK", u(c.bk)},
         {"SA", u(coop_a_stride(s_, c))},
         {"SB", u(coop_b_stride(s_, c))},
         {"GA", u(pa_.cols)},
         {"GB", u(pb_.cols)},
         {"SHARED",
          "shared uvec4 As[" + su(kCoopBuffers * ah_ / 8) + "];\n" +
              "shared uvec4 Bs[" + su(kCoopBuffers * bh_ / 8) + "];\n" +
              (!direct_store_ && !stage_in_a_ ? "shared float Cs[" + su(warps_ * mma_.m * mma_.n) + "];\n"
                                              : "")},
         {"REGISTERS", registers}});
  }

  // The emulated accumulators, half-precision reads and multiply-add of one fragment pair.
  std::string emulation_lib() const {
    std::string s = "float acc[" + su(fi_ * fj_) + "][" + su(per_lane_) +
                    "];  // lane's elements idx = lane + 32 * e, row-major\n";
    // Half h of a shared tile (8 halves per uvec4, 2 per word, the lower address in the low bits).
    for (const char* t : {"As", "Bs"})
      s += gl::render(R"(float half_${T}(uint h) {
  vec2 v = unpackHalf2x16(${T}[h >> 3u][(h >> 1u) & 3u]);
  return (h & 1u) != 0u ? v.y : v.x;
}
)",
                      {{"T", t}});
    // Row-major element (r, c) of a fragment at `off`: off + r * stride + c; column-major: off + c * stride +
    // r.
    const std::string rs = "SA", rt = "SB";
    return s + gl::render(R"(void mma_emul(uint ia, uint ib, uint fa, uint fb) {
  ${UNROLL}for (uint e = 0u; e < ${PER_LANE}; ++e) {
    uint idx = lane + 32u * e, r = idx / ${MN}, cc = idx % ${MN};
    float sum = acc[ia * ${FJ} + ib][e];
    for (uint kk = 0u; kk < ${MK}; ++kk)
      sum = fma(${HA}(fa + ${AIDX}), ${HB}(fb + ${BIDX}), sum);
    acc[ia * ${FJ} + ib][e] = sum;
  }
}
)",
                          {{"UNROLL", unroll_},
                           {"PER_LANE", u(per_lane_)},
                           {"MN", u(mma_.n)},
                           {"FJ", u(fj_)},
                           {"MK", u(mma_.k)},
                           {"HA", "half_As"},
                           {"AIDX", s_.transpose_a ? "kk * " + rs + " + r" : "r * " + rs + " + kk"},
                           {"HB", "half_Bs"},
                           {"BIDX", s_.transpose_b ? "cc * " + rt + " + kk" : "kk * " + rt + " + cc"}});
  }

  uint64_t items(bool a) const { return uint64_t(a ? c_.bm : c_.bn) * c_.bk / 8; }
  uint64_t per_item(bool a) const { return div_up(items(a), nt_); }

  // Global -> registers -> shared for operand A (`a`) or B: an item is 8 consecutive halves along the copy's
  // contiguous axis; one load and one store function.
  std::string loader(bool a) const {
    const std::string name = a ? "a" : "b";
    const bool contig_k = a ? !s_.transpose_a : s_.transpose_b;
    const uint32_t outer_tile = a ? c_.bm : c_.bn, stride = a ? coop_a_stride(s_, c_) : coop_b_stride(s_, c_);
    const uint32_t halves = a ? ah_ : bh_;
    const std::string o0 = a ? "m0" : "n0";
    const uint64_t cols8 = (a ? pa_ : pb_).cols / 8, n = items(a);
    const std::string item = gl::render(
        R"(    uint e = tid + it * ${NT};
    ${COORDS}
${GUARD})",
        {{"NT", u(nt_)},
         {"COORDS", contig_k
                        ? "uint k8 = e % " + u(c_.bk / 8) + ", o = e / " + u(c_.bk / 8) + ";"
                        : "uint o8 = e % " + u(outer_tile / 8) + ", kk = e / " + u(outer_tile / 8) + ";"},
         {"GUARD", n % nt_ != 0 ? "    if (e >= " + u(n) + ") break;\n" : ""}});
    const uint32_t r = 0;  // the register set (names ra0, rb0; one slice in flight)
    return gl::render(
          R"(void load_${X}${SET}(uint k0) {
  ${UNROLL}for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    r${X}${SET}[it] = ${SRC}[${X}_off + ${SRC_INDEX}];
  }
}
void store_${X}${SET}(uint buf) {
  ${UNROLL}for (uint it = 0u; it < ${PER}; ++it) {
${ITEM}    ${DST}[buf * ${TILE8} + ${DST_INDEX}] = r${X}${SET}[it];
  }
}
)",
          {{"X", name},
           {"SET", su(r)},
           {"UNROLL", unroll_},
           {"PER", u(per_item(a))},
           {"ITEM", item},
           {"SRC", a ? "A16" : "B16"},
           {"SRC_INDEX", contig_k ? "(" + o0 + " + o) * " + u(cols8) + " + k0 / 8u + k8"
                                  : "(k0 + kk) * " + u(cols8) + " + " + o0 + " / 8u + o8"},
           {"DST", a ? "As" : "Bs"},
           {"TILE8", u(halves / 8)},
           {"DST_INDEX", contig_k ? "o * " + u(stride / 8) + " + k8" : "kk * " + u(stride / 8) + " + o8"}});
  }

  // Fragment (i, j) covers rows wm0 + i*MM and columns wn0 + j*MN of the block; offsets in halves
  // (multiples of 8).
  std::string a_frag(const std::string& i, const std::string& kk) const {
    return s_.transpose_a ? kk + " * SA + wm0 + " + i + " * " + u(mma_.m)
                          : "(wm0 + " + i + " * " + u(mma_.m) + ") * SA + " + kk;
  }
  std::string b_frag(const std::string& j, const std::string& kk) const {
    return s_.transpose_b ? "(wn0 + " + j + " * " + u(mma_.n) + ") * SB + " + kk
                          : kk + " * SB + wn0 + " + j + " * " + u(mma_.n);
  }

  // Declares fa/fb and loads one multiply-K step's fragments (kk into the tiles at abase/bbase halves).
  std::string frag_loads(const std::string& in, const std::string& abase, const std::string& bbase,
                         const std::string& kk) const {
    return gl::render(R"(${I}${TA} fa[${FI}];
${I}${TB} fb[${FJ}];
${I}${UNROLL}for (uint i = 0u; i < ${FIU}; ++i)
${I}  coopMatLoadNV(fa[i], ${SRCA}, (${ABASE} + ${AFRAG}) / 8u, ${STRA} / 8u, ${TRA});
${I}${UNROLL}for (uint j = 0u; j < ${FJU}; ++j)
${I}  coopMatLoadNV(fb[j], ${SRCB}, (${BBASE} + ${BFRAG}) / 8u, ${STRB} / 8u, ${TRB});
)",
                      {{"I", in},
                       {"TA", t_a_},
                       {"TB", t_b_},
                       {"FI", su(fi_)},
                       {"FJ", su(fj_)},
                       {"UNROLL", unroll_},
                       {"FIU", u(fi_)},
                       {"FJU", u(fj_)},
                       {"SRCA", "As"},
                       {"ABASE", abase},
                       {"AFRAG", a_frag("i", kk)},
                       {"STRA", "SA"},
                       {"TRA", s_.transpose_a ? "true" : "false"},
                       {"SRCB", "Bs"},
                       {"BBASE", bbase},
                       {"BFRAG", b_frag("j", kk)},
                       {"STRB", "SB"},
                       {"TRB", s_.transpose_b ? "true" : "false"}});
  }

  // The multiply of fragments fa[i], fb[j] (or, emulated, at halves offsets `fa`, `fb`) into acc.
  std::string mma(const std::string& fa, const std::string& fb) const {
    if (emulate_) return "mma_emul(i, j, " + fa + ", " + fb + ");\n";
    if (c_.ablate == "nomma") return "{}  // ABLATED: no multiply\n";
    return "acc[i * " + u(fj_) + " + j] = coopMatMulAddNV(" + fa + ", " + fb + ", acc[i * " + u(fj_) +
           " + j]);\n";
  }
  // The multiplies of one step, at indentation `in`: shared by compute() and the mmaonly ablation.
  std::string step_mmas(const std::string& in, const std::string& abase, const std::string& bbase,
                        const std::string& kk) const {
    return in + unroll_ + "for (uint i = 0u; i < " + u(fi_) + "; ++i)\n" + in + "  " + unroll_ +
           "for (uint j = 0u; j < " + u(fj_) + "; ++j)\n" + in + "    " +
           (emulate_ ? mma(abase + " + " + a_frag("i", kk), bbase + " + " + b_frag("j", kk))
                     : mma("fa[i]", "fb[j]"));
  }

  // One subgroup's multiplies of the slice in shared buffer `buf` (k0: its K offset, unused by the kernel).
  std::string compute() const {
    return gl::render(R"(void compute(uint buf, uint k0) {
  uint abase = ${ABASE}, bbase = ${BBASE};
  ${UNROLL}for (uint kk = 0u; kk < BK; kk += ${MK}) {
${LOADS}${MMAS}  }
}
)",
                      {{"ABASE", "buf * " + u(ah_)},
                       {"BBASE", "buf * " + u(bh_)},
                       {"UNROLL", unroll_},
                       {"MK", u(mma_.k)},
                       {"LOADS", emulate_ ? "" : frag_loads("    ", "abase", "bbase", "kk")},
                       {"MMAS", step_mmas("    ", "abase", "bbase", "kk")}});
  }

  // main() up to the K loop: the block, this batch's matrices, the subgroup, zeroed accumulators, the K
  // range.
  std::string setup() const {
    const CoopConfig& c = c_;
    // Which matrix of each copy this batch reads (broadcast operands have stride 0).
    std::string mats;
    for (size_t d = s_.batch.size(); d-- > 0;) {
      if (s_.batch[d] == 1) continue;
      mats += "  { uint idx = rest % " + u(s_.batch[d]) + "; rest /= " + u(s_.batch[d]) + "; amat += idx * " +
              u(s_.a_stride[d]) + "; bmat += idx * " + u(s_.b_stride[d]) + "; }\n";
    }
    const uint64_t tiles = tiles_m_ * tiles_n_;
    return gl::render(
        R"(  uint split = gid / ${TNB}, batch = (gid / ${TILES}) % ${NB}, tile = gid % ${TILES};
${ORIGIN}  uint amat = 0u, bmat = 0u, rest = batch;
${MATS}  a_off = amat * ${AVEC8};
  b_off = bmat * ${BVEC8};
  tid = gl_LocalInvocationIndex;
${WARP}  wm0 = (warp / ${WARPS_N}) * ${WM};
  wn0 = (warp % ${WARPS_N}) * ${WN};
${ZERO}${K_RANGE}  const bool LOADS = ${LOADS}
)",
        {{"TNB", u(tiles * nb_)},
         {"TILES", u(tiles)},
         {"NB", u(nb_)},
         {"ORIGIN", block_origin(TileOrder::RowMajor, tiles_m_, tiles_n_, c.group_m)},
         {"MATS", mats},
         {"AVEC8", u(pa_.vec8())},
         {"BVEC8", u(pb_.vec8())},
         {"WARP", emulate_ ? "  warp = tid / 32u;\n  lane = tid % 32u;\n"
                           : "  warp = gl_SubgroupID;\n  lane = gl_SubgroupInvocationID;\n"},
         {"WARPS_N", u(warps_n_)},
         {"WM", u(c.wm)},
         {"WN", u(c.wn)},
         {"ZERO", emulate_
                      ? "  " + unroll_ + "for (uint i = 0u; i < " + u(fi_ * fj_) + "; ++i)\n    " + unroll_ +
                            "for (uint e = 0u; e < " + u(per_lane_) + "; ++e) acc[i][e] = 0.0;\n"
                      : "  " + unroll_ + "for (uint i = 0u; i < " + u(fi_ * fj_) + "; ++i) acc[i] = " + t_c_ +
                            "(0.0);\n"},
         {"K_RANGE", split_ ? "  uint kbeg = split * " + u(c.k_chunk) + ";\n  uint ntiles = (min(" +
                                  u(c.k_chunk) + ", " + u(s_.k) + " - kbeg) + BK - 1u) / BK;\n"
                            : "  const uint kbeg = 0u, ntiles = " + u(div_up(s_.k, c.bk)) + ";\n"},
         // LOADS is false only in the "noload" ablation: every slice after the first is skipped.
         {"LOADS", c.ablate == "noload" ? "false;  // ABLATED" : "true;"}});
  }

  std::string fetch(const std::string& set, const std::string& k0) const {
    return "load_a" + set + "(" + k0 + "); load_b" + set + "(" + k0 + ");";
  }
  std::string put(const std::string& set, const std::string& buf) const {
    return "store_a" + set + "(" + buf + "); store_b" + set + "(" + buf + ");";
  }

  std::string k_loop() const {
    const CoopConfig& c = c_;
    const std::string first = "  " + fetch("0", "kbeg") + "\n  " + put("0", "0u") + "\n  barrier();\n";
    std::string g;
    if (c.ablate == "mmaonly") {
      // ABLATED: the first slice's fragments are loaded once; the loop then only multiplies (no loads, no
      // barriers), as many multiply-K steps as the real kernel makes. Its time is the ceiling of the
      // driver's cooperative multiplies at this subgroup tile, whatever feeds them.
      return first + (emulate_ ? "" : frag_loads("  ", "0u", "0u", "0u")) +
             "  for (uint st = 0u; st < ntiles * " + u(c.bk / mma_.k) + "; ++st) {\n" +
             step_mmas("    ", "0u", "0u", "0u") + "  }\n";
    }
    if (c.ablate == "fragonly") {
      // ABLATED: the first slice stays in buffer 0; every slice reloads its fragments from there and
      // multiplies them, with no global loads, no stores and no barriers. The fence after each slice keeps
      // the compiler from hoisting the (otherwise loop-invariant) shared loads out of the loop; it
      // synchronizes nothing. Its time against noload's is the barriers' share.
      return first +
             "  for (uint t = 0u; t < ntiles; ++t) {\n    compute(0u, kbeg);\n    memoryBarrierShared();\n  "
             "}\n";
    }
    // Slice t+1 is loaded into registers before slice t is multiplied, and stored to the other buffer right
    // after (whose last readers, slice t-1, all passed the previous barrier): one barrier per slice.
    return first + gl::render(R"(  for (uint t = 0u; t < ntiles; ++t) {
    bool more = LOADS && t + 1u < ntiles;
    if (more) { ${FETCH} }
    uint cur = t & 1u;
    compute(cur, kbeg + t * BK);
    if (more) { ${PUT} }
    barrier();
  }
)",
                              {{"FETCH", fetch("0", "kbeg + (t + 1u) * BK")}, {"PUT", put("0", "cur ^ 1u")}});
  }

  // The stores of this subgroup's accumulators; split K: this split's partial product, [split][batch][m][n]
  // in scratch 2.
  std::string epilogue() const { return unscale() + stores(); }

  // Scaled operands: the accumulators times 1 / (s_a * s_b) (exact, a power of two), before any store
  // (split K: each partial product, so the sum kernel adds unscaled values).
  std::string unscale() const {
    if (!sc_.on()) return "";
    return "  const float unscale = uintBitsToFloat(S[2]);\n  " + unroll_ + "for (uint i = 0u; i < " +
           u(fi_ * fj_) + "; ++i)" +
           (emulate_ ? "\n    " + unroll_ + "for (uint e = 0u; e < " + u(per_lane_) + "; ++e) acc[i][e] *= unscale;\n"
                     : " acc[i] = acc[i] * unscale;\n");
  }

  std::string stores() const {
    const std::string coff =
        "  uint coff = " + (split_ ? "(split * " + u(nb_) + " + batch)" : std::string("batch")) + " * " +
        u(s_.m * s_.n) + ";\n";
    const std::string loops = "  " + unroll_ + "for (uint i = 0u; i < " + u(fi_) + "; ++i)\n    " + unroll_ +
                              "for (uint j = 0u; j < " + u(fj_) + "; ++j)";
    if (direct_store_ && !emulate_)
      return coff + loops + "\n      coopMatStoreNV(acc[i * " + u(fj_) + " + j], C, coff + (m0 + wm0 + i * " +
             u(mma_.m) + ") * N + n0 + wn0 + j * " + u(mma_.n) + ", N, false);\n";
    const std::string lane_elements = "for (uint e = 0u; e < " + u(per_lane_) + "; ++e)";
    if (direct_store_)
      return coff + loops + "\n      " + unroll_ + lane_elements +
             " {\n        uint idx = lane + 32u * e;\n" + "        C[coff + (m0 + wm0 + i * " + u(mma_.m) +
             " + idx / " + u(mma_.n) + ") * N + n0 + wn0 + j * " + u(mma_.n) + " + idx % " + u(mma_.n) +
             "] = acc[i * " + u(fj_) + " + j][e];\n      }\n";
    // Edge blocks: each fragment goes through the subgroup's staging tile, stored with bounds checks. The
    // tile is either Cs or, as raw f32 bits 4 to a uvec4, the A tiles (the K loop ended on a barrier).
    const std::string cs = "warp * " + u(mma_.m * mma_.n);
    auto staged = [&](const std::string& idx) {
      return stage_in_a_ ? "As[(" + idx + ") >> 2u][(" + idx + ") & 3u]" : "Cs[" + idx + "]";
    };
    std::string stage;
    if (emulate_)
      stage = "      " + unroll_ + lane_elements + " " + staged(cs + " + lane + 32u * e") + " = " +
              (stage_in_a_ ? "floatBitsToUint(" : "(") + "acc[i * " + u(fj_) + " + j][e]);\n";
    else if (stage_in_a_)
      stage = "      coopMatStoreNV(acc[i * " + u(fj_) + " + j], As, (" + cs + ") / 4u, " + u(mma_.n / 4) +
              ", false);\n";
    else
      stage =
          "      coopMatStoreNV(acc[i * " + u(fj_) + " + j], Cs, " + cs + ", " + u(mma_.n) + ", false);\n";
    return gl::render(
        R"(${COFF}${NOTE}${LOOPS} {
${STAGE}      barrier();
      ${UNROLL}${LANE_ELEMENTS} {
        uint idx = lane + 32u * e;
        uint m = m0 + wm0 + i * ${MM} + idx / ${MN}, n = n0 + wn0 + j * ${MN} + idx % ${MN};
        if (m < M && n < N) C[coff + m * N + n] = ${VALUE};
      }
      barrier();
    }
)",
        {{"COFF", coff},
         {"NOTE",
          stage_in_a_ ? "  // edge staging in the A tiles: " + su(coop_staging_bytes(c_)) + " bytes\n" : ""},
         {"LOOPS", loops},
         {"STAGE", stage},
         {"UNROLL", unroll_},
         {"LANE_ELEMENTS", lane_elements},
         {"MM", u(mma_.m)},
         {"MN", u(mma_.n)},
         {"VALUE", stage_in_a_ ? "uintBitsToFloat(" + staged(cs + " + idx") + ")" : staged(cs + " + idx")}});
  }

  const GemmShape& s_;
  const CoopConfig& c_;
  const CoopScale& sc_;
  const CoopMatShape& mma_;
  const bool emulate_;
  const std::string
      unroll_;  // the emulation is for tests on software devices, where unrolled code only costs JIT time
  const uint32_t warps_n_, warps_, nt_, fi_, fj_, per_lane_;
  const uint64_t nb_, tiles_m_, tiles_n_;
  const bool split_;
  const gl::Grid grid_;
  const uint32_t ah_, bh_;
  const PackedOperand pa_, pb_;
  const bool direct_store_, stage_in_a_;
  std::string t_a_, t_b_, t_c_;  // the fragment types
};

}  // namespace

Kernel coop_kernel(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate,
                   const CoopScale& sc) {
  return CoopKernel(s, caps, c, emulate, sc).kernel();
}

}  // namespace mgn::codegen
