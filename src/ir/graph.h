// The typed static graph: nodes in topological order (an input always precedes its users), with
// attributes, inferred shape/dtype, precision policy, named inputs/parameters/outputs and state updates.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/op.h"
#include "mgn/init.h"
#include "mgn/types.h"

namespace mgn::ir {

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

// Named attributes of a node; the op table declares which names and kinds each op takes.
class Attrs {
 public:
  Attrs() = default;
  Attrs& set(const std::string& k, int64_t v) { m_[k] = v; return *this; }
  Attrs& set(const std::string& k, int v) { m_[k] = int64_t(v); return *this; }
  Attrs& set(const std::string& k, bool v) { m_[k] = int64_t(v ? 1 : 0); return *this; }
  Attrs& set(const std::string& k, double v) { m_[k] = v; return *this; }
  Attrs& set(const std::string& k, std::vector<int64_t> v) { m_[k] = std::move(v); return *this; }
  Attrs& set(const std::string& k, std::string v) { m_[k] = std::move(v); return *this; }

  bool has(const std::string& k) const { return m_.count(k) != 0; }
  int64_t i(const std::string& k) const;
  double f(const std::string& k) const;  // an int attribute reads as float too
  const std::vector<int64_t>& ints(const std::string& k) const;
  const std::string& s(const std::string& k) const;
  const std::map<std::string, AttrValue>& items() const { return m_; }
  bool operator==(const Attrs& o) const { return m_ == o.m_; }

 private:
  std::map<std::string, AttrValue> m_;
};

struct Node {
  int id = -1;
  Op op = Op::Input;
  std::vector<int> inputs;
  Attrs attrs;
  Shape shape;
  DType dtype = DType::F32;
  // Unset: the compile options' default_precision decides (CompileOptions::default_precision).
  std::optional<Precision> precision;
  std::string name;  // inputs/parameters: their unique name; others: optional label

  // Parameter only.
  Init init;
  bool trainable = true;
  // Constant only: values (exact for i32/bool).
  std::shared_ptr<const std::vector<double>> data;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = default;
  Graph& operator=(const Graph&) = default;

  // Adds a node after inferring and checking its shape and dtype; throws mgn::Error naming the node and
  // what was expected. Returns the node id.
  int add(Op op, std::vector<int> inputs, Attrs attrs = {}, std::string name = "");

  int add_input(const std::string& name, const Shape& shape, DType dtype);
  int add_parameter(const std::string& name, const Shape& shape, DType dtype, const Init& init,
                    bool trainable);
  int add_constant(const Shape& shape, DType dtype, std::vector<double> values, std::string name = "");
  int add_full(const Shape& shape, DType dtype, double value);
  void add_output(const std::string& name, int node);
  // Appends a copy of `n` (from another graph, for passes that rebuild one) reading `inputs` of this graph:
  // op, attributes, name, precision and the source data (init, trainability, constant values) are kept, the
  // shape is inferred again (and must come out equal for a computed node). Inputs and parameters keep their
  // names as this graph's names.
  int add_copy(const Node& n, std::vector<int> inputs);

  const Node& node(int id) const { return nodes_.at(size_t(id)); }
  Node& node_mut(int id) { return nodes_.at(size_t(id)); }
  const std::vector<Node>& nodes() const { return nodes_; }
  int size() const { return int(nodes_.size()); }

  const std::vector<std::pair<std::string, int>>& outputs() const { return outputs_; }
  std::optional<int> find_output(const std::string& name) const;
  // Input or parameter by name.
  std::optional<int> find_named(const std::string& name) const;
  std::vector<int> inputs() const;      // Input nodes in creation order
  std::vector<int> parameters() const;  // Parameter nodes in creation order
  std::vector<int> assigns() const;     // Assign nodes in creation order

  // The precision nodes built from now on carry (unset: they leave it to the compile options).
  std::optional<Precision> default_precision() const { return default_precision_; }
  void set_default_precision(std::optional<Precision> p) { default_precision_ = p; }

  // Replaces the whole output list (used by passes).
  void set_outputs(std::vector<std::pair<std::string, int>> outs) { outputs_ = std::move(outs); }

  // Human-readable label for errors: "node %12 'fc1' (matmul)".
  std::string describe(int id) const;

 private:
  int push(Node n);
  std::vector<Node> nodes_;
  std::vector<std::pair<std::string, int>> outputs_;
  std::map<std::string, int> named_;
  std::optional<Precision> default_precision_;
};

// Computes shape and dtype of `n` from its inputs (already in g); throws mgn::Error on a bad node.
void infer_node(const Graph& g, Node& n);
// Checks the whole graph: topological order, arity, attributes, shapes, names, assign targets.
void verify(const Graph& g);
// Readable text dump, one node a line.
std::string to_text(const Graph& g);

// Numpy broadcast of two shapes; throws with `what` in the message when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& what);
// Normalizes a possibly negative axis against a rank; throws with `what` when out of range.
int normalize_axis(int64_t axis, int rank, const std::string& what);

}  // namespace mgn::ir
