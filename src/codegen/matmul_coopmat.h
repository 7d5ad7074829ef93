// matmul's f16 cooperative-matrix family (helper-private): the configuration of one kernel, the operands'
// f16 copies and the shared-memory layout both the lowering (matmul_coopmat.cpp) and the multiply kernel
// (matmul_coopmat_kernel.cpp) compute from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/matmul_common.h"

namespace mgn::codegen {

// Each operand's K slices go global -> registers -> one of two shared buffers in turn (one barrier per slice).
constexpr uint32_t kCoopBuffers = 2;

struct CoopConfig {
  uint32_t bm, bn, bk, wm, wn, group_m;
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

PackedOperand packed_a(const GemmShape& s, const CoopConfig& c);
PackedOperand packed_b(const GemmShape& s, const CoopConfig& c);
// Shared tiles keep the global layout ([m][k] or [k][m] for A, [k][n] or [n][k] for B), rows padded by
// 8 halves = 16 bytes so the cooperative loads' rows start on different banks and stay 16-byte aligned.
uint32_t coop_a_stride(const GemmShape& s, const CoopConfig& c);
uint32_t coop_b_stride(const GemmShape& s, const CoopConfig& c);
// Halves of one shared tile of an operand.
uint32_t coop_a_halves(const GemmShape& s, const CoopConfig& c);
uint32_t coop_b_halves(const GemmShape& s, const CoopConfig& c);
// Whole blocks only: the accumulators store straight to C.
bool coop_direct_store(const GemmShape& s, const CoopConfig& c);
// Edge blocks stage each f32 fragment through shared memory (a 4-byte-per-element tile per subgroup): in
// the A tiles, free once the K loop is done, when they are large enough, else in an array of its own.
uint32_t coop_staging_bytes(const CoopConfig& c);
bool coop_stage_in_a(const GemmShape& s, const CoopConfig& c);

// Power-of-two operand scaling (matmul_coopmat_scale.cpp). The scale buffer (scratch `slot`) holds, as f32
// bits: [0] s_a, [1] s_b (1 for an operand not scaled), [2] 1 / (s_a * s_b), [3] unused, then the absmax
// pass's per-workgroup maxima of |A| (groups_a words) and of |B| (groups_b words, each at most 256) as f32 bits.
constexpr uint64_t kScaleHeaderWords = 4;
struct CoopScale {
  F16Scaling which;
  int slot = -1;            // scratch index of the scale buffer; -1: no scaling
  uint64_t groups_a = 0, groups_b = 0;
  bool on() const { return slot >= 0; }
  uint64_t words() const { return kScaleHeaderWords + groups_a + groups_b; }
};
CoopScale coop_scale(const GemmShape& s, const CoopConfig& c, F16Scaling which, int slot);
// The pass before the packing kernels: per-workgroup max |x| of each scaled operand.
std::vector<Kernel> coop_scale_kernels(const GemmShape& s, const CoopConfig& c, const CoopScale& sc,
                                       const DeviceCaps& caps);
// For a scaled packing kernel of `threads` invocations per workgroup (a power of two): the shared reduction
// functions (they read the scale buffer `S`), and the prologue every invocation of a workgroup runs before any
// returns (it has barriers): `float s` = the operand's scale (A if `a`, else B); with `writes_header`,
// workgroup 0 also writes words 0..2 (s_a, s_b, 1 / (s_a * s_b)) for the multiply. The prologue uses `gid`.
std::string coop_scale_functions(uint32_t threads);
std::string coop_scale_prologue(const CoopScale& sc, bool a, bool writes_header);

// The multiply kernel: scratch 0 x scratch 1 -> the output (or, split K, scratch 2); with `sc` on, the
// accumulators are multiplied by the scale buffer's 1 / (s_a * s_b) before they are stored.
Kernel coop_kernel(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate,
                   const CoopScale& sc);

}  // namespace mgn::codegen
