// The tiled GEMM emitter (gemm_tiled.h): one kernel skeleton, two schedules, the instantiation's prologue
// and epilogue spliced in.
#include "codegen/gemm_tiled.h"

#include <algorithm>

#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::u;

// The parts of a kernel a schedule decides.
struct ScheduleText {
  std::string extensions;  // after #version
  std::string layout;      // the local size
  std::string shared;      // shared tiles
  std::string globals;     // per-invocation globals of the skeleton
  std::string compute;     // functions of the multiply
  std::string threads;     // main(): tid and the thread's place in the block
  std::string k_range;     // main(): the K range of this GEMM
  std::string zero;        // main(): accumulators to zero
  std::string pipeline;    // main(): the K loop
  std::string epilogue;    // main(): the loop over this thread's accumulators, around the store
};

ScheduleText double_buffered_vec4(const TiledGemm& g) {
  const uint32_t sm = g.tm / 4, sn = g.tn / 4, nt = g.tx * g.ty;
  ScheduleText s;
  s.extensions = "#extension GL_EXT_control_flow_attributes : require\n";
  s.layout = "local_size_x = " + std::to_string(nt);
  // k-major tiles of vec4s; the extra vec4 per row keeps the 4-row transposing stores of A conflict-free.
  s.shared = "shared vec4 As[2][BK][BM / 4u + 1u];\nshared vec4 Bs[2][BK][BN / 4u + 1u];\n";
  s.globals =
      gl::render(R"(vec4 acc[${N}];  // row i*4+r of the thread tile, column group j: acc[(i*4+r)*${SN}+j]
uint tid, tx, ty, m0, n0;
)",
                 {{"N", std::to_string(g.tm * sn)}, {"SN", std::to_string(sn)}});
  s.compute =
      gl::render(R"(void compute(uint buf) {
  [[unroll]] for (uint kk = 0u; kk < BK; ++kk) {
    vec4 a[${SM}], b[${SN}];
    [[unroll]] for (uint i = 0u; i < ${SMU}; ++i) a[i] = As[buf][kk][i * TY + ty];
    [[unroll]] for (uint j = 0u; j < ${SNU}; ++j) b[j] = Bs[buf][kk][j * TX + tx];
    [[unroll]] for (uint i = 0u; i < ${SMU}; ++i)
      [[unroll]] for (uint r = 0u; r < 4u; ++r)
        [[unroll]] for (uint j = 0u; j < ${SNU}; ++j)
          acc[(i * 4u + r) * ${SNU} + j] = fma(vec4(a[i][r]), b[j], acc[(i * 4u + r) * ${SNU} + j]);
  }
}
)",
                 {{"SM", std::to_string(sm)}, {"SN", std::to_string(sn)}, {"SMU", u(sm)}, {"SNU", u(sn)}});
  // Subgroup lanes laid out lane_x x lane_y over the thread grid (the sweep's knob on shared-memory
  // broadcast).
  const uint32_t lanes = g.lane_x * g.lane_y, warps_x = g.tx / g.lane_x;
  s.threads = gl::render(R"(  tid = gl_LocalInvocationIndex;
  { uint lane = tid % ${LANES}, w = tid / ${LANES};
    tx = (w % ${WX}) * ${LX} + lane % ${LX};
    ty = (w / ${WX}) * ${LY} + lane / ${LX}; }
)",
                         {{"LANES", u(lanes)}, {"WX", u(warps_x)}, {"LX", u(g.lane_x)}, {"LY", u(g.lane_y)}});
  s.zero = "  [[unroll]] for (uint i = 0u; i < " + u(g.tm * sn) + "; ++i) acc[i] = vec4(0.0);\n";
  if (g.k_chunk)
    s.k_range = "  uint kbeg = split * " + u(g.k_chunk) + ";\n  uint ntiles = (min(" + u(g.k_chunk) +
                ", K - kbeg) + BK - 1u) / BK;\n";
  else
    s.k_range = "  const uint kbeg = 0u, ntiles = " + u(div_up(g.k, g.bk)) + ";\n";
  // One barrier per slice: slice t+1 goes to the other buffer, whose last readers (slice t-1) all passed
  // the previous barrier; its global loads are issued before the FMAs of slice t and stored after them.
  s.pipeline = R"(  load_slice(kbeg);
  stage_slice(0u);
  barrier();
  for (uint t = 0u; t < ntiles; ++t) {
    uint cur = t & 1u;
    bool more = t + 1u < ntiles;
    if (more) load_slice(kbeg + (t + 1u) * BK);
    compute(cur);
    if (more) stage_slice(cur ^ 1u);
    barrier();
  }
)";
  // Thread (tx, ty) owns rows i*4*TY + 4*ty + r and columns j*4*TX + 4*tx + 0..3.
  auto each_accumulator = [&](const std::string& body) {
    return gl::render(R"(  [[unroll]] for (uint i = 0u; i < ${SM}; ++i)
    [[unroll]] for (uint r = 0u; r < 4u; ++r) {
      uint m = m0 + i * 4u * TY + 4u * ty + r;
${ROW_EDGE}      [[unroll]] for (uint j = 0u; j < ${SN}; ++j) {
        uint n = n0 + j * 4u * TX + 4u * tx;
${BODY}      }
    }
)",
                      {{"SM", u(sm)},
                       {"SN", u(sn)},
                       {"ROW_EDGE", g.m % g.bm != 0 ? "      if (m >= M) continue;\n" : ""},
                       {"BODY", body}});
  };
  s.epilogue = each_accumulator("        vec4 v = acc[(i * 4u + r) * " + u(sn) + " + j];\n" + g.store);
  if (!g.fixup.empty()) {
    // This block's partial products are stored; the last of the splits of its tile to arrive sums them all.
    s.shared += "shared uint last_split;\n";
    s.epilogue += gl::render(R"(  memoryBarrierBuffer();
  barrier();
  if (tid == 0u) last_split = atomicAdd(${COUNTER}, 1u) == ${LAST} ? 1u : 0u;
  barrier();
  if (last_split == 0u) return;
  memoryBarrierBuffer();
)",
                             {{"COUNTER", g.counter}, {"LAST", u(g.splits - 1)}}) +
                  each_accumulator(g.fixup) + "  if (tid == 0u) " + g.counter +
                  " = 0u;  // zero for the next run\n";
  }
  return s;
}

ScheduleText single_buffered_scalar(const TiledGemm& g) {
  ScheduleText s;
  s.layout = "local_size_x = " + std::to_string(g.tx) + ", local_size_y = " + std::to_string(g.ty);
  // +1 column: the k-wise stores would otherwise hit one bank.
  s.shared = "shared float As[BK][BM + 1u];\nshared float Bs[BK][BN + 1u];\n";
  s.globals = "uint tid, m0, n0, k_begin, k_end;\n";
  s.threads =
      "  tid = gl_LocalInvocationIndex;\n  uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;\n";
  s.k_range = g.k_chunk ? "  k_begin = split * " + u(g.k_chunk) + ";\n  k_end = min(K, k_begin + " +
                              u(g.k_chunk) + ");\n"
                        : "  k_begin = 0u;\n  k_end = K;\n";
  s.zero = R"(  float acc[TM][TN];
  for (uint i = 0u; i < TM; ++i)
    for (uint j = 0u; j < TN; ++j) acc[i][j] = 0.0;
)";
  s.pipeline = R"(  if (k_begin < k_end) {
    load_slice(k_begin);
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
      stage_slice();
      barrier();
      if (k0 + BK < k_end) load_slice(k0 + BK);  // in flight while this slice is multiplied
      float part[TM][TN];  // this slice's products, summed apart and then added: two-level summation
      for (uint i = 0u; i < TM; ++i)
        for (uint j = 0u; j < TN; ++j) part[i][j] = 0.0;
      for (uint kk = 0u; kk < BK; ++kk) {
        float av[TM], bv[TN];
        for (uint i = 0u; i < TM; ++i) av[i] = As[kk][tx + i * TX];
        for (uint j = 0u; j < TN; ++j) bv[j] = Bs[kk][ty + j * TY];
        for (uint i = 0u; i < TM; ++i)
          for (uint j = 0u; j < TN; ++j) part[i][j] = fma(av[i], bv[j], part[i][j]);
      }
      for (uint i = 0u; i < TM; ++i)
        for (uint j = 0u; j < TN; ++j) acc[i][j] += part[i][j];
      barrier();
    }
  }
)";
  s.epilogue = R"(  for (uint i = 0u; i < TM; ++i) {
    uint m = m0 + tx + i * TX;
    if (m >= M) break;
    for (uint j = 0u; j < TN; ++j) {
      uint n = n0 + ty + j * TY;
      if (n >= N) continue;
      float v = acc[i][j];
)" + g.store + "    }\n  }\n";
  return s;
}

constexpr std::string_view kSkeleton = R"(#version 450
${EXTENSIONS}${HEADER}layout(${LAYOUT}) in;
${BUFFERS}${CONSTANTS}// GEMM C[m, n] = sum_k A[m, k] * B[k, n]: BM x BN blocks, BK-deep K slices, TM x TN per thread
const uint M = ${M}, N = ${N}, K = ${K};
const uint BM = ${BM}, BN = ${BN}, BK = ${BK};
const uint TX = ${TX}, TY = ${TY}, TM = ${TMC}, TN = ${TNC};
${SHARED}${GLOBALS}${STATE}${LOADERS}${COMPUTE}void main() {
${GRID}${OUTER}${TILE}${THREADS}${K_RANGE}${SETUP}${ZERO}${PIPELINE}${EPILOGUE}}
)";

}  // namespace

uint64_t gemm_tiles(const TiledGemm& g) {
  return div_up(g.m, g.bm) * div_up(g.n, g.bn);
}

std::string block_origin(TileOrder order, uint64_t tiles_m, uint64_t tiles_n, uint32_t group_m) {
  if (order == TileOrder::ColumnMajor)
    return "  m0 = (tile % " + u(tiles_m) + ") * BM;\n  n0 = (tile / " + u(tiles_m) + ") * BN;\n";
  std::string s;
  if (group_m <= 1 || tiles_m <= 1) {
    s = "  uint tile_m = tile / " + u(tiles_n) + ", tile_n = tile % " + u(tiles_n) + ";\n";
  } else {
    const uint64_t g = std::min<uint64_t>(group_m, tiles_m);
    s = gl::render(R"(  uint group_first = (tile / ${GN}) * ${G};
  uint group_rows = min(${TM} - group_first, ${G});
  uint in_group = tile % ${GN};
  uint tile_m = group_first + in_group % group_rows, tile_n = in_group / group_rows;
)",
                   {{"GN", u(g * tiles_n)}, {"G", u(g)}, {"TM", u(tiles_m)}});
  }
  return s + "  m0 = tile_m * BM;\n  n0 = tile_n * BN;\n";
}

Kernel emit_tiled_gemm(const TiledGemm& g, const DeviceCaps& caps) {
  const ScheduleText s =
      g.schedule == GemmSchedule::DoubleBufferedVec4 ? double_buffered_vec4(g) : single_buffered_scalar(g);
  const gl::Grid grid = gl::flat_groups(g.outer * gemm_tiles(g), caps, g.name);
  Kernel k;
  k.name = g.name;
  k.glsl =
      gl::render(kSkeleton, {{"EXTENSIONS", s.extensions},
                             {"HEADER", g.header},
                             {"LAYOUT", s.layout},
                             {"BUFFERS", g.buffers},
                             {"CONSTANTS", g.constants},
                             {"M", u(g.m)},
                             {"N", u(g.n)},
                             {"K", u(g.k)},
                             {"BM", u(g.bm)},
                             {"BN", u(g.bn)},
                             {"BK", u(g.bk)},
                             {"TX", u(g.tx)},
                             {"TY", u(g.ty)},
                             {"TMC", u(g.tm)},
                             {"TNC", u(g.tn)},
                             {"SHARED", s.shared},
                             {"GLOBALS", s.globals},
                             {"STATE", g.state},
                             {"LOADERS", g.loaders},
                             {"COMPUTE", s.compute},
                             {"GRID", grid.glsl},
                             {"OUTER", g.outer_index},
                             {"TILE", block_origin(g.order, div_up(g.m, g.bm), div_up(g.n, g.bn), g.group_m)},
                             {"THREADS", s.threads},
                             {"K_RANGE", s.k_range},
                             {"SETUP", g.setup},
                             {"ZERO", s.zero},
                             {"PIPELINE", s.pipeline},
                             {"EPILOGUE", s.epilogue}});
  k.bindings = g.bindings;
  k.groups = grid.groups;
  return k;
}

}  // namespace mgn::codegen
