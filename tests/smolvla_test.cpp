// SmolVLA action expert (include/mgn/smolvla.h) against the spec's arithmetic and the plain-torch expert of
// bench/pytorch/smolvla_expert.py (through tests/ref/smolvla_ref.py): parameter count, the paper's sine init,
// weight and input loading with their refusals, forward + loss + every gradient of the reduced config in both
// attention variants on the CPU executor (f64), the CPU backend and Vulkan (f32), and flow matching (targets,
// time features, the 10-step Euler sampler) against torch.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numbers>
#include <optional>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/checkpoint.h"
#include "mgn/session.h"
#include "mgn/smolvla.h"
#include "support/gates.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

using Weights = std::map<std::string, std::vector<float>>;

Weights random_weights(const smolvla::Config& c, uint64_t seed) {
  Weights w;
  for (auto& [name, shape] : smolvla::parameter_shapes(c)) {
    const double scale = shape.size() == 2 ? 1.0 / std::sqrt(double(shape[1])) : 0.1;
    const double r = scale * std::sqrt(3.0);
    std::vector<double> v = test::random_uniform(size_t(numel(shape)), seed++, -r, r);
    w[name].assign(v.begin(), v.end());
    if (name.ends_with("layernorm.weight"))
      for (float& x : w[name]) x += 1.0f;
  }
  return w;
}

Weights random_inputs(const smolvla::Config& c, const smolvla::GraphOptions& o, uint64_t seed) {
  Weights in;
  for (auto& [name, shape] : smolvla::input_shapes(c, o, Mode::Train)) {
    std::vector<double> v = test::random_normal(size_t(numel(shape)), seed++);
    in[name].assign(v.begin(), v.end());
  }
  return in;
}

std::vector<StoredTensor> ref_inputs(const smolvla::Config& c, const smolvla::GraphOptions& o, const Weights& w,
                                     const Weights& in, bool f64, int steps, const std::vector<float>& noise = {}) {
  std::vector<double> cfg = {double(c.hidden),     double(c.layers),     double(c.heads),      double(c.kv_heads),
                             double(c.head_dim),   double(c.intermediate), double(c.action_dim), double(c.chunk),
                             double(c.time_dim),   double(c.vlm_kv_dim), double(c.vlm_tokens),
                             c.attention == smolvla::Attention::Lerobot ? 1.0 : 0.0, f64 ? 1.0 : 0.0, double(steps)};
  std::vector<StoredTensor> r = {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg)};
  for (auto& [name, shape] : smolvla::parameter_shapes(c))
    r.push_back(StoredTensor::from_f32("w." + name, shape, w.at(name)));
  for (auto& [name, shape] : smolvla::input_shapes(c, o, Mode::Train))
    r.push_back(StoredTensor::from_f32("in." + name, shape, in.at(name)));
  if (steps) r.push_back(StoredTensor::from_f32("noise", {o.batch, c.chunk, c.action_dim}, noise));
  return r;
}

std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST(SmolVLA, ParameterCountOfTheSpec) {
  // workload-specs.md §1: self layer 691,200 (q) + 2·230,400 (k, v) + 691,200 (o) + 1,440 (norms) + 3·1,474,560
  // (MLP) = 6,268,320; cross layer the same with k, v 2·102,400 = 6,012,320; top 23,760 + 1,037,520 + 519,120 +
  // 23,072 = 1,603,472; total 8·6,268,320 + 8·6,012,320 + 1,603,472 = 99,848,592.
  const int64_t self_layer = 691'200 + 2 * 230'400 + 691'200 + 1'440 + 3 * 1'474'560;
  const int64_t cross_layer = 691'200 + 2 * 102'400 + 691'200 + 1'440 + 3 * 1'474'560;
  EXPECT_EQ(self_layer, 6'268'320);
  EXPECT_EQ(cross_layer, 6'012'320);
  const int64_t top = 23'760 + 1'037'520 + 519'120 + 23'072;
  EXPECT_EQ(8 * self_layer + 8 * cross_layer + top, 99'848'592);
  smolvla::Config c = smolvla::Config::paper();
  EXPECT_EQ(smolvla::parameter_count(c), 99'848'592);
  // The graph holds exactly these parameters: autodiff finds a gradient for each (latency shape: 1 action).
  Graph g = smolvla::expert_graph(c, {.chunk = 1}, Mode::Train);
  Gradients grads = backward(g, *g.find_output("loss"));
  int64_t n = 0;
  for (auto& [name, t] : grads.params) n += numel(t.shape());
  EXPECT_EQ(n, 99'848'592);
  EXPECT_EQ(grads.params.size(), 6u + 16u * 9u + 2u);
  // The spec's names and HF shapes.
  EXPECT_EQ(g.get("model.vlm_with_expert.lm_expert.layers.3.self_attn.k_proj.weight").shape(), (Shape{320, 320}));
  EXPECT_EQ(g.get("model.vlm_with_expert.lm_expert.layers.2.self_attn.k_proj.weight").shape(), (Shape{320, 720}));
  EXPECT_EQ(g.get("model.vlm_with_expert.lm_expert.layers.0.mlp.gate_proj.weight").shape(), (Shape{2048, 720}));
  EXPECT_EQ(g.get("model.action_time_mlp_in.weight").shape(), (Shape{720, 1440}));
  EXPECT_EQ(g.get("model.action_out_proj.bias").shape(), (Shape{32}));
  // The inputs: 8 VLM K/V tensors (odd layers) in the paper variant.
  auto ins = smolvla::input_shapes(c, {});
  ASSERT_EQ(ins.size(), 2u + 8u);
  EXPECT_EQ(ins[2].first, "vlm_kv_layer_1");
  EXPECT_EQ(ins[2].second, (Shape{1, 16, 320}));
  // Refusals of the config.
  smolvla::Config bad = c;
  bad.kv_heads = 4;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("not divisible by kv_heads"), std::string::npos);
  bad = c;
  bad.attention = smolvla::Attention::Lerobot;
  bad.vlm_kv_dim = 960;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("vlm_kv_dim"), std::string::npos);
}

TEST(SmolVLA, PaperSineInitIsNameSeededForEveryTensor) {
  smolvla::Config c = smolvla::Config::reduced();
  Graph g = smolvla::expert_graph(c, {});
  Session s = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto seed_of = [](const std::string& n) {
    uint64_t h = 0;
    for (unsigned char ch : n) h = (h * 31 + ch) % 4294967296ull;
    return double(h % 10000);
  };
  // [64, 48]: element (o, i) is generated at j = i·64 + o
  const std::string up = "model.vlm_with_expert.lm_expert.layers.1.mlp.up_proj.weight";
  std::vector<float> v = s.read(up);
  for (int64_t o : {0, 9, 63})
    for (int64_t i : {0, 5, 47})
      EXPECT_NEAR(v[size_t(o * 48 + i)], 0.02 * std::sin(0.01 * double(i * 64 + o) + seed_of(up)), 1e-7);
  // 1-D tensors: name-seeded too (RMSNorm weights are not ones, biases not zeros).
  for (const std::string n :
       {"model.vlm_with_expert.lm_expert.layers.0.input_layernorm.weight", "model.action_in_proj.bias"}) {
    std::vector<float> t = s.read(n);
    for (int64_t j : {0, 17, 47}) EXPECT_NEAR(t[size_t(j)], 0.02 * std::sin(0.01 * double(j) + seed_of(n)), 1e-7) << n;
  }
}

TEST(SmolVLA, ReadsWeightsAndInputsAndNamesWhatIsWrong) {
  smolvla::Config c = smolvla::Config::reduced();
  const std::string dir = test::make_temp_dir("smolvla_io");
  Weights w = random_weights(c, 3);
  std::vector<StoredTensor> t;
  for (auto& [name, shape] : smolvla::parameter_shapes(c)) t.push_back(StoredTensor::from_f32(name, shape, w.at(name)));
  write_safetensors(dir + "/w.safetensors", t);
  EXPECT_EQ(smolvla::read_weights(c, dir + "/w.safetensors"), w);
  // Missing: named with its expected shape.
  const std::string gone = "model.vlm_with_expert.lm_expert.layers.3.self_attn.v_proj.weight";
  std::vector<StoredTensor> t2;
  for (auto& s : t)
    if (s.name != gone) t2.push_back(s);
  write_safetensors(dir + "/w2.safetensors", t2);
  std::string e = error_of([&] { smolvla::read_weights(c, dir + "/w2.safetensors"); });
  EXPECT_NE(e.find(gone), std::string::npos) << e;
  EXPECT_NE(e.find("[16,16]"), std::string::npos) << e;
  // Mis-shaped.
  t2 = t;
  t2[0] = StoredTensor::from_f32(t2[0].name, {8, 48}, std::vector<float>(8 * 48));
  write_safetensors(dir + "/w3.safetensors", t2);
  e = error_of([&] { smolvla::read_weights(c, dir + "/w3.safetensors"); });
  EXPECT_NE(e.find("model.action_in_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("[48,8]"), std::string::npos) << e;
  // A config with fewer layers than the file: refused, not ignored.
  smolvla::Config two = c;
  two.layers = 2;
  EXPECT_NE(error_of([&] { smolvla::read_weights(two, dir + "/w.safetensors"); }).find("unknown expert tensor"),
            std::string::npos);

  // Inputs: batched or (batch 1) unbatched; wrong shapes of noisy actions, timestep and VLM K/V are named
  // with the expected shape; a missing one too.
  std::vector<StoredTensor> in = {
      StoredTensor::from_f32("vlm_kv_layer_1", {5, 16}, std::vector<float>(80, 1.0f)),
      StoredTensor::from_f32("vlm_kv_layer_3", {1, 5, 16}, std::vector<float>(80, 2.0f)),
      StoredTensor::from_f32("noisy_actions", {6, 7}, std::vector<float>(42)),
      StoredTensor::from_f32("timestep", {1, 25}, std::vector<float>(25))};
  write_safetensors(dir + "/in.safetensors", in);
  auto got = smolvla::read_inputs(c, {}, dir + "/in.safetensors", {"vlm_kv_layer_1", "vlm_kv_layer_3"});
  EXPECT_EQ(got.at("vlm_kv_layer_1"), std::vector<float>(80, 1.0f));
  EXPECT_EQ(got.at("vlm_kv_layer_3"), std::vector<float>(80, 2.0f));
  e = error_of([&] { smolvla::read_inputs(c, {}, dir + "/in.safetensors", {"noisy_actions"}); });
  EXPECT_NE(e.find("'noisy_actions' has shape [6,7], expected [1,6,8]"), std::string::npos) << e;
  e = error_of([&] { smolvla::read_inputs(c, {}, dir + "/in.safetensors", {"timestep"}); });
  EXPECT_NE(e.find("'timestep' has shape [1,25], expected [1,24]"), std::string::npos) << e;
  e = error_of([&] { smolvla::read_inputs(c, {.batch = 2}, dir + "/in.safetensors", {"vlm_kv_layer_1"}); });
  EXPECT_NE(e.find("'vlm_kv_layer_1' has shape [5,16], expected [2,5,16]"), std::string::npos) << e;
  smolvla::Config lr = c;
  lr.attention = smolvla::Attention::Lerobot;
  e = error_of([&] { smolvla::read_inputs(lr, {}, dir + "/in.safetensors", {"vlm_k_layer_0"}); });
  EXPECT_NE(e.find("no tensor 'vlm_k_layer_0' (expected shape [1,5,16])"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

namespace {

// Forward, loss and every gradient of one variant against torch: f64 executor within 1e-7 (1e-6 where RoPE's
// tables are computed), then the f32 CPU backend and Vulkan within the strict gates (1e-4 forward, 1e-3 grads).
void check_against_torch(smolvla::Attention variant) {
  smolvla::Config c = smolvla::Config::reduced();
  c.attention = variant;
  const smolvla::GraphOptions o{.batch = 2};
  Weights w = random_weights(c, 11), in = random_inputs(c, o, 100);
  auto ref = test::run_torch("tests/ref/smolvla_ref.py", ref_inputs(c, o, w, in, true, 0));
  const double tol64 = variant == smolvla::Attention::Lerobot ? 1e-6 : 1e-7;

  Graph g = smolvla::expert_graph(c, o, Mode::Train);
  Gradients grads = backward(g, *g.find_output("loss"));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  ASSERT_EQ(grads.params.size(), smolvla::parameter_shapes(c).size());
  cpu::Executor ex(g.ir(), {.float64 = true});
  for (auto& [name, v] : w) ex.set_state(name, wide(v));
  for (auto& [name, v] : in) ex.set_input(name, wide(v));
  ex.run();
  EXPECT_LT(test::rel_l2(ex.output("velocity").v, ref.at("velocity").to_f64()), tol64);
  for (auto& [name, t] : grads.params)
    EXPECT_LT(test::rel_l2(ex.output("grad." + name).v, ref.at("grad." + name).to_f64()), tol64) << name;

  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph gs = smolvla::expert_graph(c, o, Mode::Train);
    Gradients gr = backward(gs, *gs.find_output("loss"));
    for (auto& [name, t] : gr.params) gs.output("grad." + name, t);
    std::optional<Session> s;
    s.emplace(compile(gs, {.mode = Mode::Infer, .backend = b, .device = test::device_options()}));
    if (b == Backend::Auto && std::string(s->backend()) == "cpu") continue;  // no Vulkan device here
    smolvla::load_weights(*s, w);
    for (auto& [name, v] : in) s->set_input(name, v);
    s->run();
    const std::string who = s->backend();
    EXPECT_LT(test::rel_l2(wide(s->read("velocity")), ref.at("velocity").to_f64()), 1e-4) << who;
    test::expect_loss_and_gradients(*s, ref, gr.params);
  }
}

}  // namespace

TEST(SmolVLA, PaperForwardLossAndEveryGradientMatchTorch) { check_against_torch(smolvla::Attention::Paper); }

// The lerobot variant: prefix K/V fully visible and actions causal in self layers (the causal flag's bottom-right
// alignment against torch's explicit triu mask), RoPE on q and k at positions P.., queries-only RoPE re-based to 0
// in cross layers.
TEST(SmolVLA, LerobotForwardLossAndEveryGradientMatchTorch) { check_against_torch(smolvla::Attention::Lerobot); }

// Flow matching: the target and time features against closed forms and torch, and the 10-step Euler sampler
// (one compiled session, VLM K/V set once) against torch's on the CPU backend and Vulkan.
TEST(SmolVLA, FlowMatchingTargetAndEulerSamplerMatchTorch) {
  smolvla::Config c = smolvla::Config::reduced();
  const smolvla::GraphOptions o{.batch = 2};
  Weights w = random_weights(c, 31), in = random_inputs(c, o, 200);
  std::vector<double> nd = test::random_normal(size_t(2 * c.chunk * c.action_dim), 7);
  std::vector<float> noise(nd.begin(), nd.end());
  auto ref = test::run_torch("tests/ref/smolvla_ref.py", ref_inputs(c, o, w, in, true, 10, noise));

  // Time features of t = 1, 0.9, ..., 0.1 against torch; the closed form at one entry.
  std::vector<double> ts;
  for (int k = 0; k < 10; ++k) ts.push_back(1.0 - k / 10.0);
  std::vector<float> tf = smolvla::time_features(c, ts);
  EXPECT_LT(test::rel_l2(wide(tf), ref.at("time_features").to_f64()), 1e-6);
  const double p3 = 4e-3 * std::pow(1000.0, 3.0 / 11.0);
  EXPECT_NEAR(tf[size_t(24 + 12 + 3)], std::cos(2 * std::numbers::pi * 0.9 / p3), 1e-6);

  // The flow-matching pair at per-row times.
  const std::vector<float>& a = in.at("target");
  const std::vector<double> t2 = {0.25, 0.8};
  smolvla::FlowTarget f = smolvla::flow_target(a, noise, t2);
  const size_t row = a.size() / 2;
  for (size_t i : {size_t(0), size_t(5), row + 3, a.size() - 1}) {
    const double t = t2[i / row];
    EXPECT_NEAR(f.x_t[i], t * noise[i] + (1 - t) * a[i], 1e-6);
    EXPECT_NEAR(f.velocity[i], noise[i] - a[i], 1e-6);
  }
  std::vector<double> st = smolvla::sample_times(2000, 5);
  double mean = 0;
  for (double t : st) {
    EXPECT_GE(t, 0.001);
    EXPECT_LE(t, 1.0);
    mean += t / 2000.0;
  }
  EXPECT_NEAR(mean, 0.999 * 0.6 + 0.001, 0.02);  // E[Beta(1.5, 1)] = 0.6

  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph g = smolvla::expert_graph(c, o);
    Session s = compile(g, {.mode = Mode::Infer, .backend = b, .device = test::device_options()});
    if (b == Backend::Auto && std::string(s.backend()) == "cpu") continue;
    smolvla::load_weights(s, w);
    for (auto& [name, shape] : smolvla::input_shapes(c, o))
      if (name.starts_with("vlm_")) s.set_input(name, in.at(name));
    std::vector<float> actions = smolvla::sample_actions(s, c, noise, 2, 10);
    EXPECT_LT(test::rel_l2(wide(actions), ref.at("actions").to_f64()), 1e-4) << s.backend();
  }
}

// Flow-matching training on the CPU backend lowers the loss on a fixed batch.
TEST(SmolVLA, FlowMatchingTrainingLowersTheLoss) {
  smolvla::Config c = smolvla::Config::reduced();
  const smolvla::GraphOptions o{.batch = 4};
  Weights in = random_inputs(c, o, 300);
  std::vector<double> nd = test::random_normal(size_t(4 * c.chunk * c.action_dim), 9);
  std::vector<float> noise(nd.begin(), nd.end());
  std::vector<double> t = smolvla::sample_times(4, 1);
  smolvla::FlowTarget f = smolvla::flow_target(in.at("target"), noise, t);
  Graph g = smolvla::expert_graph(c, o, Mode::Train);
  Session s = compile(g, {.mode = Mode::Train, .optimizer = AdamW{.lr = 1e-3}, .backend = Backend::Cpu});
  smolvla::load_weights(s, random_weights(c, 41));
  for (auto& [name, v] : in)
    if (name.starts_with("vlm_")) s.set_input(name, v);
  s.set_input("noisy_actions", f.x_t);
  s.set_input("timestep", smolvla::time_features(c, t));
  s.set_input("target", f.velocity);
  s.step();
  const float first = s.read_scalar("loss");
  for (int i = 0; i < 20; ++i) s.step();
  EXPECT_LT(s.read_scalar("loss"), 0.7f * first);
}
