// Attention as matrix products: rewrites attention, attention_lse and the attention derivatives of the graph
// into matmul, softmax and pointwise nodes over the materialized score matrix, so that long sequences run on
// the tuned GEMM kernels instead of the one-thread-per-row attention kernels (docs/perf-notes.md, Whisper).
//
//   forward   S = (scale·q)·kᵀ [+ causal −∞],  P = softmax(S),  o = P·v,  lse = logsumexp(S)
//   backward  S recomputed from q, k; P = exp(S − lse); D = rowsum(do ∘ o); dP = do·vᵀ; dS = P ∘ (dP − D)
//             dv = Pᵀ·do,  dq = scale·(dS·k),  dk = dSᵀ·(scale·q)
// Grouped-query attention folds the query heads that share a kv head into the rows of one product
// ([B, Hkv, REP·Sq, D], a reshape of q), so dk and dv sum over them inside the GEMM. The backward recomputes S
// rather than keeping the forward's (memory as FlashAttention: only lse is saved), and the derivatives of one
// attention share S, P and dS.
//
// Not rewritten (the attention kernels keep them): attentions with an additive mask (a row masked everywhere
// must give o = 0, not NaN), causal ones with more queries than keys (rows with no visible key), and any
// attention the policy declines. The CPU reference executor never sees the rewrite; the Vulkan engine applies
// it, so every Vulkan-vs-CPU attention test checks it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "ir/graph.h"

namespace mgn::passes {

struct AttentionDims {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  uint64_t score_bytes() const { return uint64_t(B * Hq * Sq * Skv) * 4; }  // one f32 score matrix
};

// Says for one attention (its dims and whether it is causal) whether to rewrite it.
using AttentionMatmulPolicy = std::function<bool(const AttentionDims&, bool causal)>;

// The dims of an attention-family node (attention, attention_lse, attention_grad_*).
AttentionDims attention_dims(const ir::Graph& g, const ir::Node& n);

// True when the rewrite can express the node exactly (no mask; causal only with Skv >= Sq).
bool attention_matmul_applies(const ir::Graph& g, const ir::Node& n);

// A copy of `g` with every attention-family node the policy accepts rewritten; inputs, parameters and outputs
// keep their names. Nothing (no copy made) when no node is accepted; `rewritten` (if given) receives the number
// of attentions rewritten.
std::optional<ir::Graph> attention_as_matmul(const ir::Graph& g, const AttentionMatmulPolicy& accept,
                                             int* rewritten = nullptr);

}  // namespace mgn::passes
