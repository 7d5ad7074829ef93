// The implicit-GEMM convolutions' shared pieces (helper-private): conv2d, conv2d_grad_input and
// conv2d_grad_weight instantiate the tiled GEMM emitter (gemm_tiled.h, schedule SingleBufferedScalar) with
// their own operand gathers (prologue) and output index maps (epilogue); tile choice and split K are decided
// here.
//
// The three convolutions are GEMMs C[p, q] = sum_k P[p, k] * Q[q, k] whose operands are gathered from the
// tensors on the fly (nothing is materialized). The p axis runs along the threads' x so the stores of
// neighbouring threads are neighbouring words; `outer` independent GEMMs (groups, stride phases, K
// splits) share one flat grid. A workgroup owns a BP x BQ block, stages BK-deep slices of both operands
// through shared memory (the next slice is loaded into registers while the current one is multiplied)
// and each thread accumulates a TP x TQ register tile with strided ownership (p = tx + i*TX,
// q = ty + j*TY), which keeps shared-memory reads conflict-free, like matmul.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen::igemm {

struct Tile {
  uint32_t bp, bq, bk, tx, ty;
  uint32_t nt() const { return tx * ty; }
};

constexpr uint64_t kWantGroups = 256;  // enough workgroups for a large GPU (the H200 has 132 SMs)

// A BP x BQ x BK tile with its threads, BK narrowed to K and to the device's shared memory.
Tile make_tile(uint32_t bp, uint32_t bq, uint32_t bk, uint64_t k, const DeviceCaps& caps);
// The tile KernelOptions::conv_tile pins, or the measured one (CodegenOptions::conv_tuned) of this node.
std::optional<Tile> forced_tile(uint64_t k, const LowerContext& ctx);
// The largest power-of-two tile edge in [lo, hi] whose padded extent stays within 25% of the smallest.
uint64_t fit_edge(uint64_t extent, uint64_t lo, uint64_t hi);

// K splits of a conv2d / conv2d_grad_input GEMM (KernelOptions::conv_splits) and the K range of each.
struct Split {
  uint64_t splits = 1, chunk = 0;  // chunk: K per split (a multiple of BK), 0 when not split
};

// `splits` ways or fewer: each split at least `min_slices` K slices, the partial outputs (splits x out_numel
// words) at most 64 MiB and one binding.
Split make_split(uint64_t splits, uint64_t K, uint32_t bk, uint64_t min_slices, uint64_t out_numel,
                 const DeviceCaps& caps);
// The tile and K split of a conv2d / conv2d_grad_input GEMM of P x Q, K deep, `outer` times, whose output has
// `out_numel` elements (conv_implicit_gemm.cpp has the rule).
std::pair<Tile, Split> pick_tile_split(uint64_t P, uint64_t Q, uint64_t K, uint64_t outer, uint64_t out_numel,
                                       const LowerContext& ctx);

// One convolution GEMM: P = rows (M of the emitter), Q = columns (N), its operands gathered by `load`.
struct ConvGemm {
  std::string name, comment;
  uint64_t P = 0, Q = 0, K = 0, outer = 1;
  uint64_t k_chunk = 0;  // > 0: K split (outer_index declares `split`)
  Tile t{};
  bool p_k_wise = false, q_k_wise = true;
  std::string buffers;      // buffer declarations (bindings in order)
  std::string consts;       // problem constants
  std::string state;        // per-invocation state the setup hoists out of the K loop (declares `uint z`)
  std::string outer_index;  // main(): decodes z (which GEMM of the grid) for the setup and the K range
  std::string setup;        // main(), before the K loop: sees z, m0, n0, tid
  std::string load;   // body of load_slice(uint k0): fills p_reg[a][c], q_reg[a][c] (zero outside k_end)
  std::string store;  // epilogue for one element: sees uint m < M, n < N, float v
  std::vector<Binding> bindings;
};

// The tiled GEMM emitter's single-buffered scalar schedule with the convolution's operand registers.
Kernel implicit_gemm(const ConvGemm& s, const DeviceCaps& caps);

// The GEMM's K split and its buffers: `outer` GEMMs (groups, stride phases) times the splits in the grid, the
// K chunk, the kernel's name and comment marked with the split, inputs `in0`, `in1` at bindings 0 and 1 and
// the output at 2 (Y, or PART: scratch of splits x the output, when K is split); the instantiation's
// `outer_index` declares `split` (z / outer).
void set_split(ConvGemm& s, const Split& sp, uint64_t outer, const std::string& in0, const std::string& in1);
// The store of output element `index` (a GLSL expression) into Y, or into this split's part of PART.
std::string out_store(const Split& sp, const std::string& index, uint64_t numel);
// A GEMM's lowering: the GEMM, then (K split) the sum of its partial outputs in split order.
Lowering with_split_sum(Kernel gemm, const Split& sp, const std::string& op, const std::string& what,
                        uint64_t numel, const DeviceCaps& caps);

// The im2col operand of conv2d and conv2d_grad_weight, gathered from X into p_reg.
struct Im2colGather {
  std::string state, setup, load;  // GemmSpec pieces; the setup needs g, the load closes its k loop
};
// `pixel_rows`: the P rows are pixels (conv2d), else taps (conv2d_grad_weight). `then`: appended to the
// body of the loop over this thread's k indices (sees k, k_ok and the k index's coordinates).
Im2colGather im2col_gather(const ir::Node& n, bool pixel_rows, const std::string& then);

}  // namespace mgn::codegen::igemm
