// The codegen contract: every IR node lowers to a short list of compute kernels (usually one), each with
// readable GLSL specialized to the node's shapes and to the device, and the buffers it binds. The Vulkan
// backend compiles, dedups and dispatches them in order with a barrier between consecutive kernels of one
// node; scratch buffers live only for the node's kernels.
//
// Storage convention on the GPU (all backends' kernels agree on it): every tensor is a tightly packed
// row-major array of 32-bit words — f32 as float, i32 as int, bool as uint 0/1. (f16/bf16 storage is a
// later extension; such nodes compute and store f32 and round values to their dtype in the epilogue.)
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "mgn/options.h"

namespace mgn::codegen {

// Shape of one cooperative-matrix multiply (the device's VkCooperativeMatrixPropertiesNV entry).
struct CoopMatShape {
  uint32_t m = 16, n = 16, k = 16;
};

// What generators may specialize on: the device's limits and features, and the verdict of the f16
// cooperative-matrix GEMM's self-test on it (vk::coopmat_verdict), computed once per device.
struct DeviceCaps {
  uint32_t subgroup_size = 32;
  uint32_t max_shared_bytes = 32768;
  uint32_t max_workgroup_invocations = 1024;
  std::array<uint32_t, 3> max_workgroup_count = {65535, 65535, 65535};
  uint64_t max_storage_buffer_range = 128ull << 20;
  bool cooperative_matrix_nv = false;  // GL_NV_cooperative_matrix usable (f16 x f16 -> f32)
  uint32_t max_storage_buffers = 16;   // bindings one kernel may declare (maxPerStageDescriptorStorageBuffers)
  // The f16 cooperative-matrix GEMM passed its self-test on this device, with this multiply shape; until
  // then no lowering picks it.
  bool coopmat_f16_verified = false;
  CoopMatShape coopmat_mma;
};

// The compile options that reach the generators: kernel choices, and the precision of nodes that leave
// theirs unset.
struct CodegenOptions {
  KernelOptions kernels;
  Precision default_precision = Precision::Strict;
  // Measured kernel choice (docs/tuning.md): the f32 SIMT tile of matmuls whose tunable_gemm_key (matmul.h) is
  // listed; the others keep the heuristics' tile. Filled by the Vulkan backend's tuner before lowering.
  std::map<std::string, GemmTile> gemm_tuned;
  // Likewise the implicit-GEMM tile of convolutions whose tunable_conv_key (tuning.h) is listed (an auto tile:
  // the heuristics, measured fastest).
  std::map<std::string, ConvTile> conv_tuned;
};

enum class BindingKind : uint8_t {
  Input,    // index: which input of the node
  Output,   // the node's result
  Scratch,  // index: into Lowering::scratch_words
  // The dispatch's counters (Lowering::counter_words): zero before the dispatch's first run, and the kernels
  // leave them zero again (a split-K GEMM's arrival counts per block), so the backend zeroes them once and
  // keeps them.
  Counters,
};

// A kernel of a one-node lowering names its node's inputs and output; a kernel of a fused dispatch (several
// nodes, see lower_dispatch) also says which node: `node` is a position in the dispatch's node list.
struct Binding {
  BindingKind kind = BindingKind::Input;
  int index = 0;
  bool written = false;  // the kernel writes it (for barriers and aliasing decisions)
  int node = 0;          // Input / Output: which node of the dispatch (0 for one-node lowerings)
};

struct Kernel {
  std::string name;                  // e.g. "matmul_64x64_t0_1"; shown in dumps and timings
  std::string glsl;                  // complete "#version 450" compute shader; bindings at set 0, 0..N-1
  std::vector<Binding> bindings;     // binding i of the shader is bindings[i]
  std::array<uint32_t, 3> groups{};  // vkCmdDispatch counts (each within max_workgroup_count)
  uint32_t required_subgroup_size = 0;
  bool scalar_block_layout = false;  // uses GL_EXT_scalar_block_layout
};

struct Lowering {
  std::vector<Kernel> kernels;              // run in order; barrier between consecutive ones
  std::vector<uint64_t> scratch_words;      // sizes of the node's scratch buffers (32-bit words)
  uint64_t counter_words = 0;               // > 0: its kernels bind counters (BindingKind::Counters)
  bool output_zero_filled = false;          // the backend must zero the output before kernel 0
};

// Everything a generator reads about one node: a lowering is a pure function of these.
struct LowerContext {
  const ir::Graph& graph;
  const ir::Node& node;
  const DeviceCaps& caps;
  const CodegenOptions& options;
  const ir::Node& input(int i) const { return graph.node(node.inputs[static_cast<size_t>(i)]); }
  Precision precision() const { return node.precision.value_or(options.default_precision); }
};

// Dispatches on the node's op (exhaustive switch in lower.cpp). Throws mgn::Error for source/state ops,
// which own memory but have no kernel.
Lowering lower_node(const LowerContext& ctx);

// One generator per archetype family; each handles every op of its family (lower.cpp routes by op).
Lowering lower_pointwise(const LowerContext& ctx);  // unary/binary/ternary/compare/cast/grad helpers/rope
Lowering lower_reduction(const LowerContext& ctx);  // reduce_*, argmax, softmax, log_softmax, logsumexp
Lowering lower_matmul(const LowerContext& ctx);     // matmul (batched, broadcast, transposes)
Lowering lower_norm(const LowerContext& ctx);       // layer/rms/group/batch norm and their *_grad
Lowering lower_conv(const LowerContext& ctx);       // conv2d (+grads), pools (+grads), upsample (+grad)
Lowering lower_attention(const LowerContext& ctx);  // attention, attention_lse, attention_grad_{q,k,v}
Lowering lower_data(const LowerContext& ctx);       // reshape/permute/slice/concat/pad/expand/gather/one_hot
// gather_elements / scatter_elements, which lower_data routes to (index_elements.cpp).
Lowering lower_gather_elements(const LowerContext& ctx);
Lowering lower_scatter_elements(const LowerContext& ctx);
Lowering lower_loss(const LowerContext& ctx);       // cross_entropy, cross_entropy_grad

// ---- Fusion (fusion.cpp): several nodes in one dispatch, one kernel
// ----------------------------------------
//
// Two kinds. A pointwise fusion is a connected set of pointwise nodes (not rope) of one output shape: one
// invocation per element loads every outside operand once (broadcast as usual), keeps each node's value in
// a local variable, and stores the values that are read outside the fusion (the plan gives exactly those
// nodes memory; the others are internal). An attention fusion is attention_grad_k + attention_grad_v of one
// attention (the same inputs): one kernel writes dK and dV from one recomputation of P and dP; or attention +
// attention_lse of the same inputs (training: the forward and the lse autodiff adds for the backward): one
// forward pass writes o and lse; an attention (or that pair) and the head merge of its o
// (attention_head_merge), o stored merged. A GEMV fusion is up to kMaxGemvSiblings small matmuls (M <= 8: one
// token's projections, e.g. q, k, v or gate, up) that read the same left operand with the same M and K, each
// of which would lower to the workgroup-per-output kernel on its own: one dispatch computes every output of
// all of them, each output exactly as the single kernel computes it (matmul_small.cpp).
struct FusionOptions {
  bool pointwise = true;
  bool attention = true;
  bool gemv = true;  // off as well when KernelOptions::gemm forces the tiled kernel (the siblings' own lowering)
  // Set: pointwise readers of a matmul that lowers to the tiled GEMM under these options (tiled_gemm_epilogue)
  // join it as its epilogue (KernelOptions::gemm_epilogue).
  const CodegenOptions* gemm_epilogues = nullptr;
  // Set: matmuls with the same gemm_sibling_key under these options join one grouped GEMM.
  const CodegenOptions* gemm_siblings = nullptr;
  uint32_t max_nodes = 64;  // per pointwise fusion (kernel size, compile time)
};
inline constexpr size_t kMaxGemvSiblings = 4;

// Empty when matmul `n` cannot join a GEMV fusion; else a key that two matmuls share exactly when one dispatch
// may compute both (same left operand, transposes, M and K).
std::string gemv_sibling_key(const ir::Graph& g, const ir::Node& n);
// The GEMV fusion's kernel (matmul_small.cpp); lower_dispatch routes.
Lowering lower_gemv_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps);
// A GEMV norm prologue: rms_norm of the left operand (over K, the last axis) in the GEMV fusion of every matmul
// that reads it (the norm alone of its kind in the dispatch, its output read by nothing else): each workgroup
// sums x·gamma·W and x² over K in one pass and scales by inversesqrt(mean(x²) + eps) at the end, so the
// normalized row is never stored (one dispatch instead of two per norm of a token's projections).
// gemv_norm_prologue: whether rms_norm `norm` can lead such a fusion of the matmul `mm`.
bool gemv_norm_prologue(const ir::Graph& g, const ir::Node& norm, const ir::Node& mm);
Lowering lower_gemv_norm_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps);
// A GEMV pointwise prologue: pointwise nodes of one shape computing the left operand of up to kMaxGemvSiblings
// such matmuls (their only readers, nothing kept), then the matmuls, then (one matmul only) its epilogue: A(m, k)
// is computed inside the K loop of every workgroup (silu(gate)·up before a Llama down projection), bitwise as
// the pointwise kernel would store it.
bool gemv_pointwise_prologue(const ir::Graph& g, const std::vector<int>& nodes);
Lowering lower_gemv_pointwise_prologue(const ir::Graph& g, const std::vector<int>& nodes,
                                       const std::vector<bool>& stored, const DeviceCaps& caps);
// A GEMV epilogue: one such small matmul (alone, not in a sibling fusion) and pointwise nodes of its output
// shape that read it (a residual add: out = x + h·Wᵀ), evaluated after the matmul's reduction by the thread that
// stores the output; the pointwise nodes' operands are loaded at the output's element. A dispatch is one when
// it holds exactly one matmul, which reads no other node of it, and otherwise pointwise nodes.
// The same shape of dispatch serves the tiled GEMM's epilogue (below), which lower_dispatch routes by the matmul.
bool gemv_epilogue(const ir::Graph& g, const std::vector<int>& nodes);
Lowering lower_gemv_epilogue(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                             const DeviceCaps& caps);
// A tiled GEMM epilogue: a matmul that lowers to the tiled (SIMT) GEMM under `options` (not the small kernel, not
// the f16 one; tiled_gemm_epilogue) and pointwise nodes of its output shape that read it (bias, residual add,
// activation), evaluated by the thread that stores each output element: in the GEMM's store, or in the split-K
// sum when K is split. The same float operations on the same values as apart, so bitwise the same results.
// lower_tiled_gemm_epilogue lowers both kinds of epilogue dispatch (the GEMV one through lower_gemv_epilogue).
bool tiled_gemm_epilogue(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps, const CodegenOptions& options);
// How many pointwise nodes the epilogue of matmul `n` may hold: 0 when it has none (not tiled_gemm_epilogue), any
// number when K is split (the sum kernel runs it once per element), else kStoreEpilogueNodes when an operand is a
// Parameter (a layer's product, forward or its input gradient) and none otherwise (a weight gradient): the tiled
// kernel's store is unrolled over a thread's 16-64 accumulators, and a long epilogue there (an optimizer's update
// of a weight gradient) made training steps up to 8% slower on an H100 (run 17, docs/perf-notes.md).
inline constexpr size_t kStoreEpilogueNodes = 3;
// A store epilogue also needs a per-thread tile of at most this many accumulators (the 4x4 tiles): behind the
// 8x8 tiles of the 128x128-block kernel (Whisper at batch 8: 12,000 x 1,536 x 384) the H100's driver spilled
// registers to local memory and the whole GEMM ran 11-15x slower (0.37-0.68 ms -> 7.3-7.5 ms; run 18,
// docs/perf-notes.md), so those products store C and their readers run apart.
inline constexpr uint32_t kStoreEpilogueAccumulators = 16;
size_t tiled_gemm_epilogue_room(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                                const CodegenOptions& options);
Lowering lower_tiled_gemm_epilogue(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                                   const DeviceCaps& caps, const CodegenOptions& options);
// The scratch sizes (words) of an epilogue dispatch's lowering, known before the plan says what it stores.
std::vector<uint64_t> gemm_epilogue_scratch_words(const ir::Graph& g, const std::vector<int>& nodes,
                                                  const DeviceCaps& caps, const CodegenOptions& options);

// A grouped GEMM (KernelOptions::gemm_siblings): up to kMaxGemmSiblings matmuls that lower to the tiled GEMM,
// read the same left operand with the same transpose, M, K and batch, and each a transposed 2-D right operand
// whose N is a multiple of kGemmSiblingAlign (a layer's q, k, v or gate, up projections), each alone a grid
// below the split-K rule's threshold: one grid over the blocks of all of them (a block lies inside one
// product) and one split-K sum. The grouped shape chooses the tile and the split, so the values may differ
// from the separate products' by their rounding (another split of K). No epilogue. gemm_sibling_key: empty
// when `n` cannot join such a group, else a key two matmuls share exactly when they can.
inline constexpr size_t kMaxGemmSiblings = 4;
inline constexpr uint64_t kGemmSiblingAlign = 32;
std::string gemm_sibling_key(const ir::Graph& g, const ir::Node& n, const DeviceCaps& caps,
                             const CodegenOptions& options);
Lowering lower_gemm_siblings(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                             const CodegenOptions& options);

// What a pointwise fusion's kernel computes, for one element `index` (an expression): buffer declarations
// (bindings numbered after `bindings`), operand loads, the nodes in order, the stores of `stored` nodes. Nodes in
// `given` are computed elsewhere in the kernel (a local `v<id>` the caller declares before the body).
struct PointwiseBody {
  std::string decls, loads, body, stores, ops;
  std::vector<Binding> bindings;
  int written = 0;
  size_t read = 0;  // outside operands
};
PointwiseBody pointwise_body(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                             const std::set<int>& given, std::vector<Binding> bindings, const std::string& index);

// The fusions of the nodes `needed` marks (each list ascending, at least two nodes), such that running
// each as one dispatch keeps the dispatch graph acyclic and adds no dependency level: a fusion only grows
// over a producer whose other readers would not wait for it. A node read through a view (reshape) is
// never fused with that reader. `caps` bounds the bindings of a fused kernel.
// `pinned`: nodes the caller reads after the step (they are written, which counts against the bindings).
std::vector<std::vector<int>> find_fusions(const ir::Graph& g, const std::vector<bool>& needed,
                                           const std::vector<int>& pinned, const DeviceCaps& caps,
                                           const FusionOptions& opt = {});

// Whether `n` may join a pointwise fusion.
bool pointwise_fusible(const ir::Node& n);

// The kernels of one dispatch of the plan: lower_node for one node, else the fused kernel. `stored[k]`:
// nodes[k] has memory (read outside the dispatch, an output, an assign's value or pinned); a pointwise
// fusion writes exactly those, an attention fusion writes both of its nodes.
Lowering lower_dispatch(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                        const DeviceCaps& caps, const CodegenOptions& options);

// The pointwise fusion kernel (fusion.cpp), the dK+dV kernel and the attention + lse kernel (attention.cpp);
// lower_dispatch routes.
// One or two rope nodes of the same cos and sin (fusion (5)), each with the permute it reads through where that
// joined (a permute that keeps the last axis and has no other reader: the head split of an attention, whose copy
// is then not made): one elementwise kernel over the ropes' outputs. A single rope alone is the node's lowering.
Lowering lower_rope_group(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps);
// Whether a rope may read its input through `permute` instead of the permute's output.
bool rope_reads_through(const ir::Graph& g, const ir::Node& permute);
Lowering lower_pointwise_fusion(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                                const DeviceCaps& caps);
Lowering lower_attention_grad_kv(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                                 const CodegenOptions& options);
// Whether the dK+dV kernel of grad_k / grad_v (same inputs) fits the device (shared memory).
bool attention_grad_kv_fits(const ir::Graph& g, int grad_k, int grad_v, const DeviceCaps& caps);
// The attention forward fusions (attention.cpp): attention and attention_lse of the same inputs and
// attributes (the forward and the lse autodiff recomputes for the backward), one forward pass writing both;
// and attention (alone or in that pair) with the head merge of its o (attention_head_merge), o then stored
// permuted by the attention kernel instead of copied by the permute.
Lowering lower_attention_fused(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps,
                               const CodegenOptions& options);
// Whether `permute` is the head merge of an attention's o: perm [0, 2, 1, 3] of an f32 attention output
// ([B, Hq, Sq, Dv] -> [B, Sq, Hq, Dv], before the output projection of a transformer block).
bool attention_head_merge(const ir::Graph& g, const ir::Node& permute);

// The GLSL expression of pointwise node `n` for one element in terms of its operands `a`, `b`, `c`
// (pointwise.cpp; `in0` is the dtype of its first input). Throws for rope and non-pointwise ops.
std::string pointwise_expr(const ir::Node& n, DType in0);

// Ceil division for workgroup counts.
constexpr uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace mgn::codegen
