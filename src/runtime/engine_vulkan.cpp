// The Vulkan engine: vk::GraphExecutor behind the Session interface. Sessions with equal DeviceOptions share
// one Context (the device, its caps and its self-test verdicts) for the life of the process, or until the
// device is lost (the next session then opens a new one).
//
// CompileOptions::profile turns on per-dispatch GPU timestamps; when the session ends the engine prints, to
// stderr, the GPU time of every kernel summed over all runs (heaviest first) and the compile time per phase.
#ifdef MGN_HAVE_VULKAN
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "backend/vulkan/graph_executor.h"
#include "passes/attention_matmul.h"
#include "runtime/engine.h"

namespace mgn::detail {

namespace {

// The process's devices: one Context per distinct DeviceOptions, and one pipeline cache per device and cache
// directory. The registry itself is never destroyed, and neither is a healthy Context: tearing the device
// down from a static destructor runs after the NVIDIA driver's own exit handlers and crashes at process exit
// (seen on the H200); the map stays reachable to the end, so LeakSanitizer does not count them as leaks.
// A lost Context (VK_ERROR_DEVICE_LOST) is dropped from the registry by the next lookup for its options, with
// its pipeline caches; the sessions still holding it keep it alive (shared ownership) and fail fast, and the
// last of them destroys it. Each pipeline cache holds its Context too, so the device outlives its pipelines.
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<vk::Context>> contexts;
  std::map<std::pair<const vk::Context*, std::string>, std::shared_ptr<vk::PipelineCache>> pipelines;
};

Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

}  // namespace

std::shared_ptr<vk::Context> shared_context(const DeviceOptions& o) {
  Registry& r = registry();
  const std::string key = o.device + '\n' + std::to_string(o.validation) + std::to_string(o.sync_validation) +
                          std::to_string(o.pipeline_statistics) + '\n' + o.pipeline_ir_dir + '\n' +
                          std::to_string(o.instance);
  std::lock_guard<std::mutex> lock(r.mutex);
  std::shared_ptr<vk::Context>& ctx = r.contexts[key];
  if (ctx && ctx->lost()) {
    std::erase_if(r.pipelines, [&](const auto& e) { return e.first.first == ctx.get(); });
    ctx.reset();  // destroyed here unless a session still holds it
  }
  if (!ctx) ctx = std::make_shared<vk::Context>(o);
  return ctx;
}

// One shader compiler per cache directory for the life of the process: the sessions of a workload (inference,
// training, ...) share its in-memory SPIR-V, so a kernel they have in common is compiled once.
static std::shared_ptr<codegen::ShaderCompiler> shared_compiler(const std::string& cache_dir) {
  static std::mutex m;
  static auto* compilers = new std::map<std::string, std::shared_ptr<codegen::ShaderCompiler>>();
  std::lock_guard<std::mutex> lock(m);
  auto& c = (*compilers)[cache_dir];
  if (!c) c = std::make_shared<codegen::ShaderCompiler>(cache_dir);
  return c;
}

// One pipeline cache per device and cache directory (only where there is a directory: a process that compiles
// many sessions in memory, such as the test programs, keeps each session's pipelines to itself): the sessions
// of a workload create the pipelines they share once. Kept as long as its device is healthy (see Registry);
// each executor saves what it added.
static std::shared_ptr<vk::PipelineCache> shared_pipelines(const std::shared_ptr<vk::Context>& ctx,
                                                           const std::string& cache_dir) {
  if (cache_dir.empty()) return nullptr;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& c = r.pipelines[{ctx.get(), cache_dir}];
  if (!c)
    c = std::shared_ptr<vk::PipelineCache>(new vk::PipelineCache(*ctx, cache_dir),
                                           [ctx](vk::PipelineCache* p) { delete p; });
  return c;
}

namespace {

// Fails the step if the validation layer (when on) reported anything: a silent layer is part of the contract.
void check_validation(vk::Context& ctx, const char* where) {
  if (!ctx.validation_enabled() || ctx.validation_message_count() == 0) return;
  std::string all;
  for (const std::string& m : ctx.validation_messages()) all += "\n  " + m;
  ctx.clear_validation_messages();
  throw Error(std::string("vulkan engine: validation layer reported during ") + where + ":" + all);
}

// What one session's arena may take: the device-local heap with the most room, its budget left where
// VK_EXT_memory_budget reports one (other sessions and processes use the rest), else its size.
void limit_to_device(plan::PlanOptions& po, const vk::Context& ctx) {
  const bool ext = ctx.has(vk::Feature::MemoryBudget);
  uint64_t best = 0;
  for (const vk::HeapBudget& h : ctx.heap_budgets())
    if (h.device_local) best = std::max(best, ext ? (h.budget > h.usage ? h.budget - h.usage : 0) : h.size);
  if (best)
    limit_to(po, best,
             ext ? "the device's memory budget left (VK_EXT_memory_budget)" : "the device's largest device-local heap");
}

vk::GraphExecutorOptions executor_options(const CompileOptions& co, const std::shared_ptr<vk::Context>& ctx) {
  vk::GraphExecutorOptions o;
  o.cache_dir = co.cache_dir;
  o.session_cache = co.session_cache_bytes > 0;
  o.session_cache_bytes = co.session_cache_bytes;
  o.compiler = shared_compiler(co.cache_dir);
  o.pipelines = shared_pipelines(ctx, co.cache_dir);
  o.codegen.kernels = co.kernels;
  o.codegen.default_precision = co.default_precision;
  o.tune = co.tune;
  o.plan = plan_options(co.planning);
  limit_to_device(o.plan, *ctx);
  o.plan.submissions = co.submissions;
  o.between_submissions = co.between_submissions;
  if (co.on_progress)
    o.on_compile_progress = [f = co.on_progress](size_t done, size_t total) { f({.done = done, .total = total}); };
  o.timestamps = co.profile;
  o.lazy_parameters = true;  // load_checkpoint right after compile skips the random initial weights
  o.faults = co.faults;
  return o;
}

class VulkanEngine final : public Engine {
 public:
  VulkanEngine(std::shared_ptr<const ir::Graph> g, const CompileOptions& co, double device_ms)
      : graph_(std::move(g)),
        ctx_(shared_context(co.device)),
        exec_(*graph_, *ctx_, executor_options(co, ctx_)),
        profile_(co.profile),
        device_ms_(device_ms) {
    check_validation(*ctx_, "compile");
    name_ = "vulkan (" + ctx_->info().name + ")";
  }
  ~VulkanEngine() override {
    if (profile_) print_profile();
  }
  VulkanEngine(const VulkanEngine&) = delete;
  VulkanEngine& operator=(const VulkanEngine&) = delete;
  const char* name() const override { return name_.c_str(); }
  const char* device_type() const override { return vk::device_type_name(ctx_->info().type); }
  void set_input(const std::string& name, std::span<const float> values) override { exec_.set_input(name, values); }
  void set_input(const std::string& name, const std::vector<int32_t>& values) override {
    exec_.set_input(name, values);
  }
  void run() override {
    exec_.run();
    check_validation(*ctx_, "run");
    if (profile_) {
      ++runs_;
      for (const vk::DispatchTiming& t : exec_.timings()) {
        auto& [ms, n] = kernel_ms_[t.label];
        ms += t.ms;
        ++n;
      }
    }
  }
  std::vector<float> read_output(const std::string& name) override { return exec_.read_output(name); }
  std::vector<float> read_state(const std::string& name) override { return exec_.read_state(name); }
  void write_state(const std::string& name, std::span<const float> values) override {
    exec_.write_state(name, values);
  }
  std::vector<std::string> state_names() const override { return exec_.state_names(); }
  std::vector<std::pair<std::string, std::string>> kernel_sources() const override { return exec_.kernel_sources(); }
  CompileReport compile_report() const override {
    const vk::CompileStats& c = exec_.compile_stats();
    CompileReport r;
    r.device_ms = device_ms_;
    r.setup_ms = c.setup_ms;
    r.hash_ms = c.hash_ms;
    r.cache_ms = c.cache_ms;
    r.fusion_ms = c.fusion_ms;
    r.emit_ms = c.lowering_ms;
    r.plan_ms = c.plan_ms;
    r.shaderc_ms = c.shaderc_ms;
    r.shaderc_cpu_ms = c.shaderc_cpu_ms;
    r.validate_cpu_ms = c.validate_cpu_ms;
    r.pipeline_ms = c.pipeline_ms;
    r.pipeline_cpu_ms = c.pipeline_cpu_ms;
    r.pipeline_thread_cpu_ms = c.pipeline_thread_cpu_ms;
    r.record_ms = c.record_ms;
    r.alloc_ms = c.alloc_ms;
    r.commands_ms = c.commands_ms;
    r.store_ms = c.store_ms;
    r.tune_ms = c.tune_ms;
    r.tune_measured = c.tune_measured;
    r.tune_cached = c.tune_cached;
    r.tune_timed = c.tune_timed;
    r.tune_file = c.tune_file;
    r.upload_ms = c.upload_ms;
    r.kernels = c.kernels;
    r.unique_kernels = c.unique_kernels;
    r.emitted = c.emitted;
    r.compiled = c.compiled;
    r.spirv_memory_hits = c.spirv_memory_hits;
    r.spirv_disk_hits = c.spirv_disk_hits;
    r.spirv_from_session = c.spirv_from_session;
    r.pipelines_created = c.pipelines_created;
    r.pipeline_threads = c.pipeline_threads;
    r.session_cache = vk::cache_result_name(c.session_cache);
    return r;
  }
  DeviceMemoryReport device_memory() const override {
    const vk::SessionMemory m = exec_.memory();
    DeviceMemoryReport r;
    r.device_bytes = m.device_bytes;
    r.staging_bytes = m.staging_bytes;
    r.allocated_bytes = m.device_bytes + m.staging_bytes;
    r.arena_bytes = m.arena_bytes;
    r.submissions = m.submissions;
    if (ctx_->has(vk::Feature::MemoryBudget)) {
      r.budget_ext = true;
      for (const vk::HeapBudget& h : ctx_->heap_budgets())
        if (h.device_local) {
          r.heap_usage_bytes += h.usage;
          r.heap_budget_bytes += h.budget;
        }
    }
    return r;
  }

  std::vector<KernelProfile> kernel_profile() const override {
    std::vector<KernelProfile> out;
    if (!profile_ || runs_ == 0) return out;
    std::set<std::string> seen;           // kernel labels taken
    std::map<std::string, size_t> group;  // node group -> its row
    for (const vk::GraphExecutor::KernelCost& c : exec_.kernel_costs()) {  // dispatch order
      const auto t = kernel_ms_.find(c.label);
      if (t == kernel_ms_.end() || !seen.insert(c.label).second) continue;
      auto [r, fresh] = group.emplace(c.nodes, out.size());
      if (fresh) {
        out.emplace_back();
        out.back().nodes = c.nodes;
        out.back().ops = c.ops;
        out.back().flops_per_run = c.group_flops;
      }
      KernelProfile& p = out[r->second];
      p.kernels += (p.kernels.empty() ? "" : "+") + c.label.substr(0, c.label.rfind(" %"));
      p.ms_per_run += t->second.first / double(runs_);
      p.kernels_per_run += t->second.second / runs_;
      p.bytes_per_run += c.bytes * double(t->second.second) / double(runs_);
    }
    std::sort(out.begin(), out.end(),
              [](const KernelProfile& a, const KernelProfile& b) { return a.ms_per_run > b.ms_per_run; });
    return out;
  }

 private:
  void print_profile() const {
    const vk::CompileStats& c = exec_.compile_stats();
    std::fprintf(
        stderr,
        "mgn profile: %s, %d nodes; compile: session cache %s %.1f ms, fusion %.1f ms, emission %.1f ms "
        "(%zu kernels), plan %.1f ms, shaderc %.1f ms (%zu compiled), pipelines %.1f ms more (%zu created, "
        "%.1f ms on %zu threads), record %.1f ms (memory %.1f ms, commands %.1f ms), tuning %.1f ms (%zu shapes "
        "measured, %zu from the file); initial values %.1f ms\n",
        name_.c_str(), graph_->size(), vk::cache_result_name(c.session_cache), c.cache_ms, c.fusion_ms,
        c.lowering_ms, c.emitted, c.plan_ms, c.shaderc_ms, c.compiled, c.pipeline_ms, c.pipelines_created,
        c.pipeline_cpu_ms, c.pipeline_threads, c.record_ms, c.alloc_ms, c.commands_ms, c.tune_ms, c.tune_measured,
        c.tune_cached, c.upload_ms);
    if (runs_ == 0) return;
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(kernel_ms_.begin(), kernel_ms_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    double total = 0;
    for (const auto& r : rows) total += r.second.first;
    std::fprintf(stderr, "mgn profile: %lld runs, GPU time per run %.3f ms (sum of dispatches)\n",
                 static_cast<long long>(runs_), total / double(runs_));
    for (const auto& [label, v] : rows)
      std::fprintf(stderr, "  %8.3f ms/run %5.1f%%  x%-4lld %s\n", v.first / double(runs_),
                   total > 0 ? 100.0 * v.first / total : 0.0, static_cast<long long>(v.second / runs_), label.c_str());
  }

  std::shared_ptr<const ir::Graph> graph_;
  std::shared_ptr<vk::Context> ctx_;  // shared with the registry and the other sessions; outlives exec_
  vk::GraphExecutor exec_;
  std::string name_;
  bool profile_ = false;
  double device_ms_ = 0;
  int64_t runs_ = 0;
  std::map<std::string, std::pair<double, int64_t>> kernel_ms_;  // label -> (total ms, dispatches)
};

}  // namespace

// Whether the graph differentiates an attention (a training graph's backward).
static bool has_attention_derivatives(const ir::Graph& g) {
  for (const ir::Node& n : g.nodes())
    if (n.op == ir::Op::AttentionGradQ || n.op == ir::Op::AttentionGradK || n.op == ir::Op::AttentionGradV)
      return true;
  return false;
}

// KernelOptions::attention: which attentions run as matrix products (passes/attention_matmul.h). Auto: long ones,
// and every one of a graph that differentiates attention (run 15 on an H100, F+L+B: DINOv3 b8 at 201 tokens
// 31.7 -> 15.2 ms, b1 8.17 -> 5.00, SmolLM2 at 128 tokens 19.2 -> 15.7, SmolVLA 8.39 -> 8.24, U-Net unchanged;
// inference at 201 tokens stays on the kernels: 2.01 against 2.07 ms).
static passes::AttentionMatmulPolicy attention_policy(AttentionKernel want, bool training) {
  switch (want) {
    case AttentionKernel::Row:
    case AttentionKernel::Tiled: return nullptr;
    case AttentionKernel::Matmul: return [](const passes::AttentionDims&, bool) { return true; };
    case AttentionKernel::Auto:
      return [training](const passes::AttentionDims& d, bool) {
        return (training || (d.Sq >= kAttentionMatmulMinSeq && d.Skv >= kAttentionMatmulMinSeq)) &&
               d.score_bytes() <= kAttentionMatmulMaxScoreBytes;
      };
  }
  return nullptr;
}

std::unique_ptr<Engine> make_vulkan_engine(std::shared_ptr<const ir::Graph> graph, const CompileOptions& options) {
  if (const passes::AttentionMatmulPolicy accept =
          attention_policy(options.kernels.attention, has_attention_derivatives(*graph))) {
    if (std::optional<ir::Graph> g = passes::attention_as_matmul(*graph, accept))
      graph = std::make_shared<const ir::Graph>(std::move(*g));
  }
  // The process's first engine: glslang's built-in tables, which its first kernel compile would build, are built on
  // another thread while the device opens (a cold compile's first shaderc wave waited ~100 ms for them; a device
  // opens in 130-500 ms).
  static std::atomic<bool> warmed{false};
  std::future<void> glslang_ready;
  if (!warmed.exchange(true)) glslang_ready = std::async(std::launch::async, codegen::ShaderCompiler::warm_up);
  const auto t0 = std::chrono::steady_clock::now();
  shared_context(options.device);  // opened here the first time, so that its cost is reported apart
  const double device_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (glslang_ready.valid()) glslang_ready.wait();
  return std::make_unique<VulkanEngine>(std::move(graph), options, device_ms);
}

}  // namespace mgn::detail
#endif
