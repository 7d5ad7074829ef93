// DataParallelTrainer: one gradient session and one update session per replica, the host-staged gradient
// reduction in replica order (optionally across processes through a ProcessGroup), and checkpoints.
#include "mgn/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/checkpoint.h"

namespace mgn {

namespace {

// Elements [begin, end) of the reduction: per element s = 0 (double), s += double(g_r) for r = 0, 1, ... in
// replica order, then the scale; in chunks whose double sums live on the stack (no buffer of the size of the
// model in double).
void reduce_range(const float* buffers, int replicas, size_t count, GradientScale scale, float* out,
                  size_t begin, size_t end) {
  constexpr size_t kChunk = 2048;
  double sum[kChunk];
  for (size_t c0 = begin; c0 < end; c0 += kChunk) {
    const size_t n = std::min(kChunk, end - c0);
    std::fill(sum, sum + n, 0.0);
    for (int r = 0; r < replicas; ++r) {
      const float* g = buffers + size_t(r) * count + c0;
      for (size_t i = 0; i < n; ++i) sum[i] += double(g[i]);
    }
    for (size_t i = 0; i < n; ++i)
      out[c0 + i] = float(scale == GradientScale::Mean ? sum[i] / double(replicas) : sum[i]);
  }
}

// The whole reduction into `out`, on up to 8 threads for large models (each element's arithmetic is the same
// whichever thread does it, so the result does not depend on the split).
void reduce_into(std::span<const float> buffers, int replicas, size_t count, GradientScale scale,
                 std::span<float> out) {
  constexpr size_t kPerThread = size_t(1) << 20;
  const size_t threads = std::clamp<size_t>(count / kPerThread, 1,
                                            std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));
  if (threads == 1) return reduce_range(buffers.data(), replicas, count, scale, out.data(), 0, count);
  std::vector<std::thread> pool;
  const size_t per = (count + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    const size_t b = std::min(count, t * per), e = std::min(count, b + per);
    pool.emplace_back([&, b, e] { reduce_range(buffers.data(), replicas, count, scale, out.data(), b, e); });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace

std::vector<float> reduce_replica_gradients(std::span<const float> buffers, int replicas, size_t count,
                                            GradientScale scale) {
  if (replicas < 1)
    throw Error("reduce_replica_gradients: replicas must be >= 1, got " + std::to_string(replicas));
  if (buffers.size() != size_t(replicas) * count)
    throw Error("reduce_replica_gradients: " + std::to_string(buffers.size()) + " values for " +
                std::to_string(replicas) + " replicas of " + std::to_string(count));
  std::vector<float> out(count);
  reduce_into(buffers, replicas, count, scale, out);
  return out;
}

namespace {

// Runs f(0..n-1), on one thread each when asked; the first failure in replica order is rethrown after all
// ended.
void for_each_replica(int n, bool threads, const std::function<void(int)>& f) {
  if (!threads || n == 1) {
    for (int r = 0; r < n; ++r) f(r);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> pool;
  pool.reserve(size_t(n));
  for (int r = 0; r < n; ++r)
    pool.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (std::thread& t : pool) t.join();
  for (std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

struct TensorInfo {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
};

std::string grad_name(const std::string& param) {
  return "grad." + param;
}

}  // namespace

struct DataParallelTrainer::Impl {
  DataParallelOptions opt;
  int rank = 0, ranks = 1, local = 0, global = 0;
  int64_t shard = 0;
  std::vector<TensorInfo> trained;  // parameters the optimizer updates, graph order
  // Every tensor a checkpoint holds, in Session::save_checkpoint's order.
  std::vector<TensorInfo> checkpointed;
  size_t grad_values = 0;  // sum of the trained parameters' sizes
  std::set<std::string> split, replicated, fed;
  std::vector<Session> grad, update;
  Timing timing;

  int first() const { return rank * local; }

  // This process's replicas' gradients and losses (n values each, one after the other) and their reduction;
  // kept from step to step (the model's size: no fresh allocation, and its page faults, per step).
  std::vector<float> mine, reduced;

  // The reduction over every replica of every process, in buckets across processes, of `mine`: a view of the
  // result, valid until the next step. One replica in all is its own reduction (float(double(g) / 1) == g).
  std::span<const float> reduce(size_t n) {
    if (!opt.group) {
      if (global == 1) return std::span<const float>(mine.data(), n);
      reduced.resize(n);
      reduce_into(mine, global, n, opt.scale, reduced);
      return reduced;
    }
    reduced.assign(n, 0.0f);
    std::vector<float>& out = reduced;
    const size_t bucket = size_t(opt.bucket_values);
    std::vector<float> send;
    for (size_t off = 0; off < n; off += bucket) {
      const size_t len = std::min(bucket, n - off);
      send.clear();
      for (int r = 0; r < local; ++r)
        send.insert(send.end(), mine.begin() + ptrdiff_t(size_t(r) * n + off),
                    mine.begin() + ptrdiff_t(size_t(r) * n + off + len));
      std::vector<float> all = opt.group->gather_to_root(send);  // rank order = global replica order
      if (rank == 0) {
        std::vector<float> part = reduce_replica_gradients(all, global, len, opt.scale);
        std::copy(part.begin(), part.end(), out.begin() + ptrdiff_t(off));
      }
      opt.group->broadcast_from_root(std::span<float>(out.data() + off, len));
    }
    return out;
  }

  // Rank 0's values of every trained parameter into every replica of every process (initial weights).
  void sync_parameters() {
    std::vector<float> flat;
    flat.reserve(grad_values);
    for (const TensorInfo& p : trained) {
      std::vector<float> v = grad[0].read(p.name);
      flat.insert(flat.end(), v.begin(), v.end());
    }
    if (opt.group)
      for (size_t off = 0; off < flat.size(); off += size_t(opt.bucket_values))
        opt.group->broadcast_from_root(
            std::span<float>(flat.data() + off, std::min(size_t(opt.bucket_values), flat.size() - off)));
    for_each_replica(local, opt.threads, [&](int r) {
      size_t off = 0;
      for (const TensorInfo& p : trained) {
        std::span<const float> v(flat.data() + off, size_t(numel(p.shape)));
        off += v.size();
        grad[size_t(r)].write_parameter(p.name, v);
        update[size_t(r)].write_parameter(p.name, v);
      }
    });
  }

  void check_agree(int64_t value, const std::string& what) {
    if (!opt.group) return;
    std::vector<int64_t> all = opt.group->all_gather(value);
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] != all[0])
        throw Error("data-parallel: the processes disagree on " + what + ": rank 0 has " +
                    std::to_string(all[0]) + ", rank " + std::to_string(i) + " has " +
                    std::to_string(all[i]));
  }

  void set_input(const std::string& name, size_t count,
                 const std::function<void(Session&, size_t, size_t)>& feed) {
    const bool is_split = split.count(name) > 0;
    if (!is_split && !replicated.count(name)) {
      for (const std::string& in : grad[0].input_names())
        if (in == name)
          throw Error("DataParallelTrainer::set_input: '" + name + "' is neither split nor replicated");
      throw Error("DataParallelTrainer::set_input: the graph has no input named '" + name + "'");
    }
    const Shape s = grad[0].shape_of(name);
    const size_t per = size_t(numel(s));
    const size_t want = is_split ? per * size_t(global) : per;
    if (count != want)
      throw Error(
          "DataParallelTrainer::set_input '" + name + "': got " + std::to_string(count) + " values, " +
          (is_split ? "the whole batch of " + std::to_string(global) + " replicas x shape " + shape_str(s)
                    : "shape " + shape_str(s) + " (replicated)") +
          " needs " + std::to_string(want));
    for (int r = 0; r < local; ++r) feed(grad[size_t(r)], is_split ? size_t(first() + r) * per : 0, per);
    fed.insert(name);
  }
};

DataParallelTrainer::DataParallelTrainer(Graph& g, DataParallelOptions opt)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.opt = std::move(opt);
  const DataParallelOptions& o = s.opt;
  if (o.devices.empty())
    throw Error("DataParallelTrainer: no devices (DataParallelOptions::devices needs one per replica)");
  if (o.bucket_values < 1) throw Error("DataParallelTrainer: bucket_values must be >= 1");
  s.local = int(o.devices.size());
  if (o.group) {
    s.rank = o.group->rank();
    s.ranks = o.group->size();
    if (s.ranks < 1 || s.rank < 0 || s.rank >= s.ranks)
      throw Error("DataParallelTrainer: process group reports rank " + std::to_string(s.rank) + " of " +
                  std::to_string(s.ranks));
  }
  s.check_agree(s.local, "the number of replicas per process");
  s.global = s.local * s.ranks;

  const ir::Graph& ir = g.ir();
  for (int id = 0; id < ir.size(); ++id)
    if (ir.node(id).op == ir::Op::Assign)
      throw Error("DataParallelTrainer: the graph assigns state in its forward pass ('" +
                  ir.node(ir.node(id).inputs.at(0)).name +
                  "', e.g. batch-norm running statistics); each replica would keep its own, so data-parallel "
                  "training does not take such graphs yet");
  const std::string& loss = o.compile.loss;
  std::optional<Tensor> loss_t = g.find_output(loss);
  if (!loss_t)
    throw Error("DataParallelTrainer: the graph has no output named '" + loss + "' to differentiate");

  // Inputs: split along axis 0 unless replicated; all split ones share the per-replica batch.
  std::vector<std::string> inputs;
  for (int id : ir.inputs()) inputs.push_back(ir.node(id).name);
  auto is_input = [&](const std::string& n) {
    return std::find(inputs.begin(), inputs.end(), n) != inputs.end();
  };
  for (const std::string& n : o.replicated_inputs) {
    if (!is_input(n))
      throw Error("DataParallelTrainer: replicated input '" + n + "' is not an input of the graph");
    s.replicated.insert(n);
  }
  for (const std::string& n : o.split_inputs.empty() ? inputs : o.split_inputs) {
    if (!is_input(n))
      throw Error("DataParallelTrainer: split input '" + n + "' is not an input of the graph");
    if (s.replicated.count(n)) {
      if (o.split_inputs.empty()) continue;
      throw Error("DataParallelTrainer: input '" + n + "' is both split and replicated");
    }
    s.split.insert(n);
  }
  for (const std::string& n : inputs)
    if (!s.split.count(n) && !s.replicated.count(n))
      throw Error("DataParallelTrainer: input '" + n + "' is neither split nor replicated");
  if (s.split.empty()) throw Error("DataParallelTrainer: no input is split along the batch");
  for (const std::string& n : s.split) {
    const Shape& sh = ir.node(*ir.find_named(n)).shape;
    if (sh.empty())
      throw Error("DataParallelTrainer: split input '" + n + "' is a scalar; expected [batch, ...]");
    if (s.shard == 0) s.shard = sh[0];
    if (sh[0] != s.shard)
      throw Error("DataParallelTrainer: split inputs disagree on the per-replica batch: '" + n +
                  "' has shape " + shape_str(sh) + ", another has batch " + std::to_string(s.shard));
  }
  s.check_agree(s.shard, "the per-replica batch");

  // The backward pass, and the gradients as outputs of the gradient graph.
  std::map<std::string, Tensor> grads = o.compile.gradients;
  if (grads.empty()) grads = backward(g, *loss_t).params;
  if (grads.empty())
    throw Error("DataParallelTrainer: the loss '" + loss + "' depends on no trainable parameter");
  for (int id : ir.parameters()) {
    const ir::Node& n = ir.node(id);
    s.checkpointed.push_back({n.name, n.shape, n.dtype});
    if (!grads.count(n.name)) continue;
    s.trained.push_back({n.name, n.shape, n.dtype});
    s.grad_values += size_t(numel(n.shape));
    if (g.find_output(grad_name(n.name)))
      throw Error("DataParallelTrainer: the graph already has an output named '" + grad_name(n.name) + "'");
    g.output(grad_name(n.name), grads.at(n.name));
  }
  for (const auto& entry : grads) {
    const std::string& name = entry.first;  // not a structured binding: clang 14 cannot capture one
    if (std::none_of(s.trained.begin(), s.trained.end(), [&](const TensorInfo& p) { return p.name == name; }))
      throw Error("DataParallelTrainer: a gradient is given for '" + name +
                  "', which is not a parameter of the graph");
  }
  s.check_agree(int64_t(s.grad_values), "the number of trained values (is the model the same?)");

  // Replica r: its gradient session and its update session, on its own logical device.
  for (int r = 0; r < s.local; ++r) {
    DeviceOptions dev = o.devices[size_t(r)];
    dev.instance = r;
    CompileOptions gc = o.compile;
    gc.mode = Mode::Infer;
    gc.gradients.clear();
    gc.device = dev;
    s.grad.push_back(compile(g, gc));

    Graph u;
    std::map<std::string, Tensor> ug;
    for (const TensorInfo& p : s.trained) {
      u.parameter(p.name, p.shape, ir.node(*ir.find_named(p.name)).init, p.dtype);
      ug[p.name] = u.input(grad_name(p.name), p.shape, p.dtype);
    }
    CompileOptions uc = o.compile;
    uc.mode = Mode::Train;
    uc.gradients = ug;
    uc.device = dev;
    s.update.push_back(compile(u, uc));
    if (r == 0)
      for (int id : u.ir().parameters()) {
        const ir::Node& n = u.ir().node(id);
        if (std::none_of(s.checkpointed.begin(), s.checkpointed.end(),
                         [&](const TensorInfo& t) { return t.name == n.name; }))
          s.checkpointed.push_back({n.name, n.shape, n.dtype});
      }
  }
  // Every replica must run the update the same way, or the replicas' weights could part in the last bits (a
  // replica that fell back to the CPU executor, or another GPU model whose sqrt rounds otherwise).
  const std::string engine = s.update[0].backend();
  for (int r = 1; r < s.local; ++r)
    if (engine != s.update[size_t(r)].backend())
      throw Error("DataParallelTrainer: replica 0 runs on " + engine + " but replica " + std::to_string(r) +
                  " on " + s.update[size_t(r)].backend() +
                  "; replicas must run on the same kind of device to stay bitwise equal");
  uint64_t engine_hash = 1469598103934665603ull;  // FNV-1a: the same on every rank of the same build
  for (unsigned char ch : engine) engine_hash = (engine_hash ^ ch) * 1099511628211ull;
  s.check_agree(int64_t(engine_hash & 0x7fffffffffffffffull),
                "the device (a hash of rank 0's '" + engine + "'; replicas must run on the same kind of device)");
  s.sync_parameters();
}

DataParallelTrainer::~DataParallelTrainer() = default;

int DataParallelTrainer::replicas() const {
  return impl_->global;
}
int DataParallelTrainer::local_replicas() const {
  return impl_->local;
}
int DataParallelTrainer::first_replica() const {
  return impl_->first();
}
int64_t DataParallelTrainer::shard_batch() const {
  return impl_->shard;
}
int64_t DataParallelTrainer::global_batch() const {
  return impl_->shard * impl_->global;
}

void DataParallelTrainer::set_input(const std::string& name, std::span<const float> values) {
  impl_->set_input(name, values.size(),
                   [&](Session& s, size_t off, size_t n) { s.set_input(name, values.subspan(off, n)); });
}

void DataParallelTrainer::set_input(const std::string& name, std::span<const int32_t> values) {
  impl_->set_input(name, values.size(),
                   [&](Session& s, size_t off, size_t n) { s.set_input(name, values.subspan(off, n)); });
}

float DataParallelTrainer::step() {
  Impl& s = *impl_;
  for (const std::set<std::string>* names : {&s.split, &s.replicated})
    for (const std::string& n : *names)
      if (!s.fed.count(n)) throw Error("DataParallelTrainer::step: input '" + n + "' was never set");
  const size_t n = s.grad_values + 1;  // every gradient, then the loss
  s.mine.resize(size_t(s.local) * n);
  const std::string& loss = s.opt.compile.loss;
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const auto t0 = Clock::now();
  for_each_replica(s.local, s.opt.threads, [&](int r) {
    Session& gs = s.grad[size_t(r)];
    gs.run();
    float* out = s.mine.data() + size_t(r) * n;
    for (const TensorInfo& p : s.trained) {
      std::vector<float> v = gs.read(grad_name(p.name));
      out = std::copy(v.begin(), v.end(), out);
    }
    *out = gs.read_scalar(loss);
  });
  const auto t1 = Clock::now();
  const std::span<const float> reduced = s.reduce(n);
  const auto t2 = Clock::now();
  for_each_replica(s.local, s.opt.threads, [&](int r) {
    Session& us = s.update[size_t(r)];
    size_t off = 0;
    for (const TensorInfo& p : s.trained) {
      const size_t k = size_t(numel(p.shape));
      us.set_input(grad_name(p.name), std::span<const float>(reduced.data() + off, k));
      off += k;
    }
    us.step();
    for (const TensorInfo& p : s.trained) s.grad[size_t(r)].write_parameter(p.name, us.read(p.name));
  });
  s.timing.gradients_s += seconds(t0, t1);
  s.timing.reduce_s += seconds(t1, t2);
  s.timing.update_s += seconds(t2, Clock::now());
  ++s.timing.steps;
  return reduced[n - 1];
}

const DataParallelTrainer::Timing& DataParallelTrainer::timing() const {
  return impl_->timing;
}

void DataParallelTrainer::write_parameter(const std::string& name, std::span<const float> values) {
  Impl& s = *impl_;
  const bool trained =
      std::any_of(s.trained.begin(), s.trained.end(), [&](const TensorInfo& p) { return p.name == name; });
  for (int r = 0; r < s.local; ++r) {
    s.grad[size_t(r)].write_parameter(name, values);
    if (trained) s.update[size_t(r)].write_parameter(name, values);  // it holds the trained ones only
  }
}

std::vector<float> DataParallelTrainer::read(const std::string& name, int r) {
  Session& us = update_session(r);
  for (const std::string& n : us.state_names())
    if (n == name) return us.read(name);
  return gradient_session(r).read(name);
}

std::vector<float> DataParallelTrainer::read_output(const std::string& name, int r) {
  return gradient_session(r).read(name);
}

std::vector<std::string> DataParallelTrainer::parameter_names() const {
  std::vector<std::string> out;
  for (const TensorInfo& p : impl_->trained) out.push_back(p.name);
  return out;
}

double DataParallelTrainer::lr() const {
  return impl_->update[0].lr();
}
void DataParallelTrainer::set_lr(double base) {
  for (Session& u : impl_->update) u.set_lr(base);
}
int64_t DataParallelTrainer::step_count() const {
  return impl_->update[0].step_count();
}

void DataParallelTrainer::save_checkpoint(const std::string& path) {
  Impl& s = *impl_;
  if (s.rank != 0) return;
  std::vector<StoredTensor> tensors;
  for (const TensorInfo& t : s.checkpointed) {
    std::vector<float> v = read(t.name, 0);
    if (is_float(t.dtype)) {
      tensors.push_back(StoredTensor::from_f32(t.name, t.shape, v, t.dtype));
    } else {
      std::vector<int32_t> iv(v.begin(), v.end());
      tensors.push_back(StoredTensor::from_i32(t.name, t.shape, iv));
    }
  }
  const UpdatePlan* plan = s.update[0].update_plan();
  write_checkpoint(path, tensors, step_count(), {{"mgn.optimizer", optimizer_name(plan->optimizer)}});
}

void DataParallelTrainer::load_checkpoint(const std::string& path) {
  Impl& s = *impl_;
  for (int r = 0; r < s.local; ++r) {
    s.update[size_t(r)].load_checkpoint(path);
    s.grad[size_t(r)].load_checkpoint(path);
  }
}

Session& DataParallelTrainer::gradient_session(int r) {
  if (r < 0 || r >= impl_->local)
    throw Error("DataParallelTrainer: replica " + std::to_string(r) + " of " + std::to_string(impl_->local));
  return impl_->grad[size_t(r)];
}

Session& DataParallelTrainer::update_session(int r) {
  if (r < 0 || r >= impl_->local)
    throw Error("DataParallelTrainer: replica " + std::to_string(r) + " of " + std::to_string(impl_->local));
  return impl_->update[size_t(r)];
}

}  // namespace mgn
