// CPU reference executor: op-by-op evaluation of the plan's dispatches, group by group, in an arena of doubles.
#include "backend/cpu/executor.h"

#include <cmath>
#include <cstring>

#include "support/numerics_trace.h"

namespace mgn::cpu {

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = int(s.size()) - 2; i >= 0; --i) st[size_t(i)] = st[size_t(i) + 1] * s[size_t(i) + 1];
  return st;
}

BroadcastIndex::BroadcastIndex(const Shape& in, const Shape& out) : out_dims_(out), identity_(in == out) {
  std::vector<int64_t> ist = strides_of(in);
  in_strides_.assign(out.size(), 0);
  size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) in_strides_[i + off] = ist[i];
}

int64_t BroadcastIndex::operator()(int64_t flat) const {
  if (identity_) return flat;
  int64_t idx = 0;
  for (int i = int(out_dims_.size()) - 1; i >= 0; --i) {
    int64_t d = out_dims_[size_t(i)];
    idx += (flat % d) * in_strides_[size_t(i)];
    flat /= d;
  }
  return idx;
}

AxisSplit split_at(const Shape& s, int axis) {
  AxisSplit r{1, s[size_t(axis)], 1};
  for (int i = 0; i < axis; ++i) r.outer *= s[size_t(i)];
  for (size_t i = size_t(axis) + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

void round_to_dtype(Buffer& b) {
  switch (b.dtype) {
    case DType::F32:
      for (double& x : b.v) x = double(float(x));
      break;
    case DType::F16:
      for (double& x : b.v) x = double(half_to_float(float_to_half(float(x))));
      break;
    case DType::BF16:
      for (double& x : b.v) x = double(bf16_to_float(float_to_bf16(float(x))));
      break;
    case DType::I32:
    case DType::Bool:
      break;
  }
}

Executor::Executor(const ir::Graph& g, ExecutorOptions opt) : g_(g), opt_(opt) {
  ir::verify(g_);
  for (int id : g_.parameters()) {
    const ir::Node& n = g_.node(id);
    // Parameters are host copies before any plan exists: refuse what host memory cannot hold up front.
    if (uint64_t(numel(n.shape)) > opt_.plan.available_bytes / sizeof(double))
      throw Error("cpu executor: parameter '" + n.name + "' " + shape_str(n.shape) + " needs more than the " +
                  std::to_string(opt_.plan.available_bytes) + " bytes available (" + opt_.plan.available_what + ")");
    std::vector<float> init;
    try {
      init = materialize(n.init, n.shape, n.name);
    } catch (const std::bad_alloc&) {
      throw Error("cpu executor: out of host memory for parameter '" + n.name + "' " + shape_str(n.shape));
    }
    std::vector<double> v(init.begin(), init.end());
    Buffer b{n.shape, n.dtype, std::move(v)};
    if (!opt_.float64) round_to_dtype(b);
    state_[n.name] = std::move(b.v);
  }
  plan::PlanOptions po = opt_.plan;
  po.tensor_bytes = [](const ir::Node& n) {
    uint64_t bytes;
    if (__builtin_mul_overflow(uint64_t(numel(n.shape)), uint64_t(sizeof(double)), &bytes))
      throw Error("cpu executor: tensor " + shape_str(n.shape) + " has more bytes than 64 bits count");
    return bytes;
  };
  po.alignment = std::max<uint64_t>(po.alignment, sizeof(double));
  if (po.segment_bytes) po.segment_bytes = (po.segment_bytes + po.alignment - 1) / po.alignment * po.alignment;
  plan_ = plan::make_plan(g_, po);
  try {
    arena_.assign(size_t(plan_.arena_bytes / sizeof(double)), 0.0);
  } catch (const std::bad_alloc&) {
    throw Error("cpu executor: out of host memory allocating the plan's arena of " +
                std::to_string(plan_.arena_bytes) + " bytes");
  }
}

void Executor::set_input(const std::string& name, std::vector<double> values) {
  auto id = g_.find_named(name);
  if (!id || g_.node(*id).op != ir::Op::Input) throw Error("set_input: the graph has no input named '" + name + "'");
  const ir::Node& n = g_.node(*id);
  if (int64_t(values.size()) != numel(n.shape))
    throw Error("set_input '" + name + "': got " + std::to_string(values.size()) + " values, shape " +
                shape_str(n.shape) + " needs " + std::to_string(numel(n.shape)));
  if (n.dtype == DType::I32 || n.dtype == DType::Bool)
    for (double x : values)
      if (x != std::floor(x)) throw Error("set_input '" + name + "': non-integer value for an integer input");
  inputs_[name] = std::move(values);
}
void Executor::set_input(const std::string& name, const std::vector<float>& values) {
  set_input(name, std::vector<double>(values.begin(), values.end()));
}
void Executor::set_input(const std::string& name, const std::vector<int32_t>& values) {
  set_input(name, std::vector<double>(values.begin(), values.end()));
}

const std::vector<double>& Executor::state(const std::string& name) const {
  auto it = state_.find(name);
  if (it == state_.end()) throw Error("the graph has no parameter or state named '" + name + "'");
  trace::record("cpu.state", it->second.data(), it->second.size() * sizeof(double));
  return it->second;
}

void Executor::set_state(const std::string& name, std::vector<double> values) {
  auto it = state_.find(name);
  if (it == state_.end()) throw Error("the graph has no parameter or state named '" + name + "'");
  if (values.size() != it->second.size())
    throw Error("set_state '" + name + "': got " + std::to_string(values.size()) + " values, expected " +
                std::to_string(it->second.size()));
  it->second = std::move(values);
}

std::vector<std::string> Executor::state_names() const {
  std::vector<std::string> r;
  for (int id : g_.parameters()) r.push_back(g_.node(id).name);
  return r;
}

namespace {

// Any read of memory the step has not written shows up as this value in the results.
constexpr double kPoison = -7.0e77;

void eval_node(const ir::Graph& g, const ir::Node& node, const Inputs& ins, Buffer& out, bool float64) {
  out.shape = node.shape;
  out.dtype = node.dtype;
  out.v.assign(size_t(numel(node.shape)), 0.0);
  switch (node.op) {
#define X(E, name, mn, mx, arch, diff, rule, attrs) \
  case ir::Op::E: k_##E(node, ins, out); break;
#include "ir/ops.def"
#undef X
  }
  if (int64_t(out.v.size()) != numel(node.shape))
    throw Error("internal: CPU kernel for " + g.describe(node.id) + " produced the wrong number of values");
  if (!float64) round_to_dtype(out);
}

}  // namespace

void Executor::run() {
  const plan::Plan& p = plan_;
  const int n = g_.size();
  std::fill(arena_.begin(), arena_.end(), kPoison);
  auto at = [&](int storage) { return arena_.data() + p.storages[size_t(storage)].offset / sizeof(double); };
  auto store = [&](int id, const std::vector<double>& v) {
    int s = p.storage_of[size_t(id)];
    if (s < 0) return;
    if (v.size() * sizeof(double) > p.storages[size_t(s)].bytes)
      throw Error("internal: plan storage of " + g_.describe(id) + " is too small");
    if (!v.empty()) std::memcpy(at(s), v.data(), v.size() * sizeof(double));
  };
  auto load = [&](int id) {
    const ir::Node& node = g_.node(id);
    Buffer b{node.shape, node.dtype, {}};
    const double* src = at(p.storage_of[size_t(id)]);
    b.v.assign(src, src + numel(node.shape));
    return b;
  };
  // Sources: inputs, parameters and state, constants.
  for (int i = 0; i < n; ++i) {
    if (!p.needed[size_t(i)] || p.storage_of[size_t(i)] < 0) continue;
    const ir::Node& node = g_.node(i);
    if (node.op == ir::Op::Input) {
      auto it = inputs_.find(node.name);
      if (it == inputs_.end()) throw Error("run: input '" + node.name + "' was not set");
      Buffer b{node.shape, node.dtype, it->second};
      if (!opt_.float64) round_to_dtype(b);
      store(i, b.v);
    } else if (node.op == ir::Op::Parameter) {
      store(i, state_.at(node.name));
    } else if (node.op == ir::Op::Constant || node.op == ir::Op::Full) {
      Buffer b;
      eval_node(g_, node, {}, b, opt_.float64);
      store(i, b.v);
    }
  }
  // Groups: every read of a group happens before any of its writes, as if its dispatches ran at once.
  for (int grp = 0; grp < p.num_groups(); ++grp) {
    const int d0 = p.group_begin[size_t(grp)], d1 = p.group_begin[size_t(grp) + 1];
    std::vector<std::map<int, Buffer>> vals(size_t(d1 - d0));
    for (int d = d0; d < d1; ++d)
      for (int id : p.dispatches[size_t(d)].nodes)
        for (int in : g_.node(id).inputs)
          if (p.dispatch_of[size_t(in)] != d && !vals[size_t(d - d0)].count(in))
            vals[size_t(d - d0)].emplace(in, load(in));
    for (int d = d0; d < d1; ++d) {
      std::map<int, Buffer>& local = vals[size_t(d - d0)];
      for (int id : p.dispatches[size_t(d)].nodes) {
        const ir::Node& node = g_.node(id);
        Inputs ins;
        for (int in : node.inputs) ins.push_back(&local.at(in));
        Buffer out;
        eval_node(g_, node, ins, out, opt_.float64);
        local[id] = std::move(out);
      }
    }
    for (int d = d0; d < d1; ++d)
      for (int id : p.dispatches[size_t(d)].nodes) store(id, vals[size_t(d - d0)].at(id).v);
  }
  // End of step: snapshots, then commits (the plan makes them independent of each other).
  for (const plan::Copy& c : p.snapshots)
    std::memmove(at(c.dst_storage), at(c.src_storage), size_t(c.bytes));
  for (const plan::Commit& c : p.commits)
    if (!c.in_place) std::memmove(at(c.dst_storage), at(c.src_storage), size_t(c.bytes));
  outputs_.clear();
  for (size_t k = 0; k < g_.outputs().size(); ++k) {
    const auto& [name, id] = g_.outputs()[k];
    const ir::Node& node = g_.node(id);
    const double* src = at(p.output_storage[k]);
    outputs_[name] = Buffer{node.shape, node.dtype, std::vector<double>(src, src + numel(node.shape))};
  }
  for (int id : g_.parameters())
    if (p.storage_of[size_t(id)] >= 0) state_[g_.node(id).name] = load(id).v;
}

const Buffer& Executor::output(const std::string& name) const {
  auto it = outputs_.find(name);
  if (it == outputs_.end()) throw Error("output '" + name + "' does not exist or the graph has not run");
  trace::record("cpu.output", it->second.v.data(), it->second.v.size() * sizeof(double));
  return it->second;
}

}  // namespace mgn::cpu
