// Graph construction: every node is shape-checked as it is added, so a bad graph never exists.
#include "ir/graph.h"

#include <algorithm>

namespace mgn::ir {

namespace {
const char* kind_name(const AttrValue& v) {
  switch (v.index()) {
    case 0: return "int";
    case 1: return "float";
    case 2: return "ints";
    default: return "str";
  }
}
}  // namespace

int64_t Attrs::i(const std::string& k) const {
  auto it = m_.find(k);
  if (it == m_.end()) throw Error("missing attribute '" + k + "'");
  if (auto* p = std::get_if<int64_t>(&it->second)) return *p;
  throw Error("attribute '" + k + "' is " + kind_name(it->second) + ", expected int");
}

double Attrs::f(const std::string& k) const {
  auto it = m_.find(k);
  if (it == m_.end()) throw Error("missing attribute '" + k + "'");
  if (auto* p = std::get_if<double>(&it->second)) return *p;
  if (auto* p = std::get_if<int64_t>(&it->second)) return double(*p);
  throw Error("attribute '" + k + "' is " + kind_name(it->second) + ", expected float");
}

const std::vector<int64_t>& Attrs::ints(const std::string& k) const {
  auto it = m_.find(k);
  if (it == m_.end()) throw Error("missing attribute '" + k + "'");
  if (auto* p = std::get_if<std::vector<int64_t>>(&it->second)) return *p;
  throw Error("attribute '" + k + "' is " + kind_name(it->second) + ", expected ints");
}

const std::string& Attrs::s(const std::string& k) const {
  auto it = m_.find(k);
  if (it == m_.end()) throw Error("missing attribute '" + k + "'");
  if (auto* p = std::get_if<std::string>(&it->second)) return *p;
  throw Error("attribute '" + k + "' is " + kind_name(it->second) + ", expected str");
}

std::string Graph::describe(int id) const {
  if (id < 0 || id >= size()) return "node %" + std::to_string(id) + " (out of range)";
  const Node& n = nodes_[size_t(id)];
  std::string s = "node %" + std::to_string(id);
  if (!n.name.empty()) s += " '" + n.name + "'";
  return s + " (" + op_name(n.op) + ")";
}

int Graph::push(Node n) {
  n.id = size();
  nodes_.push_back(std::move(n));
  return nodes_.back().id;
}

int Graph::add(Op op, std::vector<int> inputs, Attrs attrs, std::string name) {
  Node n;
  n.id = size();
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.name = std::move(name);
  n.precision = default_precision_;
  for (int in : n.inputs)
    if (in < 0 || in >= size())
      throw Error(std::string("building ") + op_name(op) + ": input %" + std::to_string(in) +
                  " does not belong to this graph");
  infer_node(*this, n);
  return push(std::move(n));
}

static void check_new_name(const std::map<std::string, int>& named, const std::string& name, const char* what) {
  if (name.empty()) throw Error(std::string(what) + " needs a non-empty name");
  if (named.count(name)) throw Error(std::string(what) + " '" + name + "': the name is already used in this graph");
}

static void check_shape(const Shape& s, const std::string& who) {
  if (s.size() > size_t(kMaxRank))
    throw Error(who + ": rank " + std::to_string(s.size()) + " exceeds the maximum " + std::to_string(kMaxRank));
  for (int64_t d : s)
    if (d <= 0) throw Error(who + ": shape " + shape_str(s) + " has a non-positive dimension");
}

int Graph::add_input(const std::string& name, const Shape& shape, DType dtype) {
  check_new_name(named_, name, "input");
  check_shape(shape, "input '" + name + "'");
  Node n;
  n.op = Op::Input;
  n.shape = shape;
  n.dtype = dtype;
  n.name = name;
  n.precision = default_precision_;
  int id = push(std::move(n));
  named_[name] = id;
  return id;
}

int Graph::add_parameter(const std::string& name, const Shape& shape, DType dtype, const Init& init,
                         bool trainable) {
  check_new_name(named_, name, "parameter");
  check_shape(shape, "parameter '" + name + "'");
  if (!is_float(dtype) && trainable)
    throw Error("parameter '" + name + "': a trainable parameter must have a float dtype, got " +
                dtype_name(dtype));
  if (init.kind == Init::Kind::Data && int64_t(init.data.size()) != numel(shape))
    throw Error("parameter '" + name + "': initial data has " + std::to_string(init.data.size()) +
                " values, shape " + shape_str(shape) + " needs " + std::to_string(numel(shape)));
  Node n;
  n.op = Op::Parameter;
  n.shape = shape;
  n.dtype = dtype;
  n.name = name;
  n.init = init;
  n.trainable = trainable;
  n.precision = default_precision_;
  int id = push(std::move(n));
  named_[name] = id;
  return id;
}

int Graph::add_constant(const Shape& shape, DType dtype, std::vector<double> values, std::string name) {
  check_shape(shape, "constant");
  if (int64_t(values.size()) != numel(shape))
    throw Error("constant: " + std::to_string(values.size()) + " values for shape " + shape_str(shape));
  Node n;
  n.op = Op::Constant;
  n.shape = shape;
  n.dtype = dtype;
  n.name = std::move(name);
  n.data = std::make_shared<const std::vector<double>>(std::move(values));
  n.precision = default_precision_;
  return push(std::move(n));
}

int Graph::add_full(const Shape& shape, DType dtype, double value) {
  check_shape(shape, "full");
  Node n;
  n.op = Op::Full;
  n.shape = shape;
  n.dtype = dtype;
  n.attrs.set("value", value);
  n.precision = default_precision_;
  return push(std::move(n));
}

int Graph::add_copy(const Node& src, std::vector<int> inputs) {
  const OpInfo& info = op_info(src.op);
  if (info.archetype == Archetype::Source) {
    Node n = src;
    n.inputs.clear();
    if (src.op == Op::Input || src.op == Op::Parameter) {
      check_new_name(named_, src.name, op_name(src.op));
      const int id = push(std::move(n));
      named_[src.name] = id;
      return id;
    }
    return push(std::move(n));
  }
  const int id = add(src.op, std::move(inputs), src.attrs, src.name);
  Node& n = nodes_.back();
  if (n.shape != src.shape || n.dtype != src.dtype)
    throw Error("copying " + describe(id) + ": its shape or dtype changed (" + shape_str(src.shape) + " became " +
                shape_str(n.shape) + ")");
  n.precision = src.precision;
  return id;
}

void Graph::add_output(const std::string& name, int node) {
  if (name.empty()) throw Error("output needs a non-empty name");
  if (node < 0 || node >= size()) throw Error("output '" + name + "': tensor does not belong to this graph");
  for (auto& [n, id] : outputs_)
    if (n == name) throw Error("output '" + name + "' is already defined");
  outputs_.emplace_back(name, node);
}

std::optional<int> Graph::find_output(const std::string& name) const {
  for (auto& [n, id] : outputs_)
    if (n == name) return id;
  return std::nullopt;
}

std::optional<int> Graph::find_named(const std::string& name) const {
  auto it = named_.find(name);
  if (it == named_.end()) return std::nullopt;
  return it->second;
}

static std::vector<int> nodes_with(const std::vector<Node>& nodes, Op op) {
  std::vector<int> r;
  for (const Node& n : nodes)
    if (n.op == op) r.push_back(n.id);
  return r;
}
std::vector<int> Graph::inputs() const { return nodes_with(nodes_, Op::Input); }
std::vector<int> Graph::parameters() const { return nodes_with(nodes_, Op::Parameter); }
std::vector<int> Graph::assigns() const { return nodes_with(nodes_, Op::Assign); }

}  // namespace mgn::ir
