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

// How many ways to split K (a power of two, at most 16): only when the grid of `blocks` is below
// `below_blocks` and K is at least `min_k`; doubling while the grid stays within `max_blocks` and each split
// keeps at least `min_chunk` of K, then on while the grid stays within `long_max_blocks` and each split keeps
// at least `long_chunk` (long contractions: a weight gradient over all the tokens of a batch). The partial
// products are summed by a second kernel.
struct SplitRule {
  uint64_t below_blocks, min_k, max_blocks, min_chunk;
  uint64_t long_max_blocks = 0, long_chunk = 0;
};
// The f32 SIMT kernel. Run 16's measured choice on an H100 (bench/results/2026-12-07-h100-run16/call4,
// tune_smollm2-135m.txt) split every small-M GEMM of SmolLM2 at 128 tokens that had K >= 384 and fewer than 256
// blocks, 4-16 ways (128x192x576: 20.9 -> 11.0 us, 128x576x576: 20.7 -> 13.0, 128x576x1536: 24.5 -> 19.1,
// 128x64x384: 14.8 -> 9.3), and none with K = 128 or 384 blocks; the previous rule (below 128 blocks, K >= 1024,
// grid <= 256, chunks >= 256) split only two of them. On the 19 measured shapes this rule's choice is the
// measured best or within 10% of it on 17 (the other two differ from the best in the block, not the split:
// 576x576x128, 1000x2048x4); summed 1.22 ms with the previous rule, 1.12 with this one, 1.11 at best.
// The long tier, from run 19 on an H100 (bench/results/2026-12-07-h100-run19/call1, gemm_dw.jsonl): Whisper b8's fc
// weight gradient 1536x384x12000 in 64x64 blocks took 0.656 ms split 2 ways (288 blocks) and 0.553 split 4 (576);
// 384x384x12000 stays at 8 ways (0.196 ms; 16 would leave 750 of K per split).
inline constexpr SplitRule kSimtSplits{256, 256, 512, 96, 1024, 1024};
// The f16 cooperative-matrix kernel (larger blocks, measured in runs 6-7): the previous rule.
inline constexpr SplitRule kCoopmatSplits{128, 1024, 256, 256};
uint64_t auto_splits(const GemmShape& s, uint64_t blocks, const SplitRule& rule);
// A GEMM epilogue (kernel.h, gemm_epilogue): the pointwise nodes of a dispatch that a GEMM's store evaluates at
// each output element it writes, `nodes[km]` the matmul. The matmul's value is the local `v<id>`; the nodes'
// operands are loaded at the element, and the nodes `stored` marks (the matmul's own value among them when it
// is read elsewhere) are written there.
struct GemmEpilogue {
  const ir::Graph* graph = nullptr;
  std::vector<int> nodes;
  std::vector<bool> stored;
  size_t km = 0;
  int matmul() const { return nodes.at(km); }
  // The matmul's operand `slot` (0: A, 1: B) as a binding of this dispatch.
  Binding operand(int slot) const;
  // The epilogue at element `index` (a uint expression), its buffers numbered after `before`.
  PointwiseBody body(std::vector<Binding> before, const std::string& index) const;
  // The statements that evaluate it for the value `value` (a float expression) at the body's index.
  std::string code(const PointwiseBody& b, const std::string& value) const;
};
// The split-K scratch (words) of the SIMT kernel split `splits` ways: 0 when K is not split.
uint64_t simt_scratch_words(const GemmShape& s, uint64_t splits);

// The second kernel of a split-K GEMM: C = the sum of the `splits` partial products in scratch `slot`
// ([split][batch][m][n], `outs` = batch * m * n values each), added in split order (deterministic, no
// atomics); with `epilogue`, the sum is the matmul's value of the epilogue instead of C.
Kernel splitk_sum_kernel(uint64_t splits, uint64_t outs, int slot, const DeviceCaps& caps,
                         const GemmEpilogue* epilogue = nullptr);

// The same for a grouped GEMM (simt_gemm_grouped): `outs[j]` values of product j, each product's sum stored
// to its output (the dispatch's node j), in one pass.
Kernel splitk_sum_grouped_kernel(uint64_t splits, const std::vector<uint64_t>& outs, int slot,
                                 const DeviceCaps& caps);

// The families.
// `fixup`: a split K is summed by the GEMM's own blocks (the last of a tile's splits to arrive;
// TiledGemm::fixup) instead of a second kernel: one kernel, counters (Lowering::counter_words), the same sums
// bitwise.
Lowering simt_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                   const GemmEpilogue* epilogue = nullptr, GemmOperands k_vec4 = GemmOperands::Both,
                   bool fixup = true);
// Products of one left operand side by side along N, one grid over all their blocks
// (KernelOptions::gemm_siblings): s is the whole shape (N = the sum of seg_n) with B transposed and
// unbatched; product j reads the dispatch's node j's right operand and writes its output; the block width
// divides every seg_n.
Lowering simt_gemm_grouped(const GemmShape& s, const std::vector<uint64_t>& seg_n, const DeviceCaps& caps,
                           const GemmTile& want, GemmOperands k_vec4, bool fixup);
Kernel small_gemm_kernel(const GemmShape& s, const DeviceCaps& caps);
Lowering coopmat_gemm(const GemmShape& s, const DeviceCaps& caps, const GemmTile& want,
                      const CoopMatShape& mma, GemmAblation ablation, bool emulate, F16Scaling scaling);

}  // namespace mgn::codegen
