// Optimizers against torch.optim: the same parameters and the same per-step gradients (fed as graph inputs,
// so only the update rule is under test), N steps, then every parameter compared; schedules against closed
// forms and torch schedulers; clipping against torch.nn.utils.clip_grad_norm_.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mgn/checkpoint.h"
#include "mgn/session.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("mgn_optim_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<float> to_f(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }
std::vector<double> to_d(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

struct ParamSpec {
  std::string name;
  Shape shape;
};
const std::vector<ParamSpec> kParams = {{"fc.weight", {3, 4}}, {"fc.bias", {4}}, {"head.weight", {5}}};
constexpr int kSteps = 10;

struct Case {
  std::string label;
  Optimizer opt;
  nlohmann::json cfg;  // the same settings for torch
  UpdateOptions update;
  Schedule schedule;
};

// Runs one case both ways and compares every parameter (and the lr / grad norm used at each step).
void run_case(const Case& c) {
  SCOPED_TRACE(c.label);
  fs::path dir = temp_dir(c.label);
  std::vector<StoredTensor> in;
  Graph g;
  std::map<std::string, Tensor> grads;
  std::map<std::string, std::vector<double>> init;
  uint64_t seed = 1;
  for (const ParamSpec& p : kParams) {
    init[p.name] = test::random_normal(size_t(numel(p.shape)), seed++, 1.0);
    g.parameter(p.name, p.shape, Init::from_data(to_f(init[p.name])));
    grads[p.name] = g.input("grad." + p.name, p.shape);
    in.push_back(StoredTensor::from_f32(p.name, p.shape, to_f(init[p.name])));
  }
  std::vector<std::map<std::string, std::vector<float>>> step_grads(kSteps);
  for (int k = 0; k < kSteps; ++k)
    for (const ParamSpec& p : kParams) {
      step_grads[size_t(k)][p.name] = to_f(test::random_normal(size_t(numel(p.shape)), 100 + seed++, 0.5));
      in.push_back(StoredTensor::from_f32("step" + std::to_string(k) + "." + p.name, p.shape,
                                          step_grads[size_t(k)][p.name]));
    }
  write_safetensors((dir / "in.safetensors").string(), in);
  nlohmann::json cfg = c.cfg;
  cfg["steps"] = kSteps;
  cfg["lr"] = base_lr(c.opt);
  cfg["params"] = nlohmann::json::array();
  for (const ParamSpec& p : kParams) cfg["params"].push_back(p.name);
  cfg["clip"] = c.update.clip_grad_norm;
  for (const LrMultiplier& m : c.update.lr_multipliers)
    cfg["lr_multipliers"].push_back({{"prefix", m.prefix}, {"scale", m.scale}});
  std::ofstream((dir / "cfg.json").string()) << cfg.dump();
  std::string cmd = std::string(MGN_TORCH_PYTHON) + " " + MGN_SOURCE_DIR + "/tests/ref/optim_ref.py " +
                    (dir / "in.safetensors").string() + " " + (dir / "out.safetensors").string() + " " +
                    (dir / "cfg.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile ref = SafetensorsFile::read((dir / "out.safetensors").string());

  Session s = compile(g, {.mode = Mode::Train, .optimizer = c.opt, .update = c.update, .schedule = c.schedule,
                          .backend = Backend::Cpu, .gradients = grads});
  for (int k = 0; k < kSteps; ++k) {
    double torch_lr = ref.get("lr" + std::to_string(k)).to_f64()[0];
    EXPECT_NEAR(s.lr(), torch_lr, 1e-12 * std::max(1.0, torch_lr)) << "lr at step " << k;
    for (const ParamSpec& p : kParams) s.set_input("grad." + p.name, step_grads[size_t(k)][p.name]);
    s.step();
    if (c.update.clip_grad_norm > 0) {
      double n = ref.get("norm" + std::to_string(k)).to_f64()[0];
      EXPECT_NEAR(s.read_scalar(UpdatePlan::kGradNormOutput), n, 1e-6 * n) << "grad norm at step " << k;
    }
  }
  EXPECT_EQ(s.step_count(), kSteps);
  EXPECT_EQ(s.read_scalar(UpdatePlan::kStepState), float(kSteps));
  for (const ParamSpec& p : kParams) {
    std::vector<double> got = to_d(s.read(p.name)), want = ref.get(p.name).to_f64();
    double err = test::rel_l2(got, want);
    EXPECT_LE(err, 1e-5) << p.name;
    // The parameters must have moved, or the comparison proves nothing.
    EXPECT_GT(test::rel_l2(init[p.name], want), 1e-3) << p.name;
  }
  fs::remove_all(dir);
}

}  // namespace

TEST(Optim, SgdPlain) { run_case({"sgd", SGD{.lr = 0.1}, {{"optimizer", "sgd"}}, {}, {}}); }

TEST(Optim, SgdMomentumWeightDecay) {
  run_case({"sgd_mom", SGD{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01},
            {{"optimizer", "sgd"}, {"momentum", 0.9}, {"weight_decay", 0.01}}, {}, {}});
}

TEST(Optim, SgdNesterov) {
  run_case({"sgd_nesterov", SGD{.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.001},
            {{"optimizer", "sgd"}, {"momentum", 0.8}, {"nesterov", true}, {"weight_decay", 0.001}}, {}, {}});
}

TEST(Optim, SgdDampening) {
  run_case({"sgd_damp", SGD{.lr = 0.05, .momentum = 0.9, .dampening = 0.3},
            {{"optimizer", "sgd"}, {"momentum", 0.9}, {"dampening", 0.3}}, {}, {}});
}

TEST(Optim, Adam) {
  run_case({"adam", Adam{.lr = 1e-2}, {{"optimizer", "adam"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}}, {}, {}});
}

TEST(Optim, AdamL2WeightDecay) {
  run_case({"adam_wd", Adam{.lr = 2e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.1},
            {{"optimizer", "adam"}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}, {"weight_decay", 0.1}}, {}, {}});
}

TEST(Optim, AdamWDecoupled) {
  run_case({"adamw", AdamW{.lr = 1e-2, .weight_decay = 0.1},
            {{"optimizer", "adamw"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.1}}, {}, {}});
}

TEST(Optim, AdamWLrMultipliers) {
  // torch equivalent: one param group per multiplier (weight decay scales with the group's lr).
  UpdateOptions u;
  u.lr_multipliers = {{"head.", 0.25}, {"fc.", 2.0}, {"fc.bias", 0.5}};
  run_case({"adamw_mult", AdamW{.lr = 1e-2, .weight_decay = 0.2},
            {{"optimizer", "adamw"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.2}}, u, {}});
}

TEST(Optim, SgdMultipliersAndClipping) {
  UpdateOptions u;
  u.clip_grad_norm = 0.7;  // the gradients' norm is ~2: clipping is active every step
  u.lr_multipliers = {{"head.", 3.0}};
  run_case({"sgd_clip", SGD{.lr = 0.1, .momentum = 0.5}, {{"optimizer", "sgd"}, {"momentum", 0.5}}, u, {}});
}

TEST(Optim, AdamClippingInactive) {
  UpdateOptions u;
  u.clip_grad_norm = 100;  // larger than the norm: the coefficient clamps to 1
  run_case({"adam_noclip", Adam{.lr = 1e-2}, {{"optimizer", "adam"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}},
            u, {}});
}

TEST(Optim, LinearWarmupMatchesTorch) {
  run_case({"sgd_warm", SGD{.lr = 0.1, .momentum = 0.9},
            {{"optimizer", "sgd"}, {"momentum", 0.9},
             {"schedule", {{"kind", "linear_warmup"}, {"warmup", 4}, {"start_factor", 0.25}}}},
            {}, Schedule::linear_warmup(4, 0.25)});
}

TEST(Optim, CosineMatchesTorch) {
  run_case({"adam_cos", Adam{.lr = 2e-2},
            {{"optimizer", "adam"}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8},
             {"schedule", {{"kind", "cosine"}, {"total", 12}, {"min_ratio", 0.1}}}},
            {}, Schedule::cosine(12, 0.1)});
}

TEST(Schedule, ClosedForms) {
  const double pi = std::acos(-1.0);
  Schedule c = Schedule::constant();
  EXPECT_DOUBLE_EQ(c.lr(0.3, 0), 0.3);
  EXPECT_DOUBLE_EQ(c.lr(0.3, 1000), 0.3);
  Schedule w = Schedule::linear_warmup(10, 0.0);
  EXPECT_DOUBLE_EQ(w.lr(1.0, 0), 0.0);
  EXPECT_DOUBLE_EQ(w.lr(1.0, 5), 0.5);
  EXPECT_DOUBLE_EQ(w.lr(1.0, 10), 1.0);
  EXPECT_DOUBLE_EQ(w.lr(1.0, 50), 1.0);
  Schedule cos = Schedule::cosine(100, 0.1);
  EXPECT_DOUBLE_EQ(cos.lr(2.0, 0), 2.0);
  EXPECT_NEAR(cos.lr(2.0, 50), 0.2 + 1.8 * 0.5, 1e-12);
  EXPECT_NEAR(cos.lr(2.0, 25), 0.2 + 1.8 * (1 + std::cos(pi / 4)) / 2, 1e-12);
  EXPECT_NEAR(cos.lr(2.0, 100), 0.2, 1e-12);
  EXPECT_NEAR(cos.lr(2.0, 500), 0.2, 1e-12);
  Schedule wc = Schedule::warmup_cosine(10, 110, 0.0, 0.0);
  EXPECT_NEAR(wc.lr(1.0, 5), 0.5, 1e-12);
  EXPECT_NEAR(wc.lr(1.0, 10), 1.0, 1e-12);
  EXPECT_NEAR(wc.lr(1.0, 60), 0.5, 1e-12);
  EXPECT_NEAR(wc.lr(1.0, 110), 0.0, 1e-12);
  EXPECT_THROW(Schedule::warmup_cosine(10, 10).validate(), Error);
  EXPECT_THROW(Schedule::cosine(0).validate(), Error);
  EXPECT_THROW(Schedule::linear_warmup(0).validate(), Error);
}

TEST(Optim, SetLrTakesEffectWithoutRecompiling) {
  // One parameter, constant gradient 1: plain SGD moves it by exactly -lr each step.
  Graph g;
  g.parameter("p", {2}, Init::constant(1.0));
  Tensor gr = g.input("grad", {2});
  Session s = compile(g, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.5}, .backend = Backend::Cpu,
                          .gradients = {{"p", gr}}});
  std::vector<float> ones{1, 1};
  s.set_input("grad", ones);
  s.step();
  EXPECT_FLOAT_EQ(s.read("p")[0], 0.5f);
  s.set_lr(0.125);
  s.step();
  EXPECT_FLOAT_EQ(s.read("p")[1], 0.375f);
  EXPECT_THROW(s.set_input("optim.lr", std::vector<float>{1.0f}), Error);
  EXPECT_THROW(s.run(), Error);
}

TEST(Optim, BadGradientsAreErrors) {
  Graph g;
  g.parameter("p", {2, 3});
  Tensor bad = g.input("grad", {3, 2});
  try {
    compile(g, {.mode = Mode::Train, .backend = Backend::Cpu, .gradients = {{"p", bad}}});
    FAIL() << "no error for a mis-shaped gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'p'"), std::string::npos) << e.what();
  }
  Graph g2;
  g2.parameter("p", {2});
  Tensor gr = g2.input("grad", {2});
  EXPECT_THROW(compile(g2, {.mode = Mode::Train, .backend = Backend::Cpu, .gradients = {{"q", gr}}}), Error);
  EXPECT_THROW(compile(g2, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.1, .nesterov = true},
                            .backend = Backend::Cpu, .gradients = {{"p", gr}}}),
               Error);
}
