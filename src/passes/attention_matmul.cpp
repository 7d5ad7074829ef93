// Attention as matrix products (see attention_matmul.h for the formulas and what is left alone).
#include "passes/attention_matmul.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "mgn/types.h"

namespace mgn::passes {
namespace {

using ir::Attrs;
using ir::Node;
using ir::Op;

bool is_forward(Op op) { return op == Op::Attention || op == Op::AttentionLse; }
bool is_grad(Op op) { return op == Op::AttentionGradQ || op == Op::AttentionGradK || op == Op::AttentionGradV; }

// Emits nodes into the rebuilt graph with the precision of the attention they replace.
struct Emit {
  ir::Graph& g;
  std::optional<Precision> precision;
  // The causal masks made so far, by (rows, Skv, Sq): one constant serves every attention of that shape (a
  // model's layers), not one each (SmolLM2's training graph had 120 copies of its 384 x 128 mask: 24 MB to
  // hash and upload).
  std::map<std::tuple<int64_t, int64_t, int64_t>, int>* masks = nullptr;

  int mark(int id) {
    g.node_mut(id).precision = precision;
    return id;
  }
  int op(Op o, std::vector<int> in, Attrs a = {}) { return mark(g.add(o, std::move(in), std::move(a))); }
  int scalar(double v) { return mark(g.add_full({1}, DType::F32, v)); }
  int reshape(int x, std::vector<int64_t> shape) {
    if (g.node(x).shape == shape) return x;
    return op(Op::Reshape, {x}, Attrs().set("shape", std::move(shape)));
  }
  int matmul(int a, int b, bool ta, bool tb) {
    return op(Op::MatMul, {a, b}, Attrs().set("transpose_a", ta).set("transpose_b", tb));
  }
};

// The rows of one product: the REP query heads of a kv head, each Sq rows.
int64_t rows(const AttentionDims& d) { return (d.Hq / d.Hkv) * d.Sq; }

// scale·q as [B, Hkv, R, D] and the scores S = (scale·q)·kᵀ [B, Hkv, R, Skv] with the causal mask added.
struct Scores {
  int qs = -1, s = -1;
};

Scores scores(Emit& e, const AttentionDims& d, int q, int k, double scale, bool causal) {
  const int64_t R = rows(d);
  Scores r;
  r.qs = e.reshape(e.op(Op::Mul, {q, e.scalar(scale)}), {d.B, d.Hkv, R, d.D});
  r.s = e.matmul(r.qs, k, false, true);
  if (causal) {
    const std::tuple<int64_t, int64_t, int64_t> key{R, d.Skv, d.Sq};
    int m = -1;
    if (e.masks)
      if (auto it = e.masks->find(key); it != e.masks->end()) m = it->second;
    if (m < 0) {
      // Key j visible to query i iff j <= i + (Skv - Sq); row r of a kv head is query r % Sq.
      std::vector<double> mask(size_t(R * d.Skv), 0.0);
      const double inf = std::numeric_limits<double>::infinity();
      for (int64_t row = 0; row < R; ++row)
        for (int64_t j = (row % d.Sq) + (d.Skv - d.Sq) + 1; j < d.Skv; ++j)
          mask[size_t(row * d.Skv + j)] = -inf;
      m = e.mark(e.g.add_constant({R, d.Skv}, DType::F32, std::move(mask)));
      if (e.masks) e.masks->emplace(key, m);
    }
    r.s = e.op(Op::Add, {r.s, m});
  }
  return r;
}

// What the derivatives of one attention share.
struct Backward {
  Scores sc;
  int p = -1, dout = -1, ds = -1;
};

// `sc`: the scores attention_lse computed just before (the derivatives follow it), else recomputed.
Backward backward(Emit& e, const AttentionDims& d, const std::vector<int>& in, double scale, bool causal,
                  const Scores* sc) {
  const int64_t R = rows(d);
  Backward b;
  b.sc = sc ? *sc : scores(e, d, in[0], in[1], scale, causal);
  const int lse = e.reshape(in[5], {d.B, d.Hkv, R, 1});
  b.p = e.op(Op::Exp, {e.op(Op::Sub, {b.sc.s, lse})});
  b.dout = e.reshape(in[4], {d.B, d.Hkv, R, d.Dv});
  const int o = e.reshape(in[3], {d.B, d.Hkv, R, d.Dv});
  const int rowdot = e.op(Op::ReduceSum, {e.op(Op::Mul, {b.dout, o})},
                          Attrs().set("axes", std::vector<int64_t>{3}).set("keepdim", true));
  const int dp = e.matmul(b.dout, in[2], false, true);
  b.ds = e.op(Op::Mul, {b.p, e.op(Op::Sub, {dp, rowdot})});
  return b;
}

}  // namespace

AttentionDims attention_dims(const ir::Graph& g, const Node& n) {
  const Shape& q = g.node(n.inputs.at(0)).shape;
  const Shape& k = g.node(n.inputs.at(1)).shape;
  const Shape& v = g.node(n.inputs.at(2)).shape;
  AttentionDims d;
  d.B = q[0];
  d.Hq = q[1];
  d.Sq = q[2];
  d.D = q[3];
  d.Hkv = k[1];
  d.Skv = k[2];
  d.Dv = v[3];
  return d;
}

bool attention_matmul_applies(const ir::Graph& g, const Node& n) {
  if (is_forward(n.op)) {
    if (n.inputs.size() > 3) return false;  // masked
  } else if (is_grad(n.op)) {
    if (n.inputs.size() > 6) return false;
  } else {
    return false;
  }
  const AttentionDims d = attention_dims(g, n);
  if (d.Hkv <= 0 || d.Hq % d.Hkv != 0) return false;
  if (g.node(n.inputs[0]).shape[0] != g.node(n.inputs[1]).shape[0]) return false;  // batch broadcast
  const bool causal = n.attrs.i("causal") != 0;
  if (causal && (d.Skv < d.Sq || rows(d) * d.Skv > (int64_t(1) << 24))) return false;
  return true;
}

std::optional<ir::Graph> attention_as_matmul(const ir::Graph& g, const AttentionMatmulPolicy& accept,
                                             int* rewritten) {
  if (rewritten) *rewritten = 0;
  auto accepted = [&](const Node& n) {
    return (is_forward(n.op) || is_grad(n.op)) && attention_matmul_applies(g, n) &&
           accept(attention_dims(g, n), n.attrs.i("causal") != 0);
  };
  bool any = false;
  for (const Node& n : g.nodes()) any = any || accepted(n);
  if (!any) return std::nullopt;
  ir::Graph out;
  out.set_default_precision(g.default_precision());
  std::vector<int> map(size_t(g.size()), -1);
  // Shared pieces, keyed by the rebuilt ids of their inputs and the attributes.
  using FwdKey = std::tuple<int, int, int, double, bool>;  // q, k, v, scale, causal
  using BwdKey = std::tuple<int, int, int, int, int, int, double, bool>;  // + o, do, lse
  // The forward's scores (attention) and the backward's (attention_lse, emitted by autodiff next to the
  // derivatives), apart: sharing one S between them would keep it alive from the forward to the backward.
  std::map<FwdKey, Scores> fwd_scores, lse_scores;
  std::map<FwdKey, int> fwd_probs;
  std::map<BwdKey, Backward> bwd;
  std::set<std::tuple<int, int, int, double, bool>> attentions;
  std::map<std::tuple<int64_t, int64_t, int64_t>, int> masks;
  for (const Node& n : g.nodes()) {
    std::vector<int> in;
    in.reserve(n.inputs.size());
    for (int i : n.inputs) in.push_back(map[size_t(i)]);
    if (!accepted(n)) {
      map[size_t(n.id)] = out.add_copy(n, std::move(in));
      continue;
    }
    const AttentionDims d = attention_dims(g, n);
    const double scale = n.attrs.f("scale");
    const bool causal = n.attrs.i("causal") != 0;
    Emit e{out, n.precision, &masks};
    const FwdKey key{in[0], in[1], in[2], scale, causal};
    attentions.insert(key);
    int result = -1;
    if (is_forward(n.op)) {
      auto& memo = n.op == Op::Attention ? fwd_scores : lse_scores;
      auto it = memo.find(key);
      if (it == memo.end()) it = memo.emplace(key, scores(e, d, in[0], in[1], scale, causal)).first;
      const int s = it->second.s;
      if (n.op == Op::Attention) {
        auto pit = fwd_probs.find(key);
        if (pit == fwd_probs.end()) pit = fwd_probs.emplace(key, e.op(Op::Softmax, {s}, Attrs().set("axis", int64_t(-1)))).first;
        result = e.reshape(e.matmul(pit->second, in[2], false, false), {d.B, d.Hq, d.Sq, d.Dv});
      } else {
        const int lse = e.op(Op::LogSumExp, {s}, Attrs().set("axis", int64_t(-1)).set("keepdim", false));
        result = e.reshape(lse, {d.B, d.Hq, d.Sq});
      }
    } else {
      const BwdKey bkey{in[0], in[1], in[2], in[3], in[4], in[5], scale, causal};
      auto it = bwd.find(bkey);
      if (it == bwd.end()) {
        auto sit = lse_scores.find(key);
        it = bwd.emplace(bkey, backward(e, d, in, scale, causal, sit == lse_scores.end() ? nullptr : &sit->second))
                 .first;
      }
      const Backward& b = it->second;
      if (n.op == Op::AttentionGradQ) {
        const int dq = e.op(Op::Mul, {e.matmul(b.ds, in[1], false, false), e.scalar(scale)});
        result = e.reshape(dq, {d.B, d.Hq, d.Sq, d.D});
      } else if (n.op == Op::AttentionGradK) {
        result = e.matmul(b.ds, b.sc.qs, true, false);
      } else {
        result = e.matmul(b.p, b.dout, true, false);
      }
    }
    // The node's label names the replacement's result, so plans and errors still say which attention it is.
    if (!n.name.empty() && out.node(result).name.empty()) out.node_mut(result).name = n.name;
    map[size_t(n.id)] = result;
  }
  std::vector<std::pair<std::string, int>> outs;
  for (const auto& [name, id] : g.outputs()) outs.emplace_back(name, map[size_t(id)]);
  out.set_outputs(std::move(outs));
  if (rewritten) *rewritten = int(attentions.size());
  return out;
}

}  // namespace mgn::passes
