// Typed configuration. Every choice that changes a compiled program is a field of KernelOptions or
// PlanningOptions (inside mgn::CompileOptions, session.h); where the program runs is DeviceOptions. The
// library never reads the process environment: compiling one graph with the same options on the same device
// gives the same program whatever the environment. The command-line tools map the MGN_* variables onto
// these types with mgn::read_environment() (mgn/environment.h), the one place that reads them.
//
// The defaults are what the project measures and tests; the other values exist for benchmarks and for
// working around a driver (docs/perf-notes.md says why each kept variant stays).
#pragma once

#include <cstdint>
#include <string>

namespace mgn {

// The f32 (strict) GEMM kernel family. Tiled: the double-buffered register-tiled SIMT kernel (split K for
// small grids). Small: GEMV-like kernels for products with M or N of at most a few rows. Auto picks per shape.
enum class GemmKernel : uint8_t { Auto, Tiled, Small };
// Which operands of a GEMM a choice applies to.
enum class GemmOperands : uint8_t { None = 0, A = 1, B = 2, Both = 3 };

// The attention kernels: Auto rewrites long attentions (at least kAttentionMatmulMinSeq queries and keys), and
// every attention of a graph that differentiates one (training), into matrix products over the materialized
// scores (src/passes/attention_matmul.h) and, for the rest, takes the query-tiled forward kernels at long
// sequences and the row kernels otherwise (measured: docs/architecture.md, docs/perf-notes.md); Row / Tiled
// force one kernel form wherever the head dims allow it (no rewrite); Matmul rewrites every attention the
// rewrite can express (no mask; causal with at least as many keys as queries) and leaves the others to Auto's
// kernels.
enum class AttentionKernel : uint8_t { Auto, Row, Tiled, Matmul };
// Auto's rewrite threshold for graphs without attention derivatives, and its bound on one score matrix
// (B·Hq·Sq·Skv f32 values).
inline constexpr int64_t kAttentionMatmulMinSeq = 256;
inline constexpr uint64_t kAttentionMatmulMaxScoreBytes = uint64_t(1) << 30;

// Benchmarks only, wrong results on purpose: parts of the f16 cooperative-matrix GEMM removed so that its
// time can be split (docs/perf-notes.md). NoLoad drops the later global loads, NoMma the multiplies; MmaOnly
// keeps only the multiplies (fragments loaded once, no barriers); FragOnly the shared-memory fragment loads
// and the multiplies (no barriers).
enum class GemmAblation : uint8_t { None, NoLoad, NoMma, MmaOnly, FragOnly };

// A GEMM tile; 0 in a field means "let the heuristic choose". Text form, parsed by parse_gemm_tile: f32 SIMT
// "BMxBNxBK[,tTMxTN][,lLXxLY][,gG][,sS]"; f16 cooperative matrix "BMxBNxBK[,wWMxWN][,gG][,sS]".
struct GemmTile {
  uint32_t bm = 0, bn = 0, bk = 0;  // block tile and K slice
  uint32_t tm = 0, tn = 0;          // simt: per-thread tile (multiples of 4)
  uint32_t lx = 0, ly = 0;          // simt: a subgroup's lanes laid out lx (along N) x ly (along M)
  uint32_t wm = 0, wn = 0;          // coopmat: one subgroup's tile
  uint32_t group_m = 0;             // tile rows walked together (L2 reuse); 1 = plain row-major order
  uint32_t splits = 0;              // K split into this many partial products, then summed

  bool operator==(const GemmTile&) const = default;
  bool is_auto() const { return *this == GemmTile{}; }
};

// The block tile of the implicit-GEMM convolution kernels: BP output pixels x BQ output channels x a BK-deep
// slice of the reduction. All zero: chosen per shape. Text form "BPxBQxBK", e.g. "128x64x16".
struct ConvTile {
  uint32_t bp = 0, bq = 0, bk = 0;

  bool operator==(const ConvTile&) const = default;
  bool is_auto() const { return *this == ConvTile{}; }
};

// Measured kernel choice (docs/tuning.md): where a GEMM has several valid kernels (block tile, split K), time
// them on the session's device while compiling and lower with the fastest, remembered per device and driver
// in <cache_dir>/tuning/. Off: the heuristics alone, the tuning file is never read or written. Use: choices
// found in the file, the heuristics for the rest (never measures). Measure: as Use, and shapes missing from
// the file are measured now and added to it (without a cache_dir: measured, kept for this session only).
enum class TuneMode : uint8_t { Off, Use, Measure };

// Which kernels the code generator emits.
struct KernelOptions {
  // Connected pointwise nodes of one shape as one kernel; attention_grad_k + attention_grad_v of one
  // attention as one; attention + attention_lse of the same inputs as one. Results are bitwise the same
  // either way, except dK/dV with AttentionKernel::Tiled (the key-tiled kernel exists only fused).
  bool fusion = true;
  // ... and the pointwise readers of a tiled (SIMT) matmul's output of its shape (bias, residual add, activation)
  // computed where that matmul stores its value: in the GEMM's store, or in the split-K sum. Bitwise the same
  // either way (the same float operations on the same values); needs `fusion`.
  bool gemm_epilogue = true;
  // ... and up to 4 tiled matmuls that read the same left operand with the same M, K and batch, each with a
  // transposed 2-D right operand (a linear layer's weight: q, k, v or gate, up of one input), as one grouped
  // GEMM: one grid over the blocks of all of them (each block inside one product), one split-K sum for all.
  // Results stay within the GEMM's rounding of the separate products (the grouped shape may split K
  // otherwise); needs `fusion`. A product in such a group takes no epilogue.
  bool gemm_siblings = true;
  AttentionKernel attention = AttentionKernel::Auto;
  GemmKernel gemm = GemmKernel::Auto;
  GemmTile gemm_tile;  // the f32 SIMT tile
  // The f32 SIMT GEMM may read these operands, where stored contiguous along K (A not transposed, B transposed: a
  // linear layer's weight) and K is a multiple of 4, as vec4s along K, transposing them into its k-major shared
  // tile, instead of 4 scalar loads down the tile's rows; it does where that measured faster (matmul_simt.cpp:
  // 8-deep K slices, and the other operand read as vec4s or K <= 128). Results are bitwise the same either way.
  GemmOperands gemm_k_vec4 = GemmOperands::Both;
  // A tiled matmul whose K is split sums its partial products in the same kernel: the last block of each
  // output tile to arrive adds the splits' partials in split order and stores the result (or evaluates the
  // epilogue), with a per-tile arrival counter the backend zeroes once; off, or behind an epilogue of more
  // than 3 nodes (an optimizer's update), a second kernel sums them. Bitwise the same either way.
  bool gemm_splitk_fixup = true;
  // Accelerated matmuls may use the f16 cooperative-matrix GEMM on a device whose self-test passed.
  bool f16_gemm = true;
  // ... when the product is big enough to pay for its operand passes: the f16 path adds two packing
  // dispatches (f16 copies of A and B, with the scaling's maxima) in front of every GEMM, a few microseconds
  // each on a big GPU, which a small product does not win back (run 14 on an H100: the U-Net's and SmolVLA's
  // accelerated steps were 1.1-1.25x slower than strict). A matmul of M x N x K x batch below this stays on
  // the f32 kernel; 0 takes the f16 path for every eligible matmul. Default 2^26 (docs/perf-notes.md).
  uint64_t f16_min_work = uint64_t(1) << 26;
  // ... and when each of M, N and K reaches this: a product with a side below a tensor-core block fills the
  // blocks' rows, columns or slices partly and still pays both packing passes (runs 15-16 on an H100: SmolVLA's
  // 50-token expert GEMMs, 50 x 720 x 2048 and its transposes, made the accelerated F+L+B 9.0 ms against strict's
  // 8.5, and 9.7 with every matmul on f16). 0: no such rule.
  uint64_t f16_min_dim = 64;
  GemmTile f16_tile;  // the f16 cooperative-matrix tile
  // The f16 GEMM scales each operand that is not a Parameter by an exact power of two (from a max |x| pass
  // over it) so that its f16 copy neither flushes small values (gradients ~1e-6: f16's normal range starts at
  // 6.1e-5) nor overflows past 65504; the f32 result is unscaled exactly. Off: plain rounding to f16.
  bool f16_operand_scaling = true;
  GemmAblation f16_ablation = GemmAblation::None;
  ConvTile conv_tile;
  // K splits of the implicit-GEMM conv2d and conv2d_grad_input kernels (conv2d_grad_weight has its own rule):
  // 0 (auto) splits K over up to 256 / tiles workgroups per tile where 64x64 tiles alone would leave the
  // device under-filled (a deep, narrow layer: ResNet-50's 7x7 and 14x14 stages at batch 4 gave 32-52 tiles)
  // and each split keeps at least 8 K slices; 1 never splits; n >= 2 splits every such kernel n ways (fewer
  // where K has fewer slices: tests). Each split stores its partial output to scratch and a second kernel
  // sums the splits in split order, so results are deterministic.
  uint32_t conv_splits = 0;
  // spirv-opt's performance passes over every kernel's SPIR-V (shaderc's -O) before the driver compiles it.
  // They are most of a cold compile: a tiled GEMM kernel takes 68 ms with them and 7 ms without (glslang alone;
  // lavapipe's host, docs/perf-notes.md 2026-12-07), and every driver optimizes the SPIR-V it gets again. Off
  // (the default): SPIR-V straight from glslang (still validated). Measured on an H100 (run 17): the kernels run as
  // fast or faster without the passes, and a cold compile is 0.02-0.34 s shorter.
  bool spirv_optimize = false;

  bool operator==(const KernelOptions&) const = default;
};

// How the static plan lays out memory. Turning these off gives every step-local tensor its own memory,
// for comparison when an aliasing bug is suspected; results are bitwise the same.
struct PlanningOptions {
  bool reuse = true;     // step-local tensors with disjoint lifetimes share memory
  bool in_place = true;  // pointwise ops (and assigns) write over an input that dies there
  // Most bytes the step's memory (the plan's arena) may take; 0: the device's own figure (Vulkan: the largest
  // device-local heap's budget left under VK_EXT_memory_budget, else its size; CPU: the host's physical
  // memory). A plan over the smaller of the two fails at compile time with the bytes needed and available.
  uint64_t memory_limit_bytes = 0;

  bool operator==(const PlanningOptions&) const = default;
};

// Which Vulkan device, and the diagnostics that must be chosen when it is opened. Sessions with equal
// DeviceOptions share one logical device (VkDevice) per process; `instance` tells apart logical devices opened
// on one physical device (the replicas of a data-parallel trainer, mgn/data_parallel.h).
struct DeviceOptions {
  // A device index (vkEnumeratePhysicalDevices order) or a case-insensitive part of its name; empty: the
  // first device of Vulkan >= 1.2, discrete before integrated before virtual before CPU. An index out of
  // range or a name no device has is an error that lists the devices.
  std::string device;
  // Load the Khronos validation layer and turn any message into an error of the step that caused it
  // (needs the vulkan-validationlayers package).
  bool validation = false;
  // With validation: also the layer's synchronization validation (VK_VALIDATION_FEATURE_ENABLE_
  // SYNCHRONIZATION_VALIDATION_EXT), whose hazard reports become errors the same way.
  bool sync_validation = false;
  // One stderr line per new pipeline with the driver's statistics (registers, shared memory, binary size),
  // where VK_KHR_pipeline_executable_properties exists.
  bool pipeline_statistics = false;
  // Also write every internal representation the driver offers of each new pipeline to this folder.
  std::string pipeline_ir_dir;
  // Which logical device of the physical one: sessions whose options differ only here get separate VkDevices
  // (and queues, memory, pipelines) on the same physical device. The data-parallel trainer sets it to the
  // replica's index so that two replicas never share a VkDevice, even when both name the same GPU.
  int instance = 0;

  bool operator==(const DeviceOptions&) const = default;
};

// Testing only: makes the Vulkan engine act as if the driver had returned an error at one chosen call of a
// session, through the same error path a real failure takes, so that tests reach the recovery code on a
// device that never fails (docs/reliability.md, "Resource exhaustion"). Counts are 1-based over the session's
// life and its own calls only; 0 never fails. Nothing reads it from the environment; the CPU engine ignores
// it.
struct FaultInjection {
  // The Nth queue submission of the session's steps (one per run/step, CompileOptions::submissions per step
  // when split) returns VK_ERROR_DEVICE_LOST; that submission is not made.
  uint64_t device_lost_at_submission = 0;
  // The Nth wait for a step to finish (one per run/step) returns VK_ERROR_DEVICE_LOST; the work itself still
  // completes on the device.
  uint64_t device_lost_at_wait = 0;
  // The Nth vkAllocateMemory of the session (its memory blocks, made while compiling: on a unified-memory
  // device such as lavapipe the first is the first device block, elsewhere the two staging blocks come first)
  // returns VK_ERROR_OUT_OF_DEVICE_MEMORY; nothing is allocated.
  uint64_t out_of_memory_at_allocation = 0;

  bool operator==(const FaultInjection&) const = default;
  bool any() const { return *this != FaultInjection{}; }
};

// Text forms (the MGN_* variables and the command line use them). Each throws mgn::Error naming `who` and
// the accepted values when the text is malformed; "" and "auto" give the default.
GemmKernel parse_gemm_kernel(const std::string& text, const std::string& who = "gemm kernel");
AttentionKernel parse_attention_kernel(const std::string& text, const std::string& who = "attention kernel");
GemmAblation parse_gemm_ablation(const std::string& text, const std::string& who = "f16 GEMM ablation");
GemmTile parse_gemm_tile(const std::string& text, bool coopmat, const std::string& who = "GEMM tile");
ConvTile parse_conv_tile(const std::string& text, const std::string& who = "conv tile");
const char* gemm_kernel_name(GemmKernel k);            // "auto", "simt", "small"
const char* attention_kernel_name(AttentionKernel k);  // "auto", "row", "tiled"
const char* gemm_ablation_name(GemmAblation a);        // "", "noload", "nomma", "mmaonly", "fragonly"
std::string gemm_tile_str(const GemmTile& t, bool coopmat);  // "auto" when every field is unset
std::string conv_tile_str(const ConvTile& t);                // "auto" when every field is unset
TuneMode parse_tune_mode(const std::string& text, const std::string& who = "tuning");  // off, use, measure
const char* tune_mode_name(TuneMode m);                                                  // "off", "use", "measure"

}  // namespace mgn
