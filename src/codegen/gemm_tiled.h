// The tiled GEMM emitter behind matmul's SIMT kernel (matmul_simt.cpp) and the implicit-GEMM convolutions
// (conv_implicit_gemm.cpp): C[m, n] = sum_k A[m, k] * B[k, n], one workgroup per BM x BN block of C and
// `outer` independent GEMMs (batches, K splits, groups, stride phases) in one flat grid.
//
// The emitter owns the GEMM's skeleton: the grid and the block's place in it (raster order), the shared
// tiles, the per-thread accumulators and the multiply of a staged K slice (the schedule), the K-slice
// pipeline and the epilogue loop over the accumulators a thread owns. An instantiation brings the rest:
//   prologue  its buffers and constants, global state, the operand loaders (`load_slice(k0)`: this thread's
//             share of the K slice [k0, k0 + BK) from global memory into registers, zeros outside K, and
//             `stage_slice(...)`: those registers into the shared tiles As / Bs in the schedule's layout),
//             the decomposition of the outer index and the per-block set-up (index maps hoisted out of the
//             K loop, the K range);
//   epilogue  the store of one accumulator (a float, or a vec4 of 4 columns).
// Every output element is one fma chain over its K range in order, whatever the tile, so the tiling
// never changes a result (split K does: its partial sums are added by a second kernel in split order).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel.h"

namespace mgn::codegen {

enum class GemmSchedule : uint8_t {
  // Two shared buffers of k-major vec4 tiles, As[2][BK][BM/4 + 1] (A transposed on the way in) and
  // Bs[2][BK][BN/4 + 1]: the next slice's loads are in flight while this one is multiplied and are staged
  // into the other buffer after it, one barrier per slice. A 1-D workgroup of TX x TY threads (thread
  // (tx, ty) set by the prologue's lane layout) owns TM x TN accumulators as (TM/4) x (TN/4) 4x4
  // sub-tiles strided across the block: rows i*4*TY + 4*ty + r, columns j*4*TX + 4*tx + 0..3. The K loop
  // runs `ntiles` slices from `kbeg` (the set-up defines both). The epilogue sees `uint m` (< M), `uint n`
  // (the first of 4 columns, maybe past N) and `vec4 v`.
  DoubleBufferedVec4,
  // One shared buffer of k-major float tiles, As[BK][BM + 1] and Bs[BK][BN + 1]; the next slice waits in
  // registers while this one is multiplied, two barriers per slice. A 2-D workgroup of TX x TY threads owns
  // TM x TN accumulators strided across the block: rows tx + i*TX, columns ty + j*TY, which keeps the
  // shared reads conflict-free. The K loop runs [k_begin, k_end) (0 and K unless the set-up narrows them).
  // Each slice's BK products are summed into a zeroed partial that is then added to the accumulator (two-level
  // summation: error ~ (BK + K/BK) ulps, not K; the conv kernels' long K of smooth, cancelling products made
  // the U-Net's attention-block gradients 4x further from f64 than PyTorch's, docs/unet.md "Gates").
  // The epilogue sees `uint m` (< M), `uint n` (< N) and `float v`.
  SingleBufferedScalar,
};

// Which block a flat `tile` index is: row-major (n fastest) with `group_m` > 1 walking group_m block rows
// down one block column before moving right (blocks in flight together share their A rows and B columns
// in L2); column-major (m fastest).
enum class TileOrder : uint8_t { RowMajor, ColumnMajor };

struct TiledGemm {
  std::string name;    // the kernel's name
  std::string header;  // comment lines after #version: archetype, specialization key, problem
  GemmSchedule schedule = GemmSchedule::SingleBufferedScalar;
  uint64_t m = 0, n = 0, k = 0;  // one GEMM
  uint64_t outer = 1;            // independent GEMMs in the grid (the prologue decodes `outer_index`)
  uint32_t bm = 0, bn = 0, bk = 0, tm = 0, tn = 0;  // block, K slice, per-thread tile
  uint32_t tx = 0, ty = 0;                          // threads (see the schedule)
  // DoubleBufferedVec4: the lanes of one subgroup cover lane_x x lane_y threads of the TX x TY grid.
  uint32_t lane_x = 1, lane_y = 1;
  // > 0: K is split; this GEMM covers [split * k_chunk, +k_chunk) (a multiple of bk), `split` decoded by
  // outer_index.
  uint64_t k_chunk = 0;
  TileOrder order = TileOrder::RowMajor;
  uint32_t group_m = 1;  // RowMajor only
  // Prologue.
  std::string buffers;      // storage buffer declarations, in binding order
  std::string constants;    // the instantiation's named constants
  std::string state;        // global variables (registers of the loaders, hoisted index maps)
  std::string loaders;      // load_slice(uint k0), stage_slice(...) and their helpers
  std::string outer_index;  // main(): statements that declare `uint tile` (< the tiles of one GEMM) and
                            // decode the rest of gid (which GEMM) for the set-up
  std::string setup;        // main(): after m0, n0 (the block's first row and column) are set
  // Epilogue: the store of one accumulator (see the schedule).
  std::string store;
  // DoubleBufferedVec4 with K split: the partial products summed in the kernel. Each block, once its `store`s
  // (of its partial products, to a coherent buffer) are done, counts its arrival at `counter` (a uint of a
  // coherent buffer, zero before the dispatch: BindingKind::Counters); the last of the tile's `splits` blocks
  // to arrive runs `fixup` for each of its accumulator positions (`uint m`, `uint n` as the epilogue's: sum
  // the partials in split order, store C) and sets the counter back to zero. Empty: no fixup (a second kernel
  // sums).
  std::string counter, fixup;
  uint64_t splits = 1;
  std::vector<Binding> bindings;
};

// The blocks of one GEMM: the flat grid has outer x tiles_m x tiles_n workgroups, `tile` < tiles_m x tiles_n.
uint64_t gemm_tiles(const TiledGemm& g);

// Statements setting `m0`, `n0` (the block's first row and column) from the flat block index `tile`.
std::string block_origin(TileOrder order, uint64_t tiles_m, uint64_t tiles_n, uint32_t group_m);

Kernel emit_tiled_gemm(const TiledGemm& g, const DeviceCaps& caps);

}  // namespace mgn::codegen
