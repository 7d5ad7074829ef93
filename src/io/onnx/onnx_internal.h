// Shared pieces of the ONNX importer: host tensors (values known at import time), the value a name is
// bound to while the graph is lowered, and the op table the importer dispatches on.
#pragma once

#include <onnx/onnx_pb.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/onnx.h"

namespace mgn::onnx_impl {

// Element class of a host tensor: ONNX float types fold as F, integer types as I, bool as B.
enum class Kind : uint8_t { F, I, B };

// A tensor whose values are known at import time. Values are doubles: integers beyond 2^53 only occur as
// sentinels (Slice's INT64_MAX ends), which to_i64 saturates.
struct HostTensor {
  Kind kind = Kind::F;
  Shape shape;
  std::vector<double> v;
  int elem = 0;  // the ONNX element type it was read as (0: computed on the host)
  int64_t numel() const { return int64_t(v.size()); }
};

int64_t to_i64(double d);
// Host tensors larger than this are refused (they come from ConstantOfShape/Range/initializers): a bound
// keeps a hostile file from exhausting memory.
constexpr int64_t kMaxHostElements = int64_t(1) << 28;
int64_t checked_numel(const Shape& s, const std::string& who);

// What an ONNX value name is bound to: a host constant (folded) or an IR tensor.
struct Value {
  std::optional<HostTensor> host;
  Tensor t;
  std::string name;         // the ONNX value name
  bool initializer = false;  // a float initializer: lowered as a named parameter, never folded away
  int elem = 0;              // a graph input's declared ONNX element type (0: not a graph input)
  bool is_seq = false;       // a sequence of values (SequenceConstruct ...): only `seq` is meaningful
  std::vector<Value> seq;
  bool is_host() const { return host.has_value(); }
  const Shape& shape() const {
    if (is_seq) throw Error("value '" + name + "' is a sequence where a tensor is expected");
    return host ? host->shape : t.shape();
  }
  int elem_type() const { return host ? host->elem : elem; }
};

// Converts a TensorProto (raw or typed data, or external data below `dir`) into a host tensor.
HostTensor tensor_from_proto(const ::onnx::TensorProto& p, const std::string& dir, const std::string& who);

class Lowering;

// One op type: lowers a node given its bound inputs (absent optional inputs are nullptr) into its outputs.
using Rule = std::function<std::vector<Value>(Lowering&, const ::onnx::NodeProto&, std::vector<const Value*>&)>;
const std::map<std::string, Rule>& op_table();

// State while one graph is lowered: the builder graph, the options and the materialization cache.
class Lowering {
 public:
  Lowering(Graph& g, const onnx::ImportOptions& opt, int opset) : g(g), opt(opt), opset(opset) {}
  Graph& g;
  const onnx::ImportOptions& opt;
  int opset;
  int64_t parameter_count = 0;

  // The IR tensor of a value; host values become constants (int as i32 with a range check) and float
  // initializers become parameters (or state when `as_state`: batch-norm running statistics).
  Tensor tensor(const Value& v, std::optional<DType> want = std::nullopt, bool as_state = false);

 private:
  std::map<std::string, Tensor> params_;
};

// Attribute helpers: throw naming the node when an attribute has the wrong type.
const ::onnx::AttributeProto* find_attr(const ::onnx::NodeProto& n, const std::string& name);
int64_t attr_i(const ::onnx::NodeProto& n, const std::string& name, int64_t dflt);
double attr_f(const ::onnx::NodeProto& n, const std::string& name, double dflt);
std::string attr_s(const ::onnx::NodeProto& n, const std::string& name, const std::string& dflt);
std::vector<int64_t> attr_ints(const ::onnx::NodeProto& n, const std::string& name,
                               const std::vector<int64_t>& dflt = {});
std::string node_label(const ::onnx::NodeProto& n);

}  // namespace mgn::onnx_impl
