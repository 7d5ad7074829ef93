// The GEMM generator behind lower_matmul, callable on a bare shape so a benchmark can generate and time a
// kernel without building a graph; plus the run-time knobs that pick among its variants.
//
// Knobs (read by lower_matmul on every lowering, so one process can be run once per setting):
//   MGN_GEMM_VARIANT  auto | simt | classic | small        f32 (strict) kernel family; default auto
//   MGN_GEMM_TILE     BMxBNxBK[,tTMxTN][,lLXxLY][,gG][,sS]  simt tile: block, per-thread tile, lanes of a
//                                                         subgroup along N x M, tile-row group, K splits
//   MGN_GEMM_F16      0 disables the f16 cooperative-matrix path for Accelerated nodes
//   MGN_GEMM_F16_TILE BMxBNxBK[,wWMxWN][,gG][,bB][,pP][,dD][,sS] coopmat tile: block, warp tile,
//                                                         tile-row group, shared buffers per operand (1 or
//                                                         2), K slices in flight in registers (1 or 2),
//                                                         operands whose fragments load straight from
//                                                         global memory (d0, da, db, dab), K splits
//   MGN_GEMM_F16_ABLATE noload | nomma | mmaonly | fragonly   benchmark only: see GemmOptions::coopmat_ablate
// Any field left out is chosen by the heuristics (the defaults are the expected-fastest configuration).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen {

struct GemmShape {
  uint64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  // Output batch dims, and per dim the matrix-count stride of a and b (0 where that operand broadcasts).
  std::vector<uint64_t> batch, a_stride, b_stride;
};

// Tiled is the register-tiled SIMT kernel (double-buffered, vec4 shared reads); Classic is the first
// single-buffered version, kept as the baseline of the sweep; CoopMatF16 rounds A and B to f16 copies
// (two packing kernels, scratch buffers) and multiplies them with GL_NV_cooperative_matrix (f32
// accumulation); only for Accelerated nodes.
enum class GemmVariant : uint8_t { Auto, Tiled, Small, Classic, CoopMatF16 };

// 0 everywhere means "let the heuristic choose".
struct GemmTile {
  uint32_t bm = 0, bn = 0, bk = 0;  // block tile and K slice
  uint32_t tm = 0, tn = 0;          // simt: per-thread tile (multiples of 4)
  uint32_t lx = 0, ly = 0;          // simt: a subgroup's lanes laid out lx (along N) x ly (along M)
  uint32_t wm = 0, wn = 0;          // coopmat: one subgroup's tile
  uint32_t group_m = 0;             // tile rows walked together (L2 reuse); 1 = plain row-major order
  uint32_t splits = 0;              // K split into this many partial products, then summed
  uint32_t buffers = 0;             // coopmat: shared-memory buffers per operand (1 or 2)
  uint32_t depth = 0;               // coopmat: K slices in flight in registers (1 or 2)
  // coopmat: operands whose fragments each subgroup loads straight from global memory (their f16 copies),
  // with no shared-memory tile: bit 0 A, bit 1 B; -1 = auto (both through shared memory).
  int direct = -1;
};

// Shape of one cooperative-matrix multiply (the device's VkCooperativeMatrixPropertiesNV entry).
struct CoopMatShape {
  uint32_t m = 16, n = 16, k = 16;
};

struct GemmOptions {
  GemmVariant variant = GemmVariant::Auto;
  GemmTile tile;          // for Tiled
  GemmTile coopmat_tile;  // for CoopMatF16
  CoopMatShape mma;       // for CoopMatF16
  // MGN_GEMM_F16_ABLATE: "noload" / "nomma" drop the CoopMatF16 kernel's later global loads / its
  // multiplies, "mmaonly" keeps only the multiplies (fragments loaded once, no barriers), and "fragonly" the
  // fragment loads from shared memory and the multiplies (no barriers), so a benchmark can split its time
  // into parts. Wrong results; never set it otherwise.
  std::string coopmat_ablate;
};

// Parses the knob strings above (empty = auto); throws mgn::Error naming the knob on a malformed value.
GemmVariant parse_gemm_variant(const std::string& text);
GemmTile parse_gemm_tile(const std::string& text, bool coopmat);
// MGN_GEMM_VARIANT / MGN_GEMM_TILE / MGN_GEMM_F16_TILE, with the process-wide cooperative-matrix shape.
GemmOptions gemm_options_from_env();

// Process-wide state of the f16 cooperative-matrix path, set by the device self-test
// (vk::gemm_coopmat_self_test); until it passes, lower_matmul never picks CoopMatF16.
struct CoopMatStatus {
  bool verified = false;
  CoopMatShape mma;
  std::string note;  // why it is off, or what passed
};
void set_coopmat_status(const CoopMatStatus& status);
CoopMatStatus coopmat_status();

// Bindings: 0 = a, 1 = b (node inputs 0, 1), 2 = output (split-K adds a scratch buffer and a second kernel;
// CoopMatF16 is three kernels: pack A to scratch 0, pack B to scratch 1, multiply scratch 0 x 1 -> output).
Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant = GemmVariant::Auto);
Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmOptions& options);

// The cooperative-matrix kernel for `s`, whatever the device: lets a test compile and validate it on a
// machine without GL_NV_cooperative_matrix. `emulate` spells every cooperative-matrix operation out in
// plain GLSL over virtual 32-lane subgroups (same tiling, staging, rounding and edges), so a device
// without the extension can run it and check everything but the hardware multiply. `ablate` as
// GemmOptions::coopmat_ablate (tests of the ablations themselves).
Lowering lower_gemm_coopmat(const GemmShape& s, const DeviceCaps& caps, const GemmTile& tile = {},
                            const CoopMatShape& mma = {}, bool emulate = false,
                            const std::string& ablate = "");

}  // namespace mgn::codegen
