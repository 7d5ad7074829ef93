// Session: compiles a graph (appending backward + optimizer in Train mode), binds it to an engine, checks
// every host transfer against the graph, and saves/loads checkpoints by parameter name.
#include "mgn/session.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "runtime/engine.h"
#include "ir/graph.h"
#include "mgn/checkpoint.h"

#include "mgn/autodiff.h"

namespace mgn {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::Auto:
      return "auto";
    case Backend::Cpu:
      return "cpu";
    case Backend::Vulkan:
      return "vulkan";
  }
  return "?";
}

Backend backend_from_name(const std::string& s) {
  if (s == "auto") return Backend::Auto;
  if (s == "cpu") return Backend::Cpu;
  if (s == "vulkan") return Backend::Vulkan;
  throw Error("unknown backend '" + s + "' (expected auto, cpu or vulkan)");
}

struct Session::Impl {
  std::shared_ptr<const ir::Graph> graph;
  std::unique_ptr<detail::Engine> engine;
  Mode mode = Mode::Infer;
  std::optional<UpdatePlan> plan;
  Schedule schedule;
  double base_lr = 0;
  int64_t steps = 0;
  bool ran = false;
  std::set<std::string> plan_inputs;
  CompileReport report;

  const ir::Node* named(const std::string& name) const {
    auto id = graph->find_named(name);
    return id ? &graph->node(*id) : nullptr;
  }
  const ir::Node& input_node(const std::string& name, DType given) const {
    const ir::Node* n = named(name);
    if (!n || n->op != ir::Op::Input) throw Error("set_input: the graph has no input named '" + name + "'");
    if (plan_inputs.count(name))
      throw Error("set_input: '" + name + "' is fed by the session itself (use set_lr for the learning rate)");
    bool int_input = n->dtype == DType::I32 || n->dtype == DType::Bool;
    if (int_input != (given == DType::I32))
      throw Error("set_input '" + name + "': the input has dtype " + dtype_name(n->dtype) + ", got " +
                  (given == DType::I32 ? "int32" : "float") + " values");
    return *n;
  }
  void check_count(const ir::Node& n, size_t count) const {
    if (int64_t(count) != numel(n.shape))
      throw Error("set_input '" + n.name + "': got " + std::to_string(count) + " values, shape " +
                  shape_str(n.shape) + " needs " + std::to_string(numel(n.shape)));
  }
  bool is_output(const std::string& name) const { return graph->find_output(name).has_value(); }
  bool is_state(const std::string& name) const {
    const ir::Node* n = named(name);
    return n && n->op == ir::Op::Parameter;
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

Mode Session::mode() const { return impl_->mode; }
const char* Session::backend() const { return impl_->engine->name(); }
const char* Session::device_type() const { return impl_->engine->device_type(); }
std::vector<std::pair<std::string, std::string>> Session::kernel_sources() const {
  return impl_->engine->kernel_sources();
}
DeviceMemoryReport Session::device_memory() const { return impl_->engine->device_memory(); }
std::vector<KernelProfile> Session::kernel_profile() const { return impl_->engine->kernel_profile(); }
const CompileReport& Session::compile_report() const { return impl_->report; }

void Session::set_input(const std::string& name, std::span<const float> values) {
  const ir::Node& n = impl_->input_node(name, DType::F32);
  impl_->check_count(n, values.size());
  impl_->engine->set_input(name, values);
}

void Session::set_input(const std::string& name, std::span<const int32_t> values) {
  const ir::Node& n = impl_->input_node(name, DType::I32);
  impl_->check_count(n, values.size());
  if (n.dtype == DType::Bool)
    for (int32_t v : values)
      if (v != 0 && v != 1) throw Error("set_input '" + name + "': a bool input takes only 0 or 1, got " + std::to_string(v));
  impl_->engine->set_input(name, std::vector<int32_t>(values.begin(), values.end()));
}

void Session::step() {
  Impl& s = *impl_;
  if (s.mode != Mode::Train) throw Error("step(): this session was compiled for inference (use run())");
  std::vector<float> scalars = s.plan->scalar_inputs(lr(), s.steps);
  for (size_t i = 0; i < scalars.size(); ++i) s.engine->set_input(s.plan->inputs[i], std::vector<float>{scalars[i]});
  s.engine->run();
  s.ran = true;
  ++s.steps;
}

void Session::run() {
  if (impl_->mode != Mode::Infer)
    throw Error("run(): this session was compiled for training (use step(); build an inference graph to evaluate)");
  impl_->engine->run();
  impl_->ran = true;
}

std::vector<float> Session::read(const std::string& name) {
  Impl& s = *impl_;
  if (s.is_output(name)) {
    if (!s.ran) throw Error("read '" + name + "': the session has not run yet");
    return s.engine->read_output(name);
  }
  if (s.is_state(name)) return s.engine->read_state(name);
  throw Error("read: the graph has no output, parameter or state named '" + name + "'");
}

float Session::read_scalar(const std::string& name) {
  std::vector<float> v = read(name);
  if (v.size() != 1) throw Error("read_scalar '" + name + "': it has " + std::to_string(v.size()) + " values");
  return v[0];
}

void Session::write_parameter(const std::string& name, std::span<const float> values) {
  const ir::Node* n = impl_->named(name);
  if (!n || n->op != ir::Op::Parameter)
    throw Error("write_parameter: the graph has no parameter or state named '" + name + "'");
  if (int64_t(values.size()) != numel(n->shape))
    throw Error("write_parameter '" + name + "': got " + std::to_string(values.size()) + " values, shape " +
                shape_str(n->shape) + " needs " + std::to_string(numel(n->shape)));
  impl_->engine->write_state(name, values);
}

Shape Session::shape_of(const std::string& name) const {
  if (auto o = impl_->graph->find_output(name)) return impl_->graph->node(*o).shape;
  if (const ir::Node* n = impl_->named(name)) return n->shape;
  throw Error("shape_of: the graph has no tensor named '" + name + "'");
}

std::vector<std::string> Session::input_names() const {
  std::vector<std::string> r;
  for (int id : impl_->graph->inputs())
    if (!impl_->plan_inputs.count(impl_->graph->node(id).name)) r.push_back(impl_->graph->node(id).name);
  return r;
}

std::vector<std::string> Session::output_names() const {
  std::vector<std::string> r;
  for (auto& [name, id] : impl_->graph->outputs()) r.push_back(name);
  return r;
}

std::vector<std::string> Session::state_names() const {
  std::vector<std::string> r;
  for (int id : impl_->graph->parameters()) r.push_back(impl_->graph->node(id).name);
  return r;
}

void Session::set_lr(double base) {
  if (!(base >= 0) || !std::isfinite(base)) throw Error("set_lr: the learning rate must be finite and >= 0");
  impl_->base_lr = base;
}

double Session::lr() const { return impl_->schedule.lr(impl_->base_lr, impl_->steps); }
int64_t Session::step_count() const { return impl_->steps; }
const UpdatePlan* Session::update_plan() const { return impl_->plan ? &*impl_->plan : nullptr; }

void Session::save_checkpoint(const std::string& path) {
  Impl& s = *impl_;
  std::vector<StoredTensor> tensors;
  for (int id : s.graph->parameters()) {
    const ir::Node& n = s.graph->node(id);
    std::vector<float> v = s.engine->read_state(n.name);
    if (is_float(n.dtype)) {
      tensors.push_back(StoredTensor::from_f32(n.name, n.shape, v, n.dtype));
    } else {
      std::vector<int32_t> iv(v.begin(), v.end());
      tensors.push_back(StoredTensor::from_i32(n.name, n.shape, iv));
    }
  }
  std::map<std::string, std::string> meta;
  if (s.plan) meta["mgn.optimizer"] = optimizer_name(s.plan->optimizer);
  write_checkpoint(path, tensors, s.steps, meta);
}

void Session::load_checkpoint(const std::string& path, const LoadOptions& opt) {
  Impl& s = *impl_;
  TensorSet ts = read_tensor_set(path);
  // Check everything before writing anything, so a bad file leaves the session as it was.
  std::vector<std::pair<std::string, std::vector<float>>> values;
  bool have_step = false;
  for (int id : s.graph->parameters()) {
    const ir::Node& n = s.graph->node(id);
    if (!ts.find(n.name) && !opt.require_optimizer_state && n.name.rfind("optim.", 0) == 0) continue;
    if (!ts.find(n.name))
      throw Error("checkpoint '" + path + "' has no tensor '" + n.name + "' (the graph expects shape " +
                  shape_str(n.shape) + ")");
    values.emplace_back(n.name, ts.values_f32(n.name, n.shape));
    if (n.name == UpdatePlan::kStepState) have_step = true;
  }
  for (auto& [name, v] : values) s.engine->write_state(name, v);
  if (s.mode == Mode::Train) {
    if (have_step) {
      double st = s.engine->read_state(UpdatePlan::kStepState)[0];
      if (!(st >= 0) || st != std::floor(st))
        throw Error("checkpoint '" + path + "': optim.step holds " + std::to_string(st) + ", not a step count");
      s.steps = int64_t(st);
    } else {
      s.steps = 0;
    }
  }
}

namespace {

std::map<std::string, Tensor> gradients_for(Graph& g, const CompileOptions& opt) {
  if (!opt.gradients.empty()) return opt.gradients;
  auto loss_id = g.ir().find_output(opt.loss);
  if (!loss_id)
    throw Error("compile (train): the graph has no output named '" + opt.loss + "' to differentiate");
  Gradients grads = backward(g, Tensor(&g.ir(), *loss_id));
  return grads.params;
}

std::unique_ptr<detail::Engine> make_engine(std::shared_ptr<const ir::Graph> graph, const CompileOptions& opt) {
  switch (opt.backend) {
    case Backend::Cpu:
      return detail::make_cpu_engine(std::move(graph), opt);
    case Backend::Vulkan:
#ifdef MGN_HAVE_VULKAN
      return detail::make_vulkan_engine(std::move(graph), opt);
#else
      throw Error("Backend::Vulkan: this build has no Vulkan backend (use Backend::Cpu or Auto)");
#endif
    case Backend::Auto:
#ifdef MGN_HAVE_VULKAN
      try {
        return detail::make_vulkan_engine(graph, opt);
      } catch (const Error& e) {
        // No usable device (or the graph cannot run there): the CPU reference runs every graph. Said once per
        // session, so a slow fallback is never silent.
        std::fprintf(stderr, "mgn: Vulkan engine unavailable, using the CPU reference executor: %s\n", e.what());
      }
#endif
      return detail::make_cpu_engine(std::move(graph), opt);
  }
  throw Error("compile: unknown backend");
}

}  // namespace

Session compile(Graph& g, const CompileOptions& opt) {
  auto impl = std::make_unique<Session::Impl>();
  impl->mode = opt.mode;
  using Clock = std::chrono::steady_clock;
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t0 = Clock::now();
  double autodiff_ms = 0, optimizer_ms = 0;
  if (opt.mode == Mode::Train) {
    opt.schedule.validate();
    const auto ta = Clock::now();
    std::map<std::string, Tensor> grads = gradients_for(g, opt);
    const auto tb = Clock::now();
    impl->plan = append_optimizer(g, grads, opt.optimizer, opt.update);
    autodiff_ms = ms(ta, tb);
    optimizer_ms = ms(tb, Clock::now());
    impl->schedule = opt.schedule;
    impl->base_lr = base_lr(opt.optimizer);
    for (const std::string& in : impl->plan->inputs) impl->plan_inputs.insert(in);
  }
  const auto tv = Clock::now();
  g.verify();
  impl->graph = std::make_shared<const ir::Graph>(g.ir());
  const auto t1 = Clock::now();
  if (opt.submissions < 1)
    throw Error("compile: submissions must be >= 1, got " + std::to_string(opt.submissions));
  impl->engine = make_engine(impl->graph, opt);
  const auto t2 = Clock::now();
  CompileReport& r = impl->report;
  r = impl->engine->compile_report();
  r.autodiff_ms = autodiff_ms;
  r.optimizer_ms = optimizer_ms;
  r.verify_ms = ms(tv, t1);
  r.total_ms = ms(t0, t2);
  // Profiling: the graph passes' share of compile time (the Vulkan engine prints its own phases).
  if (opt.profile)
    std::fprintf(stderr, "mgn profile: compile %s graph (%d nodes): graph passes %.1f ms (autodiff %.1f, optimizer %.1f, "
                 "verify %.1f), engine %.1f ms\n", opt.mode == Mode::Train ? "train" : "infer", impl->graph->size(),
                 ms(t0, t1), autodiff_ms, optimizer_ms, r.verify_ms, ms(t1, t2));
  return Session(std::move(impl));
}

}  // namespace mgn
