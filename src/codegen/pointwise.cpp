// Pointwise archetype: one thread per output element; numpy broadcasting is index arithmetic specialized to
// the operand shapes (identity where a shape equals the output's). Covers unary/binary/compare/where/cast,
// the derivative helpers and rope.
#include <algorithm>
#include <cmath>

#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

using gl::flit;
using gl::u;

bool is_int(DType t) { return t == DType::I32 || t == DType::Bool; }

// x^e: exact repeated products for small integer exponents (GLSL pow is undefined for x < 0).
std::string pow_expr(const std::string& x, double e) {
  if (e == 0.5) return "sqrt(" + x + ")";
  if (e == std::floor(e) && std::fabs(e) <= 16) {
    int n = int(std::fabs(e));
    std::string p = n == 0 ? "1.0" : x;
    for (int i = 1; i < n; ++i) p += " * " + x;
    return e < 0 ? "(1.0 / (" + p + "))" : "(" + p + ")";
  }
  return "(" + x + " < 0.0 ? mgn_nan() : pow(" + x + ", " + flit(e) + "))";
}

}  // namespace

// The value of the node for one element, in the output's GLSL type; a, b, c are the loaded operands.
std::string pointwise_expr(const ir::Node& n, DType in0) {
  using ir::Op;
  const bool ints = is_int(in0);
  switch (n.op) {
    case Op::Neg: return "-a";
    case Op::Abs: return "abs(a)";
    case Op::Exp: return "exp(a)";
    case Op::Log: return "log(a)";
    case Op::Sqrt: return "sqrt(a)";
    case Op::Rsqrt: return "1.0 / sqrt(a)";
    case Op::Reciprocal: return "1.0 / a";
    case Op::Square: return "a * a";
    case Op::Relu: return "a > 0.0 ? a : 0.0";
    case Op::LeakyRelu: return "a > 0.0 ? a : " + flit(n.attrs.f("alpha")) + " * a";
    case Op::GeluErf: return "0.5 * a * (1.0 + mgn_erf(a * 0.70710678118654752))";
    case Op::GeluTanh:
      return "0.5 * a * (1.0 + mgn_tanh(0.79788456080286536 * (a + 0.044715 * a * a * a)))";
    case Op::Silu: return "a * mgn_sigmoid(a)";
    case Op::Sigmoid: return "mgn_sigmoid(a)";
    case Op::Tanh: return "mgn_tanh(a)";
    case Op::Softplus: return "a > 20.0 ? a : mgn_log1p(exp(a))";
    case Op::Erf: return "mgn_erf(a)";
    case Op::Sin: return "sin(a)";
    case Op::Cos: return "cos(a)";
    case Op::PowScalar: return pow_expr("a", n.attrs.f("exponent"));
    case Op::Clamp: {
      std::string lo = flit(n.attrs.f("min")), hi = flit(n.attrs.f("max"));
      return "a < " + lo + " ? " + lo + " : (a > " + hi + " ? " + hi + " : a)";
    }
    case Op::Cast: {
      DType to = n.dtype;
      if (to == DType::Bool) return ints ? "a != 0 ? 1u : 0u" : "a != 0.0 ? 1u : 0u";
      if (to == DType::I32) return "int(a)";  // truncates toward zero, like the CPU reference
      return "float(a)";
    }
    case Op::StopGradient: return "a";
    case Op::ReluGrad: return "a > 0.0 ? b : 0.0";
    case Op::GeluErfGrad:
      return "b * (0.5 * (1.0 + mgn_erf(a * 0.70710678118654752)) + a * 0.39894228040143268 * exp(-0.5 * a * a))";
    case Op::GeluTanhGrad:
      return "b * (0.5 * (1.0 + mgn_tanh(0.79788456080286536 * (a + 0.044715 * a * a * a))) + 0.5 * a * "
             "(1.0 - mgn_tanh(0.79788456080286536 * (a + 0.044715 * a * a * a)) * mgn_tanh(0.79788456080286536 * "
             "(a + 0.044715 * a * a * a))) * 0.79788456080286536 * (1.0 + 3.0 * 0.044715 * a * a))";
    case Op::SiluGrad: return "b * mgn_sigmoid(a) * (1.0 + a * (1.0 - mgn_sigmoid(a)))";
    case Op::Add: return "a + b";
    case Op::Sub: return "a - b";
    case Op::Mul: return "a * b";
    case Op::Div: return "a / b";  // int: truncation toward zero
    case Op::Maximum: return ints ? "max(a, b)" : "(isnan(a) || isnan(b)) ? mgn_nan() : max(a, b)";
    case Op::Minimum: return ints ? "min(a, b)" : "(isnan(a) || isnan(b)) ? mgn_nan() : min(a, b)";
    case Op::Equal: return "a == b ? 1u : 0u";
    case Op::NotEqual: return "a != b ? 1u : 0u";
    case Op::Less: return "a < b ? 1u : 0u";
    case Op::LessEqual: return "a <= b ? 1u : 0u";
    case Op::Greater: return "a > b ? 1u : 0u";
    case Op::GreaterEqual: return "a >= b ? 1u : 0u";
    case Op::Where: return "a != 0u ? b : c";
    case Op::Rope: break;  // reads its input at other elements: lower_rope
#define MGN_FAMILY_Pointwise
#include "codegen/other_ops.inc"
      break;
  }
  throw Error(std::string("internal: ") + ir::op_name(n.op) + " is not a pointwise op");
}

namespace {

// The rope of x (`xs`, its element `i`) into y, cos/sin broadcast by idx_cs (`sfx` tells the buffers of a group
// apart). Pairs (d, d + D/2): y_lo = x_lo cos - x_hi sin, y_hi = x_hi cos + x_lo sin. x is read at src<sfx>(i):
// the element itself, or, where x is a permute the dispatch does not make, the permute's input at the element's
// source (the permute keeps the last axis, so the partner is D/2 away there too).
std::string rope_body(const Shape& xs, const std::string& i, const std::string& sfx) {
  const int64_t D = xs.back(), H = D / 2;
  return gl::render(R"(  uint d = ${I} % ${D};
  uint j = d % ${H};
  uint h = idx_cs${S}((${I} / ${D}) * ${H} + j);
  float c = cs[h], s = sn[h];
  uint xi = src${S}(${I});
  if (d < ${H}) y${S}[${I}] = x${S}[xi] * c - x${S}[xi + ${H}] * s;
  else y${S}[${I}] = x${S}[xi] * c + x${S}[xi - ${H}] * s;
)",
                    {{"I", i}, {"S", sfx}, {"D", u(uint64_t(D))}, {"H", u(uint64_t(H))}});
}

Shape rope_half(Shape xs) {
  xs.back() /= 2;
  return xs;
}

// `uint src<sfx>(uint i)`: the flat index in x's memory of element i of the rope's input (shape `xs`): i itself,
// or through `permute` (a node, or nullptr).
std::string rope_source_fn(const std::string& sfx, const Shape& xs, const ir::Graph& g, const ir::Node* permute) {
  std::string body = "  return i;\n";
  if (permute) {
    const std::vector<gl::Dim> dims = gl::permuted_dims(g.node(permute->inputs[0]).shape, xs, permute->attrs.ints("perm"));
    body = "  uint src = 0u;\n" + gl::offset_code(dims, "i", "src", "t") + "  return src;\n";
  }
  return "uint src" + sfx + "(uint i) {\n" + body + "}\n";
}

Lowering lower_rope(const LowerContext& ctx) {
  return lower_rope_group(ctx.graph, {ctx.node.id}, ctx.caps);
}

}  // namespace

bool rope_reads_through(const ir::Graph& g, const ir::Node& permute) {
  if (permute.op != ir::Op::Permute || numel(permute.shape) == 0 || permute.dtype != DType::F32) return false;
  const auto& perm = permute.attrs.ints("perm");
  const int64_t r = int64_t(perm.size());
  return r > 0 && (perm.back() + r) % r == r - 1 && g.node(permute.inputs[0]).shape.size() == size_t(r);
}

Lowering lower_rope_group(const ir::Graph& g, const std::vector<int>& nodes, const DeviceCaps& caps) {
  // The ropes in node order, each with the member permute it reads through (if any).
  std::vector<std::pair<const ir::Node*, const ir::Node*>> ropes;
  size_t through = 0;  // permutes read through
  for (int id : nodes) {
    const ir::Node& n = g.node(id);
    if (n.op == ir::Op::Permute) continue;
    if (n.op != ir::Op::Rope) throw Error("internal: " + g.describe(n.id) + " in a rope dispatch");
    const bool member = std::find(nodes.begin(), nodes.end(), n.inputs[0]) != nodes.end();
    const ir::Node* p = member ? &g.node(n.inputs[0]) : nullptr;
    if (p && !rope_reads_through(g, *p)) throw Error("internal: a rope cannot read through " + g.describe(p->id));
    through += member;
    ropes.emplace_back(&n, p);
  }
  if (ropes.empty() || ropes.size() > 2 || nodes.size() != ropes.size() + through)
    throw Error("internal: " + g.describe(nodes.at(0)) + "... is no rope dispatch");
  const ir::Node& first = *ropes[0].first;
  for (const auto& [r, p] : ropes)
    if (r->inputs[1] != first.inputs[1] || r->inputs[2] != first.inputs[2])
      throw Error("internal: " + g.describe(r->id) + " and " + g.describe(first.id) + " are not ropes of one table");
  auto member = [&](const ir::Node* n) { return int(std::find(nodes.begin(), nodes.end(), n->id) - nodes.begin()); };
  const Shape& cs = g.node(first.inputs[1]).shape;
  const bool pair = ropes.size() == 2;
  std::string decls, body, name = pair ? "rope_pair" : "rope", what = pair ? "pointwise rope pair" : "pointwise rope";
  std::vector<Binding> bindings;
  std::vector<uint64_t> counts;
  for (size_t k = 0; k < ropes.size(); ++k) {
    const auto& [r, p] = ropes[k];
    const std::string sfx = pair ? std::to_string(k) : "";
    const Shape& xs = g.node(r->inputs[0]).shape;
    decls += gl::buffer(int(k), "x" + sfx, DType::F32, true);
    // x: the rope's input, or the permute's input (the permute's own input 0).
    bindings.push_back(p ? Binding{BindingKind::Input, 0, false, member(p)} : Binding{BindingKind::Input, 0, false, member(r)});
    name += "_" + shape_str(xs) + (p ? "p" : "");
    what += (k ? " and x " : " x ") + shape_str(xs) + (p ? " read through permute " + shape_str(p->attrs.ints("perm")) : "");
    counts.push_back(gl::numel_u(r->shape));
  }
  const int nr = int(ropes.size());
  decls += gl::buffer(nr, "cs", DType::F32, true) + gl::buffer(nr + 1, "sn", DType::F32, true);
  bindings.push_back({BindingKind::Input, 1, false, member(&first)});
  bindings.push_back({BindingKind::Input, 2, false, member(&first)});
  for (size_t k = 0; k < ropes.size(); ++k) {
    const auto& [r, p] = ropes[k];
    const std::string sfx = pair ? std::to_string(k) : "";
    const Shape& xs = g.node(r->inputs[0]).shape;
    decls += gl::buffer(nr + 2 + int(k), "y" + sfx, DType::F32, false, true);
    bindings.push_back({BindingKind::Output, 0, true, member(r)});
    decls += gl::broadcast_fn("idx_cs" + sfx, cs, rope_half(xs)) + rope_source_fn(sfx, xs, g, p);
  }
  if (pair)
    body = "  if (i < " + u(counts[0]) + ") {\n" + rope_body(g.node(ropes[0].first->inputs[0]).shape, "i", "0") +
           "  } else {\n  uint i1 = i - " + u(counts[0]) + ";\n" +
           rope_body(g.node(ropes[1].first->inputs[0]).shape, "i1", "1") + "  }\n";
  else
    body = rope_body(g.node(first.inputs[0]).shape, "i", "");
  Lowering l;
  l.kernels.push_back(gl::elementwise(name, what + " cos " + shape_str(cs), decls, body,
                                      pair ? counts[0] + counts[1] : counts[0], std::move(bindings), caps));
  return l;
}

Lowering lower_pointwise(const LowerContext& ctx) {
  const ir::Node& n = ctx.node;
  if (n.op == ir::Op::Rope) return lower_rope(ctx);
  const size_t nin = n.inputs.size();
  const char* names[] = {"a", "b", "c"};
  std::string decls, body, key;
  std::vector<Binding> bindings;
  for (size_t k = 0; k < nin; ++k) {
    const ir::Node& in = ctx.input(int(k));
    decls += gl::buffer(int(k), std::string("in_") + names[k], in.dtype, true);
    decls += gl::broadcast_fn(std::string("idx_") + names[k], in.shape, n.shape);
    body += std::string("  ") + gl::type_of(in.dtype) + " " + names[k] + " = in_" + names[k] + "[idx_" + names[k] +
            "(i)];\n";
    key += (k ? " " : "") + shape_str(in.shape) + dtype_name(in.dtype);
    bindings.push_back({BindingKind::Input, int(k)});
  }
  decls += gl::buffer(int(nin), "y", n.dtype, false, true) + gl::math_lib();
  bindings.push_back({BindingKind::Output, 0, true});
  std::string e = pointwise_expr(n, ctx.input(0).dtype);
  // Float-literal expressions on f32 operands; integer ops keep their type (the cast below is a no-op).
  // `precise` (no contraction across the ops of the expression) is what a fused kernel does for each of its
  // nodes too, so a node computes the same bits alone and inside a fusion.
  const std::string t = gl::type_of(n.dtype);
  body += std::string("  ") + (is_float(n.dtype) ? "precise " : "") + t + " r = " + t +
          "(" + e + ");\n  y[i] = r;\n";
  Lowering l;
  l.kernels.push_back(gl::elementwise(std::string(ir::op_name(n.op)) + "_" + shape_str(n.shape),
                                      std::string("pointwise ") + ir::op_name(n.op) + " " + key + " -> " +
                                          shape_str(n.shape) + dtype_name(n.dtype),
                                      decls, body, gl::numel_u(n.shape), std::move(bindings), ctx.caps));
  return l;
}

}  // namespace mgn::codegen
