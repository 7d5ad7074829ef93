// The GEMM generator behind lower_matmul, callable on a bare shape so a benchmark can generate and time a
// kernel without building a graph. Which variant and tile a graph's matmul gets comes from
// KernelOptions (gemm, gemm_tile, f16_gemm, f16_tile, f16_ablation; include/mgn/options.h, where the tile
// grammar is) and from the device's cooperative-matrix self-test verdict in DeviceCaps; any tile field left
// at 0 is chosen by the heuristics (the defaults are the expected-fastest configuration).
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

// Tiled is the register-tiled SIMT kernel (double-buffered, vec4 shared reads); CoopMatF16 rounds A and B
// to f16 copies (two packing kernels, scratch buffers) and multiplies them with GL_NV_cooperative_matrix (f32
// accumulation); only for Accelerated nodes.
enum class GemmVariant : uint8_t { Auto, Tiled, Small, CoopMatF16 };

using mgn::GemmTile;

// Which operands of a CoopMatF16 product get exact power-of-two scaling on their way to f16
// (KernelOptions::f16_operand_scaling; matmul_coopmat_scale.cpp): a scaled operand's max |x| is taken first
// and its f16 copy holds x * s, s = 2^(14 - e) for max |x| in [2^(e-1), 2^e), so the copy's largest value lies
// in [2^13, 2^14) whatever the operand's magnitude; the f32 accumulators are multiplied by 1 / (s_a * s_b).
struct F16Scaling {
  bool a = false, b = false;
  bool any() const { return a || b; }
};

struct GemmOptions {
  GemmVariant variant = GemmVariant::Auto;
  GemmTile tile;          // for Tiled
  GemmOperands k_vec4 = GemmOperands::Both;  // for Tiled: KernelOptions::gemm_k_vec4
  bool splitk_fixup = true;                  // for Tiled: KernelOptions::gemm_splitk_fixup
  GemmTile coopmat_tile;  // for CoopMatF16
  F16Scaling coopmat_scaling;  // for CoopMatF16
  CoopMatShape mma;       // for CoopMatF16
  // Benchmarks only (wrong results): parts of the CoopMatF16 kernel removed (mgn::GemmAblation).
  GemmAblation coopmat_ablate = GemmAblation::None;
};

// Bindings: 0 = a, 1 = b (node inputs 0, 1), 2 = output (split-K adds a scratch buffer and a second kernel;
// CoopMatF16 is three kernels: pack A to scratch 0, pack B to scratch 1, multiply scratch 0 x 1 -> output;
// with operand scaling, two max |x| passes come first, writing the scales to the last scratch buffer).
Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, GemmVariant variant = GemmVariant::Auto);
Lowering lower_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmOptions& options);

// The cooperative-matrix kernel for `s`, whatever the device: lets a test compile and validate it on a
// machine without GL_NV_cooperative_matrix. `emulate` spells every cooperative-matrix operation out in
// plain GLSL over virtual 32-lane subgroups (same tiling, staging, rounding and edges), so a device
// without the extension can run it and check everything but the hardware multiply. `ablate` as
// GemmOptions::coopmat_ablate (tests of the ablations themselves); `scaling` as GemmOptions::coopmat_scaling.
Lowering lower_gemm_coopmat(const GemmShape& s, const DeviceCaps& caps, const GemmTile& tile = {},
                            const CoopMatShape& mma = {}, bool emulate = false,
                            GemmAblation ablate = GemmAblation::None, F16Scaling scaling = {});

// ---- Measured kernel choice (docs/tuning.md) -------------------------------------------------------------

// The GEMM of a matmul node (its output shape, the transposes, batch broadcasting of its inputs).
GemmShape matmul_shape(const ir::Graph& g, const ir::Node& node);
// The key under which a measured choice for this matmul is kept: "<dtype>/<strict|accelerated>/MxNxK/t<ta><tb>/
// <batch dim>.<a stride>.<b stride>,...", or "" when its lowering takes no tunable kernel (the f32 SIMT kernel
// with every tile field on auto: not the Small or f16 cooperative-matrix kernels, not an explicit tile).
std::string tunable_gemm_key(const LowerContext& ctx);
// The SIMT tile `want` gives for `s` on `caps` with every field the heuristics fill filled in (a lowering with
// the result is the same kernel); throws mgn::Error when `want` is not valid for the shape and device.
GemmTile resolve_simt_tile(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want = {});
// The candidates timed for `s`: the heuristics' choice first, then other block tiles (32x32, 64x64, 128x128)
// and split-K counts (x2 and x4 the default's, and no split where the default splits) that are valid for the
// shape and device; resolved, without duplicates.
std::vector<GemmTile> gemm_tune_candidates(const GemmShape& s, const DeviceCaps& caps);

}  // namespace mgn::codegen
