// What the attention kernel families share (helper-private): the problem of one attention node, its
// kinds, the prelude of named constants and the mask, and the entry points of each family
// (attention_row.cpp, attention_tiled.cpp, attention_grad_kv.cpp). attention.cpp has the overview.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/glsl.h"
#include "codegen/kernel.h"

namespace mgn::codegen::attn {

struct Dims {
  uint64_t B, Hq, Hkv, Sq, Skv, D, Dv;
};
Dims dims_of(const ir::Graph& g, const ir::Node& n);

// ForwardLse: attention and attention_lse of the same inputs in one kernel (o and lse; see
// lower_attention_with_lse).
enum class Kind { Forward, Lse, ForwardLse, GradQ, GradK, GradV };
bool is_forward(Kind k);

// Which node of the dispatch takes each forward output (-1: not written). `o_bshd`: o is stored with its head
// and query axes swapped, [B, Sq, Hq, Dv] (the head merge of a transformer block, a permute [0, 2, 1, 3]
// fused into the store; lower_attention_fused).
struct FwdOuts {
  int o = -1, lse = -1;
  bool o_bshd = false;
};

// One attention problem: its dims and attributes, the names it goes by, the device.
struct Problem {
  Dims d;
  bool causal = false;
  const Shape* mask = nullptr;  // the mask input's shape, or none
  double scale = 1.0;
  std::string key;  // specialization key (dims_key)
  std::string op;   // kernel name prefix
  std::string who;  // the node(s), for errors
  const DeviceCaps* caps = nullptr;
  bool o_bshd = false;  // the forward kinds store o as [B, Sq, Hq, Dv] (FwdOuts::o_bshd)
};
std::string dims_key(const Dims& d, bool causal, const Shape* mask);

// Threads per workgroup of the query-tiled and key-tiled kernels (a thread per row).
uint32_t tiled_workgroup(const DeviceCaps& caps);
// Threads per workgroup: the tile length, also enough to cover `dims` output dims with one accumulator.
uint32_t workgroup_for(uint64_t tile, uint64_t dims, const DeviceCaps& caps);

// Shared float arrays, counted against the device limit.
struct Shared {
  std::string decls;
  uint64_t words = 0;
  void add(const std::string& name, uint64_t n, const std::string& comment);
};
// Throws when `bytes` of shared memory exceed the device's; `what` says which kernel and why.
void check_shared(uint64_t bytes, const Problem& p, const std::string& what);

// Named constants, -inf, and `float mask_at(uint b, uint h, uint i, uint j)`: the mask broadcast to
// [B, Hq, Sq, Skv] with stride 0 on its broadcast dims (resolved here, at codegen time).
std::string prelude(const Dims& d, uint32_t wg, double scale, bool causal, const Shape* mask);

// A whole attention kernel: #version (and [[unroll]] when `unroll`), the header comment naming the archetype,
// `op`, the problem's key and scale and the kernel's design, the local size, the buffers, the prelude, then
// `decls` and `main`.
std::string attention_kernel_glsl(const Problem& p, bool unroll, const std::string& op,
                                  const std::string& design, uint32_t wg, const gl::Buffers& bufs,
                                  const std::string& decls, const std::string& main);

// `float out = sum over the dims, in order, of x * y`, x and y being vec4 expressions of the index c < n4
// (the order score() and the derivative kernels use: P = exp(s - lse) there must see the score this lse
// came from, and a peaky softmax amplifies any difference).
std::string vec4_dot(const std::string& out, const std::string& x, const std::string& y,
                     const std::string& n4, const std::string& in);

// D_i = do_i . o_i, once per query row, into scratch 0 (the kernel before dk's).
void add_delta_kernel(Lowering& l, const Problem& p);

// The row kernels (attention_row.cpp): a workgroup per query row (forward kinds, grad_q) or per key row
// (grad_k, grad_v, and both at once: `pk`, `pv` the dispatch nodes of dk and dv, -1 for one not written).
Lowering row_lowering(const Problem& p, Kind kind, FwdOuts outs);
Lowering row_grad_kv_lowering(const Problem& p, int pk, int pv);
uint32_t grad_kv_workgroup(const Dims& d, const DeviceCaps& caps);
uint64_t grad_kv_shared_bytes(const Dims& d, uint32_t wg);

// The query-tiled kernels (attention_tiled.cpp): whether `kind` takes them, and the kernel.
bool use_query_tiled(const Dims& d, Kind kind, const DeviceCaps& caps, AttentionKernel want);
Kernel query_tiled(const Problem& p, Kind kind, FwdOuts outs);

// The key-tiled dK+dV kernels (attention_grad_kv.cpp).
bool use_kv_tiled(const Dims& d, AttentionKernel want);
void grad_kv_tiled(Lowering& l, const Problem& p, int pk, int pv);

}  // namespace mgn::codegen::attn
