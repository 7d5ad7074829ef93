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

// The multiply kernel: scratch 0 x scratch 1 -> the output (or, split K, scratch 2).
Kernel coop_kernel(const GemmShape& s, const DeviceCaps& caps, const CoopConfig& c, bool emulate);

}  // namespace mgn::codegen
