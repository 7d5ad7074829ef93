// Runs an ir::Graph on a Vulkan device from its static plan (src/plan): lowers every dispatch to kernels,
// compiles and deduplicates them, backs the plan's arena (in segments of at most one binding's range) with
// every tensor at its planned offset, records one command stream at build time (barriers only between the
// plan's groups) and resubmits it on every run(). The program is a function of the graph, the options and
// the device's caps (with the self-test verdict), nothing else.
// Semantics follow the CPU executor: inputs, parameters/state from their initializers, constants, full,
// and assigns committed at the end of the step (reads in the step see the old values).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/vulkan/command.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "backend/vulkan/session_cache.h"
#include "codegen/kernel.h"
#include "codegen/shader_compiler.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace mgn::vk {

struct GraphExecutorOptions {
  std::string cache_dir;   // SPIR-V, compiled-session and pipeline caches on disk; empty: memory only
  // The compiled-session cache (session_cache.h) in cache_dir/sessions, bounded to this many bytes.
  bool session_cache = true;
  uint64_t session_cache_bytes = 512ull << 20;
  // GLSL -> SPIR-V compiler; sessions that share one compile identical kernels once. Null: a compiler of
  // this executor's own over cache_dir.
  std::shared_ptr<codegen::ShaderCompiler> compiler;
  // Pipelines; sessions that share one create a pipeline they have in common once (the cache must belong to
  // the same Context). Null: a cache of this executor's own over cache_dir.
  std::shared_ptr<PipelineCache> pipelines;
  unsigned compile_threads = 0;  // emission and shaderc workers; 0: the hardware's concurrency
  bool timestamps = false;  // per-kernel GPU timings (where supported)
  // Fill every computed tensor with NaN before each run (tests: an unwritten element shows up).
  bool poison = false;
  AllocatorOptions allocator;
  // Parameters receive their initializer's values only when first needed (run, read_state), and not at
  // all if write_state gave them values first: a session that loads a checkpoint right after compiling
  // never computes (and uploads) random initial weights. Results are the same either way.
  bool lazy_parameters = false;
  // Kernel choices and the precision of nodes that leave it unset. With codegen.kernels.fusion, connected
  // pointwise nodes of one shape run as one kernel (values in registers, written only where read outside
  // the fusion), attention_grad_k + attention_grad_v of one attention as one kernel, and attention +
  // attention_lse as one (codegen::find_fusions).
  codegen::CodegenOptions codegen;
  // Measured kernel choice (gemm_tune.h, docs/tuning.md): fills codegen.gemm_tuned before lowering.
  TuneMode tune = TuneMode::Off;
  plan::PlanOptions plan;  // tuning (in_place, reuse, submissions...); sizes, alignment and limits from the device
  // Called after submission i of a step is queued, before submission i + 1 (plan.submissions > 1).
  std::function<void(int)> between_submissions;
  // Called with (done, total) while kernels are compiled to SPIR-V: (0, total) first, then after each one;
  // serialized, from the worker threads. Not called when nothing needs compiling.
  std::function<void(size_t, size_t)> on_compile_progress;
  // Testing only: driver failures injected at the executor's own submissions, step waits and allocations.
  FaultInjection faults;
};

// What one executor holds (VkDeviceMemory its allocator reserved) and how it submits.
struct SessionMemory {
  uint64_t device_bytes = 0;   // device-kind blocks (tensors, arena, scratch)
  uint64_t staging_bytes = 0;  // upload + readback staging blocks
  uint64_t arena_bytes = 0;    // the plan's arena
  int submissions = 1;         // vkQueueSubmit calls per step
};

struct CompileStats {
  double setup_ms = 0;     // the executor's allocator, transfer and command objects (before lowering)
  double hash_ms = 0;      // the canonical hash of graph, options and device (the session cache's key)
  double cache_ms = 0;     // compiled-session cache lookup (read, verify, parse)
  double fusion_ms = 0;    // rewrites: choosing the fusions (codegen::find_fusions)
  double lowering_ms = 0;  // codegen: GLSL emission (wall time, parallel)
  double shaderc_ms = 0;   // GLSL -> validated SPIR-V (wall time, parallel; SPIR-V cache lookups included)
  double shaderc_cpu_ms = 0;   // of which glslang + spirv-opt, summed over threads
  double validate_cpu_ms = 0;  // of which spirv-val, summed over threads
  double store_ms = 0;         // writing the compiled-session cache entry (a miss only)
  double tune_ms = 0;          // measured kernel choice: the tuning file, timing the candidates
  size_t tune_measured = 0;    // GEMM shapes timed by this compile
  size_t tune_cached = 0;      // GEMM shapes whose choice came from the tuning file
  size_t tune_timed = 0;       // candidate kernels timed
  const char* tune_file = "off";  // tune_file_name (gemm_tune.h)
  // Pipeline creation overlaps shaderc (a kernel's pipeline is created as soon as its SPIR-V is ready, on the
  // same workers): pipeline_ms is the wall time the phase lasts after shaderc's last compile ended.
  double pipeline_ms = 0;
  double pipeline_cpu_ms = 0;  // vkCreateShaderModule + vkCreateComputePipelines calls, summed over threads
  // The CPU time the calling threads spent in those calls (CLOCK_THREAD_CPUTIME_ID): far below
  // pipeline_cpu_ms means the calls waited (a lock in the driver, or a loaded machine).
  double pipeline_thread_cpu_ms = 0;
  double record_ms = 0;    // allocation, step building, command recording (plan and uploads apart)
  double alloc_ms = 0;     // of record_ms: device memory (arena segments, zero-fill sources and their fills)
  double commands_ms = 0;  // of record_ms: the command stream (dispatch list, descriptor sets, vkCmd*)
  double plan_ms = 0;      // of record_ms: the static plan
  double upload_ms = 0;    // of record_ms: initial parameter/constant values (host init + upload)
  size_t kernels = 0;      // dispatches in the stream
  size_t emitted = 0;           // kernels whose GLSL the generators emitted (0 on a full cache hit)
  size_t compiled = 0;          // shaderc compilations (glslang ran)
  size_t spirv_memory_hits = 0;  // SPIR-V the shared compiler already had (another session of the process)
  size_t spirv_disk_hits = 0;    // SPIR-V from the per-kernel disk cache
  size_t spirv_from_session = 0;  // SPIR-V from the compiled-session entry
  size_t pipelines_created = 0;   // vkCreateComputePipelines calls
  size_t pipeline_threads = 0;    // distinct threads that made those calls
  CacheResult session_cache = CacheResult::Off;
  size_t unique_kernels = 0;
  size_t barriers = 0;
  size_t groups = 0;         // barrier groups of the plan
  uint64_t arena_bytes = 0;  // device memory of the plan's arena
};

class GraphExecutor {
 public:
  GraphExecutor(const ir::Graph& g, Context& ctx, GraphExecutorOptions options = {});
  ~GraphExecutor();
  GraphExecutor(const GraphExecutor&) = delete;
  GraphExecutor& operator=(const GraphExecutor&) = delete;

  // Count must match the input's shape; values are converted to the input's dtype.
  void set_input(const std::string& name, std::span<const float> values);
  void set_input(const std::string& name, const std::vector<int32_t>& values);
  // One step: submits the recorded stream and waits. On a lost device (Context::lost) this and every call
  // that reads or writes tensors throws DeviceLost at once.
  void run();
  // i32/bool outputs are converted to float.
  std::vector<float> read_output(const std::string& name);
  std::vector<float> read_state(const std::string& name);
  void write_state(const std::string& name, std::span<const float> values);
  std::vector<std::string> state_names() const;

  // (kernel name, GLSL) of every dispatched kernel, in dispatch order.
  std::vector<std::pair<std::string, std::string>> kernel_sources() const;
  const CompileStats& compile_stats() const { return stats_; }
  // The static plan the stream was recorded from.
  const plan::Plan& plan() const { return *plan_; }
  // Per-dispatch GPU times of the last run; throws mgn::Error if timestamps are off or unsupported.
  std::vector<DispatchTiming> timings() const;
  // What each kernel works on, in dispatch order: its label (as in timings()), its node group ("%<id>,..." and
  // the ops), the bytes of the buffers it binds, and the group's multiply-add FLOPs (mgn::KernelProfile).
  struct KernelCost {
    std::string label, nodes, ops;
    double bytes = 0, group_flops = 0;
  };
  const std::vector<KernelCost>& kernel_costs() const { return costs_; }
  SessionMemory memory() const;

 private:
  struct Storage {
    Buffer buffer;
    uint64_t words = 0;
    int owner = -1;  // node whose storage this is
    bool view = false;  // a view into the plan's arena (not freed on its own)
  };
  struct Step {  // one dispatch or copy of the recorded stream
    const Pipeline* pipeline = nullptr;
    size_t kernel = 0;                         // index into kernels_
    std::vector<int> storages;                 // binding i -> storage id
    std::vector<bool> writes;                  // binding i is written
    int copy_src = -1, copy_dst = -1;          // copy step when pipeline is null
    bool barrier_before = false;               // a barrier precedes this step
    int group = -1;                            // the plan's barrier group
  };
  void build();
  codegen::DeviceCaps device_caps();  // the context's caps, with the f16 GEMM verdict where the graph needs it
  int new_storage(uint64_t words, int owner, const std::string& what);
  void lower(const codegen::DeviceCaps& caps);  // fusions, plan, arena, steps in plan order
  int arena_view(uint64_t offset, uint64_t bytes, int owner);
  void compile_kernels();
  void record();
  void upload_words(int storage, const std::vector<uint32_t>& words);
  void upload_sources();                                        // parameters, constants, fills
  void check_grid(int node, const codegen::Kernel& kern) const;  // workgroup counts within the device
  void init_parameter(int id);  // uploads its initial values now, or records it (lazy_parameters)
  void flush_pending_init();
  std::vector<uint32_t> download_words(int storage);
  void set_input_words(const std::string& name, size_t count, const std::vector<uint32_t>& words);
  const ir::Node& named_state(const std::string& name) const;
  std::vector<float> to_float(const std::vector<uint32_t>& w, DType t) const;
  std::vector<uint32_t> from_float(std::span<const float> v, DType t, const std::string& who) const;
  // A tensor's first `count` values as floats / from floats: f32 tensors go straight between the caller's
  // memory and the staging buffer, the integer types through from_float / to_float.
  std::vector<float> download_floats(int storage, DType t, size_t count);
  void upload_floats(int storage, std::span<const float> v, DType t, const std::string& who);

  ir::Graph g_;
  Context& ctx_;
  GraphExecutorOptions opt_;
  FaultPoints faults_;  // before everything that counts through it
  std::unique_ptr<Allocator> alloc_;
  std::unique_ptr<Transfer> transfer_;
  std::shared_ptr<codegen::ShaderCompiler> compiler_;
  std::shared_ptr<PipelineCache> pipelines_;
  std::unique_ptr<CommandStream> stream_;
  std::set<int> pending_init_;  // parameters whose initial values are not uploaded yet (lazy_parameters)

  std::vector<bool> need_;
  std::vector<int> storage_of_;           // node -> storage id (-1: none)
  std::vector<Storage> storages_;
  std::map<int, int> output_copy_;        // output node -> storage holding its pre-commit value
  std::vector<int> poison_;               // storages poisoned before each run
  std::vector<codegen::Kernel> kernels_;  // in dispatch order
  std::vector<KernelCost> costs_;          // parallel to kernels_
  // Compiled-session cache: the entry a hit loaded (until the kernels are compiled), the SPIR-V it gives
  // each kernel (null: compile), and what a miss stores (each dispatch's lowering, in kernel order).
  SessionKey session_key_;
  std::optional<CompiledSession> cached_;
  std::vector<const std::vector<uint32_t>*> kernel_spirv_;
  std::vector<CachedDispatch> to_store_;
  std::vector<std::vector<int>> fusions_;
  bool store_entry_ = false;
  std::vector<Step> steps_;
  CompileStats stats_;
  std::optional<plan::Plan> plan_;
  std::vector<Buffer> arena_;              // the plan's arena segments
  std::vector<int> plan_view_;             // plan storage -> whole-storage view (for end-of-step copies)
};

}  // namespace mgn::vk
