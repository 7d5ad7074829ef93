// The MGN_* variables (include/mgn/environment.h): one table gives each its documentation and the option it
// sets, so the docs, the mapping and the unknown-name check cannot drift apart. The only getenv in src/.
#include "mgn/environment.h"

#include <cstdlib>
#include <cstring>
#include <set>

extern char** environ;

namespace mgn {
namespace {

bool parse_flag(const std::string& v, const char* name) {
  if (v == "1" || v == "on" || v == "true" || v == "yes") return true;
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  throw Error(std::string(name) + "='" + v + "': expected 1 or 0 (also on/off, true/false, yes/no)");
}

uint64_t parse_count(const std::string& v, const char* name) {
  const bool digits = !v.empty() && v.size() <= 19 && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) throw Error(std::string(name) + "='" + v + "': expected a non-negative integer");
  return std::stoull(v);
}

Precision parse_precision(const std::string& v, const char* name) {
  if (v == "strict") return Precision::Strict;
  if (v == "accelerated") return Precision::Accelerated;
  throw Error(std::string(name) + "='" + v + "': expected strict or accelerated");
}

// A variable's documentation and what it sets (null for the variables only the tests read).
struct Row {
  EnvironmentVariable doc;
  void (*set)(Environment& e, const std::string& value, const char* name);
};

const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      {{"MGN_DEVICE", "device",
        "a device index, or a case-insensitive part of its name (empty: the first device of Vulkan >= 1.2, "
        "discrete before integrated before virtual before CPU)",
        "which Vulkan device sessions open; an index out of range or a name no device has is an error that "
        "lists the devices. Option: `DeviceOptions::device`"},
       [](Environment& e, const std::string& v, const char*) { e.device.device = v; }},
      {{"MGN_VALIDATION", "device", "`1` / `0` (`0`)",
        "loads the Khronos validation layer and turns any message into an error of the step that caused it "
        "(the tests run with it on). Option: `DeviceOptions::validation`"},
       [](Environment& e, const std::string& v, const char* n) { e.device.validation = parse_flag(v, n); }},
      {{"MGN_SYNC_VALIDATION", "device", "`1` / `0` (`0`)",
        "with the validation layer on, also its synchronization validation (hazards between dispatches, "
        "copies "
        "and host access); slower. Option: `DeviceOptions::sync_validation`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.device.sync_validation = parse_flag(v, n);
       }},
      {{"MGN_CACHE_DIR", "device", "a folder (`$XDG_CACHE_HOME/meganeura`, else `~/.cache/meganeura`)",
        "where compiled SPIR-V (by content hash) and the Vulkan pipeline cache are kept across processes. "
        "Option: `CompileOptions::cache_dir` (the library's default is memory only)"},
       [](Environment& e, const std::string& v, const char*) { e.cache_dir = v; }},
      {{"MGN_PROFILE", "device", "`1` / `0` (`0`)",
        "per-kernel GPU time from timestamp queries and compile time per phase (graph passes, lowering, "
        "shaderc, pipelines, record), on stderr when a session ends. Option: `CompileOptions::profile`"},
       [](Environment& e, const std::string& v, const char* n) { e.profile = parse_flag(v, n); }},
      {{"MGN_PIPELINE_STATS", "device", "`1` / `0` (`0`)",
        "one stderr line per new pipeline with the driver's statistics (registers, shared memory, binary "
        "size), where `VK_KHR_pipeline_executable_properties` exists. Option: "
        "`DeviceOptions::pipeline_statistics`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.device.pipeline_statistics = parse_flag(v, n);
       }},
      {{"MGN_PIPELINE_IR", "device", "a folder (unset)",
        "also writes every internal representation the driver offers of each new pipeline there (NVIDIA's "
        "580 "
        "driver offers none). Option: `DeviceOptions::pipeline_ir_dir`"},
       [](Environment& e, const std::string& v, const char*) { e.device.pipeline_ir_dir = v; }},
      {{"MGN_FASHION_MNIST_DIR", "device", "a folder (`/usr/share/datasets/fashion-mnist`)",
        "where `mgn train-fashion-mnist` finds the IDX files (`--data` overrides)"},
       [](Environment& e, const std::string& v, const char*) { e.fashion_mnist_dir = v; }},
      {{"MGN_PRECISION", "compiler", "`strict`, `accelerated` (`strict`)",
        "the precision of nodes that leave theirs unset: accelerated lets eligible matmuls round their "
        "inputs "
        "to f16 (f32 accumulation) where the device's self-test passed. Option: "
        "`CompileOptions::default_precision`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.default_precision = parse_precision(v, n);
       }},
      {{"MGN_SPIRV_OPT", "compiler", "`1` / `0` (`0`)",
        "`1`: spirv-opt's performance passes over the kernels' SPIR-V (a cold compile several times slower; "
        "the "
        "driver optimizes the SPIR-V anyway). Option: `KernelOptions::spirv_optimize`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.spirv_optimize = parse_flag(v, n);
       }},
      {{"MGN_FUSION", "compiler", "`1` / `0` (`1`)",
        "`0`: no fusion (pointwise groups; dK + dV; attention + attention_lse). Results are bitwise the "
        "same, "
        "except dK and dV under `MGN_ATTENTION=tiled` (the key-tiled kernel exists only fused). Option: "
        "`KernelOptions::fusion`"},
       [](Environment& e, const std::string& v, const char* n) { e.kernels.fusion = parse_flag(v, n); }},
      {{"MGN_GEMM_EPILOGUE", "compiler", "`1` / `0` (`1`)",
        "`0`: the pointwise readers of a tiled matmul (bias, residual add, activation) run as their own "
        "kernel "
        "instead of in the GEMM's store or split-K sum. Results are bitwise the same. Option: "
        "`KernelOptions::gemm_epilogue`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.gemm_epilogue = parse_flag(v, n);
       }},
      {{"MGN_GEMM_SIBLINGS", "compiler", "`1` / `0` (`1`)",
        "`0`: tiled matmuls of one left operand (a layer's q, k, v or gate, up projections) run as separate "
        "GEMMs instead of one grouped GEMM. Results agree within the GEMM's rounding. Option: "
        "`KernelOptions::gemm_siblings`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.gemm_siblings = parse_flag(v, n);
       }},
      {{"MGN_GEMM_SPLITK_FIXUP", "compiler", "`1` / `0` (`1`)",
        "`0`: a tiled matmul whose K is split sums its partial products in a second kernel instead of in the "
        "GEMM's "
        "last-arriving block per tile. Results are bitwise the same. Option: "
        "`KernelOptions::gemm_splitk_fixup`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.gemm_splitk_fixup = parse_flag(v, n);
       }},
      {{"MGN_GEMM_K_VEC4", "compiler", "`1` / `0` / `a` / `b` (`1`)",
        "which operands of the tiled matmul that are stored contiguous along K (A not transposed; B "
        "transposed: a "
        "linear layer's weight) are read as one vec4 along K per item (`1`: both) instead of 4 scalar loads. "
        "Results are bitwise the same. Option: `KernelOptions::gemm_k_vec4`"},
       [](Environment& e, const std::string& v, const char* n) {
         if (v == "a" || v == "b") {
           e.kernels.gemm_k_vec4 = v == "a" ? GemmOperands::A : GemmOperands::B;
           return;
         }
         try {
           e.kernels.gemm_k_vec4 = parse_flag(v, n) ? GemmOperands::Both : GemmOperands::None;
         } catch (const Error&) {
           throw Error(std::string(n) + "='" + v + "': expected 1, 0, a or b");
         }
       }},
      {{"MGN_PLAN_REUSE", "compiler", "`1` / `0` (`1`)",
        "`0`: the static plan gives every step-local tensor its own memory (no sharing, no in-place ops), "
        "for "
        "comparison when an aliasing bug is suspected; results are bitwise the same. Options: "
        "`PlanningOptions::reuse`, `PlanningOptions::in_place`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.planning.reuse = e.planning.in_place = parse_flag(v, n);
       }},
      {{"MGN_ATTENTION", "compiler", "`auto`, `row`, `tiled`, `matmul` (`auto`)",
        "the attention kernels: `auto` rewrites attentions of at least 256 queries and keys, and every "
        "attention "
        "of a training graph, into matrix products over the materialized scores and, for the rest, takes the "
        "query-tiled forward kernels at long sequences and the row kernels otherwise (docs/architecture.md); "
        "`row` / `tiled` force one "
        "kernel form wherever the head dims allow it; `matmul` rewrites every attention without a mask. "
        "Option: `KernelOptions::attention`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.attention = parse_attention_kernel(v, n);
       }},
      {{"MGN_GEMM_VARIANT", "compiler", "`auto`, `simt`, `small` (`auto`)",
        "the f32 (strict) GEMM kernel family. Option: `KernelOptions::gemm`"},
       [](Environment& e, const std::string& v, const char* n) { e.kernels.gemm = parse_gemm_kernel(v, n); }},
      {{"MGN_GEMM_TILE", "compiler", "`BMxBNxBK[,tTMxTN][,lLXxLY][,gG][,sS]` (chosen per shape)",
        "the f32 SIMT GEMM tile (grammar in include/mgn/options.h). Option: `KernelOptions::gemm_tile`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.gemm_tile = parse_gemm_tile(v, false, n);
       }},
      {{"MGN_GEMM_F16", "compiler", "`1` / `0` (`1`: where the device self-test passes)",
        "`0`: Accelerated matmuls stay f32. Option: `KernelOptions::f16_gemm`"},
       [](Environment& e, const std::string& v, const char* n) { e.kernels.f16_gemm = parse_flag(v, n); }},
      {{"MGN_GEMM_F16_MIN_WORK", "compiler", "an integer >= 0 (`67108864`, 2^26)",
        "the smallest M·N·K·batch an Accelerated matmul must have to take the f16 cooperative-matrix GEMM; "
        "smaller ones stay f32 (the f16 path's two packing passes cost more than a small product saves); "
        "`0`: "
        "every eligible matmul. Option: `KernelOptions::f16_min_work`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.f16_min_work = parse_count(v, n);
       }},
      {{"MGN_GEMM_F16_MIN_DIM", "compiler", "an integer >= 0 (`64`)",
        "the smallest M, N and K an Accelerated matmul must have to take the f16 cooperative-matrix GEMM (a "
        "side shorter than a tensor-core block wastes it); `0`: no such rule. Option: "
        "`KernelOptions::f16_min_dim`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.f16_min_dim = parse_count(v, n);
       }},
      {{"MGN_GEMM_F16_SCALING", "compiler", "`1` / `0` (`1`)",
        "`0`: the f16 GEMM rounds its operands to f16 as they are, without the power-of-two scaling of "
        "non-parameter operands (values below 6e-8 then flush to zero, above 65504 overflow). Option: "
        "`KernelOptions::f16_operand_scaling`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.f16_operand_scaling = parse_flag(v, n);
       }},
      {{"MGN_GEMM_F16_TILE", "compiler", "`BMxBNxBK[,wWMxWN][,gG][,sS]` (chosen per shape)",
        "the f16 cooperative-matrix GEMM tile. Option: `KernelOptions::f16_tile`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.f16_tile = parse_gemm_tile(v, true, n);
       }},
      {{"MGN_GEMM_F16_ABLATE", "compiler", "`noload`, `nomma`, `mmaonly`, `fragonly` (unset)",
        "**benchmarks only, wrong results on purpose**: parts of the f16 GEMM removed so that its time can "
        "be "
        "split (docs/perf-notes.md). Option: `KernelOptions::f16_ablation`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.f16_ablation = parse_gemm_ablation(v, n);
       }},
      {{"MGN_CONV_TILE", "compiler", "`BPxBQxBK`, e.g. `128x64x16` (chosen per shape)",
        "pins the tile of every implicit-GEMM convolution kernel. Option: `KernelOptions::conv_tile`"},
       [](Environment& e, const std::string& v, const char* n) {
         e.kernels.conv_tile = parse_conv_tile(v, n);
       }},
      {{"MGN_CONV_SPLITS", "compiler", "`0` (auto), `1` (never) or the number of K splits (`0`)",
        "K splits of the implicit-GEMM conv2d and conv2d_grad_input kernels. Option: "
        "`KernelOptions::conv_splits`"},
       [](Environment& e, const std::string& v, const char* n) {
         const uint64_t splits = parse_count(v, n);
         if (splits > 64) throw Error(std::string(n) + "='" + v + "': at most 64 splits");
         e.kernels.conv_splits = uint32_t(splits);
       }},
      {{"MGN_REQUIRE_REFERENCES", "tests", "`1` (unset)",
        "a missing reference file (SmolLM2's tokenizer, from the Debian package the set-up script installs) "
        "fails `tokenizer_test` instead of skipping it; CI sets it"},
       nullptr},
      {{"MGN_ORACLE_DIR", "tests", "a folder (the build's `oracle/`)",
        "where `vulkan_ops_test` reads the PyTorch oracle files (the GPU machine's copy lives elsewhere)"},
       nullptr},
      {{"MGN_TEST_PRINT_ERR", "tests", "`1` (unset)", "the attention tests print per-tensor errors"},
       nullptr},
      {{"MGN_RESNET_VERBOSE", "tests", "`1` (unset)", "the ResNet tests print per-tensor errors"}, nullptr},
  };
  return r;
}

std::string default_cache_dir(const std::function<const char*(const char*)>& lookup) {
  if (const char* x = lookup("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/meganeura";
  if (const char* h = lookup("HOME"); h && *h) return std::string(h) + "/.cache/meganeura";
  return "";  // nowhere sensible: no disk cache
}

}  // namespace

const std::vector<EnvironmentVariable>& environment_variables() {
  static const std::vector<EnvironmentVariable> docs = [] {
    std::vector<EnvironmentVariable> d;
    for (const Row& r : rows()) d.push_back(r.doc);
    return d;
  }();
  return docs;
}

std::string environment_markdown() {
  const std::pair<const char*, const char*> sections[] = {
      {"device", "Device, caches and diagnostics"},
      {"compiler", "Compiler and kernel choices (for benchmarking and for working around a driver)"},
      {"tests", "Tests only (read by the test programs, never by the library)"}};
  std::string out;
  for (const auto& [key, title] : sections) {
    out += std::string(out.empty() ? "" : "\n") + "### " + title + "\n\n| variable | values (default) | effect |\n"
           "|---|---|---|\n";
    for (const EnvironmentVariable& v : environment_variables())
      if (std::strcmp(v.section, key) == 0)
        out += std::string("| `") + v.name + "` | " + v.values + " | " + v.effect + " |\n";
  }
  return out;
}

void Environment::apply(CompileOptions& o) const {
  o.kernels = kernels;
  o.planning = planning;
  o.device = device;
  o.default_precision = default_precision;
  o.cache_dir = cache_dir;
  o.profile = profile;
}

Environment environment_from(const std::function<const char*(const char*)>& lookup,
                             const std::vector<std::string>& names) {
  Environment e;
  e.cache_dir = default_cache_dir(lookup);
  std::set<std::string> known;
  for (const Row& r : rows()) {
    known.insert(r.doc.name);
    const char* v = lookup(r.doc.name);
    if (!r.set || !v || !*v) continue;
    r.set(e, v, r.doc.name);
  }
  for (const std::string& n : names)
    if (n.rfind("MGN_", 0) == 0 && !known.count(n)) e.unknown.push_back(n);
  return e;
}

Environment read_environment() {
  std::vector<std::string> names;
  for (char** p = environ; p && *p; ++p) {
    const char* eq = std::strchr(*p, '=');
    names.emplace_back(*p, eq ? size_t(eq - *p) : std::strlen(*p));
  }
  return environment_from([](const char* name) { return std::getenv(name); }, names);
}

}  // namespace mgn
