// Whole-graph checks: order, arity and shapes re-inferred, declared attributes only, names, assign targets.
#include <set>
#include <sstream>

#include "ir/graph.h"

namespace mgn::ir {

void verify(const Graph& g) {
  std::set<std::string> names, outs;
  std::set<int> assigned;
  for (const Node& n : g.nodes()) {
    for (int in : n.inputs)
      if (in < 0 || in >= n.id)
        throw Error(g.describe(n.id) + ": input %" + std::to_string(in) + " does not precede it (graph order broken)");
    const OpInfo& info = op_info(n.op);
    std::string spec = std::string(" ") + info.attrs;
    for (auto& [k, v] : n.attrs.items())
      if (spec.find(" " + k + ":") == std::string::npos)
        throw Error(g.describe(n.id) + ": attribute '" + k + "' is not declared for " + info.name);
    if (n.op == Op::Input || n.op == Op::Parameter) {
      if (!names.insert(n.name).second) throw Error(g.describe(n.id) + ": duplicate name '" + n.name + "'");
      if (n.shape.size() > size_t(kMaxRank)) throw Error(g.describe(n.id) + ": rank exceeds the maximum");
    } else if (n.op == Op::Constant) {
      if (!n.data || int64_t(n.data->size()) != numel(n.shape))
        throw Error(g.describe(n.id) + ": constant data does not match its shape");
    } else if (n.op != Op::Full) {
      Node copy = n;
      infer_node(g, copy);
      if (copy.shape != n.shape || copy.dtype != n.dtype)
        throw Error(g.describe(n.id) + ": recorded type " + dtype_name(n.dtype) + shape_str(n.shape) +
                    " differs from the inferred " + dtype_name(copy.dtype) + shape_str(copy.shape));
    }
    if (n.op == Op::Assign && !assigned.insert(n.inputs[0]).second)
      throw Error(g.describe(n.id) + ": parameter '" + g.node(n.inputs[0]).name + "' is assigned twice in one step");
  }
  for (auto& [name, id] : g.outputs()) {
    if (!outs.insert(name).second) throw Error("output '" + name + "' is defined twice");
    if (id < 0 || id >= g.size()) throw Error("output '" + name + "' refers to a missing node");
  }
}

namespace {
std::string attr_text(const AttrValue& v) {
  std::ostringstream os;
  switch (v.index()) {
    case 0: os << std::get<int64_t>(v); break;
    case 1: os << std::get<double>(v); break;
    case 2: os << shape_str(std::get<std::vector<int64_t>>(v)); break;
    default: os << '"' << std::get<std::string>(v) << '"'; break;
  }
  return os.str();
}
}  // namespace

std::string to_text(const Graph& g) {
  std::ostringstream os;
  os << "graph (" << g.size() << " nodes, default precision "
     << (g.default_precision() ? precision_name(*g.default_precision()) : "unset") << ")\n";
  for (const Node& n : g.nodes()) {
    os << "  %" << n.id << " = " << op_name(n.op);
    if (n.op == Op::Input || n.op == Op::Parameter) {
      os << " '" << n.name << "'";
      if (n.op == Op::Parameter) os << " init=" << init_kind_name(n.init.kind) << (n.trainable ? "" : " frozen");
    }
    if (!n.inputs.empty()) {
      os << "(";
      for (size_t i = 0; i < n.inputs.size(); ++i) os << (i ? ", %" : "%") << n.inputs[i];
      os << ")";
    }
    if (!n.attrs.items().empty()) {
      os << " {";
      bool first = true;
      for (auto& [k, v] : n.attrs.items()) {
        os << (first ? "" : ", ") << k << "=" << attr_text(v);
        first = false;
      }
      os << "}";
    }
    os << " : " << dtype_name(n.dtype) << shape_str(n.shape);
    if (n.precision) os << " " << precision_name(*n.precision);
    if (!n.name.empty() && n.op != Op::Input && n.op != Op::Parameter) os << "  # " << n.name;
    os << "\n";
  }
  for (auto& [name, id] : g.outputs()) os << "  output '" << name << "' = %" << id << "\n";
  return os.str();
}

}  // namespace mgn::ir
