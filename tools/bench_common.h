// Pieces shared by the benchmark commands (`mgn bench` and its workloads, `mgn llama-check`, `mgn bench-gemm`):
// the arguments of a workload, the timing protocol of docs/benchmarks.md, JSON lines, memory figures of a
// session and graph helpers.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/llama.h"
#include "mgn/session.h"

namespace mgn::bench {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double ms_since(Clock::time_point t0);

// Linear interpolation between order statistics (numpy.percentile's default), so both sides agree.
double percentile(const std::vector<double>& sorted, double q);
// The warm-up before the timed calls: at least `calls` untimed calls and at least `min_ms` of wall time in
// them. The time floor is there because a GPU's clock falls while the host compiles (an H200 drops from
// 1980 to 345 MHz within about 1.5 s of idling) and a few short calls do not bring it back: 25 calls of a
// 2048^3 GEMM ran at a quarter of its speed (docs/perf-notes.md, H200 run 6). Both sides use the same rule
// (bench/pytorch/timing.py).
struct Warmup {
  int64_t calls = 5;
  double min_ms = 500;
};
// What time_calls measured: the raw times in ms in the order taken, and the warm-up actually done.
struct Samples {
  std::vector<double> ms;
  int64_t warmup_calls = 0;
  double warmup_ms = 0;
};
// Session::run and Session::step return after the device finished (the submission's fence is waited on),
// so the wall time of one call is one synchronized sample, submission overhead included.
// `label` non-empty: a progress line over the samples on stderr (tools/progress.h), drawn between timed calls.
Samples time_calls(const Warmup& warmup, int64_t samples, const std::function<void()>& fn,
                   const std::string& label = "");
// warmup (calls made), warmup_ms (their wall time), samples, median_ms, p25_ms, p75_ms, iqr_ms, min_ms,
// max_ms, samples_ms (the JSON schema of docs/benchmarks.md, the same as bench/pytorch/timing.py's
// summary()).
Json summary(const Samples& s);

std::vector<std::string> split_commas(const std::string& s);

// `mgn bench` arguments (declared in tools/bench.cpp); what a workload does not use it ignores, what it
// cannot take it refuses (a usage error, before anything is compiled).
struct Args {
  std::string workload;
  std::vector<std::string> phases;  // empty: the workload's default set
  Warmup warmup;
  int64_t samples = 20;
  int64_t batch = 0, seq = 0;  // 0: the workload's default
  std::string json, weights, outputs, data, config, cases;
  std::string fashion_mnist_dir;  // the environment's (MGN_FASHION_MNIST_DIR), used without --data
  // What every session compiles with (the environment's options, then --backend, --device, --mode); the
  // precision mode is its default_precision.
  CompileOptions base;
  uint64_t seed = 0;
  double lr = 1e-3;
  bool cold_cache = false;  // compile with an empty shader/pipeline cache (a temporary cache folder)
  bool tiny = false;        // microbenchmarks: the tiny shapes (CI), not the paper's
  int64_t session_cache_mb = -1;  // compiled-session cache bound; 0: off; -1: the library's default
  bool verbose = false;     // model workloads: a per-session table of the compile phases on stderr

  Precision mode() const { return base.default_precision; }
  bool has(const std::string& phase) const;
  // Refuses a phase outside `allowed`; fills the default when none was given.
  void check_phases(const std::vector<std::string>& allowed, const std::vector<std::string>& defaults);
};

// JSON lines to stdout and, when a path is given, to that file as well.
class JsonLines {
 public:
  explicit JsonLines(const std::string& path);
  ~JsonLines();
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  void emit(const Json& line);

 private:
  std::FILE* file_ = nullptr;
};

// --cache cold: a temporary cache folder for the lifetime of this object, removed afterwards.
class ColdCache {
 public:
  explicit ColdCache(bool on);
  ~ColdCache();
  ColdCache(const ColdCache&) = delete;
  ColdCache& operator=(const ColdCache&) = delete;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// The options every session of a benchmark compiles with: Args::base (environment, backend, device,
// precision mode), the mode, and the cold cache folder when there is one.
CompileOptions compile_options(const Args& a, Mode mode, const ColdCache& cold);

// Appends the backward pass of the output `loss` and outputs "grad.<name>" for every parameter named, so
// one Infer session computes forward + loss + backward (the F+L+B phase). `who` prefixes errors.
void add_gradient_outputs(Graph& g, const std::vector<std::string>& params, const std::string& who,
                          const std::string& loss = "loss");
// A Llama-family F+L+B graph: llama::loss_graph with every parameter's gradient as an output.
Graph llama_flb_graph(const llama::Config& cfg, int64_t batch, int64_t seq, uint64_t seed = 0);

// Memory of one session: the static plan of its graph (mgn::summarize_plan, as `mgn plan` plans it: 4-byte
// elements, 256-byte alignment), the arena of the plan the engine made of it (session_arena_bytes: after the
// backend's rewrites, e.g. attention as matrix products with its score matrices, and its fusions and scratch)
// and what the engine measured (Session::device_memory). Fields: plan_logical_bytes, plan_physical_bytes,
// plan_peak_live_bytes, session_arena_bytes, allocated_bytes, heap_usage_bytes,
// heap_budget_bytes, budget_ext; and the session's dispatches: dispatches, matmul_dispatches (kernels named
// matmul_*, without the f16 packing passes), f16_gemm_dispatches (the f16 cooperative-matrix GEMM kernels,
// not their packing passes).
Json memory_fields(const Session& s, const Graph& compiled);

// Deterministic values in [lo, hi) from splitmix64 (the same on every platform, no std distribution).
std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi);
uint64_t name_seed(const std::string& name, uint64_t seed);  // FNV-1a of the name, mixed with the seed

// The workload families (bench_model.cpp, bench_micro.cpp); each returns the process exit status.
bool is_model_workload(
    const std::string& workload);  // fashion-cnn, fashion-mlp, smollm2-135m, llama-tiny, llama
int run_model_bench(Args& a);
bool is_micro_workload(const std::string& workload);  // attention, conv
int run_micro_bench(Args& a);

}  // namespace mgn::bench
