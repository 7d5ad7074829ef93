// What the matmul kernel families share (helper-private): batch and operand index maps of a GemmShape,
// split K, and the entry points of each family (matmul_simt.cpp, matmul_small.cpp, matmul_coopmat.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/matmul.h"

namespace mgn::codegen {

inline std::string su(uint64_t v) {
  return std::to_string(v);
}

uint64_t batch_count(const GemmShape& s);
// "M=.. N=.. K=.. batch=..", for kernel header comments.
std::string gemm_dims(const GemmShape& s);
// Statements declaring `uint aoff, boff` (word offsets of this batch's matrices) from the flat batch index
// `batch`.
std::string batch_offsets(const GemmShape& s);
// GLSL index of A(m, k) and B(k, n) within one matrix, honoring the transposes.
std::string a_index(const GemmShape& s, const std::string& m, const std::string& k);
std::string b_index(const GemmShape& s, const std::string& k, const std::string& n);
// Bindings of a one-kernel GEMM: a, b (node inputs 0, 1), c (the output).
std::vector<Binding> gemm_bindings();

// How many ways to split K: only when the grid of `blocks` would leave most of a big GPU idle (< 128
// blocks) and K is long; doubling while the grid stays within 256 blocks and each split keeps >= 256 of K.
uint64_t auto_splits(const GemmShape& s, uint64_t blocks);
// The second kernel of a split-K GEMM: C = the sum of the `splits` partial products in scratch `slot`
// ([split][batch][m][n], `outs` = batch * m * n values each), added in split order (deterministic, no
// atomics).
Kernel splitk_sum_kernel(uint64_t splits, uint64_t outs, int slot, const DeviceCaps& caps);

// The families.
Lowering simt_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want);
Kernel small_gemm_kernel(const GemmShape& s, const DeviceCaps& caps);
Lowering coopmat_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                      const CoopMatShape& mma, GemmAblation ablation, bool emulate, F16Scaling scaling);

}  // namespace mgn::codegen
