// Reverse-mode autodiff as a graph transformation: walks the forward graph from the loss backwards and
// appends, per node, the ops of its gradient rule. The rules are one table indexed by ir::Op, generated from
// ops.def: a differentiable op without a rule fails to compile.
#include "mgn/autodiff.h"

#include <array>
#include <cmath>
#include <optional>

#include "ir/graph.h"
#include "passes/autodiff_table.h"

namespace mgn {

using ir::Attrs;
using ir::Op;

namespace {

// Brings a gradient to the shape of the input it belongs to: sums over the axes that numpy broadcasting
// added or stretched in the forward op, and broadcasts a gradient that a rule produced with fewer (or
// size-1) axes than the input.
Tensor sum_to(Tensor t, const Shape& target) {
  Shape s = t.shape();
  if (s == target) return t;
  if (s.size() < target.size()) {
    Shape padded(target.size() - s.size(), 1);
    padded.insert(padded.end(), s.begin(), s.end());
    t = reshape(t, padded);
    s = padded;
  }
  size_t lead = s.size() - target.size();
  std::vector<int64_t> axes;
  for (size_t i = 0; i < s.size(); ++i)
    if (i < lead || (target[i - lead] == 1 && s[i] != 1)) axes.push_back(int64_t(i));
  Tensor r = axes.empty() ? t : sum(t, axes, true);
  Shape kept(r.shape().begin() + std::ptrdiff_t(lead), r.shape().end());
  if (kept != r.shape()) r = reshape(r, kept);
  if (kept == target) return r;
  for (size_t i = 0; i < kept.size(); ++i)
    if (kept[i] != target[i] && kept[i] != 1)
      throw Error("autodiff: gradient of shape " + shape_str(t.shape()) + " does not fit input shape " +
                  shape_str(target));
  return expand(r, target);
}

// Everything a rule sees: the forward node (a copy, since appending nodes may move the node list), its
// output and cotangent, which inputs want a gradient, and where to put the contributions.
struct RuleCtx {
  ir::Graph& g;
  ir::Node n;
  Tensor y, dy;
  std::vector<bool> need;
  std::vector<std::pair<size_t, Tensor>> out;

  Tensor x(size_t i) const { return Tensor(&g, n.inputs.at(i)); }
  // By value: building gradient ops appends nodes, which may move the node list.
  Shape in_shape(size_t i) const { return g.node(n.inputs.at(i)).shape; }
  DType in_dtype(size_t i) const { return g.node(n.inputs.at(i)).dtype; }
  size_t arity() const { return n.inputs.size(); }
  bool wants(size_t i) const { return i < need.size() && need[i]; }
  // Records d loss / d input i; broadcasting of the forward op is undone here, once for every rule.
  void give(size_t i, Tensor grad) {
    if (!wants(i)) return;
    out.emplace_back(i, sum_to(grad, in_shape(i)));
  }
  Tensor op(Op o, const std::vector<Tensor>& in, Attrs attrs = {}) {
    std::vector<int> ids;
    for (const Tensor& t : in) ids.push_back(t.id());
    return Tensor(&g, g.add(o, std::move(ids), std::move(attrs)));
  }
  Tensor zero() { return Tensor(&g, g.add_full({}, dy.dtype(), 0.0)); }
  Tensor one() { return Tensor(&g, g.add_full({}, dy.dtype(), 1.0)); }
  // The shape of a reduction's output with keepdim, so dy can broadcast back over the reduced axes.
  Tensor keepdim(Tensor t, const std::vector<int64_t>& axes) {
    Shape k = in_shape(0);
    for (int64_t a : axes) k[size_t(a)] = 1;
    return t.shape() == k ? t : reshape(t, k);
  }
};

Tensor sign_of(Tensor x) { return cast(greater(x, 0.0 * x), x.dtype()) - cast(less(x, 0.0 * x), x.dtype()); }

// Sum over every axis but the channel axis 1 (batch/group norm weight and bias gradients).
Tensor channel_sum(Tensor t) {
  std::vector<int64_t> axes;
  for (int i = 0; i < t.rank(); ++i)
    if (i != 1) axes.push_back(i);
  return sum(t, axes, false);
}

Attrs pick(const Attrs& a, std::initializer_list<const char*> keys) {
  Attrs r;
  for (const char* k : keys) {
    const ir::AttrValue& v = a.items().at(k);
    std::visit([&](const auto& x) { r.set(k, x); }, v);
  }
  return r;
}

using Rule = void (*)(RuleCtx&);

// The primary template is never defined for real: a differentiable op without a specialization below
// stops the build here.
template <Op O>
void rule(RuleCtx&) {
  static_assert(O != O, "ops.def marks this op differentiable but autodiff.cpp has no gradient rule for it");
}

#define RULE(E) \
  template <>   \
  void rule<Op::E>([[maybe_unused]] RuleCtx & c)

// ---- pointwise unary
RULE(Neg) { c.give(0, -c.dy); }
RULE(Abs) { c.give(0, c.dy * sign_of(c.x(0))); }  // 0 at x = 0, like PyTorch
RULE(Exp) { c.give(0, c.dy * c.y); }
RULE(Log) { c.give(0, c.dy / c.x(0)); }
RULE(Sqrt) { c.give(0, c.dy * 0.5 / c.y); }
RULE(Rsqrt) { c.give(0, c.dy * -0.5 * c.y * c.y * c.y); }
RULE(Reciprocal) { c.give(0, -c.dy * c.y * c.y); }
RULE(Square) { c.give(0, c.dy * 2.0 * c.x(0)); }
// relu(x) > 0 exactly where x > 0: reading the output lets the input die at the ReLU (in place over it).
RULE(Relu) { c.give(0, c.op(Op::ReluGrad, {c.y, c.dy})); }
RULE(LeakyRelu) {
  c.give(0, where(greater(c.x(0), c.zero()), c.dy, c.dy * c.n.attrs.f("alpha")));
}
RULE(GeluErf) { c.give(0, c.op(Op::GeluErfGrad, {c.x(0), c.dy})); }
RULE(GeluTanh) { c.give(0, c.op(Op::GeluTanhGrad, {c.x(0), c.dy})); }
RULE(Silu) { c.give(0, c.op(Op::SiluGrad, {c.x(0), c.dy})); }
RULE(Sigmoid) { c.give(0, c.dy * c.y * (1.0 - c.y)); }
RULE(Tanh) { c.give(0, c.dy * (1.0 - c.y * c.y)); }
// PyTorch's softplus is linear above the threshold 20, and so is its gradient.
RULE(Softplus) {
  Tensor x = c.x(0);
  c.give(0, where(greater(x, x * 0.0 + 20.0), c.dy, c.dy * sigmoid(x)));
}
RULE(Erf) { c.give(0, c.dy * (2.0 / std::sqrt(M_PI)) * exp(-square(c.x(0)))); }
RULE(Sin) { c.give(0, c.dy * cos(c.x(0))); }
RULE(Cos) { c.give(0, -c.dy * sin(c.x(0))); }
RULE(PowScalar) {
  double e = c.n.attrs.f("exponent");
  if (e == 0) return;  // constant 1: no contribution
  c.give(0, c.dy * e * pow(c.x(0), e - 1.0));
}
// PyTorch passes the gradient where min <= x <= max (bounds included).
RULE(Clamp) {
  Tensor x = c.x(0);
  Tensor lo = x * 0.0 + c.n.attrs.f("min"), hi = x * 0.0 + c.n.attrs.f("max");
  c.give(0, where(less(x, lo), c.zero(), where(greater(x, hi), c.zero(), c.dy)));
}
RULE(Cast) {
  if (!is_float(c.in_dtype(0))) return;
  c.give(0, c.dy.dtype() == c.in_dtype(0) ? c.dy : cast(c.dy, c.in_dtype(0)));
}
RULE(StopGradient) {}  // blocks: the analysis never marks its input as needing a gradient through it

// ---- pointwise binary / ternary
RULE(Add) {
  c.give(0, c.dy);
  c.give(1, c.dy);
}
RULE(Sub) {
  c.give(0, c.dy);
  c.give(1, -c.dy);
}
RULE(Mul) {
  c.give(0, c.dy * c.x(1));
  c.give(1, c.dy * c.x(0));
}
RULE(Div) {
  c.give(0, c.dy / c.x(1));
  c.give(1, -c.dy * c.y / c.x(1));
}
// Ties split the gradient evenly, like torch.maximum / torch.minimum.
static void extremum_rule(RuleCtx& c, bool is_max) {
  Tensor a = c.x(0), b = c.x(1);
  Tensor half = c.dy * 0.5;
  Tensor a_wins = is_max ? greater(a, b) : less(a, b);
  Tensor b_wins = is_max ? less(a, b) : greater(a, b);
  Tensor tie = equal(a, b);
  if (c.wants(0)) c.give(0, where(a_wins, c.dy, where(tie, half, c.zero())));
  if (c.wants(1)) c.give(1, where(b_wins, c.dy, where(tie, half, c.zero())));
}
RULE(Maximum) { extremum_rule(c, true); }
RULE(Minimum) { extremum_rule(c, false); }
RULE(Where) {
  Tensor cond = c.x(0);
  c.give(1, where(cond, c.dy, c.zero()));
  c.give(2, where(cond, c.zero(), c.dy));
}

// ---- reductions
RULE(ReduceSum) {
  const auto& axes = c.n.attrs.ints("axes");
  c.give(0, expand(c.keepdim(c.dy, axes), c.in_shape(0)));
}
RULE(ReduceMean) {
  const auto& axes = c.n.attrs.ints("axes");
  int64_t count = 1;
  for (int64_t a : axes) count *= c.in_shape(0)[size_t(a)];
  c.give(0, expand(c.keepdim(c.dy, axes) / double(count), c.in_shape(0)));
}
// PyTorch amax/amin: the gradient is shared evenly by every element equal to the extremum.
static void reduce_extremum_rule(RuleCtx& c) {
  const auto& axes = c.n.attrs.ints("axes");
  Tensor yk = c.keepdim(c.y, axes), dyk = c.keepdim(c.dy, axes);
  Tensor mask = cast(equal(c.x(0), yk), c.dy.dtype());
  Tensor count = sum(mask, axes, true);
  c.give(0, mask * (dyk / count));
}
RULE(ReduceMax) { reduce_extremum_rule(c); }
RULE(ReduceMin) { reduce_extremum_rule(c); }
// Row sums instead of the softmax Jacobian: dx = y * (dy - sum(dy * y)).
RULE(Softmax) {
  int64_t axis = ir::normalize_axis(c.n.attrs.i("axis"), int(c.in_shape(0).size()), "softmax");
  c.give(0, c.y * (c.dy - sum(c.dy * c.y, {axis}, true)));
}
RULE(LogSoftmax) {
  int64_t axis = ir::normalize_axis(c.n.attrs.i("axis"), int(c.in_shape(0).size()), "log_softmax");
  c.give(0, c.dy - exp(c.y) * sum(c.dy, {axis}, true));
}
RULE(LogSumExp) {
  std::vector<int64_t> axes = {c.n.attrs.i("axis")};
  Tensor yk = c.keepdim(c.y, axes), dyk = c.keepdim(c.dy, axes);
  c.give(0, dyk * exp(c.x(0) - yk));
}

// ---- matmul: C = op(A) op(B); each gradient is one more matmul with transpose flags (no transposes
// materialized). Broadcast batch axes are summed by give().
RULE(MatMul) {
  bool ta = c.n.attrs.i("transpose_a") != 0, tb = c.n.attrs.i("transpose_b") != 0;
  Tensor a = c.x(0), b = c.x(1), dc = c.dy;
  if (c.wants(0)) c.give(0, ta ? matmul(b, dc, tb, true) : matmul(dc, b, false, !tb));
  if (!c.wants(1)) return;
  // A matrix b shared by every batch of a (a linear layer's weight over [batch, tokens, features]): its gradient
  // sums over the batch and the rows, so the batch folds into the rows of one product, [B*M, K]^T [B*M, N],
  // instead of B products of M rows and a sum over their outputs. Needs a's rows stored [.., M, K] (not
  // transposed) and the same batch as dc.
  const Shape as = a.shape(), ds = dc.shape();
  if (b.shape().size() == 2 && as.size() > 2 && !ta && Shape(as.begin(), as.end() - 2) == Shape(ds.begin(), ds.end() - 2)) {
    const int64_t rows = numel(as) / as.back();
    Tensor a2 = reshape(a, {rows, as.back()}), d2 = reshape(dc, {rows, ds.back()});
    c.give(1, tb ? matmul(d2, a2, true, false) : matmul(a2, d2, true, false));
    return;
  }
  c.give(1, tb ? matmul(dc, a, true, ta) : matmul(a, dc, !ta, false));
}

// ---- normalization: dx through the *_norm_grad ops; weight and bias from reductions of dy and xhat
static void norm_rule(RuleCtx& c, Op grad_op, bool channel_axis) {
  Tensor x = c.x(0);
  Attrs attrs = c.n.op == Op::GroupNorm ? pick(c.n.attrs, {"groups", "eps"}) : pick(c.n.attrs, {"eps"});
  if (c.wants(0)) {
    std::vector<Tensor> in = {x, c.dy};
    if (c.arity() > 1) in.push_back(c.x(1));
    c.give(0, c.op(grad_op, in, attrs));
  }
  if (c.wants(1)) {
    Tensor xhat = c.op(c.n.op, {x}, attrs);  // the normalized input, without weight and bias
    Tensor p = c.dy * xhat;
    c.give(1, channel_axis ? channel_sum(p) : sum_to(p, c.in_shape(1)));
  }
  if (c.wants(2)) c.give(2, channel_axis ? channel_sum(c.dy) : sum_to(c.dy, c.in_shape(2)));
}
RULE(LayerNorm) { norm_rule(c, Op::LayerNormGrad, false); }
RULE(RmsNorm) { norm_rule(c, Op::RmsNormGrad, false); }
RULE(GroupNorm) { norm_rule(c, Op::GroupNormGrad, true); }
RULE(BatchNorm) { norm_rule(c, Op::BatchNormGrad, true); }

// ---- convolution and pooling
RULE(Conv2d) {
  Attrs geo = pick(c.n.attrs, {"stride", "padding", "dilation", "groups"});
  if (c.wants(0)) c.give(0, c.op(Op::Conv2dGradInput, {c.dy, c.x(1)}, Attrs(geo).set("input_shape", c.in_shape(0))));
  if (c.wants(1))
    c.give(1, c.op(Op::Conv2dGradWeight, {c.x(0), c.dy}, Attrs(geo).set("weight_shape", c.in_shape(1))));
}
// conv2d_grad_input(y, w) is the transposed convolution z of y: dy = conv2d(dz, w) (the forward it is the
// derivative of), dw = conv2d_grad_weight(dz, y) (z sums w[o, c] y[o] over o, as conv2d's input gradient).
RULE(Conv2dGradInput) {
  Attrs geo = pick(c.n.attrs, {"stride", "padding", "dilation", "groups"});
  if (c.wants(0)) c.give(0, c.op(Op::Conv2d, {c.dy, c.x(1)}, geo));
  if (c.wants(1))
    c.give(1, c.op(Op::Conv2dGradWeight, {c.dy, c.x(0)}, Attrs(geo).set("weight_shape", c.in_shape(1))));
}
RULE(MaxPool2d) { c.give(0, c.op(Op::MaxPool2dGrad, {c.x(0), c.dy}, c.n.attrs)); }
RULE(AvgPool2d) { c.give(0, c.op(Op::AvgPool2dGrad, {c.dy}, Attrs(c.n.attrs).set("input_shape", c.in_shape(0)))); }
RULE(Upsample2d) { c.give(0, c.op(Op::Upsample2dGrad, {c.dy}, c.n.attrs)); }

// ---- attention: the forward's log-sum-exp is recomputed once (attention_lse) and shared by dq/dk/dv.
RULE(Attention) {
  if (c.wants(3))
    throw Error("backward: " + c.g.describe(c.n.id) +
                ": the attention mask depends on a trainable tensor, but attention has no mask gradient");
  std::vector<Tensor> qkv = {c.x(0), c.x(1), c.x(2)};
  if (c.arity() > 3) qkv.push_back(c.x(3));
  Attrs attrs = pick(c.n.attrs, {"scale", "causal"});
  Tensor lse = c.op(Op::AttentionLse, qkv, attrs);
  std::vector<Tensor> in = {c.x(0), c.x(1), c.x(2), c.y, c.dy, lse};
  if (c.arity() > 3) in.push_back(c.x(3));
  const Op grads[3] = {Op::AttentionGradQ, Op::AttentionGradK, Op::AttentionGradV};
  for (size_t i = 0; i < 3; ++i)
    if (c.wants(i)) c.give(i, c.op(grads[i], in, attrs));
}
// y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin (halves of the last axis): the transpose is a rotation by -sin.
RULE(Rope) {
  Tensor x = c.x(0), cs = c.x(1), sn = c.x(2);
  if (c.wants(0)) c.give(0, rope(c.dy, cs, -sn));
  if (c.wants(1) || c.wants(2)) {
    int64_t d = x.dim(-1), h = d / 2;
    Tensor x1 = slice(x, -1, 0, h), x2 = slice(x, -1, h, d);
    Tensor g1 = slice(c.dy, -1, 0, h), g2 = slice(c.dy, -1, h, d);
    if (c.wants(1)) c.give(1, g1 * x1 + g2 * x2);
    if (c.wants(2)) c.give(2, g2 * x1 - g1 * x2);
  }
}

// ---- data movement
RULE(Reshape) { c.give(0, reshape(c.dy, c.in_shape(0))); }
RULE(Permute) {
  const auto& perm = c.n.attrs.ints("perm");
  int r = int(perm.size());
  std::vector<int64_t> inv(perm.size());
  for (int i = 0; i < r; ++i) inv[size_t((perm[size_t(i)] + r) % r)] = i;
  c.give(0, permute(c.dy, inv));
}
RULE(Slice) {
  c.give(0, c.op(Op::SliceGrad, {c.dy}, Attrs(c.n.attrs).set("input_shape", c.in_shape(0))));
}
RULE(Concat) {
  int64_t axis = c.n.attrs.i("axis"), off = 0;
  for (size_t i = 0; i < c.arity(); ++i) {
    int64_t len = c.in_shape(i)[size_t(axis)];
    if (c.wants(i)) c.give(i, len == c.dy.dim(int(axis)) ? c.dy : slice(c.dy, axis, off, off + len));
    off += len;
  }
}
RULE(Pad) {
  const auto& p = c.n.attrs.ints("pads");
  const Shape& xs = c.in_shape(0);
  std::vector<int64_t> st(xs.size()), en(xs.size()), sp(xs.size(), 1);
  for (size_t i = 0; i < xs.size(); ++i) {
    st[i] = p[i];
    en[i] = p[i] + xs[i];
  }
  c.give(0, c.op(Op::Slice, {c.dy}, Attrs().set("starts", st).set("ends", en).set("steps", sp)));
}
RULE(Expand) { c.give(0, c.dy); }  // give() sums over the expanded axes
RULE(Gather) {
  c.give(0, c.op(Op::GatherGrad, {c.dy, c.x(1)}, Attrs(c.n.attrs).set("table_shape", c.in_shape(0))));
}
// Every read position gets its cotangent back, summed where positions repeat.
RULE(GatherElements) {
  Tensor zero = Tensor(&c.g, c.g.add_full(c.in_shape(0), c.dy.dtype(), 0.0));
  c.give(0, c.op(Op::ScatterElements, {zero, c.x(1), c.dy}, Attrs(c.n.attrs).set("reduction", std::string("add"))));
}
// As torch's scatter: data's cotangent is dy except where an update overwrote it (reduction none); each update
// gets dy at its destination. mul/max/min have no rule.
RULE(ScatterElements) {
  const std::string r = c.n.attrs.s("reduction");
  if (r != "none" && r != "add")
    throw Error("backward: " + c.g.describe(c.n.id) + ": scatter_elements with reduction '" + r +
                "' has no gradient rule (none and add do)");
  const Attrs axis = pick(c.n.attrs, {"axis"});
  if (c.wants(0)) {
    if (r == "add") {
      c.give(0, c.dy);
    } else {
      Tensor zero = Tensor(&c.g, c.g.add_full(c.in_shape(2), c.dy.dtype(), 0.0));
      c.give(0, c.op(Op::ScatterElements, {c.dy, c.x(1), zero}, Attrs(axis).set("reduction", std::string("none"))));
    }
  }
  if (c.wants(2)) c.give(2, c.op(Op::GatherElements, {c.dy, c.x(1)}, axis));
}

// ---- losses
RULE(CrossEntropy) { c.give(0, c.op(Op::CrossEntropyGrad, {c.x(0), c.x(1), c.dy}, c.n.attrs)); }

#undef RULE

template <bool Differentiable, Op O>
constexpr Rule rule_entry() {
  if constexpr (Differentiable) return &rule<O>;
  else return nullptr;
}

constexpr std::array<Rule, ir::kOpCount> kRules = {{
#define X(E, name, mn, mx, arch, diff, shape_rule, attrs) rule_entry<diff, Op::E>(),
#include "ir/ops.def"
#undef X
}};

}  // namespace

bool ir::has_gradient_rule(Op op) { return kRules[size_t(op)] != nullptr; }

Gradients backward(Graph& graph, Tensor loss, const BackwardOptions& opt) {
  ir::Graph& g = graph.ir();
  if (!loss.valid() || loss.graph() != &g) throw Error("backward: the loss tensor does not belong to this graph");
  if (!is_float(loss.dtype()) || loss.numel() != 1)
    throw Error("backward: the loss must be a float scalar, got " + std::string(dtype_name(loss.dtype())) + " " +
                shape_str(loss.shape()) + " from " + g.describe(loss.id()));
  const int n_fwd = loss.id() + 1;  // nodes after the loss cannot influence it

  // Leaves that want a gradient: trainable float parameters, and the requested inputs.
  std::vector<bool> wanted(size_t(g.size()), false);
  for (int id : g.parameters())
    if (g.node(id).trainable && is_float(g.node(id).dtype)) wanted[size_t(id)] = true;
  for (const Tensor& t : opt.inputs) {
    if (!t.valid() || t.graph() != &g) throw Error("backward: a requested input does not belong to this graph");
    const ir::Node& n = g.node(t.id());
    if (n.op != Op::Input && n.op != Op::Parameter)
      throw Error("backward: requested " + g.describe(t.id()) + " is not a graph input or parameter");
    if (!is_float(n.dtype))
      throw Error("backward: requested input '" + n.name + "' is " + dtype_name(n.dtype) +
                  "; only float tensors have gradients");
    wanted[size_t(t.id())] = true;
  }

  // Forward pass of the analysis: which nodes depend on a wanted leaf through differentiable float ops.
  std::vector<bool> reach(size_t(g.size()), false);
  for (int id = 0; id < n_fwd; ++id) {
    const ir::Node& n = g.node(id);
    if (wanted[size_t(id)]) {
      reach[size_t(id)] = true;
      continue;
    }
    if (!ir::op_info(n.op).differentiable || n.op == Op::StopGradient || !is_float(n.dtype)) continue;
    for (int in : n.inputs)
      if (reach[size_t(in)]) reach[size_t(id)] = true;
  }

  std::vector<std::optional<Tensor>> grad(static_cast<size_t>(n_fwd));
  grad[size_t(loss.id())] = Tensor(&g, g.add_full(loss.shape(), loss.dtype(), 1.0));
  for (int id = n_fwd - 1; id >= 0; --id) {
    if (!grad[size_t(id)] || !reach[size_t(id)]) continue;
    RuleCtx c{g, g.node(id), Tensor(&g, id), *grad[size_t(id)], {}, {}};
    if (c.n.op == Op::Input || c.n.op == Op::Parameter) continue;
    Rule r = kRules[size_t(c.n.op)];
    if (!r) throw Error("internal: autodiff reached " + g.describe(id) + " which has no gradient rule");
    for (int in : c.n.inputs) c.need.push_back(reach[size_t(in)] && is_float(g.node(in).dtype));
    r(c);
    for (auto& [i, t] : c.out) {
      auto& slot = grad[size_t(c.n.inputs[i])];
      slot = slot ? add(*slot, t) : t;
    }
  }

  Gradients res;
  for (int id : g.parameters()) {
    const ir::Node& n = g.node(id);
    if (id < n_fwd && n.trainable && grad[size_t(id)]) res.params.emplace(n.name, *grad[size_t(id)]);
  }
  for (const Tensor& t : opt.inputs) {
    if (t.id() < n_fwd && grad[size_t(t.id())]) res.inputs.push_back(*grad[size_t(t.id())]);
    else res.inputs.push_back(Tensor(&g, g.add_full(t.shape(), t.dtype(), 0.0)));
  }
  return res;
}

}  // namespace mgn
