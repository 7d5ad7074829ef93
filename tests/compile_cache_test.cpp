// The compile pipeline's caches on the Vulkan engine (lavapipe in CI): a second compile of the same graph
// with the same cache directory emits no GLSL and runs no shaderc (counted, not timed), and computes what the
// CPU reference executor computes; a corrupt or truncated compiled-session entry is detected, never used,
// and rebuilt; the cache is bounded; kernel names do not split the SPIR-V cache; pipelines are created on
// several threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "backend/cpu/executor.h"
#include "codegen/shader_compiler.h"
#include "mgn/models.h"
#include "mgn/session.h"
#include "support/cache_folder.h"
#include "support/parallel.h"
#include "support/test_util.h"
#ifdef MGN_HAVE_VULKAN
#include "backend/vulkan/context.h"
#include "backend/vulkan/graph_executor.h"
#endif

using namespace mgn;
namespace fs = std::filesystem;

namespace {

Graph mlp(int64_t hidden) {
  return models::fashion_mnist({.arch = models::FashionArch::Mlp, .batch = 4, .mode = Mode::Infer, .hidden = hidden, .seed = 3});
}

CompileOptions vk_options(const std::string& dir) {
  CompileOptions o{.mode = Mode::Infer, .backend = Backend::Vulkan, .device = test::device_options()};
  o.cache_dir = dir;
  return o;
}

std::vector<float> input(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float((i * 37) % 101) / 101.0f - 0.5f;
  return x;
}

// Runs `s` from the CPU session's parameters on a fixed input; returns the logits of both.
std::pair<std::vector<float>, std::vector<float>> run_both(Session& s, int64_t hidden) {
  Graph g = mlp(hidden);
  Session cpu = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  for (const std::string& n : cpu.state_names()) s.write_parameter(n, cpu.read(n));
  const std::vector<float> x = input(4 * 784);
  cpu.set_input("x", x);
  s.set_input("x", x);
  cpu.run();
  s.run();
  return {s.read("logits"), cpu.read("logits")};
}

void expect_matches_cpu(Session& s, int64_t hidden) {
  auto [gpu, cpu] = run_both(s, hidden);
  ASSERT_EQ(gpu.size(), cpu.size());
  EXPECT_LT(test::rel_l2(std::vector<double>(gpu.begin(), gpu.end()), std::vector<double>(cpu.begin(), cpu.end())), 1e-5);
}

std::vector<fs::path> entries(const std::string& dir) {
  std::vector<fs::path> r;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "sessions"))
    if (e.path().extension() == ".mgs") r.push_back(e.path());
  return r;
}

}  // namespace

TEST(CompileCache, WarmCompileEmitsNoGlslAndRunsNoShaderc) {
  const std::string dir = test::make_temp_dir("compile_cache_warm");
  Graph g1 = mlp(24);
  Session cold = compile(g1, vk_options(dir));
  const CompileReport& c = cold.compile_report();
  EXPECT_EQ(c.session_cache, "miss");
  EXPECT_GT(c.emitted, 0u);
  EXPECT_GT(c.compiled, 0u);
  EXPECT_EQ(c.compiled, c.unique_kernels);  // an empty cache directory: every unique kernel once
  expect_matches_cpu(cold, 24);

  Graph g2 = mlp(24);  // the same graph, built again
  Session warm = compile(g2, vk_options(dir));
  const CompileReport& w = warm.compile_report();
  EXPECT_EQ(w.session_cache, "hit");
  EXPECT_EQ(w.emitted, 0u);
  EXPECT_EQ(w.compiled, 0u);
  EXPECT_EQ(w.spirv_memory_hits + w.spirv_disk_hits, 0u);  // the compiler was not asked at all
  EXPECT_EQ(w.spirv_from_session, w.unique_kernels);
  EXPECT_EQ(w.kernels, c.kernels);
  EXPECT_EQ(warm.kernel_sources(), cold.kernel_sources());
  expect_matches_cpu(warm, 24);

  // A different graph or different kernel options: another key, so a miss (and GLSL emitted again).
  Graph g3 = mlp(16);
  Session other = compile(g3, vk_options(dir));
  EXPECT_EQ(other.compile_report().session_cache, "miss");
  EXPECT_GT(other.compile_report().emitted, 0u);
  expect_matches_cpu(other, 16);
  Graph g4 = mlp(24);
  CompileOptions no_fusion = vk_options(dir);
  no_fusion.kernels.fusion = false;
  Session unfused = compile(g4, no_fusion);
  EXPECT_EQ(unfused.compile_report().session_cache, "miss");
  EXPECT_EQ(entries(dir).size(), 3u);
}

// A split-K GEMM summed in its own kernel (KernelOptions::gemm_splitk_fixup) needs its counters zero before
// its first run: a session from a cache hit (the lowering, counters included, read back from the entry)
// computes what the CPU reference executor computes, run after run (each on another input), as the cold one
// does.
TEST(CompileCache, SplitKCountersThroughTheCache) {
  const std::string dir = test::make_temp_dir("compile_cache_splitk");
  auto build = [] {
    Graph g;
    Tensor x = g.input("x", {40, 1024});
    g.output("y", linear(x, g.parameter("w", {24, 1024}, Init::uniform(-0.1, 0.1, 9))));
    return g;
  };
  Graph gc = build();
  Session cpu = compile(gc, {.mode = Mode::Infer, .backend = Backend::Cpu});
  const std::vector<float> x = input(40 * 1024);
  cpu.set_input("x", x);
  cpu.run();
  const std::vector<float> want = cpu.read("y");
  for (const char* phase : {"miss", "hit"}) {
    Graph g = build();
    Session s = compile(g, vk_options(dir));
    EXPECT_EQ(s.compile_report().session_cache, phase);
    bool fixup = false;
    for (const auto& [name, glsl] : s.kernel_sources())
      fixup = fixup ||
              (name.find("_fx") != std::string::npos && glsl.find("atomicAdd(CNT[") != std::string::npos);
    EXPECT_TRUE(fixup) << phase;
    s.write_parameter("w", cpu.read("w"));
    for (int run = 0; run < 3; ++run) {  // x times 1, 2, 4 (exact): a run that stored nothing would show
      const double scale = double(1 << run);
      std::vector<float> xs = x;
      for (float& v : xs) v *= float(scale);
      s.set_input("x", xs);
      s.run();
      const std::vector<float> got = s.read("y");
      std::vector<double> ref(want.begin(), want.end());
      for (double& v : ref) v *= scale;
      EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), ref), 1e-5)
          << phase << " run " << run;
    }
  }
}

TEST(CompileCache, CorruptOrTruncatedEntryIsRebuilt) {
  const std::string dir = test::make_temp_dir("compile_cache_corrupt");
  Graph g1 = mlp(20);
  Session first = compile(g1, vk_options(dir));
  ASSERT_EQ(entries(dir).size(), 1u);
  const fs::path entry = entries(dir)[0];
  const uintmax_t size = fs::file_size(entry);

  // One flipped byte in the middle of the payload (the GLSL or SPIR-V): the checksum catches it.
  {
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(size / 2));
    char b = 0;
    f.read(&b, 1);
    b = char(b ^ 0x5a);
    f.seekp(std::streamoff(size / 2));
    f.write(&b, 1);
  }
  Graph g2 = mlp(20);
  Session s2 = compile(g2, vk_options(dir));
  EXPECT_EQ(s2.compile_report().session_cache, "corrupt");
  EXPECT_GT(s2.compile_report().emitted, 0u);  // rebuilt from the graph, not from the entry
  expect_matches_cpu(s2, 20);
  ASSERT_EQ(entries(dir).size(), 1u);
  EXPECT_EQ(fs::file_size(entry), size);  // written again, whole

  // The rewritten entry is good again.
  Graph g3 = mlp(20);
  Session s3 = compile(g3, vk_options(dir));
  EXPECT_EQ(s3.compile_report().session_cache, "hit");
  EXPECT_EQ(s3.compile_report().emitted, 0u);

  // Truncated (a copy cut short): detected the same way.
  fs::resize_file(entry, size - 100);
  Graph g4 = mlp(20);
  Session s4 = compile(g4, vk_options(dir));
  EXPECT_EQ(s4.compile_report().session_cache, "corrupt");
  EXPECT_GT(s4.compile_report().emitted, 0u);
  expect_matches_cpu(s4, 20);
  EXPECT_EQ(fs::file_size(entry), size);

  // Emptied, and garbage of the right size.
  fs::resize_file(entry, 0);
  Graph g5 = mlp(20);
  EXPECT_EQ(compile(g5, vk_options(dir)).compile_report().session_cache, "corrupt");
  {
    std::ofstream f(entry, std::ios::binary | std::ios::trunc);
    f << std::string(size_t(size), 'x');
  }
  Graph g6 = mlp(20);
  Session s6 = compile(g6, vk_options(dir));
  EXPECT_EQ(s6.compile_report().session_cache, "corrupt");
  expect_matches_cpu(s6, 20);
}

TEST(CompileCache, BoundedLeastRecentlyUsedAndClear) {
  const std::string dir = test::make_temp_dir("compile_cache_lru");
  CompileOptions o = vk_options(dir);
  Graph a = mlp(8);
  compile(a, o);
  ASSERT_EQ(entries(dir).size(), 1u);
  const uintmax_t one = fs::file_size(entries(dir)[0]);
  o.session_cache_bytes = one + one / 2;  // room for one entry of this size, not two
  Graph b = mlp(12);
  compile(b, o);
  const std::vector<fs::path> left = entries(dir);
  ASSERT_EQ(left.size(), 1u);  // the least recently used one (a's) went
  Graph b2 = mlp(12);
  EXPECT_EQ(compile(b2, o).compile_report().session_cache, "hit");
  Graph a2 = mlp(8);
  EXPECT_EQ(compile(a2, o).compile_report().session_cache, "miss");

  CacheUsage u = cache_usage(dir);
  EXPECT_EQ(u.session_entries, 1u);
  EXPECT_GT(u.session_bytes, 0u);
  EXPECT_GT(u.spirv_files, 0u);
  const CacheUsage cleared = clear_cache(dir);
  EXPECT_EQ(cleared.session_entries, u.session_entries);
  EXPECT_EQ(cleared.spirv_files, u.spirv_files);
  u = cache_usage(dir);
  EXPECT_EQ(u.session_entries + u.spirv_files + u.pipeline_files, 0u);
  Graph a3 = mlp(8);
  EXPECT_EQ(compile(a3, o).compile_report().session_cache, "miss");
}

TEST(CompileCache, EvictionTakesTheOldestFirst) {
  const std::string dir = test::make_temp_dir("compile_cache_evict");
  const auto now = fs::file_time_type::clock::now();
  for (int i = 0; i < 4; ++i) {
    const fs::path p = fs::path(dir) / ("e" + std::to_string(i) + ".mgs");
    std::ofstream(p) << std::string(100, 'a');
    fs::last_write_time(p, now - std::chrono::hours(10 - i));  // e0 oldest
  }
  std::ofstream(fs::path(dir) / "other.txt") << std::string(1000, 'b');  // not an entry: never counted or removed
  EXPECT_EQ(files::folder_usage(dir, ".mgs").bytes, 400u);
  EXPECT_EQ(files::evict_lru(dir, ".mgs", 250, (fs::path(dir) / "e0.mgs").string()), 2u);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "e0.mgs"));  // kept: the entry just written
  EXPECT_FALSE(fs::exists(fs::path(dir) / "e1.mgs"));
  EXPECT_FALSE(fs::exists(fs::path(dir) / "e2.mgs"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "e3.mgs"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "other.txt"));
}

TEST(CompileCache, KernelNameDoesNotSplitTheSpirvCache) {
  const std::string glsl =
      "#version 450\nlayout(local_size_x = 64) in;\nlayout(set = 0, binding = 0) buffer B { float v[]; };\n"
      "void main() { v[gl_GlobalInvocationID.x] *= 2.0; }\n";
  codegen::ShaderCompiler shared("");
  codegen::ShaderOptions a, b;
  a.name = "double %3";
  b.name = "double %17";
  const codegen::SpirV sa = shared.compile(glsl, a);
  const codegen::SpirV sb = shared.compile(glsl, b);
  EXPECT_EQ(shared.stats().compiled, 1u);
  EXPECT_EQ(shared.stats().memory_hits, 1u);
  // The name never reaches the module: a fresh compiler given the other name produces the same words.
  codegen::ShaderCompiler fresh("");
  EXPECT_EQ(fresh.compile(glsl, b).words, sa.words);
  EXPECT_EQ(sb.words, sa.words);
}

// The same pointwise program over other node ids (what each layer of a model emits) compiles once; a
// different program does not share the entry.
TEST(CompileCache, RenumberedKernelsShareOneCompile) {
  auto kernel = [](int a, int b, int out, const char* op) {
    const std::string x = "x" + std::to_string(a), y = "x" + std::to_string(b), v = "v" + std::to_string(out);
    return std::string("#version 450\nlayout(local_size_x = 64) in;\n") +
           "layout(std430, set = 0, binding = 0) readonly buffer Blk0 { float in_" + x + "[]; };\n" +
           "layout(std430, set = 0, binding = 1) readonly buffer Blk1 { float in_" + y + "[]; };\n" +
           "layout(std430, set = 0, binding = 2) writeonly buffer Blk2 { float out_" + v + "[]; };\n" +
           "void main() {\n  uint i = gl_GlobalInvocationID.x;\n  float " + x + " = in_" + x + "[i];  // %" +
           std::to_string(a) + "\n  float " + y + " = in_" + y + "[i];\n  precise float " + v + " = " + x + " " +
           op + " " + y + ";  // mul %" + std::to_string(out) + "\n  out_" + v + "[i] = " + v + ";\n}\n";
  };
  const std::string a = kernel(1016, 998, 1026, "*"), b = kernel(1078, 974, 1090, "*");
  const std::string c = kernel(1078, 974, 1090, "-"), swapped = kernel(998, 1016, 1026, "*");
  EXPECT_NE(a, b);
  EXPECT_EQ(codegen::canonical_glsl(a), codegen::canonical_glsl(b));
  EXPECT_NE(codegen::canonical_glsl(a), codegen::canonical_glsl(c));
  codegen::ShaderCompiler shared("");
  const codegen::SpirV sa = shared.compile(a), sb = shared.compile(b);
  EXPECT_EQ(shared.stats().compiled, 1u);
  EXPECT_EQ(shared.stats().memory_hits, 1u);
  // What b compiles to on its own (a fresh compiler) is what the shared one handed back.
  codegen::ShaderCompiler fresh("");
  EXPECT_EQ(fresh.compile(b).words, sb.words);
  EXPECT_EQ(sa.words, sb.words);
  const codegen::SpirV sc = shared.compile(c);
  EXPECT_EQ(shared.stats().compiled, 2u);
  EXPECT_NE(sc.words, sa.words);
  // The same ids in another order is the same program too (consistent renaming), and compiles the same.
  shared.compile(swapped);
  EXPECT_EQ(shared.stats().compiled, 2u);
  EXPECT_EQ(fresh.compile(swapped).words, sa.words);
}

// The compile pool: with 3 workers and 7 items every worker runs at least one item (counted by thread id),
// every item runs once, and a failing item's error reaches the caller as it was thrown.
TEST(CompileCache, ParallelForUsesEveryWorkerAndRethrows) {
  std::mutex m;
  std::set<std::thread::id> ids;
  std::vector<int> runs(7, 0);
  support::parallel_for(runs.size(), 3, [&](size_t i) {
    std::lock_guard lock(m);
    ids.insert(std::this_thread::get_id());
    ++runs[i];
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(runs, std::vector<int>(7, 1));
  try {
    support::parallel_for(7, 3, [&](size_t i) {
      if (i == 4) throw Error("pipeline 'kernel 4': vkCreateComputePipelines failed");
    });
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "pipeline 'kernel 4': vkCreateComputePipelines failed");
  }
}

#ifdef MGN_HAVE_VULKAN
// Pipelines are created on the compile workers, each as soon as its kernel's SPIR-V is ready: with three
// workers and at least three distinct kernels every worker creates one (support::parallel_for gives worker
// w item w first), counted by thread id, not timed. The session still computes what the CPU reference
// executor computes, and the step's dispatches point at the pipelines of their own kernels.
TEST(CompileCache, PipelinesAreCreatedOnSeveralThreads) {
  Graph g;
  Tensor x = g.input("x", {6, 16}), w = g.input("w", {16, 12}), b = g.input("b", {12});
  Tensor h = matmul(x, w) + b;  // a GEMM and a pointwise kernel
  Tensor p = softmax(h, -1);    // a row reduction
  Tensor m = max(h, {1});       // another one
  Tensor n = layer_norm(h, std::nullopt, std::nullopt);
  g.output("p", p);
  g.output("m", m);
  g.output("n", sum(n * n, {0}));

  vk::Context ctx(test::device_options());
  vk::GraphExecutorOptions o;
  o.cache_dir = "";  // nothing from disk: every pipeline is created now
  o.compile_threads = 3;
  vk::GraphExecutor e(g.ir(), ctx, o);
  const vk::CompileStats& s = e.compile_stats();
  ASSERT_GE(s.unique_kernels, 3u);
  EXPECT_EQ(s.compiled, s.unique_kernels);
  EXPECT_EQ(s.pipelines_created, s.unique_kernels);  // distinct kernels, distinct SPIR-V
  EXPECT_EQ(s.pipeline_threads, 3u);
  EXPECT_GT(s.pipeline_cpu_ms, 0.0);

  cpu::Executor ref(g.ir());
  const std::map<std::string, std::vector<double>> in = {{"x", test::random_normal(6 * 16, 11)},
                                                         {"w", test::random_normal(16 * 12, 12)},
                                                         {"b", test::random_normal(12, 13)}};
  for (const auto& [name, v] : in) {
    const std::vector<float> f(v.begin(), v.end());
    ref.set_input(name, f);
    e.set_input(name, f);
  }
  ref.run();
  e.run();
  for (const char* name : {"p", "m", "n"}) {
    const std::vector<float> got = e.read_output(name);
    EXPECT_LE(test::rel_l2(std::vector<double>(got.begin(), got.end()), ref.output(name).v), 1e-5) << name;
  }
  EXPECT_EQ(ctx.validation_message_count(), 0u);
  for (const auto& msg : ctx.validation_messages()) ADD_FAILURE() << msg;
}
#endif
