// Whole-graph conformance of the Vulkan engine: the Fashion-MNIST MLP and CNN trained with AdamW on real
// images for a few steps on Vulkan (lavapipe in CI) and on the CPU reference executor from the same initial
// parameters must give the same losses, the same parameters and optimizer state after every step, and
// the same logits from a reloaded inference session.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>

#include "mgn/data.h"
#include "mgn/models.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

Session make(models::FashionArch arch, Backend b, Mode mode, int64_t batch, bool spirv_optimize = false) {
  Graph g = models::fashion_mnist({.arch = arch, .batch = batch, .mode = mode, .hidden = 32, .seed = 7});
  CompileOptions opt{.mode = mode, .backend = b, .device = test::device_options()};
  opt.kernels.spirv_optimize = spirv_optimize;
  if (mode == Mode::Train) opt.optimizer = AdamW{.lr = 3e-3, .weight_decay = 0.01};
  return compile(g, opt);
}

// Steps on Vulkan and on the CPU executor from the same parameters, then inference from a checkpoint.
void check_training_matches_cpu(models::FashionArch arch, int64_t batch, int64_t steps, bool spirv_optimize = false) {
  Dataset data = load_fashion_mnist(fashion_mnist_dir(), Split::Train, batch * steps);
  Session cpu = make(arch, Backend::Cpu, Mode::Train, batch);
  Session gpu = make(arch, Backend::Vulkan, Mode::Train, batch, spirv_optimize);
  ASSERT_STRNE(gpu.backend(), "cpu");
  // Same initial parameters on both (written from the CPU side, not trusted to the two initializers).
  for (const std::string& n : cpu.state_names()) {
    std::vector<float> v = cpu.read(n);
    gpu.write_parameter(n, v);
  }
  BatchLoader loader(data, {.batch = batch, .shuffle = false});
  loader.start_epoch(0);
  Batch b;
  for (int64_t s = 0; s < steps; ++s) {
    ASSERT_TRUE(loader.next(b));
    for (Session* x : {&cpu, &gpu}) {
      x->set_input("x", b.features);
      x->set_input("labels", b.labels);
      x->step();
    }
    float lc = cpu.read_scalar("loss"), lg = gpu.read_scalar("loss");
    EXPECT_NEAR(lg, lc, 1e-5 * std::fabs(lc)) << "step " << s;
    for (const std::string& n : cpu.state_names()) {
      std::vector<float> a = cpu.read(n), g = gpu.read(n);
      ASSERT_EQ(a.size(), g.size()) << n;
      EXPECT_LT(test::rel_l2(std::vector<double>(g.begin(), g.end()), std::vector<double>(a.begin(), a.end())), 1e-5)
          << n << " after step " << s;
    }
  }
  // Deploy on Vulkan from the CPU-trained checkpoint; compare with CPU inference.
  std::string ckpt = test::make_temp_dir("vksession") + "/" + models::fashion_arch_name(arch) + ".safetensors";
  cpu.save_checkpoint(ckpt);
  Session ic = make(arch, Backend::Cpu, Mode::Infer, batch),
          ig = make(arch, Backend::Vulkan, Mode::Infer, batch, spirv_optimize);
  ic.load_checkpoint(ckpt);
  ig.load_checkpoint(ckpt);
  for (Session* x : {&ic, &ig}) {
    x->set_input("x", b.features);
    x->run();
  }
  std::vector<float> a = ic.read("logits"), g = ig.read("logits");
  EXPECT_LT(test::rel_l2(std::vector<double>(g.begin(), g.end()), std::vector<double>(a.begin(), a.end())), 1e-5);
}

}  // namespace

TEST(VulkanSession, FashionMlpTrainingStepsMatchCpu) { check_training_matches_cpu(models::FashionArch::Mlp, 16, 4); }

// conv2d, max_pool2d and their derivatives inside a whole training step (small batch: lavapipe is slow).
TEST(VulkanSession, FashionCnnTrainingStepsMatchCpu) { check_training_matches_cpu(models::FashionArch::Cnn, 4, 3); }

// The same with spirv-opt's performance passes over the SPIR-V (KernelOptions::spirv_optimize on; off by
// default): the optimized kernels are still valid (spirv-val, the validation layer) and compute the same step.
TEST(VulkanSession, FashionCnnTrainingStepsMatchCpuWithSpirvOpt) {
  check_training_matches_cpu(models::FashionArch::Cnn, 4, 3, true);
}

// Parameters are initialized lazily on Vulkan (skipped when a checkpoint overwrites them): read back
// before any step, and after one step from their own initial values, they equal the CPU executor's.
TEST(VulkanSession, LazyInitialValuesMatchCpu) {
  Session cpu = make(models::FashionArch::Mlp, Backend::Cpu, Mode::Train, 8);
  Session gpu = make(models::FashionArch::Mlp, Backend::Vulkan, Mode::Train, 8);
  ASSERT_STRNE(gpu.backend(), "cpu");
  for (const std::string& n : cpu.state_names()) {
    std::vector<float> a = cpu.read(n), g = gpu.read(n);
    ASSERT_EQ(a, g) << n;  // the same counter-based initializer on both sides: bit-identical
  }
  Session gpu2 = make(models::FashionArch::Mlp, Backend::Vulkan, Mode::Train, 8);
  Dataset data = load_fashion_mnist(fashion_mnist_dir(), Split::Train, 8);
  BatchLoader loader(data, {.batch = 8, .shuffle = false});
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  for (Session* x : {&cpu, &gpu2}) {
    x->set_input("x", b.features);
    x->set_input("labels", b.labels);
    x->step();  // gpu2: no read before the step, so the step itself must trigger the initial upload
  }
  EXPECT_NEAR(gpu2.read_scalar("loss"), cpu.read_scalar("loss"), 1e-5 * std::fabs(cpu.read_scalar("loss")));
}

// The GLSL of a compiled session is inspectable (mgn kernels): one entry per dispatch, complete shaders;
// the CPU reference executor has none.
TEST(VulkanSession, KernelSourcesOfACompiledSession) {
  Session gpu = make(models::FashionArch::Cnn, Backend::Vulkan, Mode::Infer, 2);
  auto kernels = gpu.kernel_sources();
  ASSERT_FALSE(kernels.empty());
  bool conv = false, pool = false;
  for (const auto& [name, glsl] : kernels) {
    EXPECT_EQ(glsl.rfind("#version 450", 0), 0u) << name;
    EXPECT_NE(glsl.find("void main()"), std::string::npos) << name;
    conv = conv || name.rfind("conv2d", 0) == 0;
    pool = pool || name.rfind("max_pool2d", 0) == 0;
  }
  EXPECT_TRUE(conv && pool);
  EXPECT_TRUE(make(models::FashionArch::Cnn, Backend::Cpu, Mode::Infer, 2).kernel_sources().empty());
}

// Submission chunking: a training step split into several queue submissions gives bit-identical results
// to one submission, the hook runs between the pieces (never after the last), and the memory report
// measures what the session's allocator reserved.
TEST(VulkanSession, ChunkedSubmissionsMatchOneSubmission) {
  const int64_t batch = 4;
  Dataset data = load_fashion_mnist(fashion_mnist_dir(), Split::Train, batch * 2);
  auto build = [&](int submissions, std::function<void(int)> hook) {
    Graph g = models::fashion_mnist({.arch = models::FashionArch::Cnn, .batch = batch, .hidden = 32, .seed = 7});
    CompileOptions opt{.mode = Mode::Train, .backend = Backend::Vulkan, .device = test::device_options()};
    opt.optimizer = AdamW{.lr = 3e-3, .weight_decay = 0.01};
    opt.submissions = submissions;
    opt.between_submissions = std::move(hook);
    return compile(g, opt);
  };
  std::vector<int> calls;
  Session one = build(1, nullptr);
  Session four = build(4, [&calls](int i) { calls.push_back(i); });
  for (const std::string& n : one.state_names()) four.write_parameter(n, one.read(n));
  BatchLoader loader(data, {.batch = batch, .shuffle = false});
  loader.start_epoch(0);
  Batch b;
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(loader.next(b));
    for (Session* x : {&one, &four}) {
      x->set_input("x", b.features);
      x->set_input("labels", b.labels);
      x->step();
    }
    EXPECT_EQ(one.read_scalar("loss"), four.read_scalar("loss")) << "step " << s;
    for (const std::string& n : one.state_names()) EXPECT_EQ(one.read(n), four.read(n)) << n << " after step " << s;
  }
  DeviceMemoryReport m1 = one.device_memory(), m4 = four.device_memory();
  EXPECT_EQ(m1.submissions, 1);
  EXPECT_EQ(m4.submissions, 4);
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  // The arena is planned; the allocator's blocks must hold it (and every staging buffer on top).
  EXPECT_GT(m1.arena_bytes, 0u);
  EXPECT_GE(m1.device_bytes, m1.arena_bytes);
  EXPECT_EQ(m1.allocated_bytes, m1.device_bytes + m1.staging_bytes);
  EXPECT_EQ(m1.arena_bytes, m4.arena_bytes);
  if (m1.budget_ext) {
    EXPECT_GT(m1.heap_budget_bytes, 0u);
    EXPECT_GT(m1.heap_usage_bytes, 0u);
  }
  EXPECT_THROW(build(0, nullptr), Error);
}

// The ops the op recipe was proven on (docs/architecture.md): a transposed convolution, gather_elements with
// repeated indices and scatter_elements (none and add) in one trained graph; Vulkan and the CPU reference from
// the same parameters give the same loss and parameters step by step, so the GPU kernels of the ops and of
// their gradients (conv2d, conv2d_grad_weight, scatter_elements add, gather_elements) agree with the reference.
TEST(VulkanSession, TransposedConvGatherScatterTrainingMatchesCpu) {
  auto make_graph = [](Graph& g) {
    Tensor x = g.input("x", {2, 3, 3, 4});
    Tensor w = g.parameter("up.weight", {3, 2, 3, 3}, Init::uniform(-0.4, 0.4, 1));
    Tensor bias = g.parameter("up.bias", {2}, Init::uniform(-0.1, 0.1, 2));
    Tensor y = conv_transpose2d(x, w, {.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 0}}, bias);  // [2,2,6,7]
    std::vector<int32_t> take(2 * 2 * 6 * 5), put(2 * 2 * 6 * 3);
    for (size_t i = 0; i < take.size(); ++i) take[i] = int32_t((i * 5 + i / 7) % 7);  // repeats along the axis
    for (size_t i = 0; i < put.size(); ++i) put[i] = int32_t((i % 3) * 2 + (i / 3) % 2);  // distinct per row
    Tensor t = gather_elements(y, g.constant_i32({2, 2, 6, 5}, take), 3);
    Tensor s = scatter_elements(y, g.constant_i32({2, 2, 6, 3}, put), slice(t, 3, 0, 3) * 0.5, 3);
    Tensor a = scatter_elements(s, g.constant_i32({2, 2, 6, 5}, take), t, 3, ScatterReduction::Add);
    g.output("loss", mean(square(a)) + mean(t));
  };
  Graph gc, gv;
  make_graph(gc);
  make_graph(gv);
  Session cpu = compile(gc, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.1}, .backend = Backend::Cpu});
  Session gpu = compile(gv, {.mode = Mode::Train,
                             .optimizer = SGD{.lr = 0.1},
                             .backend = Backend::Vulkan,
                             .device = test::device_options()});
  ASSERT_STRNE(gpu.backend(), "cpu");
  std::vector<double> x = test::random_uniform(2 * 3 * 3 * 4, 5, -1, 1);
  for (int step = 0; step < 3; ++step) {
    for (Session* s : {&cpu, &gpu}) {
      s->set_input("x", std::vector<float>(x.begin(), x.end()));
      s->step();
    }
    const float lc = cpu.read_scalar("loss"), lg = gpu.read_scalar("loss");
    EXPECT_NEAR(lg, lc, 1e-5 * std::fabs(lc)) << "step " << step;
    for (const char* n : {"up.weight", "up.bias"}) {
      std::vector<float> a = cpu.read(n), b = gpu.read(n);
      EXPECT_LT(test::rel_l2(std::vector<double>(b.begin(), b.end()), std::vector<double>(a.begin(), a.end())), 1e-5)
          << n << " after step " << step;
    }
  }
}

// Two SGD steps of the attention graphs below on `gpu` and on the CPU reference `ref` (input x): the same loss
// and the same q/k/v weights after each step, to f32 rounding.
static void steps_like_cpu(Session& gpu, Session& ref, const std::vector<double>& x) {
  for (int step = 0; step < 2; ++step) {
    for (Session* s : {&ref, &gpu}) {
      s->set_input("x", std::vector<float>(x.begin(), x.end()));
      s->step();
    }
    const float lc = ref.read_scalar("loss"), lg = gpu.read_scalar("loss");
    EXPECT_NEAR(lg, lc, 1e-5 * std::fabs(lc)) << "step " << step;
    for (const char* n : {"wq", "wk", "wv"}) {
      std::vector<float> a = ref.read(n), b = gpu.read(n);
      EXPECT_LT(test::rel_l2(std::vector<double>(b.begin(), b.end()), std::vector<double>(a.begin(), a.end())), 1e-5)
          << n << " after step " << step;
    }
  }
}

// Auto also rewrites short attentions when the graph differentiates them (a training session: the derivative
// kernels lose to the GEMMs there, perf-notes run 15), and keeps the attention kernels for the same attention
// in an inference session. Training over 24 tokens matches the CPU reference after two SGD steps.
TEST(VulkanSession, ShortAttentionTrainsAsMatmulAndInfersWithKernels) {
  auto make_graph = [](Graph& g) {
    Tensor x = g.input("x", {2, 24, 16});
    Tensor wq = g.parameter("wq", {16, 16}, Init::uniform(-0.5, 0.5, 1));
    Tensor wk = g.parameter("wk", {16, 16}, Init::uniform(-0.5, 0.5, 2));
    Tensor wv = g.parameter("wv", {16, 16}, Init::uniform(-0.5, 0.5, 3));
    auto heads = [](Tensor t) { return permute(reshape(t, {2, 24, 2, 8}), {0, 2, 1, 3}); };  // [2, 2, 24, 8]
    Tensor o = attention(heads(matmul(x, wq)), heads(matmul(x, wk)), heads(matmul(x, wv)), {.causal = true});
    g.output("loss", mean(square(o)));
  };
  auto attention_kernels = [](const Session& s) {
    int n = 0;
    for (const auto& [name, glsl] : s.kernel_sources()) n += name.rfind("attention", 0) == 0;
    return n;
  };
  std::vector<double> x = test::random_uniform(2 * 24 * 16, 4, -1, 1);
  Graph gi;
  make_graph(gi);
  Session infer = compile(gi, {.mode = Mode::Infer, .backend = Backend::Vulkan, .device = test::device_options()});
  EXPECT_GT(attention_kernels(infer), 0);
  Graph gv;
  make_graph(gv);
  Session gpu = compile(gv, {.mode = Mode::Train,
                             .optimizer = SGD{.lr = 0.5},
                             .backend = Backend::Vulkan,
                             .device = test::device_options()});
  EXPECT_EQ(attention_kernels(gpu), 0);
  Graph gc;
  make_graph(gc);
  Session ref = compile(gc, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.5}, .backend = Backend::Cpu});
  steps_like_cpu(gpu, ref, x);
}

// KernelOptions::attention = Auto rewrites long attentions into matrix products inside the Vulkan engine
// (passes/attention_matmul.h): a causal self-attention over 256 tokens with trainable q/k/v projections, trained
// for two SGD steps, gives the CPU reference's loss and parameters, and no attention kernel is compiled; Row
// keeps the attention kernels (the short-sequence path, compared the same way).
TEST(VulkanSession, LongAttentionAsMatmulTrainsLikeCpu) {
  auto make_graph = [](Graph& g) {
    Tensor x = g.input("x", {1, 256, 16});
    Tensor wq = g.parameter("wq", {16, 16}, Init::uniform(-0.5, 0.5, 1));
    Tensor wk = g.parameter("wk", {16, 16}, Init::uniform(-0.5, 0.5, 2));
    Tensor wv = g.parameter("wv", {16, 16}, Init::uniform(-0.5, 0.5, 3));
    auto heads = [](Tensor t) { return permute(reshape(t, {1, 256, 2, 8}), {0, 2, 1, 3}); };  // [1, 2, 256, 8]
    Tensor o = attention(heads(matmul(x, wq)), heads(matmul(x, wk)), heads(matmul(x, wv)), {.causal = true});
    g.output("loss", mean(square(o)));
  };
  std::vector<double> x = test::random_uniform(256 * 16, 9, -1, 1);
  for (const AttentionKernel kernel : {AttentionKernel::Auto, AttentionKernel::Row}) {
    SCOPED_TRACE(attention_kernel_name(kernel));
    Graph gv;
    make_graph(gv);
    CompileOptions opt{.mode = Mode::Train,
                       .optimizer = SGD{.lr = 0.5},
                       .backend = Backend::Vulkan,
                       .device = test::device_options()};
    opt.kernels.attention = kernel;
    Session gpu = compile(gv, opt);
    ASSERT_STRNE(gpu.backend(), "cpu");
    int attention_kernels = 0;
    for (const auto& [name, glsl] : gpu.kernel_sources()) attention_kernels += name.rfind("attention", 0) == 0;
    if (kernel == AttentionKernel::Auto)
      EXPECT_EQ(attention_kernels, 0);
    else
      EXPECT_GT(attention_kernels, 0);
    Graph gc;
    make_graph(gc);
    Session ref = compile(gc, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.5}, .backend = Backend::Cpu});
    steps_like_cpu(gpu, ref, x);
  }
}

// CompileOptions::on_progress: (0, total) first, then one call per kernel compiled to SPIR-V with done counting
// up to total; total is the number of kernels the compile report says went to the SPIR-V compiler or its caches.
// A second compile of the same graph in the same cache folder (a compiled-session cache hit) reports nothing.
TEST(VulkanSession, CompileProgressCountsTheKernels) {
  const std::string dir = testing::TempDir() + "mgn_compile_progress";
  std::filesystem::remove_all(dir);
  auto make_graph = [](Graph& g) {
    Tensor x = g.input("x", {3, 37});
    Tensor w = g.parameter("w", {37, 11}, Init::uniform(-0.5, 0.5, 1));
    g.output("loss", mean(square(tanh(matmul(x, w)) * 1.75 + 0.25)));
  };
  std::vector<CompileProgress> calls;
  CompileOptions opt{.mode = Mode::Train, .backend = Backend::Vulkan, .device = test::device_options()};
  opt.cache_dir = dir;
  opt.on_progress = [&](const CompileProgress& p) { calls.push_back(p); };
  Graph g1;
  make_graph(g1);
  Session s1 = compile(g1, opt);
  ASSERT_STRNE(s1.backend(), "cpu");
  const CompileReport r = s1.compile_report();
  const size_t total = r.compiled + r.spirv_memory_hits + r.spirv_disk_hits;
  ASSERT_GT(total, 0u);
  ASSERT_EQ(calls.size(), total + 1);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].done, i);
    EXPECT_EQ(calls[i].total, total);
  }
  calls.clear();
  Graph g2;
  make_graph(g2);
  Session s2 = compile(g2, opt);
  EXPECT_EQ(s2.compile_report().emitted, 0u) << "the second compile is a compiled-session cache hit";
  EXPECT_TRUE(calls.empty());
  std::filesystem::remove_all(dir);
}
