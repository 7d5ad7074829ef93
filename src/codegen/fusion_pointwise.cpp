// The kernel of a pointwise fusion (lower_pointwise_fusion) and the body it shares with the GEMM and GEMV epilogues
// and prologues (pointwise_body): each member's expression with its operands substituted, outside operands loaded
// once (broadcast where their shape differs), the values the plan keeps stored.
#include <cctype>
#include <map>
#include <set>

#include "codegen/glsl.h"

namespace mgn::codegen {
namespace {

// `e` with the identifiers a, b, c replaced by args[0..2] (numbers and other names are left alone).
std::string substitute(const std::string& e, const std::string (&args)[3]) {
  std::string r;
  size_t i = 0;
  while (i < e.size()) {
    unsigned char c = static_cast<unsigned char>(e[i]);
    if (std::isalpha(c) || c == '_' || std::isdigit(c)) {
      size_t j = i;
      const bool number = std::isdigit(c) != 0;
      while (j < e.size() &&
             (std::isalnum(static_cast<unsigned char>(e[j])) || e[j] == '_' || (number && e[j] == '.')))
        ++j;
      std::string tok = e.substr(i, j - i);
      if (!number && tok.size() == 1 && tok[0] >= 'a' && tok[0] <= 'c') tok = args[tok[0] - 'a'];
      r += tok;
      i = j;
    } else {
      r += e[i++];
    }
  }
  return r;
}

}  // namespace

PointwiseBody pointwise_body(const ir::Graph& g, const std::vector<int>& nodes, const std::vector<bool>& stored,
                             const std::set<int>& given, std::vector<Binding> bindings, const std::string& index) {
  PointwiseBody r;
  std::set<int> members;
  Shape shape;
  for (int id : nodes)
    if (!given.count(id)) {
      shape = g.node(id).shape;
      break;
    }
  for (int id : nodes) members.insert(id);
  std::map<int, std::string> ext;  // outside operand -> its local name
  for (size_t k = 0; k < nodes.size(); ++k) {
    const ir::Node& n = g.node(nodes[k]);
    if (given.count(n.id)) continue;
    if (!pointwise_fusible(n) || n.shape != shape)
      throw Error("internal: " + g.describe(n.id) + " cannot join a pointwise fusion of shape " +
                  shape_str(shape));
    std::string args[3];
    for (size_t j = 0; j < n.inputs.size(); ++j) {
      const int x = n.inputs[j];
      if (members.count(x)) {
        args[j] = "v" + std::to_string(x);
        continue;
      }
      auto it = ext.find(x);
      if (it == ext.end()) {
        // Outside operands, fills included: a fill inlined as a literal would let the shader compiler fold
        // transcendental functions of it at compile time, with other rounding than the same node alone computes.
        const ir::Node& in = g.node(x);
        const std::string name = "x" + std::to_string(x);
        const int b = int(bindings.size());
        r.decls += gl::buffer(b, "in_" + name, in.dtype, true);
        std::string idx = index;
        if (in.shape != shape) {
          r.decls += gl::broadcast_fn("idx_" + name, in.shape, shape);
          idx = "idx_" + name + "(" + index + ")";
        }
        r.loads += std::string("  ") + gl::type_of(in.dtype) + " " + name + " = in_" + name + "[" + idx +
                   "];  // %" + std::to_string(x) + " " + shape_str(in.shape) + dtype_name(in.dtype) + "\n";
        bindings.push_back({BindingKind::Input, int(j), false, int(k)});
        it = ext.emplace(x, name).first;
      }
      args[j] = it->second;
    }
    const std::string t = gl::type_of(n.dtype);
    const std::string e = substitute(pointwise_expr(n, g.node(n.inputs[0]).dtype), args);
    r.body += std::string("  ") + (is_float(n.dtype) ? "precise " : "") + t + " v" + std::to_string(n.id) +
              " = " + t + "(" + e + ");  // " + ir::op_name(n.op) + " %" + std::to_string(n.id) + "\n";
    r.ops += std::string(r.ops.empty() ? "" : " ") + ir::op_name(n.op);
  }
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (!stored.at(k)) continue;
    const ir::Node& n = g.node(nodes[k]);
    const std::string v = "v" + std::to_string(n.id);
    r.decls += gl::buffer(int(bindings.size()), "out_" + v, n.dtype, false, true);
    bindings.push_back({BindingKind::Output, 0, true, int(k)});
    r.stores += "  out_" + v + "[" + index + "] = " + v + ";\n";
    ++r.written;
  }
  r.read = ext.size();
  r.bindings = std::move(bindings);
  return r;
}

// One invocation per element: load every outside operand, compute each node into a local variable in node
// order, then store the values the plan keeps. All loads precede all stores, so a value may be written
// over an operand of its own shape (in place): every access to it is at this invocation's element.
Lowering lower_pointwise_fusion(const ir::Graph& g, const std::vector<int>& nodes,
                                const std::vector<bool>& stored, const DeviceCaps& caps) {
  const Shape& shape = g.node(nodes.at(0)).shape;
  PointwiseBody b = pointwise_body(g, nodes, stored, {}, {}, "i");
  if (b.written == 0)
    throw Error("internal: a pointwise fusion of " + g.describe(nodes[0]) + " writes nothing");
  Lowering l;
  l.kernels.push_back(
      gl::elementwise("fused" + std::to_string(nodes.size()) + "_" + shape_str(shape),
                      "pointwise fusion of " + std::to_string(nodes.size()) + " nodes (" + b.ops + ") over " +
                          shape_str(shape) + ", " + std::to_string(b.written) + " written, " +
                          std::to_string(b.read) + " read",
                      b.decls + gl::math_lib(), b.loads + b.body + b.stores, gl::numel_u(shape),
                      std::move(b.bindings), caps));
  return l;
}

}  // namespace mgn::codegen
