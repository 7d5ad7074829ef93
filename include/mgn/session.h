// A compiled graph bound to a backend: feed inputs, step (train) or run (infer), read outputs and state.
//
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Train, .optimizer = mgn::AdamW{.lr = 1e-3}});
//   session.set_input("x", images);          // host span, shape-checked
//   session.set_input("labels", labels);
//   session.step();                          // forward + backward + update, one run of the engine
//   float l = session.read_scalar("loss");
//   session.save_checkpoint("cnn.safetensors");
//
//   auto infer = mgn::compile(g_infer, {.mode = mgn::Mode::Infer});
//   infer.load_checkpoint("cnn.safetensors");  // parameters by name; optimizer state is ignored
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mgn/graph.h"
#include "mgn/optim.h"
#include "mgn/options.h"

namespace mgn {

enum class Mode : uint8_t { Train, Infer };
// Auto: a GPU engine when one is available, else the CPU reference executor.
enum class Backend : uint8_t { Auto, Cpu, Vulkan };
const char* backend_name(Backend b);
Backend backend_from_name(const std::string& s);  // "auto", "cpu", "vulkan"

// Everything compile() needs besides the graph. The compiled program is a function of the graph, these
// options and the device (its features and limits, and the verdict of the f16 GEMM self-test on it);
// nothing is read from the process environment (mgn/environment.h maps MGN_* variables onto these fields
// for programs that want that).
// What CompileOptions::on_progress reports: `done` of `total` kernels compiled from GLSL to SPIR-V (including
// the ones the per-kernel SPIR-V cache answered).
struct CompileProgress {
  size_t done = 0, total = 0;
};

struct CompileOptions {
  Mode mode = Mode::Infer;
  Optimizer optimizer = AdamW{};
  UpdateOptions update;  // gradient clipping, per-parameter lr multipliers
  Schedule schedule;     // on top of the optimizer's lr
  Backend backend = Backend::Auto;
  std::string loss = "loss";  // Train: the output differentiated
  // Train: gradients already in the graph (parameter name -> gradient); empty = run mgn::backward on `loss`.
  std::map<std::string, Tensor> gradients;
  // The precision of nodes whose own is unset (Tensor::set_precision and Graph::set_precision set it);
  // Accelerated lets eligible matmuls round their inputs to f16 (f32 accumulation) where the device can.
  Precision default_precision = Precision::Strict;
  KernelOptions kernels;      // which kernels the code generator emits (options.h)
  PlanningOptions planning;   // how the static plan shares memory
  DeviceOptions device;       // Vulkan: which device; validation and pipeline diagnostics
  // Vulkan: where compiled SPIR-V (by content hash) and the pipeline cache are kept across processes;
  // empty: in memory only. (mgn::read_environment() gives the conventional place, ~/.cache/meganeura.)
  std::string cache_dir;
  // Vulkan: bound on the compiled-session cache in cache_dir (least recently used entries are removed);
  // 0 turns it off (every compile emits and compiles again, from the per-kernel SPIR-V cache).
  uint64_t session_cache_bytes = 512ull << 20;
  // Vulkan: measured GEMM kernel choice (TuneMode, options.h; docs/tuning.md). Off (the default) keeps compiling
  // as fast as before; Measure times the candidate kernels of every f32 GEMM shape the tuning file in cache_dir
  // lacks (seconds on a big model, once per device and driver) and CompileReport says how long it took.
  TuneMode tune = TuneMode::Off;
  // Per-kernel GPU time (timestamp queries, summed over the session's runs, heaviest first) and compile time
  // per phase, printed on stderr when the session ends.
  bool profile = false;
  // Vulkan: split every step into this many queue submissions (at barrier groups of the static plan, as
  // even in dispatches as the groups allow; fewer when the step has fewer groups), for callers that share
  // the queue with other work such as a renderer. Results are the same for any value.
  int submissions = 1;
  // Vulkan: called on the host after submission i of a step is queued and before submission i + 1 is
  // (never after the last), e.g. to queue a frame's rendering between the pieces of a training step.
  std::function<void(int submission)> between_submissions;
  // Vulkan: called while the session's kernels are turned into SPIR-V (the slow part of a cold compile):
  // once with done = 0 when there is any to compile, then after each one, done = total last. Calls come one at
  // a time, from the compile's worker threads. Nothing is called when every kernel came from a cache entry.
  std::function<void(const CompileProgress&)> on_progress;
  // Testing only (options.h): a Vulkan driver failure injected at a chosen call of this session.
  FaultInjection faults;
};

// GPU time of one dispatch of the compiled step (one node's lowering, or one fusion of several nodes: its kernels
// together, e.g. a split-K GEMM and the sum of its splits), over the runs since compile (CompileOptions::profile).
struct KernelProfile {
  std::string kernels;       // the kernels' names in dispatch order, joined by '+'
  std::string nodes;         // "%<id>,<id>,..." (Session::kernel_sources names them the same way)
  std::string ops;           // the nodes' ops, e.g. "matmul", "mul add"
  double ms_per_run = 0;     // GPU time (timestamps around each kernel, summed) per run
  int64_t kernels_per_run = 0;
  // Work per run, estimated: bytes = every buffer its kernels bind, counted once per kernel (an upper bound on
  // what they must move when every element is touched); flops = 2 per multiply-add of the matmuls,
  // convolutions (forward and both derivatives) and attentions (forward: QK^T and PV) among its nodes, 0 for
  // other ops.
  double bytes_per_run = 0, flops_per_run = 0;
  double gbps() const { return ms_per_run > 0 ? bytes_per_run / (ms_per_run * 1e6) : 0; }
  double tflops() const { return ms_per_run > 0 ? flops_per_run / (ms_per_run * 1e9) : 0; }
};

// Memory one session holds, measured (not planned) where the device can say.
struct DeviceMemoryReport {
  uint64_t allocated_bytes = 0;  // VkDeviceMemory the session's allocator reserved (device + staging)
  uint64_t device_bytes = 0;     // of which device memory (tensors, the plan's arena, scratch)
  uint64_t staging_bytes = 0;    // of which host-visible staging (uploads, readbacks)
  uint64_t arena_bytes = 0;      // the static plan's arena (planned physical bytes)
  // VK_EXT_memory_budget, device-local heaps, read when asked: process-wide usage (every session and the
  // driver's own allocations) and the budget the driver grants. Zero when budget_ext is false.
  uint64_t heap_usage_bytes = 0;
  uint64_t heap_budget_bytes = 0;
  bool budget_ext = false;
  int submissions = 1;  // queue submissions per step
};

// Where compile() spent its time, phase by phase (docs/perf-notes.md "compile time per phase"). Building the
// graph happens before compile() and is the caller's to time; the initial values (upload_ms) are reported
// apart and not counted as compiling. Parallel phases give wall time; *_cpu_ms sum over threads.
struct CompileReport {
  double total_ms = 0;         // compile() wall time
  double autodiff_ms = 0;      // Train: the backward pass (mgn::backward)
  double optimizer_ms = 0;     // Train: the optimizer update appended to the graph
  double verify_ms = 0;        // checking and copying the graph
  double device_ms = 0;        // opening the device (the first session of a process with these DeviceOptions)
  double setup_ms = 0;         // the session's allocator, command pools and transfer objects
  double hash_ms = 0;          // canonical hash of graph, options and device (the session cache's key)
  double cache_ms = 0;         // compiled-session cache lookup: read, verify, parse
  double fusion_ms = 0;        // rewrites: the fusion choice
  double emit_ms = 0;          // GLSL emission
  double plan_ms = 0;          // scheduling + memory plan
  double shaderc_ms = 0;       // GLSL -> validated SPIR-V (SPIR-V cache lookups included)
  double shaderc_cpu_ms = 0;   // of which glslang + spirv-opt, summed over threads
  double validate_cpu_ms = 0;  // of which spirv-val, summed over threads
  double pipeline_ms = 0;      // pipeline creation wall time after shaderc's last compile (the two overlap)
  double pipeline_cpu_ms = 0;  // vkCreateComputePipelines (+ its shader module) calls, summed over threads
  double pipeline_thread_cpu_ms = 0;  // the CPU time those calls used (far below: they waited)
  double record_ms = 0;        // allocation, step building, command recording
  double alloc_ms = 0;         // of record_ms: device memory (the plan's arena, zero-fill sources)
  double commands_ms = 0;      // of record_ms: the command stream (descriptor sets, vkCmd* recording)
  double store_ms = 0;         // writing the compiled-session cache entry (a miss)
  double tune_ms = 0;          // measured kernel choice (CompileOptions::tune): reading, timing, writing the file
  double upload_ms = 0;        // initial parameter / constant values (not compile time)
  size_t kernels = 0;          // dispatches of the step
  size_t unique_kernels = 0;   // distinct GLSL among them
  size_t emitted = 0;          // kernels whose GLSL was generated (0 when the session cache had it all)
  size_t compiled = 0;         // shaderc compilations
  size_t spirv_memory_hits = 0;   // SPIR-V another session of this process had compiled
  size_t spirv_disk_hits = 0;     // SPIR-V from the per-kernel disk cache
  size_t spirv_from_session = 0;  // SPIR-V from the compiled-session cache entry
  size_t pipelines_created = 0;
  size_t tune_measured = 0;    // GEMM shapes whose candidates were timed by this compile
  size_t tune_cached = 0;      // GEMM shapes whose choice came from the tuning file
  size_t tune_timed = 0;       // candidate kernels timed (over the measured shapes)
  std::string tune_file = "off";  // off, miss (no file), hit, damaged (ignored; rewritten by Measure)
  size_t pipeline_threads = 0;        // distinct threads that created this session's pipelines
  std::string session_cache = "off";  // off (no cache_dir, or CPU), miss, hit, corrupt (rebuilt)
};

// Compiled-session and kernel caches in a cache directory (CompileOptions::cache_dir): `mgn cache`.
struct CacheUsage {
  uint64_t session_entries = 0, session_bytes = 0;  // compiled sessions (sessions/)
  uint64_t spirv_files = 0, spirv_bytes = 0;        // SPIR-V per kernel (spirv/)
  uint64_t pipeline_files = 0, pipeline_bytes = 0;  // VkPipelineCache files, one per driver build
};
CacheUsage cache_usage(const std::string& cache_dir);
// Removes every cache file of the directory (what cache_usage counts); returns what was there.
CacheUsage clear_cache(const std::string& cache_dir);

struct LoadOptions {
  // A training session may start from parameters alone (fine-tuning): missing "optim.*" state then
  // keeps its initial value and the step count restarts at 0.
  bool require_optimizer_state = true;
};

class Session {
 public:
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  ~Session();

  Mode mode() const;
  const char* backend() const;  // "cpu", "vulkan (<device name>)"
  // "host" for the CPU reference executor; for Vulkan the device type: "discrete GPU", "integrated GPU",
  // "virtual GPU", "CPU" (a software implementation such as lavapipe) or "other".
  const char* device_type() const;

  // Host values for a graph input; the count and dtype must match (throws naming the input otherwise).
  void set_input(const std::string& name, std::span<const float> values);
  void set_input(const std::string& name, std::span<const int32_t> values);
  void set_input(const std::string& name, const std::vector<float>& values) {
    set_input(name, std::span<const float>(values));
  }
  void set_input(const std::string& name, const std::vector<int32_t>& values) {
    set_input(name, std::span<const int32_t>(values));
  }

  void step();  // Train: forward + backward + update; the lr comes from the schedule
  void run();   // evaluate the outputs without training (Infer; in Train mode it throws)

  // An output (after run/step), or a parameter / state tensor by name.
  std::vector<float> read(const std::string& name);
  float read_scalar(const std::string& name);
  void write_parameter(const std::string& name, std::span<const float> values);
  Shape shape_of(const std::string& name) const;  // of an output, input, parameter or state
  std::vector<std::string> input_names() const;
  std::vector<std::string> output_names() const;
  std::vector<std::string> state_names() const;  // parameters, then state, in graph order
  // (kernel name, GLSL) of every dispatch of the compiled step, in order ("<kernel> %<node id>", or
  // "fused<N>_[shape] %<id>,<id>,..." for a fused dispatch); empty
  // on the CPU reference executor. `mgn kernels` prints them.
  std::vector<std::pair<std::string, std::string>> kernel_sources() const;
  // What the session's engine holds now (the CPU engine reports its plan's arena only).
  DeviceMemoryReport device_memory() const;
  // Per dispatch, heaviest first: the GPU time of the runs since compile with CompileOptions::profile on (Vulkan,
  // where the device has timestamp queries); empty otherwise.
  std::vector<KernelProfile> kernel_profile() const;
  // Where compiling this session spent its time, and what came from the caches.
  const CompileReport& compile_report() const;

  // Learning rate: set_lr replaces the base lr the schedule scales; lr() is the one the next step uses.
  void set_lr(double base);
  double lr() const;
  int64_t step_count() const;

  void save_checkpoint(const std::string& path);
  void load_checkpoint(const std::string& path, const LoadOptions& opt = {});

  const UpdatePlan* update_plan() const;  // Train only

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  friend Session compile(Graph& g, const CompileOptions& opt);
  std::unique_ptr<Impl> impl_;
};

// Compiles `g` for a backend. In Train mode the backward pass (unless opt.gradients is given) and the
// optimizer update are appended to `g` itself, so compile a training graph once.
Session compile(Graph& g, const CompileOptions& opt = {});

}  // namespace mgn
