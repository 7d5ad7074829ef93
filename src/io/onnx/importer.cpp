// ONNX model import: protobuf parsing, tensor data (typed, raw and external), graph validation (missing
// values, cycles, unsupported ops) and the walk that lowers each node through the op table.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "io/onnx/onnx_internal.h"
#include "ir/graph.h"

namespace mgn::onnx_impl {

namespace pb = ::onnx;

int64_t to_i64(double d) {
  if (std::isnan(d)) return 0;
  if (d >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (d <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return int64_t(d);
}

int64_t checked_numel(const Shape& s, const std::string& who) {
  if (s.size() > size_t(kMaxRank) + 2) throw Error(who + ": rank " + std::to_string(s.size()) + " is too large");
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw Error(who + ": negative dimension in " + shape_str(s));
    if (d != 0 && n > kMaxHostElements / d)
      throw Error(who + ": shape " + shape_str(s) + " has more than " + std::to_string(kMaxHostElements) +
                  " elements");
    n *= d;
  }
  return n;
}

std::string node_label(const pb::NodeProto& n) {
  return "node '" + (n.name().empty() ? (n.output_size() ? n.output(0) : std::string("?")) : n.name()) + "' (" +
         n.op_type() + ")";
}

const pb::AttributeProto* find_attr(const pb::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

int64_t attr_i(const pb::NodeProto& n, const std::string& name, int64_t dflt) {
  const auto* a = find_attr(n, name);
  if (!a) return dflt;
  if (a->type() != pb::AttributeProto::INT) throw Error(node_label(n) + ": attribute '" + name + "' must be an int");
  return a->i();
}

double attr_f(const pb::NodeProto& n, const std::string& name, double dflt) {
  const auto* a = find_attr(n, name);
  if (!a) return dflt;
  if (a->type() != pb::AttributeProto::FLOAT)
    throw Error(node_label(n) + ": attribute '" + name + "' must be a float");
  return a->f();
}

std::string attr_s(const pb::NodeProto& n, const std::string& name, const std::string& dflt) {
  const auto* a = find_attr(n, name);
  if (!a) return dflt;
  if (a->type() != pb::AttributeProto::STRING)
    throw Error(node_label(n) + ": attribute '" + name + "' must be a string");
  return a->s();
}

std::vector<int64_t> attr_ints(const pb::NodeProto& n, const std::string& name, const std::vector<int64_t>& dflt) {
  const auto* a = find_attr(n, name);
  if (!a) return dflt;
  if (a->type() != pb::AttributeProto::INTS)
    throw Error(node_label(n) + ": attribute '" + name + "' must be a list of ints");
  return {a->ints().begin(), a->ints().end()};
}

namespace {

Kind kind_of(int elem_type, const std::string& who) {
  switch (elem_type) {
    case pb::TensorProto::FLOAT:
    case pb::TensorProto::DOUBLE:
    case pb::TensorProto::FLOAT16:
    case pb::TensorProto::BFLOAT16: return Kind::F;
    case pb::TensorProto::INT8:
    case pb::TensorProto::UINT8:
    case pb::TensorProto::INT16:
    case pb::TensorProto::UINT16:
    case pb::TensorProto::INT32:
    case pb::TensorProto::INT64:
    case pb::TensorProto::UINT32:
    case pb::TensorProto::UINT64: return Kind::I;
    case pb::TensorProto::BOOL: return Kind::B;
    default: throw Error(who + ": unsupported tensor element type " + std::to_string(elem_type));
  }
}

size_t raw_size(int elem_type) {
  switch (elem_type) {
    case pb::TensorProto::INT8:
    case pb::TensorProto::UINT8:
    case pb::TensorProto::BOOL: return 1;
    case pb::TensorProto::INT16:
    case pb::TensorProto::UINT16:
    case pb::TensorProto::FLOAT16:
    case pb::TensorProto::BFLOAT16: return 2;
    case pb::TensorProto::FLOAT:
    case pb::TensorProto::INT32:
    case pb::TensorProto::UINT32: return 4;
    default: return 8;
  }
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double decode(int elem_type, const char* p) {
  switch (elem_type) {
    case pb::TensorProto::FLOAT: return load<float>(p);
    case pb::TensorProto::DOUBLE: return load<double>(p);
    case pb::TensorProto::FLOAT16: return half_to_float(load<uint16_t>(p));
    case pb::TensorProto::BFLOAT16: return bf16_to_float(load<uint16_t>(p));
    case pb::TensorProto::INT8: return load<int8_t>(p);
    case pb::TensorProto::UINT8: return load<uint8_t>(p);
    case pb::TensorProto::BOOL: return load<uint8_t>(p) != 0;
    case pb::TensorProto::INT16: return load<int16_t>(p);
    case pb::TensorProto::UINT16: return load<uint16_t>(p);
    case pb::TensorProto::INT32: return load<int32_t>(p);
    case pb::TensorProto::UINT32: return load<uint32_t>(p);
    case pb::TensorProto::INT64: return double(load<int64_t>(p));
    default: return double(load<uint64_t>(p));
  }
}

// Reads the bytes of an external-data tensor; the location must stay inside `dir`.
std::string read_external(const pb::TensorProto& p, const std::string& dir, const std::string& who) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& e : p.external_data()) {
    auto parse_int = [&](const std::string& s) {
      try {
        size_t used = 0;
        long long v = std::stoll(s, &used);
        if (used != s.size() || v < 0) throw std::invalid_argument(s);
        return int64_t(v);
      } catch (const std::exception&) {
        throw Error(who + ": external_data '" + e.key() + "' is not a non-negative integer: '" + s + "'");
      }
    };
    if (e.key() == "location") location = e.value();
    else if (e.key() == "offset") offset = parse_int(e.value());
    else if (e.key() == "length") length = parse_int(e.value());
  }
  namespace fs = std::filesystem;
  fs::path rel(location);
  if (location.empty() || rel.is_absolute() || rel.has_root_name() ||
      std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; }))
    throw Error(who + ": external data location '" + location + "' must be a relative path inside the model's folder");
  fs::path full = fs::path(dir.empty() ? "." : dir) / rel;
  std::ifstream f(full, std::ios::binary);
  if (!f) throw Error(who + ": cannot open external data file '" + full.string() + "'");
  f.seekg(0, std::ios::end);
  int64_t size = int64_t(f.tellg());
  if (offset > size) throw Error(who + ": external data offset " + std::to_string(offset) + " is past the end of '" +
                                 full.string() + "' (" + std::to_string(size) + " bytes)");
  if (length < 0) length = size - offset;
  if (length > size - offset)
    throw Error(who + ": external data [" + std::to_string(offset) + ", +" + std::to_string(length) +
                ") runs past the end of '" + full.string() + "' (" + std::to_string(size) + " bytes)");
  std::string bytes(size_t(length), '\0');
  f.seekg(offset);
  f.read(bytes.data(), length);
  if (!f) throw Error(who + ": reading external data from '" + full.string() + "' failed");
  return bytes;
}

}  // namespace

HostTensor tensor_from_proto(const pb::TensorProto& p, const std::string& dir, const std::string& who_in) {
  std::string who = who_in + (p.name().empty() ? "" : " tensor '" + p.name() + "'");
  HostTensor h;
  int et = p.data_type();
  h.kind = kind_of(et, who);
  h.elem = et;
  h.shape.assign(p.dims().begin(), p.dims().end());
  int64_t n = checked_numel(h.shape, who);
  h.v.resize(size_t(n));
  auto mismatch = [&](int64_t got) {
    return Error(who + ": holds " + std::to_string(got) + " values, shape " + shape_str(h.shape) + " needs " +
                 std::to_string(n));
  };
  if (p.data_location() == pb::TensorProto::EXTERNAL || p.has_raw_data()) {
    std::string ext;
    const std::string& raw = p.data_location() == pb::TensorProto::EXTERNAL ? (ext = read_external(p, dir, who)) : p.raw_data();
    size_t es = raw_size(et);
    if (raw.size() != size_t(n) * es) throw mismatch(int64_t(raw.size() / es));
    for (int64_t i = 0; i < n; ++i) h.v[size_t(i)] = decode(et, raw.data() + size_t(i) * es);
    return h;
  }
  switch (et) {
    case pb::TensorProto::FLOAT:
      if (p.float_data_size() != n) throw mismatch(p.float_data_size());
      for (int64_t i = 0; i < n; ++i) h.v[size_t(i)] = p.float_data(int(i));
      break;
    case pb::TensorProto::DOUBLE:
      if (p.double_data_size() != n) throw mismatch(p.double_data_size());
      for (int64_t i = 0; i < n; ++i) h.v[size_t(i)] = p.double_data(int(i));
      break;
    case pb::TensorProto::INT64:
      if (p.int64_data_size() != n) throw mismatch(p.int64_data_size());
      for (int64_t i = 0; i < n; ++i) h.v[size_t(i)] = double(p.int64_data(int(i)));
      break;
    case pb::TensorProto::UINT32:
    case pb::TensorProto::UINT64:
      if (p.uint64_data_size() != n) throw mismatch(p.uint64_data_size());
      for (int64_t i = 0; i < n; ++i) h.v[size_t(i)] = double(p.uint64_data(int(i)));
      break;
    default:  // int32_data holds every narrower type, float16/bfloat16 as bit patterns
      if (p.int32_data_size() != n) throw mismatch(p.int32_data_size());
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = p.int32_data(int(i));
        if (et == pb::TensorProto::FLOAT16) h.v[size_t(i)] = half_to_float(uint16_t(v));
        else if (et == pb::TensorProto::BFLOAT16) h.v[size_t(i)] = bf16_to_float(uint16_t(v));
        else if (et == pb::TensorProto::BOOL) h.v[size_t(i)] = v != 0;
        else h.v[size_t(i)] = v;
      }
  }
  return h;
}

Tensor Lowering::tensor(const Value& v, std::optional<DType> want, bool as_state) {
  if (v.is_seq) throw Error("value '" + v.name + "' is a sequence where a tensor is expected");
  if (!v.is_host()) return v.t;
  const HostTensor& h = *v.host;
  if (v.initializer && h.kind == Kind::F) {
    auto it = params_.find(v.name);
    if (it != params_.end()) return it->second;
    Init init = Init::from_data(std::vector<float>(h.v.begin(), h.v.end()));
    Tensor t;
    if (as_state) {
      t = g.state(v.name, h.shape, init);
    } else {
      t = g.parameter(v.name, h.shape, init);
      if (!opt.trainable) g.ir().node_mut(t.id()).trainable = false;
      parameter_count += h.numel();
    }
    params_.emplace(v.name, t);
    return t;
  }
  DType dt = want ? *want : h.kind == Kind::F ? DType::F32 : h.kind == Kind::I ? DType::I32 : DType::Bool;
  std::string key = v.name + "#" + dtype_name(dt);
  auto it = params_.find(key);
  if (it != params_.end()) return it->second;
  if (dt == DType::I32) {
    for (double d : h.v)
      if (d != std::floor(d) || d < double(std::numeric_limits<int32_t>::min()) ||
          d > double(std::numeric_limits<int32_t>::max()))
        throw Error("value '" + v.name + "': " + std::to_string(d) + " does not fit the i32 tensors the IR uses");
  }
  std::vector<float> f(h.v.begin(), h.v.end());
  if (dt == DType::Bool)
    for (float& x : f) x = x != 0 ? 1.0f : 0.0f;
  Tensor t = g.constant(h.shape, f, dt);
  params_.emplace(key, t);
  return t;
}

}  // namespace mgn::onnx_impl

namespace mgn::onnx {

namespace pb = ::onnx;
using namespace onnx_impl;

namespace {

pb::ModelProto parse_model(const std::string& bytes, const std::string& origin) {
  pb::ModelProto m;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), int(std::min<size_t>(bytes.size(), INT32_MAX)));
  google::protobuf::io::CodedInputStream in(&raw);
  in.SetRecursionLimit(64);
  if (bytes.size() > size_t(INT32_MAX)) throw Error(origin + ": file larger than 2 GiB (use external data)");
  if (!m.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    throw Error(origin + ": not a valid ONNX protobuf (truncated or corrupt)");
  if (!m.has_graph()) throw Error(origin + ": the model has no graph");
  return m;
}

int default_opset(const pb::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return int(o.version());
  return 0;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot open ONNX file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool is_default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

DType dtype_of_elem(int et, const std::string& who) {
  switch (kind_of(et, who)) {
    case Kind::F: return DType::F32;
    case Kind::I: return DType::I32;
    case Kind::B: return DType::Bool;
  }
  return DType::F32;
}

Imported lower(const pb::ModelProto& m, const std::string& origin, const ImportOptions& opt, const std::string& dir) {
  Imported out;
  out.opset = default_opset(m);
  if (out.opset == 0) throw Error(origin + ": the model imports no default-domain (ai.onnx) opset");
  if (out.opset < 1 || out.opset > 20)
    throw Error(origin + ": opset " + std::to_string(out.opset) + " is not supported (expected 1 to 20)");
  std::map<std::string, int> domain_opset;
  for (const auto& o : m.opset_import()) domain_opset[o.domain()] = int(o.version());
  const pb::GraphProto& gp = m.graph();

  // Every unsupported op at once, so a user sees the whole gap in one run.
  const auto& table = op_table();
  std::vector<std::string> unsupported;
  for (const auto& n : gp.node()) {
    if (is_default_domain(n.domain()) && table.count(n.op_type())) continue;
    std::string dom = n.domain().empty() ? "ai.onnx" : n.domain();
    int ver = domain_opset.count(n.domain()) ? domain_opset[n.domain()] : 0;
    unsupported.push_back(node_label(n) + " [domain " + dom + ", opset " + std::to_string(ver) + "]");
  }
  if (!unsupported.empty()) {
    std::string msg = origin + ": " + std::to_string(unsupported.size()) + " node(s) use unsupported ops:";
    for (const auto& u : unsupported) msg += "\n  " + u;
    throw Error(msg);
  }

  std::map<std::string, Value> env;
  std::map<std::string, const pb::TensorProto*> inits;
  for (const auto& t : gp.initializer()) {
    if (t.name().empty()) throw Error(origin + ": an initializer has no name");
    if (!inits.emplace(t.name(), &t).second) throw Error(origin + ": initializer '" + t.name() + "' is defined twice");
  }
  for (const auto& t : gp.sparse_initializer())
    throw Error(origin + ": sparse initializer '" + t.values().name() + "' is not supported");

  Graph& g = out.graph;
  for (const auto& in : gp.input()) {
    if (inits.count(in.name())) continue;  // old exporters list initializers as inputs too
    std::string who = origin + ": input '" + in.name() + "'";
    if (in.name().empty()) throw Error(origin + ": a graph input has no name");
    if (env.count(in.name())) throw Error(who + " is declared twice");
    if (!in.type().has_tensor_type()) throw Error(who + ": only tensor inputs are supported");
    if (auto known = opt.input_values.find(in.name()); known != opt.input_values.end()) {
      // A value given before import folds like a constant (ImportOptions::input_values).
      const TensorFile& tf = known->second;
      Value v;
      v.name = in.name();
      v.host = HostTensor{kind_of(tf.elem_type, who), tf.shape, tf.values, tf.elem_type};
      if (checked_numel(tf.shape, who) != int64_t(tf.values.size()))
        throw Error(who + ": the given value holds " + std::to_string(tf.values.size()) + " elements, its shape " +
                    shape_str(tf.shape) + " needs " + std::to_string(numel(tf.shape)));
      env.emplace(in.name(), std::move(v));
      continue;
    }
    const auto& tt = in.type().tensor_type();
    DType dt = dtype_of_elem(tt.elem_type(), who);
    Shape shape;
    auto bound = opt.input_shapes.find(in.name());
    if (tt.has_shape()) {
      const auto& dims = tt.shape().dim();
      if (bound != opt.input_shapes.end() && bound->second.size() != size_t(dims.size()))
        throw Error(who + ": bound shape " + shape_str(bound->second) + " has rank " +
                    std::to_string(bound->second.size()) + ", the model declares rank " + std::to_string(dims.size()));
      for (int i = 0; i < dims.size(); ++i) {
        if (dims[i].has_dim_value() && dims[i].dim_value() > 0) {
          if (bound != opt.input_shapes.end() && bound->second[size_t(i)] != dims[i].dim_value())
            throw Error(who + ": bound shape " + shape_str(bound->second) + " disagrees with the model's fixed axis " +
                        std::to_string(i) + " = " + std::to_string(dims[i].dim_value()));
          shape.push_back(dims[i].dim_value());
        } else if (bound != opt.input_shapes.end()) {
          shape.push_back(bound->second[size_t(i)]);
        } else {
          throw Error(who + ": axis " + std::to_string(i) + " is dynamic ('" + dims[i].dim_param() +
                      "'); bind it with ImportOptions::input_shapes (mgn: --input " + in.name() + "=AxBxC)");
        }
      }
    } else if (bound != opt.input_shapes.end()) {
      shape = bound->second;
    } else {
      throw Error(who + ": no shape in the model; bind one with ImportOptions::input_shapes");
    }
    checked_numel(shape, who);
    Value v;
    v.name = in.name();
    v.t = g.input(in.name(), shape, dt);
    v.elem = tt.elem_type();
    env.emplace(in.name(), std::move(v));
    out.inputs.push_back(in.name());
  }
  for (const auto& [name, _] : opt.input_shapes)
    if (!env.count(name)) throw Error(origin + ": --input binds '" + name + "', which is not a graph input");
  for (const auto& [name, _] : opt.input_values)
    if (!env.count(name)) throw Error(origin + ": a value is given for '" + name + "', which is not a graph input");
  for (const auto& [name, t] : inits) {
    if (env.count(name)) continue;
    Value v;
    v.name = name;
    v.host = tensor_from_proto(*t, dir, origin + ": initializer");
    v.initializer = v.host->kind == Kind::F;
    env.emplace(name, std::move(v));
  }

  // Topological order (ONNX requires sorted nodes, but a file may not be): Kahn's algorithm over producers.
  int nn = gp.node_size();
  std::map<std::string, int> producer;
  for (int i = 0; i < nn; ++i)
    for (const auto& o : gp.node(i).output()) {
      if (o.empty()) continue;
      if (env.count(o) || !producer.emplace(o, i).second)
        throw Error(origin + ": value '" + o + "' is produced twice (by " + node_label(gp.node(i)) + ")");
    }
  std::vector<int> pending(size_t(nn), 0);
  std::vector<std::vector<int>> users{size_t(nn)};
  for (int i = 0; i < nn; ++i) {
    for (const auto& in : gp.node(i).input()) {
      if (in.empty() || env.count(in)) continue;
      auto p = producer.find(in);
      if (p == producer.end())
        throw Error(origin + ": " + node_label(gp.node(i)) + " reads '" + in +
                    "', which is no graph input, initializer or node output");
      ++pending[size_t(i)];
      users[size_t(p->second)].push_back(i);
    }
  }
  std::vector<int> order, ready;
  for (int i = nn - 1; i >= 0; --i)
    if (pending[size_t(i)] == 0) ready.push_back(i);
  while (!ready.empty()) {
    int i = ready.back();
    ready.pop_back();
    order.push_back(i);
    for (int u : users[size_t(i)])
      if (--pending[size_t(u)] == 0) ready.push_back(u);
  }
  if (int(order.size()) != nn) {
    for (int i = 0; i < nn; ++i)
      if (pending[size_t(i)] > 0)
        throw Error(origin + ": the graph has a cycle through " + node_label(gp.node(i)));
  }

  Lowering low(g, opt, out.opset);
  for (int i : order) {
    const pb::NodeProto& n = gp.node(i);
    std::vector<const Value*> ins;
    for (const auto& in : n.input()) {
      if (in.empty()) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = env.find(in);
      if (it == env.end())
        throw Error(origin + ": " + node_label(n) + " reads '" + in + "', an output its producer does not support");
      ins.push_back(&it->second);
    }
    std::vector<Value> outs;
    try {
      outs = table.at(n.op_type())(low, n, ins);
    } catch (const Error& e) {
      std::string what = e.what();
      std::string label = node_label(n);
      throw Error(origin + ": " + (what.rfind(label, 0) == 0 ? what : label + ": " + what));
    } catch (const std::exception& e) {
      throw Error(origin + ": " + node_label(n) + ": " + e.what());
    }
    for (size_t k = 0; k < outs.size() && k < size_t(n.output_size()); ++k) {
      if (n.output(int(k)).empty()) continue;
      if (!outs[k].initializer) outs[k].name = n.output(int(k));
      env[n.output(int(k))] = std::move(outs[k]);
    }
  }

  for (const auto& o : gp.output()) {
    auto it = env.find(o.name());
    if (it == env.end()) throw Error(origin + ": graph output '" + o.name() + "' is not computed by any node");
    Tensor t;
    try {
      t = low.tensor(it->second);
    } catch (const Error& e) {
      throw Error(origin + ": graph output '" + o.name() + "': " + e.what());
    }
    g.output(o.name(), t);
    out.outputs.push_back(o.name());
  }
  out.parameter_count = low.parameter_count;
  g.verify();
  return out;
}

std::string dims_str(const pb::ValueInfoProto& v) {
  if (!v.type().has_tensor_type()) return "(not a tensor)";
  const auto& tt = v.type().tensor_type();
  std::string s = pb::TensorProto::DataType_IsValid(tt.elem_type())
                      ? pb::TensorProto::DataType_Name(pb::TensorProto::DataType(tt.elem_type()))
                      : "?";
  if (!tt.has_shape()) return s + " [?]";
  s += " [";
  for (int i = 0; i < tt.shape().dim_size(); ++i) {
    const auto& d = tt.shape().dim(i);
    if (i) s += ", ";
    s += d.has_dim_value() ? std::to_string(d.dim_value()) : d.dim_param().empty() ? "?" : d.dim_param();
  }
  return s + "]";
}

}  // namespace

Imported import_bytes(const std::string& bytes, const std::string& origin, const ImportOptions& opt) {
  pb::ModelProto m = parse_model(bytes, origin);
  return lower(m, origin, opt, opt.external_data_dir);
}

Imported import_file(const std::string& path, const ImportOptions& opt) {
  pb::ModelProto m = parse_model(read_file(path), path);
  std::string dir = opt.external_data_dir;
  if (dir.empty()) dir = std::filesystem::path(path).parent_path().string();
  return lower(m, path, opt, dir);
}

std::string inspect_bytes(const std::string& bytes, const std::string& origin) {
  pb::ModelProto m = parse_model(bytes, origin);
  const auto& gp = m.graph();
  std::ostringstream s;
  s << origin << ": opset " << default_opset(m) << ", producer '" << m.producer_name() << " " << m.producer_version()
    << "'\n";
  std::set<std::string> inits;
  int64_t params = 0;
  for (const auto& t : gp.initializer()) {
    inits.insert(t.name());
    // A count for the report only: it saturates instead of overflowing on absurd declared dimensions.
    int64_t n = 1;
    for (int64_t d : t.dims())
      if (d <= 0)
        n = d == 0 ? 0 : n;
      else if (__builtin_mul_overflow(n, d, &n))
        n = INT64_MAX;
    int et = t.data_type();
    if ((et == pb::TensorProto::FLOAT || et == pb::TensorProto::DOUBLE || et == pb::TensorProto::FLOAT16 ||
         et == pb::TensorProto::BFLOAT16) &&
        __builtin_add_overflow(params, n, &params))
      params = INT64_MAX;
  }
  s << "inputs:\n";
  for (const auto& in : gp.input())
    if (!inits.count(in.name())) s << "  " << in.name() << ": " << dims_str(in) << "\n";
  s << "outputs:\n";
  for (const auto& o : gp.output()) s << "  " << o.name() << ": " << dims_str(o) << "\n";
  std::map<std::string, int> hist;
  for (const auto& n : gp.node())
    hist[(is_default_domain(n.domain()) ? std::string() : n.domain() + ".") + n.op_type()]++;
  s << "ops (" << gp.node_size() << " nodes):\n";
  const auto& table = op_table();
  for (const auto& [op, count] : hist)
    s << "  " << op << " x" << count << (table.count(op) ? "" : "  (unsupported)") << "\n";
  s << "initializers: " << gp.initializer_size() << ", parameters (float elements): " << params << "\n";
  return s.str();
}

std::string inspect(const std::string& path) { return inspect_bytes(read_file(path), path); }

bool TensorFile::is_float() const {
  return elem_type == pb::TensorProto::FLOAT || elem_type == pb::TensorProto::DOUBLE ||
         elem_type == pb::TensorProto::FLOAT16 || elem_type == pb::TensorProto::BFLOAT16;
}

TensorFile read_tensor_file(const std::string& path) {
  const std::string bytes = read_file(path);
  pb::TensorProto p;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), int(std::min<size_t>(bytes.size(), INT32_MAX)));
  google::protobuf::io::CodedInputStream in(&raw);
  in.SetRecursionLimit(16);
  if (bytes.size() > size_t(INT32_MAX) || !p.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    throw Error(path + ": not a serialized ONNX TensorProto");
  TensorFile t;
  t.name = p.name();
  t.elem_type = p.data_type();
  t.type_name = pb::TensorProto::DataType_IsValid(t.elem_type)
                    ? pb::TensorProto::DataType_Name(pb::TensorProto::DataType(t.elem_type))
                    : "?";
  HostTensor h = tensor_from_proto(p, std::filesystem::path(path).parent_path().string(), path);
  t.shape = std::move(h.shape);
  t.values = std::move(h.v);
  return t;
}

namespace {
int elem_of(const pb::ValueInfoProto& v) {
  return v.type().has_tensor_type() ? v.type().tensor_type().elem_type() : 0;
}
}  // namespace

std::vector<GraphValue> graph_inputs(const std::string& path) {
  pb::ModelProto m = parse_model(read_file(path), path);
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  std::vector<GraphValue> vs;
  for (const auto& in : m.graph().input())
    if (!inits.count(in.name())) vs.push_back({in.name(), elem_of(in)});
  return vs;
}

std::vector<GraphValue> graph_outputs(const std::string& path) {
  pb::ModelProto m = parse_model(read_file(path), path);
  std::vector<GraphValue> vs;
  for (const auto& o : m.graph().output()) vs.push_back({o.name(), elem_of(o)});
  return vs;
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> v;
  for (const auto& [name, _] : op_table()) v.push_back(name);
  return v;
}

}  // namespace mgn::onnx
