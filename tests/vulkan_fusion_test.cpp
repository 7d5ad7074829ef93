// Fusion on the Vulkan planned path (codegen/fusion.cpp): random pointwise DAGs with broadcast operands,
// views and several written values per fused kernel against the CPU reference executor (double) and against
// the same executor with fusion off (bitwise: a node computes the same bits alone and fused); AdamW steps of
// a small MLP against the CPU reference; the AdamW update of one parameter in at most two dispatches; and the
// fused dK+dV attention kernel (GQA, causal, broadcast masks with all -inf rows) against the CPU reference,
// with the separate kernels kept where only one of the two derivatives is needed.
#include <gtest/gtest.h>

#ifdef MGN_HAVE_VULKAN
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/executor.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/graph_executor.h"
#include "codegen/matmul.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/graph.h"
#include "mgn/llama.h"
#include "mgn/models.h"
#include "mgn/optim.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

class VulkanFusion : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctx_ = std::make_unique<vk::Context>(test::device_options());
  }
  static void TearDownTestSuite() { ctx_.reset(); }
  void TearDown() override {
    EXPECT_EQ(ctx_->validation_message_count(), 0u);
    for (const auto& m : ctx_->validation_messages()) ADD_FAILURE() << m;
    ctx_->clear_validation_messages();
  }
  static std::unique_ptr<vk::Context> ctx_;
};
std::unique_ptr<vk::Context> VulkanFusion::ctx_;

std::vector<double> f64(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// Dispatches of a plan that hold several nodes, and how many of those write two or more values.
struct FusionCount {
  int fused = 0, multi_output = 0, nodes_in_fusions = 0;
};
FusionCount count_fusions(const plan::Plan& p) {
  FusionCount c;
  for (const plan::Dispatch& d : p.dispatches) {
    if (d.nodes.size() < 2) continue;
    ++c.fused;
    c.nodes_in_fusions += int(d.nodes.size());
    int stored = 0;
    for (int id : d.nodes) stored += p.storage_of[size_t(id)] >= 0;
    c.multi_output += stored >= 2;
  }
  return c;
}

// ---- random pointwise DAGs --------------------------------------------------------------------------------

struct RandomGraph {
  Graph g;
  std::vector<std::pair<std::string, Shape>> inputs;
};

// Pointwise ops on [R, C] with operands that broadcast ([C], [R, 1], [] and fills), reductions that read
// fused values from outside (their results come back broadcast), views (reshape, then pointwise, then
// back), comparisons feeding where, casts, several outputs, and a parameter updated from its old value.
RandomGraph random_pointwise(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
  RandomGraph r;
  Graph& g = r.g;
  const int64_t R = std::vector<int64_t>{3, 5, 17}[size_t(pick(3))],
                C = std::vector<int64_t>{4, 33}[size_t(pick(2))];
  const Shape full{R, C};
  std::vector<Tensor> pool, side;  // side: operands that broadcast to [R, C]
  auto add_input = [&](const std::string& name, const Shape& s) {
    r.inputs.push_back({name, s});
    return g.input(name, s);
  };
  pool.push_back(add_input("x0", full));
  pool.push_back(add_input("x1", full));
  side.push_back(add_input("bias", {C}));
  side.push_back(add_input("col", {R, 1}));
  side.push_back(add_input("lr", {}));
  side.push_back(g.full({1, C}, 0.25));
  Tensor p = g.parameter("p", full, Init::uniform(-1, 1, seed));
  pool.push_back(p);
  auto operand = [&]() {
    return pool[size_t(std::max(0, int(pool.size()) - 1 - pick(std::min<int>(int(pool.size()), 5))))];
  };
  auto partner = [&]() {
    return pick(3) == 0 ? side[size_t(pick(int(side.size())))] : pool[size_t(pick(int(pool.size())))];
  };
  const int ops = 8 + pick(20);
  for (int k = 0; k < ops; ++k) {
    Tensor x = operand(), y;
    switch (pick(15)) {
      case 0:
        y = relu(x);
        break;
      case 1:
        y = tanh(x);
        break;
      case 2:
        y = sigmoid(x) * partner();
        break;
      case 3:
        y = -x * 0.5 + partner();
        break;  // (scaled: a saturated x and partner would cancel)
      case 4:
        y = square(tanh(x));
        break;
      case 5:
        y = exp(tanh(x));
        break;
      case 6:
        y = x * 0.75 - partner();
        break;
      case 7:
        y = x / (abs(partner()) + 1.0);
        break;
      case 8:
        y = maximum(x, partner());
        break;
      case 9:
        y = where(greater(x, partner()), x, partner() * 0.5);
        break;
      case 10:
        y = x + cast(less(x, partner()), DType::F32);
        break;
      case 11:
        y = silu(x) + gelu(partner());
        break;
      case 12:
        y = sqrt(abs(x) + 0.1) * log(abs(partner()) + 1.0);
        break;
      case 13: {  // a fused value read from outside; the reduction comes back as a broadcast operand
        Tensor s = sum(x, {1}, true);
        side.push_back(s);
        y = x + s * (1.0 / double(C));
        break;
      }
      case 14: {  // a view: never fused with its reader, through any number of views
        Tensor v = reshape(x, {C, R});
        y = reshape(tanh(v) * 2.0, {R, C}) + x;
        break;
      }
    }
    pool.push_back(y);
  }
  g.output("out", pool.back());
  for (int i = 0; i < 2; ++i)
    g.output("extra" + std::to_string(i), pool[size_t(3 + pick(int(pool.size()) - 3))]);
  assign(p, p * 0.9 + pool[size_t(pick(int(pool.size())))] * 0.1);
  return r;
}

TEST_F(VulkanFusion, RandomPointwiseDagsMatchCpuAndUnfused) {
  size_t kernels_fused = 0, kernels_plain = 0;
  FusionCount total;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    RandomGraph r = random_pointwise(seed);
    const ir::Graph& g = r.g.ir();
    SCOPED_TRACE("seed " + std::to_string(seed) + "\n" + ir::to_text(g));
    cpu::Executor cpu(g);
    vk::GraphExecutorOptions fo;
    fo.cache_dir = "";
    fo.poison = true;
    vk::GraphExecutorOptions uo = fo;
    uo.codegen.kernels.fusion = false;
    vk::GraphExecutor fused(g, *ctx_, fo), plain(g, *ctx_, uo);
    FusionCount c = count_fusions(fused.plan());
    total.fused += c.fused;
    total.multi_output += c.multi_output;
    total.nodes_in_fusions += c.nodes_in_fusions;
    EXPECT_EQ(count_fusions(plain.plan()).fused, 0);
    kernels_fused += fused.compile_stats().kernels;
    kernels_plain += plain.compile_stats().kernels;
    EXPECT_LE(fused.compile_stats().kernels, plain.compile_stats().kernels);
    EXPECT_LE(fused.compile_stats().groups, plain.compile_stats().groups);
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        std::vector<double> v =
            test::random_normal(size_t(numel(r.inputs[i].second)), seed * 100 + uint64_t(step) * 10 + i);
        std::vector<float> f(v.begin(), v.end());
        cpu.set_input(r.inputs[i].first, f);
        fused.set_input(r.inputs[i].first, f);
        plain.set_input(r.inputs[i].first, f);
      }
      cpu.run();
      fused.run();
      plain.run();
      for (auto& [name, id] : g.outputs()) {
        std::vector<float> a = fused.read_output(name), b = plain.read_output(name);
        EXPECT_LE(test::rel_l2(f64(a), cpu.output(name).v), 1e-5) << "step " << step << " output " << name;
        EXPECT_TRUE(same_bits(a, b)) << "step " << step << " output " << name << ": fused and unfused differ";
      }
      std::vector<float> a = fused.read_state("p"), b = plain.read_state("p");
      EXPECT_LE(test::rel_l2(f64(a), cpu.state("p")), 1e-5) << "step " << step;
      EXPECT_TRUE(same_bits(a, b)) << "step " << step << " state p";
    }
    if (HasFailure()) break;
  }
  std::printf(
      "random pointwise DAGs: %zu dispatches fused vs %zu unfused; %d fusions of %d nodes, %d writing "
      "several values\n",
      kernels_fused, kernels_plain, total.fused, total.nodes_in_fusions, total.multi_output);
  EXPECT_LT(kernels_fused, kernels_plain);
  EXPECT_GT(total.multi_output, 0);
}

// The generated kernel of a fusion: one readable shader, a local variable per node, broadcast operands.
TEST_F(VulkanFusion, FusedKernelIsOneReadableShader) {
  Graph g;
  Tensor x = g.input("x", {4, 8}), b = g.input("b", {8}), s = g.input("s", {});
  Tensor h = (x + b) * s;              // bias, then a scalar
  Tensor y = relu(h) - tanh(h) * 0.5;  // h has two readers, both fused
  g.output("y", y);
  g.output("h", h);  // an output: written as well
  vk::GraphExecutor e(g.ir(), *ctx_, {.cache_dir = ""});
  ASSERT_EQ(e.compile_stats().kernels, 1u);
  auto ks = e.kernel_sources();
  ASSERT_EQ(ks.size(), 1u);
  const std::string& glsl = ks[0].second;
  EXPECT_EQ(ks[0].first.rfind("fused", 0), 0u) << ks[0].first;
  EXPECT_NE(glsl.find("uint idx_x" + std::to_string(b.id()) + "(uint i)"), std::string::npos) << glsl;
  EXPECT_NE(glsl.find("precise float v" + std::to_string(h.id())), std::string::npos) << glsl;
  EXPECT_NE(glsl.find("out_v" + std::to_string(h.id()) + "[i]"), std::string::npos) << glsl;
  EXPECT_NE(glsl.find("out_v" + std::to_string(y.id()) + "[i]"), std::string::npos) << glsl;
  cpu::Executor cpu(g.ir());
  std::vector<double> xv = test::random_normal(32, 1), bv = test::random_normal(8, 2);
  for (auto* name : {"x", "b", "s"}) {
    std::vector<double> v = std::string(name) == "x"   ? xv
                            : std::string(name) == "b" ? bv
                                                       : std::vector<double>{0.7};
    std::vector<float> f(v.begin(), v.end());
    cpu.set_input(name, f);
    e.set_input(name, f);
  }
  cpu.run();
  e.run();
  for (const char* name : {"y", "h"})
    EXPECT_LE(test::rel_l2(f64(e.read_output(name)), cpu.output(name).v), 1e-6) << name;
}

// ---- AdamW ---------------------------------------------------------------------------------------------

// A two-layer MLP with a GELU and a squared-error loss, trained with AdamW (weight decay on).
Session make_mlp(Backend b, bool fusion = true) {
  Graph g;
  Tensor x = g.input("x", {6, 12}), target = g.input("target", {6, 5});
  Tensor w1 = g.parameter("fc1.weight", {16, 12}, Init::uniform(-0.3, 0.3, 1));
  Tensor b1 = g.parameter("fc1.bias", {16}, Init::uniform(-0.1, 0.1, 2));
  Tensor w2 = g.parameter("fc2.weight", {5, 16}, Init::uniform(-0.3, 0.3, 3));
  Tensor b2 = g.parameter("fc2.bias", {5}, Init::uniform(-0.1, 0.1, 4));
  Tensor y = linear(gelu(linear(x, w1, b1)), w2, b2);
  g.output("loss", mean(square(y - target)));
  return compile(g, {.mode = Mode::Train,
                     .optimizer = AdamW{.lr = 2e-2, .weight_decay = 0.1},
                     .backend = b,
                     .kernels = {.fusion = fusion},
                     .device = test::device_options()});
}

TEST_F(VulkanFusion, AdamWStepsMatchCpuAndUnfused) {
  Session cpu = make_mlp(Backend::Cpu), gpu = make_mlp(Backend::Vulkan);
  Session plain = make_mlp(Backend::Vulkan, /*fusion=*/false);
  ASSERT_STRNE(gpu.backend(), "cpu");
  bool fused_kernel = false, any_fused_plain = false;
  for (const auto& [name, glsl] : gpu.kernel_sources()) fused_kernel |= name.rfind("fused", 0) == 0;
  for (const auto& [name, glsl] : plain.kernel_sources()) any_fused_plain |= name.rfind("fused", 0) == 0;
  EXPECT_TRUE(fused_kernel);
  EXPECT_FALSE(any_fused_plain);  // KernelOptions::fusion = false
  EXPECT_LT(gpu.kernel_sources().size(), plain.kernel_sources().size());
  for (const std::string& n : cpu.state_names()) {
    std::vector<float> v = cpu.read(n);
    gpu.write_parameter(n, v);
    plain.write_parameter(n, v);
  }
  for (int step = 0; step < 4; ++step) {
    std::vector<double> x = test::random_normal(6 * 12, 10 + uint64_t(step)),
                        t = test::random_normal(6 * 5, 20 + uint64_t(step));
    for (Session* s : {&cpu, &gpu, &plain}) {
      s->set_input("x", std::vector<float>(x.begin(), x.end()));
      s->set_input("target", std::vector<float>(t.begin(), t.end()));
      s->step();
    }
    EXPECT_NEAR(gpu.read_scalar("loss"), cpu.read_scalar("loss"), 1e-5 * std::fabs(cpu.read_scalar("loss")));
    for (const std::string& n : cpu.state_names()) {
      std::vector<float> a = cpu.read(n), gf = gpu.read(n), gp = plain.read(n);
      EXPECT_LE(test::rel_l2(f64(gf), f64(a)), 1e-5) << n << " after step " << step;
      EXPECT_TRUE(same_bits(gf, gp)) << n << " after step " << step << ": fused and unfused differ";
    }
  }
}

// The training graph of the Fashion-MNIST MLP with AdamW, and where its optimizer nodes start.
struct TrainGraph {
  Graph g;
  int first_optimizer_node = 0;
};
TrainGraph fashion_train(models::FashionArch arch, int64_t batch) {
  TrainGraph t;
  t.g = models::fashion_mnist({.arch = arch, .batch = batch, .mode = Mode::Train, .hidden = 32, .seed = 7});
  Tensor loss(&t.g.ir(), *t.g.ir().find_output("loss"));
  Gradients grads = backward(t.g, loss);
  t.first_optimizer_node = t.g.ir().size();
  append_optimizer(t.g, grads.params, AdamW{.lr = 1e-3, .weight_decay = 0.01});
  t.g.verify();
  return t;
}

// The dispatches that compute the AdamW update of parameter `name` (its new value and both moments).
std::set<int> update_dispatches(const plan::Plan& p, const ir::Graph& g, int first_opt,
                                const std::string& name) {
  std::set<std::string> targets = {name, "optim." + name + ".exp_avg", "optim." + name + ".exp_avg_sq"};
  std::vector<int> stack;
  for (int a : g.assigns())
    if (targets.count(g.node(g.node(a).inputs[0]).name)) stack.push_back(g.node(a).inputs[1]);
  std::set<int> seen, ds;
  while (!stack.empty()) {
    int id = stack.back();
    stack.pop_back();
    if (id < first_opt || !seen.insert(id).second) continue;
    if (p.dispatch_of[size_t(id)] >= 0) ds.insert(p.dispatch_of[size_t(id)]);
    for (int in : g.node(id).inputs) stack.push_back(in);
  }
  return ds;
}

TEST_F(VulkanFusion, AdamWUpdateOfOneParameterIsAtMostTwoDispatches) {
  TrainGraph t = fashion_train(models::FashionArch::Mlp, 4);
  const ir::Graph& g = t.g.ir();
  vk::GraphExecutorOptions fo;
  fo.cache_dir = "";
  vk::GraphExecutorOptions uo = fo;
  uo.codegen.kernels.fusion = false;
  vk::GraphExecutor fused(g, *ctx_, fo), plain(g, *ctx_, uo);
  for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    std::set<int> f = update_dispatches(fused.plan(), g, t.first_optimizer_node, name);
    std::set<int> u = update_dispatches(plain.plan(), g, t.first_optimizer_node, name);
    std::printf("AdamW update of %s: %zu dispatches fused, %zu unfused\n", name, f.size(), u.size());
    EXPECT_LE(f.size(), 2u) << name;
    EXPECT_GE(u.size(), 10u) << name;  // the count measures something
  }
}

// The numbers of docs/perf-notes.md ("Pointwise fusion"): dispatches and barrier groups of one training
// step, fusion on and off (compile only).
TEST_F(VulkanFusion, DispatchCountsOfTrainingSteps) {
  auto report = [&](const char* what, const ir::Graph& g) {
    vk::GraphExecutorOptions fo;
    fo.cache_dir = "";
    vk::GraphExecutorOptions uo = fo;
    uo.codegen.kernels.fusion = false;
    vk::GraphExecutor fused(g, *ctx_, fo), plain(g, *ctx_, uo);
    const vk::CompileStats &a = fused.compile_stats(), &b = plain.compile_stats();
    auto in_place = [](const plan::Plan& p) {
      int k = 0;
      for (const plan::Commit& c : p.commits) k += c.in_place;
      return k;
    };
    std::printf(
        "%s: %zu dispatches / %zu groups unfused -> %zu dispatches / %zu groups fused; arena %llu -> %llu "
        "bytes; in-place assigns %d -> %d of %zu\n",
        what, b.kernels, b.groups, a.kernels, a.groups, (unsigned long long)b.arena_bytes,
        (unsigned long long)a.arena_bytes, in_place(plain.plan()), in_place(fused.plan()),
        fused.plan().commits.size());
    EXPECT_LT(a.kernels, b.kernels) << what;
    EXPECT_LE(a.groups, b.groups) << what;
  };
  {
    Graph g = models::fashion_mnist(
        {.arch = models::FashionArch::Cnn, .batch = 64, .mode = Mode::Train, .seed = 7});
    Tensor loss(&g.ir(), *g.ir().find_output("loss"));
    Gradients grads = backward(g, loss);
    append_optimizer(g, grads.params, AdamW{.lr = 1e-3, .weight_decay = 0.01});
    report("fashion-mnist cnn training step (batch 64, AdamW)", g.ir());
  }
  {
    llama::Config c = llama::Config::tiny();
    Graph g = llama::loss_graph(c, {.batch = 2, .seq = 16});
    Tensor loss(&g.ir(), *g.ir().find_output("loss"));
    Gradients grads = backward(g, loss);
    append_optimizer(g, grads.params, AdamW{.lr = 1e-3, .weight_decay = 0.01});
    report("tiny llama training step (batch 2, seq 16, AdamW)", g.ir());
  }
}

// ---- fused dK + dV -------------------------------------------------------------------------------------

struct AttnCfg {
  const char* name;
  int64_t B, Hq, Hkv, Sq, Skv, D, Dv;
  bool causal;
  Shape mask;     // empty: none
  bool inf_rows;  // mask: every third row all -inf, plus random -inf entries
};

// Forward and backward of one attention; `grads` picks which of dq, dk, dv are outputs.
void check_attention(vk::Context& ctx, const AttnCfg& c, const std::vector<const char*>& grads,
                     bool expect_fused) {
  SCOPED_TRACE(c.name);
  mgn::Graph g;
  Shape qs{c.B, c.Hq, c.Sq, c.D}, ks{c.B, c.Hkv, c.Skv, c.D}, vs{c.B, c.Hkv, c.Skv, c.Dv},
      os{c.B, c.Hq, c.Sq, c.Dv};
  Tensor q = g.input("q", qs), k = g.input("k", ks), v = g.input("v", vs), dout = g.input("do", os);
  std::vector<int> fin = {q.id(), k.id(), v.id()};
  int mask_id = -1;
  if (!c.mask.empty()) {
    mask_id = g.input("mask", c.mask).id();
    fin.push_back(mask_id);
  }
  ir::Graph& ir = g.ir();
  ir::Attrs at = ir::Attrs().set("scale", 1.0 / std::sqrt(double(c.D))).set("causal", int64_t(c.causal));
  int on = ir.add(ir::Op::Attention, fin, at), ln = ir.add(ir::Op::AttentionLse, fin, at);
  std::vector<int> gin = {q.id(), k.id(), v.id(), on, dout.id(), ln};
  if (mask_id >= 0) gin.push_back(mask_id);
  std::vector<std::string> names = {"o"};
  ir.add_output("o", on);
  for (const char* gname : grads) {
    ir::Op op = std::string(gname) == "dq"   ? ir::Op::AttentionGradQ
                : std::string(gname) == "dk" ? ir::Op::AttentionGradK
                                             : ir::Op::AttentionGradV;
    ir.add_output(gname, ir.add(op, gin, at));
    names.push_back(gname);
  }
  std::mt19937 rng(11);
  cpu::Executor cpu(ir);
  vk::GraphExecutor gpu(ir, ctx, {.cache_dir = "", .poison = true});
  int kv = 0, separate = 0;
  for (const auto& [name, glsl] : gpu.kernel_sources()) {
    kv += name.rfind("attention_grad_kv_", 0) == 0;
    separate += name.rfind("attention_grad_k_", 0) == 0 || name.rfind("attention_grad_v_", 0) == 0;
  }
  EXPECT_EQ(kv, expect_fused ? 1 : 0);
  int kv_grads = 0;
  for (const char* gname : grads) kv_grads += std::string(gname) != "dq";
  EXPECT_EQ(separate, expect_fused ? 0 : kv_grads);
  for (int id : ir.inputs()) {
    const bool inf_rows = id == mask_id && c.inf_rows;
    std::vector<float> x =
        test::attention_input(rng, size_t(numel(ir.node(id).shape)), ir.node(id).name == "q" ? 2.0f : 1.0f,
                              inf_rows, inf_rows ? c.mask.back() : 1);
    cpu.set_input(ir.node(id).name, x);
    gpu.set_input(ir.node(id).name, x);
  }
  cpu.run();
  gpu.run();
  for (const std::string& name : names) {
    const std::vector<double>& want = cpu.output(name).v;
    std::vector<float> got = gpu.read_output(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    double num = 0, den = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      ASSERT_TRUE(std::isfinite(got[e])) << name << " element " << e;
      double d = double(got[e]) - want[e];
      num += d * d;
      den += want[e] * want[e];
    }
    EXPECT_LE(den == 0 ? std::sqrt(num) : std::sqrt(num / den), 2e-6) << name;
  }
}

const AttnCfg kAttn[] = {
    {"gqa_several_tiles", 1, 4, 2, 70, 9, 6, 5, false, {}, false},
    {"causal_sq_gt_skv", 1, 2, 1, 40, 12, 4, 4, true, {}, false},
    {"causal_sq_lt_skv", 2, 2, 2, 9, 30, 4, 3, true, {}, false},
    {"broadcast_mask_inf_rows", 2, 3, 1, 20, 35, 4, 4, false, {2, 1, 20, 35}, true},
    {"mask_inf_rows_causal", 1, 2, 2, 7, 9, 4, 4, true, {7, 9}, true},
    {"wide_dims", 1, 2, 2, 3, 5, 130, 150, false, {}, false},
};

TEST_F(VulkanFusion, AttentionDkDvFusedMatchesCpu) {
  for (const AttnCfg& c : kAttn) check_attention(*ctx_, c, {"dq", "dk", "dv"}, true);
}

TEST_F(VulkanFusion, AttentionSingleGradientKeepsSeparateKernel) {
  check_attention(*ctx_, kAttn[0], {"dv"}, false);
  check_attention(*ctx_, kAttn[3], {"dq", "dk"}, false);
}

// Transcendental functions of fills inside a fusion: the fill is loaded like any operand (a literal would
// be folded by the shader compiler with other rounding), so fused and unfused agree to the bit.
TEST_F(VulkanFusion, FillOperandsComputeLikeUnfused) {
  Graph g;
  Tensor p0 = g.parameter("p0", {4, 4}, Init::uniform(-1, 1, 5));
  Tensor f = g.full({1, 1}, 0.5);
  Tensor v = p0 * 0.9 + tanh(f) * 0.1 + exp(sigmoid(g.full({4}, 0.3))) * gelu(g.full({}, -1.7));
  assign(p0, v);
  g.output("v", v * 1.0);
  vk::GraphExecutorOptions fo;
  fo.cache_dir = "";
  fo.poison = true;
  vk::GraphExecutorOptions uo = fo;
  uo.codegen.kernels.fusion = false;
  vk::GraphExecutor fused(g.ir(), *ctx_, fo), plain(g.ir(), *ctx_, uo);
  EXPECT_GT(count_fusions(fused.plan()).fused, 0);
  cpu::Executor cpu(g.ir());
  for (int step = 0; step < 2; ++step) {
    fused.run();
    plain.run();
    cpu.run();
    EXPECT_TRUE(same_bits(fused.read_output("v"), plain.read_output("v"))) << "step " << step;
    EXPECT_TRUE(same_bits(fused.read_state("p0"), plain.read_state("p0"))) << "step " << step;
    EXPECT_LE(test::rel_l2(f64(fused.read_state("p0")), cpu.state("p0")), 1e-6) << "step " << step;
  }
}

// ---- GEMV siblings -------------------------------------------------------------------------------------

// Random inputs `names` into the fused and unfused executors and the CPU reference, one run each (the Vulkan
// ones `runs` times), then every output of `outputs`: fused bitwise as unfused, and within 1e-6 of the CPU's.
// No cache folder, poisoned memory (a value the kernel forgot to write shows), fusion on or off.
vk::GraphExecutorOptions poisoned(bool fusion) {
  vk::GraphExecutorOptions o;
  o.cache_dir = "";
  o.poison = true;
  o.codegen.kernels.fusion = fusion;
  return o;
}

void check_fused_outputs(const ir::Graph& g, vk::GraphExecutor& fused, vk::GraphExecutor& plain,
                         const std::vector<std::string>& names, const std::vector<std::string>& outputs,
                         unsigned seed, int runs = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  cpu::Executor cpu(g);
  for (const std::string& name : names) {
    std::vector<float> v(size_t(numel(g.node(*g.find_named(name)).shape)));
    for (float& x : v) x = dist(rng);
    fused.set_input(name, v);
    plain.set_input(name, v);
    cpu.set_input(name, v);
  }
  for (int rep = 0; rep < runs; ++rep) {
    fused.run();
    plain.run();
  }
  cpu.run();
  for (const std::string& o : outputs) {
    const std::vector<float> a = fused.read_output(o);
    EXPECT_TRUE(same_bits(a, plain.read_output(o))) << o;
    EXPECT_LE(test::rel_l2(f64(a), cpu.output(o).v), 1e-6) << o;
  }
}

// One token's projections of the same input (q, k, v; gate, up: M = 1, weights [N, K] read along K) share one
// dispatch, each output computed as its own kernel computes it: bitwise equal to the session without fusion,
// and within f32 rounding of the CPU reference (double). Five linears of h: the first four (the group's cap)
// fuse, the fifth stays alone; a linear of another input and a 9-row one (M > 8) do not join.
TEST_F(VulkanFusion, GemvSiblingsShareOneDispatch) {
  Graph g;
  const int64_t K = 200;
  Tensor h = g.input("h", {1, K});
  std::vector<Tensor> outs;
  const int64_t ns[] = {48, 16, 16, 72, 24};
  for (int j = 0; j < 5; ++j)
    outs.push_back(linear(h, g.parameter("w" + std::to_string(j), {ns[j], K}, Init::uniform(-0.5, 0.5, uint64_t(j + 1)))));
  Tensor other = g.input("other", {1, K});
  outs.push_back(linear(other, g.parameter("w_other", {8, K}, Init::uniform(-0.5, 0.5, 11))));
  Tensor rows = g.input("rows", {9, K});
  outs.push_back(linear(rows, g.parameter("w_rows", {8, K}, Init::uniform(-0.5, 0.5, 12))));
  for (size_t j = 0; j < outs.size(); ++j) g.output("y" + std::to_string(j), outs[j]);
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  int groups = 0;
  for (const plan::Dispatch& d : fused.plan().dispatches)
    if (d.nodes.size() > 1) {
      ++groups;
      EXPECT_EQ(d.nodes.size(), codegen::kMaxGemvSiblings);
      for (int id : d.nodes) EXPECT_EQ(g.ir().node(id).op, ir::Op::MatMul);
    }
  EXPECT_EQ(groups, 1);
  bool named = false;
  for (const auto& [name, glsl] : fused.kernel_sources()) named = named || name.rfind("matmul_small_siblings4", 0) == 0;
  EXPECT_TRUE(named);
  EXPECT_EQ(fused.compile_stats().kernels + 3, plain.compile_stats().kernels);
  std::vector<std::string> names;
  for (size_t j = 0; j < outs.size(); ++j) names.push_back("y" + std::to_string(j));
  check_fused_outputs(g.ir(), fused, plain, {"h", "other", "rows"}, names, 3);
}

// A residual add behind a token's projection (and a pointwise chain after it) runs in the projection's dispatch,
// after its reduction, bitwise as the separate kernels compute it. Cases: y = r + h·W0ᵀ with out = silu(y) * 2
// (the matmul's value internal); a matmul whose value is also an output (stored as well); and p = h * 2 read by
// both the matmul and the add (N = K): the add joins the matmul, p stays outside (the matmul reads all of it).
TEST_F(VulkanFusion, GemvEpilogueRunsInTheMatmulsDispatch) {
  Graph g;
  const int64_t K = 96;
  Tensor h = g.input("h", {1, K}), r = g.input("r", {1, 40});
  Tensor y = r + linear(h, g.parameter("w0", {40, K}, Init::uniform(-0.5, 0.5, 1)));
  g.output("out", silu(y) * 2.0);
  Tensor m1 = linear(h * 0.5 + 1.0, g.parameter("w1", {24, K}, Init::uniform(-0.5, 0.5, 2)));
  g.output("m1", m1);
  g.output("m1_plus", m1 + g.input("r1", {1, 24}));
  Tensor p = h * 2.0;
  g.output("self", linear(p, g.parameter("w2", {K, K}, Init::uniform(-0.5, 0.5, 3))) + p);
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  int epilogues = 0;
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    if (!codegen::gemv_epilogue(g.ir(), d.nodes)) continue;
    ++epilogues;
    for (int id : d.nodes) {  // a matmul never shares a dispatch with the computation of its own operand
      if (g.ir().node(id).op != ir::Op::MatMul) continue;
      for (int x : g.ir().node(id).inputs) EXPECT_EQ(std::count(d.nodes.begin(), d.nodes.end(), x), 0) << id;
    }
  }
  // out's chain and p's add (p itself stays outside: the matmul reads it); m1's matmul takes its operand's
  // pointwise nodes as a prologue as well (VulkanFusion.PointwisePrologueRunsInTheGemvsKLoop), so its add is
  // counted there.
  EXPECT_EQ(epilogues, 2);
  int prologue_epilogues = 0;
  for (const plan::Dispatch& d : fused.plan().dispatches)
    prologue_epilogues += codegen::gemv_pointwise_prologue(g.ir(), d.nodes) &&
                          g.ir().node(d.nodes.back()).op != ir::Op::MatMul;
  EXPECT_EQ(prologue_epilogues, 1);
  check_fused_outputs(g.ir(), fused, plain, {"h", "r", "r1"}, {"out", "m1", "m1_plus", "self"}, 5, 2);
}

// The pointwise readers of a matmul that lowers to the tiled GEMM (bias, activation, residual add: a
// transformer's linears at many tokens) run where the GEMM stores its output: in the tiled kernel's store, or,
// when K is split, in the split-K sum. The same float operations on the same values, so bitwise the session
// without fusion, and within f32 rounding of the CPU reference. Cases: a batched linear (2 x 20 rows) with bias,
// GELU and a residual (one K slice, no split; N a multiple of 4); N = 30 (scalar stores) with bias and ReLU; a
// long K (split 8 ways) whose matmul value is an output too (the epilogue stores it as well) with a residual; and
// a split one of 15 x 13 outputs (not a multiple of 4: the scalar sum); and five nodes behind an unsplit GEMM, of
// which its store takes only kStoreEpilogueNodes.
TEST_F(VulkanFusion, TiledGemmEpilogueRunsInTheStoreOrTheSplitSum) {
  Graph g;
  auto w = [&](const std::string& name, Shape shape, uint64_t seed) {
    return g.parameter(name, std::move(shape), Init::uniform(-0.3, 0.3, seed));
  };
  Tensor x = g.input("x", {2, 20, 48}), r = g.input("r", {2, 20, 36});
  g.output("block", r + gelu(linear(x, w("w0", {36, 48}, 1), w("b0", {36}, 2))));
  g.output("narrow", relu(linear(x, w("w1", {30, 48}, 3), w("b1", {30}, 4))));
  Tensor xl = g.input("xl", {16, 1024}), rl = g.input("rl", {16, 24});
  Tensor long_mm = linear(xl, w("w2", {24, 1024}, 5));
  g.output("long_mm", long_mm);
  g.output("long_res", (long_mm + rl) * 0.5);
  Tensor xo = g.input("xo", {15, 1024});
  g.output("odd", tanh(linear(xo, w("w3", {13, 1024}, 6))));
  // Five pointwise nodes behind an unsplit GEMM: its store takes kStoreEpilogueNodes of them, the rest run apart.
  g.output("deep", sigmoid(relu(linear(x, w("w4", {16, 48}, 7), w("b4", {16}, 8)) * 2.0) - 0.5) + 1.0);
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  int epilogues = 0, matmuls = 0;
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    for (int id : d.nodes) matmuls += g.ir().node(id).op == ir::Op::MatMul;
    if (!codegen::gemv_epilogue(g.ir(), d.nodes)) continue;
    ++epilogues;
    for (int id : d.nodes)
      if (g.ir().node(id).op == ir::Op::MatMul) {
        EXPECT_TRUE(codegen::tiled_gemm_epilogue(g.ir(), g.ir().node(id), ctx_->caps(), {})) << id;
        if (codegen::tiled_gemm_epilogue_room(g.ir(), g.ir().node(id), ctx_->caps(), {}) == codegen::kStoreEpilogueNodes) {
          EXPECT_LE(d.nodes.size(), 1 + codegen::kStoreEpilogueNodes) << id;
        }
        for (int in : g.ir().node(id).inputs) EXPECT_EQ(std::count(d.nodes.begin(), d.nodes.end(), in), 0) << id;
      }
  }
  EXPECT_EQ(matmuls, 5);
  EXPECT_EQ(epilogues, 5);  // every matmul took its readers
  EXPECT_LT(fused.plan().dispatches.size(), plain.plan().dispatches.size());
  check_fused_outputs(g.ir(), fused, plain, {"x", "r", "xl", "rl", "xo"},
                      {"block", "narrow", "long_mm", "long_res", "odd", "deep"}, 7, 2);
  // The split: long K's GEMM is two kernels (partials, then the sum with the epilogue).
  const GemmTile t = codegen::resolve_simt_tile(codegen::matmul_shape(g.ir(), g.ir().node(long_mm.id())), ctx_->caps(), {});
  EXPECT_GT(t.splits, 1u);
}

// Tiled matmuls of one left operand (a layer's q, k, v; gate, up) run as one grouped GEMM: one grid over the
// blocks of all of them, each block inside one product, and one split-K sum for all. Cases: four linears of a
// batched x (2 x 40 rows: a row edge; N = 96, 32, 32, 32; the fourth with a bias, which then runs apart,
// since a grouped GEMM takes no epilogue), K = 64 (no split); gate and up of a 512-deep x (split K) read by
// silu(gate)·up, gate also an output; a linear of x with N = 48 (no multiple of 32) and one of another input
// stay alone. Values within f32 rounding of the CPU reference (double) and of the session without fusion (the
// grouped shape may split K otherwise) and bitwise the same run to run and with the split summed by a second
// kernel (KernelOptions::gemm_splitk_fixup off); with KernelOptions::gemm_siblings off, no group (and bitwise
// the session without fusion).
TEST_F(VulkanFusion, SiblingGemmsRunAsOneGroupedGemm) {
  Graph g;
  auto w = [&](const std::string& name, Shape shape, uint64_t seed) {
    return g.parameter(name, std::move(shape), Init::uniform(-0.3, 0.3, seed));
  };
  Tensor x = g.input("x", {2, 40, 64});
  g.output("q", linear(x, w("wq", {96, 64}, 1)));
  g.output("k", linear(x, w("wk", {32, 64}, 2)));
  g.output("v", linear(x, w("wv", {32, 64}, 3)));
  g.output("qb", linear(x, w("wb", {32, 64}, 4), w("bb", {32}, 5)));
  g.output("odd", linear(x, w("wo", {48, 64}, 6)));
  Tensor xl = g.input("xl", {40, 512});
  Tensor gate = linear(xl, w("wg", {64, 512}, 7)), up = linear(xl, w("wu", {64, 512}, 8));
  g.output("gate", gate);
  g.output("mlp", silu(gate) * up);
  g.output("other", linear(g.input("y", {2, 40, 64}), w("wy", {32, 64}, 9)));
  const std::vector<std::string> inputs = {"x", "xl", "y"},
                                 outputs = {"q", "k", "v", "qb", "odd", "gate", "mlp", "other"};
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  vk::GraphExecutorOptions apart_options = poisoned(true);
  apart_options.codegen.kernels.gemm_siblings = false;
  vk::GraphExecutor apart(g.ir(), *ctx_, apart_options);
  vk::GraphExecutorOptions summed_options = poisoned(true);
  summed_options.codegen.kernels.gemm_splitk_fixup = false;
  vk::GraphExecutor summed(g.ir(), *ctx_, summed_options);
  auto groups = [&](vk::GraphExecutor& e) {
    std::multiset<size_t> sizes;
    for (const plan::Dispatch& d : e.plan().dispatches)
      if (d.nodes.size() > 1 && std::all_of(d.nodes.begin(), d.nodes.end(),
                                            [&](int id) { return g.ir().node(id).op == ir::Op::MatMul; }))
        sizes.insert(d.nodes.size());
    return sizes;
  };
  EXPECT_EQ(groups(fused), (std::multiset<size_t>{2, 4}));
  EXPECT_TRUE(groups(apart).empty());
  for (const auto& [name, glsl] : fused.kernel_sources()) {
    if (name.rfind("matmul_grouped_", 0) == 0) {
      EXPECT_NE(glsl.find("SEG_N0"), std::string::npos) << name;
    }
  }
  bool grouped = false, grouped_split = false, grouped_sum = false;
  for (const auto& [name, glsl] : fused.kernel_sources()) {
    grouped = grouped || name.rfind("matmul_grouped_", 0) == 0;
    grouped_split =
        grouped_split || (name.rfind("matmul_grouped_", 0) == 0 && name.find("_s4") != std::string::npos &&
                          name.find("_fx") != std::string::npos);
  }
  for (const auto& [name, glsl] : summed.kernel_sources())
    grouped_sum = grouped_sum || name.rfind("matmul_splitk_sum_4_x2", 0) == 0;
  EXPECT_TRUE(grouped);
  EXPECT_TRUE(grouped_split);  // gate and up: K split 4 ways, summed by the GEMM's last blocks
  EXPECT_TRUE(grouped_sum);    // ... or by one sum kernel for both (KernelOptions::gemm_splitk_fixup off)
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  cpu::Executor cpu(g.ir());
  for (const std::string& name : inputs) {
    std::vector<float> v(size_t(numel(g.ir().node(*g.ir().find_named(name)).shape)));
    for (float& e : v) e = dist(rng);
    for (vk::GraphExecutor* e : {&fused, &plain, &apart, &summed}) e->set_input(name, v);
    cpu.set_input(name, v);
  }
  for (int rep = 0; rep < 2; ++rep)
    for (vk::GraphExecutor* e : {&fused, &plain, &apart, &summed}) e->run();
  cpu.run();
  for (const std::string& o : outputs) {
    const std::vector<float> a = fused.read_output(o);
    EXPECT_LE(test::rel_l2(f64(a), cpu.output(o).v), 1e-6) << o;
    EXPECT_LE(test::rel_l2(f64(a), f64(plain.read_output(o))), 1e-6) << o;
    EXPECT_TRUE(same_bits(apart.read_output(o), plain.read_output(o))) << o;  // the rest of fusion is bitwise
    EXPECT_TRUE(same_bits(a, summed.read_output(o))) << o;  // the split-K fixup adds as the sum kernel does
  }
  fused.run();  // run to run: bitwise the same
  for (const std::string& o : outputs) {
    std::vector<float> again = fused.read_output(o);
    fused.run();
    EXPECT_TRUE(same_bits(again, fused.read_output(o))) << o;
  }
}

// Which matmuls group (codegen::gemm_sibling_key) on a big GPU's caps (the defaults): SmolLM2-135M's
// projections at 128 tokens (q 576, k and v 192, gate and up 1536 wide: each alone a grid below 256 blocks)
// do, and the grouped shape takes a block that divides every product; Whisper's at batch 8 (12,000 rows: 282
// blocks alone) do not; neither does a product of another left operand, of another K, a batched right
// operand, N = 48, or a non-transposed weight; nor anything with the option off.
TEST(GemmSiblingRule, SmallGridsOfOneLeftOperandGroup) {
  const codegen::DeviceCaps big;
  Graph g;
  Tensor h = g.input("h", {1, 128, 576});
  auto lin = [&](const Tensor& x, int64_t n, const std::string& name) {
    return linear(x, g.parameter(name, {n, x.shape().back()}));
  };
  Tensor q = lin(h, 576, "q"), k = lin(h, 192, "k"), gate = lin(h, 1536, "gate");
  Tensor other = lin(g.input("h2", {1, 128, 576}), 192, "o2");
  Tensor odd = lin(h, 48, "odd");
  Tensor plain_b = matmul(h, g.parameter("wn", {576, 64}));
  Tensor batched_b = matmul(h, g.input("bw", {1, 64, 576}), false, true);
  Tensor whisper = lin(g.input("x8", {8, 1500, 384}), 384, "w8");
  const codegen::CodegenOptions on;
  codegen::CodegenOptions off;
  off.kernels.gemm_siblings = false;
  auto key = [&](const Tensor& t, const codegen::CodegenOptions& o = {}) {
    return codegen::gemm_sibling_key(g.ir(), g.ir().node(t.id()), big, o);
  };
  EXPECT_FALSE(key(q).empty());
  EXPECT_EQ(key(q), key(k));
  EXPECT_EQ(key(q), key(gate));
  EXPECT_NE(key(q), key(other));
  EXPECT_FALSE(key(other).empty());
  EXPECT_TRUE(key(odd).empty());
  EXPECT_TRUE(key(plain_b).empty());
  EXPECT_TRUE(key(batched_b).empty());
  EXPECT_TRUE(key(whisper).empty());
  EXPECT_TRUE(key(q, off).empty());
  // q, k, v side by side: 128 x 960 x 576 in 32x32 blocks (120), K split 4 ways; the last block of each tile
  // to arrive sums the splits and stores its product's part (one counter per tile); or a sum kernel stores
  // all three.
  const int v = lin(h, 192, "v").id();
  const codegen::Lowering l = codegen::lower_gemm_siblings(g.ir(), {q.id(), k.id(), v}, big, on);
  ASSERT_EQ(l.kernels.size(), 1u);
  EXPECT_NE(l.kernels[0].glsl.find("BM = 32u, BN = 32u"), std::string::npos);
  EXPECT_NE(l.kernels[0].name.find("_s4"), std::string::npos) << l.kernels[0].name;
  EXPECT_EQ(l.kernels[0].bindings.size(),
            1u + 3u + 1u + 1u + 3u);  // A, 3 weights, partials, counters, 3 outputs
  EXPECT_EQ(l.counter_words, 120u);
  ASSERT_EQ(l.scratch_words.size(), 1u);
  EXPECT_EQ(l.scratch_words[0], 4u * 128u * 960u);
  codegen::CodegenOptions summed = on;
  summed.kernels.gemm_splitk_fixup = false;
  const codegen::Lowering two = codegen::lower_gemm_siblings(g.ir(), {q.id(), k.id(), v}, big, summed);
  ASSERT_EQ(two.kernels.size(), 2u);
  EXPECT_EQ(two.kernels[1].bindings.size(), 4u);
  EXPECT_EQ(two.counter_words, 0u);
  // gate and up: 128 x 3072 x 576, 384 blocks: no split, one kernel storing both.
  const codegen::Lowering mlp =
      codegen::lower_gemm_siblings(g.ir(), {gate.id(), lin(h, 1536, "up").id()}, big, on);
  ASSERT_EQ(mlp.kernels.size(), 1u);
  EXPECT_EQ(mlp.kernels[0].bindings.size(), 5u);
  EXPECT_TRUE(mlp.scratch_words.empty());
}

// A store epilogue only behind GEMMs whose threads hold at most kStoreEpilogueAccumulators (4x4) results: on
// a big GPU's caps (the defaults), Whisper's batch-8 linears (12,000 rows) take the 128x128 block with 8x8
// per thread and store C themselves; the same layer at batch 1 (1,500 rows: 64x64 blocks, 4x4) takes its bias
// and activation; a weight gradient's product (no Parameter operand) takes none; split K takes any number (up
// to kStoreEpilogueNodes in the GEMM's fixup, more in a sum kernel).
TEST(GemmEpilogueRule, StoreEpilogueOnlyBehindFourByFourThreadTiles) {
  const codegen::DeviceCaps big;
  Graph g;
  auto fc1 = [&](int64_t rows) {
    return linear(g.input("x" + std::to_string(rows), {rows, 384}), g.parameter("w" + std::to_string(rows), {1536, 384}));
  };
  Tensor b8 = fc1(12000), b1 = fc1(1500);
  Tensor dw = matmul(g.input("gy", {200, 1536}), g.input("xt", {200, 384}), true, false);  // gyᵀ·x: no Parameter, K unsplit
  Tensor split = linear(g.input("xl", {16, 1024}), g.parameter("wl", {24, 1024}));
  auto tile = [&](const Tensor& t) {
    return codegen::resolve_simt_tile(codegen::matmul_shape(g.ir(), g.ir().node(t.id())), big, {});
  };
  auto room = [&](const Tensor& t) { return codegen::tiled_gemm_epilogue_room(g.ir(), g.ir().node(t.id()), big, {}); };
  EXPECT_EQ(tile(b8).tm * tile(b8).tn, 64u);
  EXPECT_EQ(tile(b8).splits, 1u);
  EXPECT_EQ(room(b8), 0u);
  EXPECT_EQ(tile(b1).tm * tile(b1).tn, 16u);
  EXPECT_EQ(tile(b1).splits, 1u);
  EXPECT_EQ(room(b1), codegen::kStoreEpilogueNodes);
  EXPECT_EQ(tile(dw).splits, 1u);
  EXPECT_EQ(room(dw), 0u);
  EXPECT_GT(tile(split).splits, 1u);
  EXPECT_EQ(room(split), SIZE_MAX);
  // Split K: the GEMM's last blocks sum the splits and evaluate an epilogue of up to kStoreEpilogueNodes
  // nodes (one kernel); a longer one (an optimizer's update) runs in the second kernel that sums.
  std::vector<int> nodes = {split.id()};
  Tensor t = split;
  for (int j = 0; j < 5; ++j) {
    t = t * 0.5 + 1.0;
    nodes.push_back(g.ir().node(t.id()).inputs[0]);
    nodes.push_back(t.id());
  }
  auto kernels = [&](size_t count) {
    const std::vector<int> part(nodes.begin(), nodes.begin() + std::ptrdiff_t(count));
    std::vector<bool> stored(count, false);
    stored.back() = true;
    return codegen::lower_tiled_gemm_epilogue(g.ir(), part, stored, big, {}).kernels.size();
  };
  EXPECT_EQ(kernels(1 + codegen::kStoreEpilogueNodes), 1u);
  EXPECT_EQ(kernels(1 + codegen::kStoreEpilogueNodes + 1), 2u);
}

// An rms_norm whose every reader is a token projection of it (q, k, v behind a Llama layer's input norm) runs
// in the projections' GEMV dispatch: each workgroup sums x·gamma·W and x² in one pass, so the normalized row is
// never stored. Not bitwise the separate kernels' (x is scaled after the sum, not before), so fused and plain
// are each checked against the CPU reference in double. Cases: a norm with gamma read by three linears (one
// dispatch of 4 nodes); a norm without gamma read by one linear; a norm that is also an output, one read by a
// pointwise node as well, one with M = 9 rows, and one read by five linears keep their own dispatch (their
// linears still fuse as siblings where they can).
TEST_F(VulkanFusion, RmsNormLeadsTheGemvOfItsProjections) {
  Graph g;
  const int64_t K = 160;
  uint64_t seed = 1;
  auto w = [&](int64_t n) {
    const uint64_t s = seed++;
    return g.parameter("w" + std::to_string(s), {n, K}, Init::uniform(-0.5, 0.5, s));
  };
  auto gamma = [&] {
    const uint64_t s = seed++;
    return g.parameter("g" + std::to_string(s), {K}, Init::uniform(0.5, 1.5, s));
  };
  Tensor x = g.input("x", {2, K});
  Tensor a = rms_norm(x, gamma(), 1e-5);
  g.output("q", linear(a, w(48)));
  g.output("k", linear(a, w(16)));
  g.output("v", linear(a, w(16)));
  g.output("plain_norm", linear(rms_norm(g.input("x1", {1, 1, K}), std::nullopt, 1e-6), w(24)));
  Tensor kept = rms_norm(g.input("x2", {1, K}), gamma(), 1e-5);
  g.output("kept", kept);
  g.output("kept_mm", linear(kept, w(8)));
  Tensor shared = rms_norm(g.input("x3", {1, K}), gamma(), 1e-5);
  g.output("shared_mm", linear(shared, w(8)));
  g.output("shared_pw", shared * 2.0);
  g.output("rows_mm", linear(rms_norm(g.input("x4", {9, K}), gamma(), 1e-5), w(8)));
  Tensor five = rms_norm(g.input("x5", {1, K}), gamma(), 1e-5);
  for (int j = 0; j < 5; ++j) g.output("five" + std::to_string(j), linear(five, w(8)));
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  std::vector<size_t> prologues;  // nodes per dispatch led by a norm
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    if (d.nodes.size() < 2 || g.ir().node(d.nodes[0]).op != ir::Op::RmsNorm) continue;
    prologues.push_back(d.nodes.size());
    for (size_t k = 1; k < d.nodes.size(); ++k) {
      const ir::Node& mm = g.ir().node(d.nodes[k]);
      EXPECT_EQ(mm.op, ir::Op::MatMul);
      EXPECT_EQ(mm.inputs[0], d.nodes[0]);
    }
  }
  std::sort(prologues.begin(), prologues.end());
  EXPECT_EQ(prologues, (std::vector<size_t>{2, 4}));
  int named = 0;
  for (const auto& [name, glsl] : fused.kernel_sources()) named += name.rfind("matmul_small_rms_siblings", 0) == 0;
  EXPECT_EQ(named, 2);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  cpu::Executor cpu(g.ir());
  for (const char* name : {"x", "x1", "x2", "x3", "x4", "x5"}) {
    std::vector<float> v(size_t(numel(g.ir().node(*g.ir().find_named(name)).shape)));
    for (float& e : v) e = dist(rng);
    fused.set_input(name, v);
    plain.set_input(name, v);
    cpu.set_input(name, v);
  }
  fused.run();
  fused.run();  // the second run reads nothing the first left behind
  plain.run();
  cpu.run();
  for (const auto& [name, id] : g.ir().outputs()) {
    EXPECT_LE(test::rel_l2(f64(fused.read_output(name)), cpu.output(name).v), 1e-6) << name;
    EXPECT_LE(test::rel_l2(f64(plain.read_output(name)), cpu.output(name).v), 1e-6) << name;
  }
}

// Two ropes of the same cos and sin tables (q and k of one attention) share a dispatch, each element computed
// as the rope kernel alone computes it (bitwise equal to the session without fusion, and within rounding of
// the CPU reference). A rope of a rope of the same tables does not pair with the rope it reads, and stays open to
// the next one (e).
TEST_F(VulkanFusion, RopesOfOneTablePair) {
  Graph g;
  Tensor cs = g.input("cos", {3, 4}), sn = g.input("sin", {3, 4});
  g.output("q", rope(g.input("xq", {1, 4, 3, 8}), cs, sn));
  g.output("k", rope(g.input("xk", {1, 2, 3, 8}), cs, sn));
  Tensor once = rope(g.input("xc", {2, 3, 8}), cs, sn);
  g.output("twice", rope(once, cs, sn));
  g.output("e", rope(g.input("xe", {3, 8}), cs, sn));
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  int pairs = 0;
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    if (d.nodes.size() != 2 || g.ir().node(d.nodes[0]).op != ir::Op::Rope) continue;
    ++pairs;
    const ir::Node& second = g.ir().node(d.nodes[1]);
    EXPECT_EQ(second.op, ir::Op::Rope);
    EXPECT_NE(second.inputs[0], d.nodes[0]) << "a rope paired with the rope it reads";
  }
  EXPECT_EQ(pairs, 2);  // q with k, twice with e
  check_fused_outputs(g.ir(), fused, plain, {"cos", "sin", "xq", "xk", "xc", "xe"}, {"q", "k", "twice", "e"}, 9);
}

// A rope reads its input through the head split that makes it ([B, S, H, D] -> [B, H, S, D], a permute that keeps
// the last axis and has no other reader), so the permuted copy is not made: q and k with their permutes are one
// dispatch. A permute that is also an output, and one that moves the last axis, stay their own kernels (their
// ropes still pair). Bitwise the session without fusion, within rounding of the CPU reference.
TEST_F(VulkanFusion, RopesReadThroughTheirHeadSplit) {
  Graph g;
  Tensor cs = g.input("cos", {3, 4}), sn = g.input("sin", {3, 4});
  g.output("q", rope(transpose(g.input("xq", {2, 3, 4, 8}), 1, 2), cs, sn));
  g.output("k", rope(transpose(g.input("xk", {2, 3, 2, 8}), 1, 2), cs, sn));
  Tensor tv = transpose(g.input("xv", {1, 3, 2, 8}), 1, 2);
  g.output("v", rope(tv, cs, sn));
  g.output("tv", tv);
  g.output("w", rope(permute(g.input("xw", {8, 3}), {1, 0}), cs, sn));
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  std::vector<std::string> groups;  // per rope dispatch: its ops, in node order
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    bool has_rope = false;
    std::string ops;
    for (int id : d.nodes) {
      has_rope = has_rope || g.ir().node(id).op == ir::Op::Rope;
      ops += std::string(ops.empty() ? "" : " ") + ir::op_name(g.ir().node(id).op);
    }
    if (has_rope) groups.push_back(ops);
  }
  std::sort(groups.begin(), groups.end());
  EXPECT_EQ(groups, (std::vector<std::string>{"permute rope permute rope", "rope rope"}));
  int through = 0, permutes = 0;
  for (const auto& [name, glsl] : fused.kernel_sources()) {
    through += name.rfind("rope_pair_[2,4,3,8]p_[2,2,3,8]p", 0) == 0;
    permutes += name.rfind("permute", 0) == 0;
  }
  EXPECT_EQ(through, 1);
  EXPECT_EQ(permutes, 2);  // tv's and xw's
  check_fused_outputs(g.ir(), fused, plain, {"cos", "sin", "xq", "xk", "xv", "xw"}, {"q", "k", "v", "tv", "w"}, 10, 2);
}

// The pointwise nodes that compute a token projection's left operand and nothing else run inside the GEMV's K
// loop (silu(gate)·up before a Llama down projection), bitwise as their own kernel stores that operand. Cases:
// the Llama MLP (gate and up siblings, then silu·mul as the down projection's prologue and the residual add as
// its epilogue); one prologue shared by two sibling matmuls; an operand that is also an output, and one whose
// prologue has a node read elsewhere (no prologue); an epilogue that reads what the prologue reads (prologue
// only, the add alone).
TEST_F(VulkanFusion, PointwisePrologueRunsInTheGemvsKLoop) {
  Graph g;
  const int64_t K = 72;
  uint64_t seed = 1;
  auto w = [&](int64_t n, int64_t k) {
    const uint64_t s = seed++;
    return g.parameter("w" + std::to_string(s), {n, k}, Init::uniform(-0.5, 0.5, s));
  };
  Tensor x = g.input("x", {1, K}), r = g.input("r", {1, K});
  Tensor gate = linear(x, w(96, K)), up = linear(x, w(96, K));
  g.output("mlp", r + linear(silu(gate) * up, w(K, 96)));
  Tensor p = x * 2.0 + 1.0;
  g.output("s0", linear(p, w(16, K)));
  g.output("s1", linear(p, w(24, K)));
  Tensor kept = x * 3.0;
  g.output("kept", kept);
  g.output("kept_mm", linear(kept, w(8, K)));
  Tensor t = x - 1.0;
  g.output("t_pw", t * t);
  g.output("t_mm", linear(exp(t), w(8, K)));
  Tensor y = g.input("y", {1, K});
  g.output("apart", y + linear(y * 0.5, w(K, K)));
  g.output("rows", linear(sigmoid(g.input("x3", {3, K})), w(40, K)));  // M = 3: A(m, k) at row m
  vk::GraphExecutor fused(g.ir(), *ctx_, poisoned(true)), plain(g.ir(), *ctx_, poisoned(false));
  std::vector<std::string> shapes;  // per prologue dispatch: "<prologue nodes>+<matmuls>+<epilogue nodes>"
  for (const plan::Dispatch& d : fused.plan().dispatches) {
    if (!codegen::gemv_pointwise_prologue(g.ir(), d.nodes)) continue;
    int pre = 0, mm = 0, post = 0;
    for (int id : d.nodes) {
      if (g.ir().node(id).op == ir::Op::MatMul) ++mm;
      else (mm ? post : pre) += 1;
    }
    shapes.push_back(std::to_string(pre) + "+" + std::to_string(mm) + "+" + std::to_string(post));
  }
  std::sort(shapes.begin(), shapes.end());
  // apart's y * 0.5 (its add alone); rows' sigmoid; s0/s1's x * 2 + 1; the MLP's silu, mul and add. Not
  // t_mm: t, exp(t) and t_pw are one pointwise group, and t_pw is an output.
  EXPECT_EQ(shapes, (std::vector<std::string>{"1+1+0", "1+1+0", "2+1+1", "2+2+0"}));
  int named = 0;
  for (const auto& [name, glsl] : fused.kernel_sources()) named += name.rfind("matmul_small_prologue", 0) == 0;
  EXPECT_EQ(named, 4);
  check_fused_outputs(g.ir(), fused, plain, {"x", "r", "y", "x3"},
                      {"mlp", "s0", "s1", "kept", "kept_mm", "t_pw", "t_mm", "apart", "rows"}, 13, 2);
}

// Random token-projection graphs (a decode step's shape: M <= 3 rows of width K): rms_norm, pointwise chains,
// linears of K -> K (so projections and residuals share shapes) and K -> N, reading one operand from several
// linears (siblings), norms read by projections only or by other nodes too, ropes of one table, several outputs.
// Whatever the GEMV fusions (siblings, epilogues, norm and pointwise prologues, rope pairs) make of them, the
// fused session matches the CPU reference and the session without fusion (not bitwise: the norm prologue
// scales after the sum).
TEST_F(VulkanFusion, RandomTokenProjectionsMatchCpuAndUnfused) {
  int prologues = 0, epilogues = 0, siblings = 0, ropes = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](int n) { return int(rng() % uint64_t(n)); };
    Graph g;
    const int64_t M = 1 + pick(3), K = 16, N = 24;
    std::vector<std::pair<std::string, Shape>> inputs = {{"x", {M, K}}, {"r", {M, K}}};
    std::vector<Tensor> pool = {g.input("x", {M, K}), g.input("r", {M, K})};
    Tensor cs = g.input("cos", {M, K / 2}), sn = g.input("sin", {M, K / 2});
    inputs.push_back({"cos", {M, K / 2}});
    inputs.push_back({"sin", {M, K / 2}});
    uint64_t wseed = seed * 100;
    auto weight = [&](int64_t n) {
      const uint64_t ws = wseed++;
      return g.parameter("w" + std::to_string(ws), {n, K}, Init::uniform(-0.4, 0.4, ws));
    };
    auto operand = [&]() { return pool[pool.size() - 1 - size_t(pick(std::min<int>(int(pool.size()), 4)))]; };
    std::vector<Tensor> outs;
    const int ops = 6 + pick(10);
    for (int k = 0; k < ops; ++k) {
      Tensor x = operand(), y;
      switch (pick(8)) {
        case 0:
          y = rms_norm(x, g.parameter("g" + std::to_string(wseed), {K}, Init::uniform(0.5, 1.5, wseed)), 1e-5);
          ++wseed;
          break;
        case 1:
          y = linear(x, weight(K));
          break;
        case 2: {  // siblings of one operand, one of width N kept as an output
          Tensor a = linear(x, weight(K));
          outs.push_back(linear(x, weight(N)));
          y = a;
          break;
        }
        case 3:
          y = silu(linear(x, weight(K))) * linear(x, weight(K));
          break;
        case 4:
          y = x + linear(operand(), weight(K));  // a residual epilogue
          break;
        case 5:
          y = tanh(x) * 0.5 + pool[size_t(pick(int(pool.size())))] * 0.25;
          break;
        case 6: {  // two ropes of one table
          Tensor a = rope(reshape(x, {1, M, K}), cs, sn), b = rope(reshape(operand(), {1, M, K}), cs, sn);
          y = reshape(a, {M, K}) + reshape(b, {M, K}) * 0.5;
          break;
        }
        case 7:
          y = linear(sigmoid(x) * 2.0 - 1.0, weight(K));  // a pointwise prologue
          break;
      }
      pool.push_back(y);
    }
    outs.push_back(pool.back());
    outs.push_back(pool[size_t(2 + pick(int(pool.size()) - 2))]);
    for (size_t i = 0; i < outs.size(); ++i) g.output("out" + std::to_string(i), outs[i]);
    const ir::Graph& ir = g.ir();
    SCOPED_TRACE("seed " + std::to_string(seed) + "\n" + ir::to_text(ir));
    vk::GraphExecutor fused(ir, *ctx_, poisoned(true)), plain(ir, *ctx_, poisoned(false));
    for (const plan::Dispatch& d : fused.plan().dispatches) {
      if (d.nodes.size() < 2) continue;
      const ir::Op first = ir.node(d.nodes[0]).op;
      prologues += first == ir::Op::RmsNorm || codegen::gemv_pointwise_prologue(ir, d.nodes);
      epilogues += codegen::gemv_epilogue(ir, d.nodes);
      siblings += first == ir::Op::MatMul && ir.node(d.nodes[1]).op == ir::Op::MatMul;
      ropes += first == ir::Op::Rope;
    }
    cpu::Executor cpu(ir);
    for (const auto& [name, shape] : inputs) {
      std::vector<double> v = test::random_normal(size_t(numel(shape)), seed * 10 + name.size());
      std::vector<float> f(v.begin(), v.end());
      cpu.set_input(name, f);
      fused.set_input(name, f);
      plain.set_input(name, f);
    }
    cpu.run();
    fused.run();
    fused.run();
    plain.run();
    for (const auto& [name, id] : ir.outputs()) {
      EXPECT_LE(test::rel_l2(f64(fused.read_output(name)), cpu.output(name).v), 1e-5) << name;
      EXPECT_LE(test::rel_l2(f64(plain.read_output(name)), cpu.output(name).v), 1e-5) << name;
    }
    if (HasFailure()) break;
  }
  std::printf("random token projections: %d prologues, %d epilogues, %d sibling groups, %d rope pairs\n", prologues,
              epilogues, siblings, ropes);
  EXPECT_GT(prologues, 0);
  EXPECT_GT(epilogues, 0);
  EXPECT_GT(siblings, 0);
  EXPECT_GT(ropes, 0);
}

// The head merge of an attention's o (permute [0, 2, 1, 3] before the output projection) runs in the
// attention's kernel, which stores o permuted: bitwise the session without fusion (the permute's copy of the
// same o), within rounding of the CPU reference. Each forward kernel family: the one-pass row kernel (GQA,
// causal), the scalar row kernel (head dims not whole vec4s), the online vec4 row kernel (many keys), the
// query-tiled kernel, and the attention + lse pair. An o that is also read elsewhere (an output) keeps its
// permute.
TEST_F(VulkanFusion, HeadMergeRunsInTheAttentionsStore) {
  struct Case {
    const char* name;
    int64_t B, Hq, Hkv, Sq, Skv, D, Dv;
    bool causal, lse, o_out;
    AttentionKernel kernel;
    const char* family;  // the attention kernel's name prefix
  };
  const Case cases[] = {
      {"whole_gqa_causal", 2, 4, 2, 5, 7, 8, 8, true, false, false, AttentionKernel::Auto,
       "attention_whole_"},
      {"scalar_row", 1, 3, 1, 9, 6, 6, 5, false, false, false, AttentionKernel::Auto, "attention_q"},
      {"online_vec", 1, 2, 2, 3, 520, 8, 8, false, false, false, AttentionKernel::Auto, "attention_vec_"},
      {"query_tiled", 1, 2, 1, 40, 33, 8, 8, true, false, false, AttentionKernel::Tiled, "attention_tiled_"},
      {"with_lse", 2, 2, 1, 6, 6, 8, 4, false, true, false, AttentionKernel::Auto,
       "attention_with_lse_whole_"},
      {"o_read_elsewhere", 1, 2, 2, 4, 4, 8, 8, false, false, true, AttentionKernel::Auto,
       "attention_whole_"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Graph g;
    Tensor q = g.input("q", {c.B, c.Hq, c.Sq, c.D}), k = g.input("k", {c.B, c.Hkv, c.Skv, c.D}),
           v = g.input("v", {c.B, c.Hkv, c.Skv, c.Dv});
    Tensor o = attention(q, k, v, {.causal = c.causal});
    g.output("merged", reshape(permute(o, {0, 2, 1, 3}), {c.B, c.Sq, c.Hq * c.Dv}) * 1.0);
    std::vector<std::string> outs = {"merged"};
    if (c.o_out) {
      g.output("o", o);
      outs.push_back("o");
    }
    if (c.lse) {
      ir::Graph& ir = g.ir();
      const ir::Node& on = ir.node(o.id());
      const int ln = ir.add(ir::Op::AttentionLse, on.inputs, on.attrs);
      ir.add_output("lse", ln);
      outs.push_back("lse");
    }
    vk::GraphExecutorOptions fo = poisoned(true), po = poisoned(false);
    fo.codegen.kernels.attention = po.codegen.kernels.attention = c.kernel;
    vk::GraphExecutor fused(g.ir(), *ctx_, fo), plain(g.ir(), *ctx_, po);
    std::string attention_ops;  // the ops of the dispatch holding the attention
    for (const plan::Dispatch& d : fused.plan().dispatches) {
      std::string ops;
      for (int id : d.nodes) ops += std::string(ops.empty() ? "" : " ") + ir::op_name(g.ir().node(id).op);
      if (ops.rfind("attention", 0) == 0) attention_ops = ops;
    }
    const std::string want = c.o_out ? "attention"
                             : c.lse ? "attention permute attention_lse"
                                     : "attention permute";
    EXPECT_EQ(attention_ops, want);
    int permutes = 0, family = 0, bshd = 0;
    for (const auto& [name, glsl] : fused.kernel_sources()) {
      permutes += name.rfind("permute", 0) == 0;
      family += name.rfind(c.family, 0) == 0;
      bshd += name.find("_obshd") != std::string::npos;
    }
    EXPECT_EQ(permutes, c.o_out ? 1 : 0);
    EXPECT_EQ(family, 1);
    EXPECT_EQ(bshd, c.o_out ? 0 : 1);
    check_fused_outputs(g.ir(), fused, plain, {"q", "k", "v"}, outs, 21, 2);
  }
}

}  // namespace

#endif  // MGN_HAVE_VULKAN
