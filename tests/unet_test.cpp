// The conditioned U-Net (include/mgn/unet.h) against the spec and a plain-torch re-implementation
// (bench/pytorch/sd_unet.py through tests/ref/sd_unet_ref.py): the spec's per-part parameter table, the
// paper's sine init, weight loading and its refusals, input-shape checks, forward + every gradient of the
// spec's tiny config on the CPU executor (f64), the CPU backend and Vulkan (f32), and the DDPM / DDIM
// arithmetic.
#include "mgn/unet.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "support/gates.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

std::vector<double> wide(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// Random weights scaled like trained ones; norm weights around 1.
std::map<std::string, std::vector<float>> random_weights(const unet::Config& c, uint64_t seed) {
  std::map<std::string, std::vector<float>> w;
  for (auto& [name, shape] : unet::parameter_shapes(c)) {
    const bool norm = name.find(".norm") != std::string::npos;
    const double fan = shape.size() >= 2 ? double(numel(shape) / shape[0]) : 1.0;
    const double scale = shape.size() >= 2 ? 1.0 / std::sqrt(fan) : 0.1;
    std::vector<double> v =
        test::random_uniform(size_t(numel(shape)), seed++, -scale * std::sqrt(3.0), scale * std::sqrt(3.0));
    w[name].assign(v.begin(), v.end());
    if (norm && name.ends_with(".weight"))
      for (float& x : w[name]) x += 1.0f;
  }
  return w;
}

std::vector<float> floats(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST(Unet, ParameterCountPerPartIsTheSpecTable) {
  // workload-specs.md §2, "Param breakdown", as printed there.
  const std::vector<std::pair<std::string, int64_t>> table = {{"time_mlp.", 82'432},
                                                              {"conv_in.", 2'304},
                                                              {"encoder.0.resblock.", 90'432},
                                                              {"encoder.0.downsample.", 36'864},
                                                              {"encoder.1.resblock.", 262'656},
                                                              {"encoder.1.attn.", 460'416},
                                                              {"encoder.1.downsample.", 147'456},
                                                              {"encoder.2.resblock.", 984'064},
                                                              {"encoder.2.attn.", 1'445'120},
                                                              {"middle.resblock.", 1'246'464},
                                                              {"middle.attn.", 1'445'120},
                                                              {"decoder.2.resblock.", 1'967'872},
                                                              {"decoder.2.attn.", 1'445'120},
                                                              {"decoder.1.resblock.", 672'896},
                                                              {"decoder.1.attn.", 460'416},
                                                              {"decoder.0.resblock.", 176'704},
                                                              {"conv_out.", 2'432}};
  unet::Config c = unet::Config::small();
  std::map<std::string, int64_t> got;
  int64_t total = 0;
  for (auto& [name, shape] : unet::parameter_shapes(c)) {
    total += numel(shape);
    int matches = 0;
    for (auto& [part, n] : table)
      if (name.starts_with(part)) {
        got[part] += numel(shape);
        ++matches;
      }
    EXPECT_EQ(matches, 1) << name << " belongs to no part of the table (or to several)";
  }
  // No convolution (4-D weight) has a bias.
  std::set<std::string> names;
  for (auto& [name, shape] : unet::parameter_shapes(c)) names.insert(name);
  for (auto& [name, shape] : unet::parameter_shapes(c))
    if (shape.size() == 4) {
      EXPECT_FALSE(names.count(name.substr(0, name.size() - 7) + ".bias")) << name;
    }
  for (auto& [part, n] : table) EXPECT_EQ(got[part], n) << part;
  EXPECT_EQ(total, 10'928'768);
  EXPECT_EQ(unet::parameter_count(c), 10'928'768);
  // The spec's conditioned tiny(): 3,131,712 "by the same arithmetic".
  EXPECT_EQ(unet::parameter_count(unet::Config::tiny()), 3'131'712);
  // The graph holds exactly these tensors and autodiff reaches every one.
  Graph g = unet::graph(c, {.batch = 1}, Mode::Train);
  Gradients grads = backward(g, *g.find_output("loss"));
  int64_t trainable = 0;
  for (auto& [name, t] : grads.params) trainable += numel(t.shape());
  EXPECT_EQ(trainable, 10'928'768);
  EXPECT_EQ(g.find_output("noise_pred")->shape(), (Shape{1, 4, 32, 32}));
  // Ten attention ops (5 self + 5 cross).
  EXPECT_EQ(std::ranges::count_if(
                g.parameters(),
                [](const Tensor& t) { return t.graph()->node(t.id()).name.ends_with("attn.q_proj.weight"); }),
            10);
}

TEST(Unet, PaperSineInitIsTheClosedForm) {
  unet::Config c = unet::Config::tiny();
  Graph g = unet::graph(c, {.batch = 1, .context_len = 4}, Mode::Infer);
  Session s = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto seed_of = [](const std::string& n) {
    uint64_t h = 0;
    for (unsigned char ch : n) h = (h * 31 + ch) % 4294967296ull;
    return double(h % 10000);
  };
  // A linear weight [out, in] = [64, 768], generated [in, out]: element (o, i) at j = i·64 + o.
  const std::string k = "encoder.1.attn.transformer.cross_attn.k_proj.weight";
  std::vector<float> v = s.read(k);
  for (int64_t o : {0, 9, 63})
    for (int64_t i : {0, 100, 767})
      EXPECT_NEAR(v[size_t(o * 768 + i)], 0.02 * std::sin(0.01 * double(i * 64 + o) + seed_of(k)), 1e-7);
  // A conv weight: flat order.
  const std::string conv = "decoder.0.resblock.conv1.weight";
  v = s.read(conv);
  for (int64_t j : {0, 17, 5000})
    EXPECT_NEAR(v[size_t(j)], 0.02 * std::sin(0.01 * double(j) + seed_of(conv)), 1e-7);
  // Norms start at 1 / 0.
  for (const std::string n : {"conv_out.norm", "middle.attn.transformer.norm3", "encoder.0.resblock.norm1"}) {
    for (float x : s.read(n + ".weight")) EXPECT_EQ(x, 1.0f) << n;
    for (float x : s.read(n + ".bias")) EXPECT_EQ(x, 0.0f) << n;
  }
}

TEST(Unet, WeightsAndInputsAreCheckedByName) {
  unet::Config c = unet::Config::tiny();
  c.levels = 2;
  auto w = random_weights(c, 3);
  const std::string dir = test::make_temp_dir("unet_weights");
  const std::string file = dir + "/unet.safetensors";
  auto write_all = [&](const std::string& skip, const std::string& reshape, const std::string& extra) {
    std::vector<StoredTensor> t;
    for (auto& [name, shape] : unet::parameter_shapes(c)) {
      if (name == skip) continue;
      Shape s = shape;
      if (name == reshape) s = {numel(shape)};
      t.push_back(StoredTensor::from_f32(name, s, w.at(name)));
    }
    if (!extra.empty()) t.push_back(StoredTensor::from_f32(extra, {1}, {0.0f}));
    write_safetensors(file, t);
  };
  write_all("", "", "");
  auto got = unet::read_weights(c, file);
  ASSERT_EQ(got.size(), w.size());
  for (auto& [name, v] : w) EXPECT_EQ(got.at(name), v) << name;

  write_all("decoder.1.attn.transformer.cross_attn.v_proj.weight", "", "");
  std::string e = error_of([&] { unet::read_weights(c, file); });
  EXPECT_NE(e.find("'decoder.1.attn.transformer.cross_attn.v_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[64, 768]"), std::string::npos) << e;
  EXPECT_NE(e.find("unet.safetensors"), std::string::npos) << e;

  write_all("", "encoder.1.resblock.res_conv.weight", "");
  e = error_of([&] { unet::read_weights(c, file); });
  EXPECT_NE(e.find("'encoder.1.resblock.res_conv.weight' has shape [2048], expected [64, 32, 1, 1]"),
            std::string::npos)
      << e;

  write_all("", "", "encoder.2.attn.norm.weight");  // a file of a deeper config
  e = error_of([&] { unet::read_weights(c, file); });
  EXPECT_NE(e.find("unknown tensor 'encoder.2.attn.norm.weight'"), std::string::npos) << e;
  std::filesystem::remove_all(dir);

  // Input shapes.
  const unet::GraphOptions o{.batch = 2, .context_len = 5};
  EXPECT_EQ(unet::input_shape(c, o, "noisy_latent"), (Shape{2, 4, 16, 16}));
  EXPECT_EQ(unet::input_shape(c, o, "timestep_embedding"), (Shape{2, 32}));
  EXPECT_EQ(unet::input_shape(c, o, "text_context"), (Shape{2, 5, 768}));
  e = error_of([&] { unet::check_input(c, o, "text_context", {2, 5, 512}, "ctx.safetensors"); });
  EXPECT_EQ(e, "ctx.safetensors: text_context must be [2, 5, 768], got [2, 5, 512]");
  e = error_of([&] { unet::check_input(c, o, "noisy_latent", {2, 4, 32, 32}); });
  EXPECT_NE(e.find("noisy_latent must be [2, 4, 16, 16]"), std::string::npos) << e;
  e = error_of([&] { unet::check_input(c, o, "timestep_embedding", {2, 64}); });
  EXPECT_NE(e.find("timestep_embedding must be [2, 32]"), std::string::npos) << e;
  // Config refusals.
  unet::Config bad = c;
  bad.base_channels = 36;
  EXPECT_NE(error_of([&] { unet::graph(bad, {}); }).find("not divisible by groups"), std::string::npos);
  EXPECT_NE(error_of([&] { unet::graph(c, {.latent = 15}); }).find("must be divisible by 2"),
            std::string::npos);
}

// Forward, the DDPM loss and every gradient of the spec's tiny config cut to 2 levels (every block kind: a
// plain and a res_conv ResBlock, downsample, upsample, skip concat, one attention level and the middle)
// against plain torch (f64) at batch 2, then the f32 backends against the same reference.
TEST(Unet, ForwardLossAndEveryGradientMatchTorch) {
  unet::Config c = unet::Config::tiny();
  c.levels = 2;
  const unet::GraphOptions o{.batch = 2, .context_len = 8};
  auto w = random_weights(c, 11);
  auto in_of = [&](const std::string& name, uint64_t seed) {
    return floats(test::random_normal(size_t(numel(unet::input_shape(c, o, name))), seed));
  };
  std::map<std::string, std::vector<float>> in = {{"noisy_latent", in_of("noisy_latent", 1)},
                                                  {"timestep_embedding", in_of("timestep_embedding", 2)},
                                                  {"text_context", in_of("text_context", 3)},
                                                  {"noise_target", in_of("noise_target", 4)}};
  std::vector<double> cfg = {double(c.in_channels), double(c.base_channels),  double(c.levels),
                             double(c.groups),      double(c.time_input_dim), double(c.time_embed_dim),
                             double(c.context_dim), double(c.head_dim),       1.0};
  std::vector<StoredTensor> ref_in = {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg)};
  for (auto& [name, v] : in) ref_in.push_back(StoredTensor::from_f32(name, unet::input_shape(c, o, name), v));
  for (auto& [name, shape] : unet::parameter_shapes(c))
    ref_in.push_back(StoredTensor::from_f32("w." + name, shape, w.at(name)));
  auto ref = test::run_torch("tests/ref/sd_unet_ref.py", ref_in);

  Graph g = unet::graph(c, o, Mode::Train);
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  ASSERT_EQ(grads.params.size(), unet::parameter_shapes(c).size());

  cpu::Executor ex(g.ir(), {.float64 = true});
  for (auto& [name, v] : w) ex.set_state(name, wide(v));
  for (auto& [name, v] : in) ex.set_input(name, wide(v));
  ex.run();
  EXPECT_LT(test::rel_l2(ex.output("noise_pred").v, ref.at("noise_pred").to_f64()), 1e-7);
  EXPECT_NEAR(ex.output("loss").v[0], ref.at("loss").to_f64()[0],
              1e-7 * std::fabs(ref.at("loss").to_f64()[0]));
  for (auto& [name, t] : grads.params)
    EXPECT_LT(test::rel_l2(ex.output("grad." + name).v, ref.at("grad." + name).to_f64()), 1e-7) << name;

  // f32 sessions: forward rel-L2 <= 1e-4, every gradient rel-L2 <= 1e-3 (the strict gates of
  // bench/compare.py).
  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph gs = unet::graph(c, o, Mode::Train);
    Gradients gr = backward(gs, Tensor(&gs.ir(), *gs.ir().find_output("loss")));
    for (auto& [name, t] : gr.params) gs.output("grad." + name, t);
    std::optional<Session> s;
    s.emplace(compile(gs, {.mode = Mode::Infer, .backend = b, .device = test::device_options()}));
    if (b == Backend::Auto && std::string(s->backend()) == "cpu") continue;  // no Vulkan device here
    unet::load_weights(*s, w);
    for (auto& [name, v] : in) s->set_input(name, v);
    s->run();
    const std::string who = s->backend();
    std::printf("gates checked on %s\n", who.c_str());
    EXPECT_LT(test::rel_l2(wide(s->read("noise_pred")), ref.at("noise_pred").to_f64()), 1e-4) << who;
    test::expect_loss_and_gradients(*s, ref, gr.params);
  }
}

// The caller-side diffusion arithmetic against torch: the sinusoidal embedding, the linear schedule's
// ᾱ, q(x_t | x_0) and one DDIM step.
TEST(Unet, DiffusionArithmeticMatchesTorch) {
  const int64_t B = 3, n = 2 * 4 * 4;
  std::vector<int64_t> t = {0, 417, 999};
  std::vector<float> x0 = floats(test::random_normal(size_t(B * n), 5)),
                     noise = floats(test::random_normal(size_t(B * n), 6));
  std::vector<float> x = floats(test::random_normal(size_t(n), 7)),
                     eps = floats(test::random_normal(size_t(n), 8));
  unet::Schedule s = unet::linear_schedule(1000, 1e-4, 0.02);
  std::vector<int64_t> steps = unet::ddim_timesteps(s, 50);
  ASSERT_EQ(steps.size(), 50u);
  EXPECT_EQ(steps.front(), 980);
  EXPECT_EQ(steps.back(), 0);
  const int64_t tt = steps[10], tp = steps[11];
  auto ref = test::run_torch(
      "tests/ref/sd_unet_ref.py",
      {StoredTensor::from_i32("t", {B}, {0, 417, 999}), StoredTensor::from_f32("x0", {B, n}, x0),
       StoredTensor::from_f32("noise", {B, n}, noise), StoredTensor::from_f64("dim", {1}, {64.0}),
       StoredTensor::from_i32("ddim", {2}, {int32_t(tt), int32_t(tp)}), StoredTensor::from_f32("x", {n}, x),
       StoredTensor::from_f32("eps", {n}, eps)});
  EXPECT_LT(test::rel_l2(wide(unet::timestep_embedding(t, 64)), ref.at("temb").to_f64()), 1e-6);
  EXPECT_LT(test::rel_l2(s.alphas_cumprod, ref.at("alphas_cumprod").to_f64()), 1e-12);
  EXPECT_LT(test::rel_l2(wide(unet::add_noise(s, x0, noise, t)), ref.at("x_t").to_f64()), 1e-6);
  EXPECT_LT(test::rel_l2(wide(unet::ddim_step(s, x, eps, tt, tp)), ref.at("x_prev").to_f64()), 1e-6);
  // The last DDIM step (to t_prev = -1, ᾱ = 1) returns the predicted x0.
  std::vector<float> last = unet::ddim_step(s, x, eps, 0, -1);
  const double a = s.alphas_cumprod[0];
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(last[size_t(i)], (x[size_t(i)] - std::sqrt(1 - a) * eps[size_t(i)]) / std::sqrt(a), 1e-5);
}
