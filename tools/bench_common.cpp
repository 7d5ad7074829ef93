// Shared pieces of the benchmark commands: phase checks, the timing protocol, JSON lines, memory figures.
#include "bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "cli.h"
#include "mgn/autodiff.h"
#include "mgn/plan.h"
#include "progress.h"

namespace mgn::bench {

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double percentile(const std::vector<double>& sorted, double q) {
  double pos = q * double(sorted.size() - 1);
  size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

Samples time_calls(const Warmup& warmup, int64_t samples, const std::function<void()>& fn,
                   const std::string& label) {
  Samples r;
  const auto w0 = Clock::now();
  while (r.warmup_calls < warmup.calls || (warmup.min_ms > 0 && ms_since(w0) < warmup.min_ms)) {
    fn();
    ++r.warmup_calls;
  }
  r.warmup_ms = ms_since(w0);
  tool::Progress bar(label, samples, "samples", !label.empty() && samples > 0);
  for (int64_t i = 0; i < samples; ++i) {
    auto t0 = Clock::now();
    fn();
    r.ms.push_back(ms_since(t0));
    bar.update(i + 1);
  }
  bar.finish();
  return r;
}

Json summary(const Samples& t) {
  std::vector<double> s = t.ms;
  std::sort(s.begin(), s.end());
  double p25 = percentile(s, 0.25), p75 = percentile(s, 0.75);
  return Json{{"warmup", t.warmup_calls},
              {"warmup_ms", t.warmup_ms},
              {"samples", t.ms.size()},
              {"median_ms", percentile(s, 0.5)},
              {"p25_ms", p25},
              {"p75_ms", p75},
              {"iqr_ms", p75 - p25},
              {"min_ms", s.front()},
              {"max_ms", s.back()},
              {"samples_ms", t.ms}};
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> r;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) r.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return r;
}

bool Args::has(const std::string& phase) const {
  return std::find(phases.begin(), phases.end(), phase) != phases.end();
}

void Args::check_phases(const std::vector<std::string>& allowed, const std::vector<std::string>& defaults) {
  if (phases.empty()) phases = defaults;
  for (const std::string& p : phases)
    if (std::find(allowed.begin(), allowed.end(), p) == allowed.end()) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      throw tool::UsageError("unknown phase '" + p + "' for " + workload + " (expected " + list + ")");
    }
}

JsonLines::JsonLines(const std::string& path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) throw Error("cannot write '" + path + "'");
}

JsonLines::~JsonLines() {
  if (file_) std::fclose(file_);
}

void JsonLines::emit(const Json& line) {
  const std::string s = line.dump() + "\n";
  std::fputs(s.c_str(), stdout);
  std::fflush(stdout);
  if (file_) {
    std::fputs(s.c_str(), file_);
    std::fflush(file_);
  }
}

ColdCache::ColdCache(bool on) {
  if (!on) return;
  std::string tmpl = (std::filesystem::temp_directory_path() / "mgn-bench-cache-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw Error("cannot create a temporary cache folder from " + tmpl);
  dir_ = tmpl;
}

ColdCache::~ColdCache() {
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

CompileOptions compile_options(const Args& a, Mode mode, const ColdCache& cold) {
  CompileOptions o = a.base;
  o.mode = mode;
  if (!cold.dir().empty()) o.cache_dir = cold.dir().string();
  if (a.session_cache_mb >= 0) o.session_cache_bytes = uint64_t(a.session_cache_mb) << 20;
  return o;
}

void add_gradient_outputs(Graph& g, const std::vector<std::string>& params, const std::string& who,
                          const std::string& loss) {
  std::optional<Tensor> loss_tensor = g.find_output(loss);
  if (!loss_tensor) throw Error(who + ": the graph has no output '" + loss + "'");
  Gradients grads = backward(g, *loss_tensor);
  for (const std::string& name : params) {
    auto it = grads.params.find(name);
    if (it == grads.params.end()) throw Error(who + ": parameter '" + name + "' gets no gradient");
    g.output("grad." + name, it->second);
  }
}

Graph llama_flb_graph(const llama::Config& cfg, int64_t batch, int64_t seq, uint64_t seed) {
  Graph g = llama::loss_graph(cfg, {.batch = batch, .seq = seq, .seed = seed});
  std::vector<std::string> names;
  for (auto& [name, shape] : llama::parameter_shapes(cfg)) names.push_back(name);
  add_gradient_outputs(g, names, "llama F+L+B graph");
  return g;
}

Json memory_fields(const Session& s, const Graph& compiled) {
  // The plan `mgn plan` prints for this graph (include/mgn/plan.h); the Vulkan executor plans the same graph
  // with its fusions and the device's alignment, so its arena can differ a little.
  const PlanSummary p = summarize_plan(compiled, {.element_bytes = 4, .alignment = 256});
  const DeviceMemoryReport m = s.device_memory();
  // How many of the session's dispatches are the f16 cooperative-matrix GEMM (Accelerated matmuls on a device
  // whose self-test passed; elsewhere they stay f32), so that a table can say what "accelerated" ran.
  int64_t dispatches = 0, matmuls = 0, f16_gemm = 0;
  for (const auto& [name, src] : s.kernel_sources()) {
    ++dispatches;
    // GEMM kernels only: not the f16 packing and operand-scaling passes (matmul_f16_*) or the split-K sums
    // that come with some of them.
    if (name.rfind("matmul_", 0) == 0 && name.rfind("matmul_f16_", 0) != 0 &&
        name.rfind("matmul_splitk_sum_", 0) != 0)
      ++matmuls;
    if (name.rfind("matmul_coopmat_f16_", 0) == 0 && name.rfind("matmul_coopmat_f16_emul_", 0) != 0)
      ++f16_gemm;
  }
  Json profile = Json::array();  // with MGN_PROFILE / CompileOptions::profile: per dispatch, heaviest first
  for (const KernelProfile& k : s.kernel_profile())
    profile.push_back({{"kernels", k.kernels},
                       {"nodes", k.nodes},
                       {"ops", k.ops},
                       {"ms", k.ms_per_run},
                       {"count", k.kernels_per_run},
                       {"bytes", k.bytes_per_run},
                       {"flops", k.flops_per_run},
                       {"gbps", k.gbps()},
                       {"tflops", k.tflops()}});
  Json out{{"dispatches", dispatches},
              {"matmul_dispatches", matmuls},
              {"f16_gemm_dispatches", f16_gemm},
              {"plan_logical_bytes", p.logical_bytes},
              {"plan_physical_bytes", p.physical_bytes},
              {"plan_peak_live_bytes", p.peak_live_bytes},
              {"session_arena_bytes", m.arena_bytes},
              {"allocated_bytes", m.allocated_bytes},
              {"heap_usage_bytes", m.heap_usage_bytes},
              {"heap_budget_bytes", m.heap_budget_bytes},
              {"budget_ext", m.budget_ext}};
  if (!profile.empty()) out["kernel_profile"] = std::move(profile);
  return out;
}

std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = lo + (hi - lo) * float(double(z >> 40) / double(1ull << 24));  // 24 bits: exact in f32
  }
  return v;
}

uint64_t name_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h ^ (seed * 0x9e3779b97f4a7c15ull);
}

}  // namespace mgn::bench
