// Train-to-deploy: train, save, build a fresh inference graph, load, predict. The two-class linear model runs
// with hand-derived gradients (closed form of softmax cross-entropy) and again through autodiff; the
// Fashion-MNIST MLP subset runs through compile()'s autodiff and the Trainer, and its reloaded predictions
// are checked against a host forward pass over the trained parameters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "mgn/data.h"
#include "mgn/models.h"
#include "mgn/session.h"
#include "mgn/train.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("mgn_train_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Eight points, two classes split by the line x0 + 2 x1 = 0.5 (linearly separable, not through the origin).
const std::vector<float> kPoints = {1, 1, 2, 0, 0.5f, 1, -1, 2, -1, -1, 0, -0.5f, -2, 0.5f, 1, -1};
const std::vector<int32_t> kLabels = {1, 1, 1, 1, 0, 0, 0, 0};

struct Linear2 {
  Graph g;
  Tensor x, labels, w, b, logits, loss;
  std::map<std::string, Tensor> hand_grads;
};

void build_linear2(Linear2& m, Mode mode) {
  m.x = m.g.input("x", {8, 2});
  m.w = m.g.parameter("fc.weight", {2, 2});  // zero init: every logit is 0, the loss exactly ln 2
  m.b = m.g.parameter("fc.bias", {2});
  m.logits = linear(m.x, m.w, m.b);
  m.g.output("logits", m.logits);
  if (mode == Mode::Infer) return;
  m.labels = m.g.input("labels", {8}, DType::I32);
  m.loss = cross_entropy(m.logits, m.labels);
  m.g.output("loss", m.loss);
  // d loss / d logits = (softmax - onehot) / N for the mean cross-entropy.
  Tensor dz = (softmax(m.logits, -1) - one_hot(m.labels, 2)) / 8.0;
  m.hand_grads["fc.weight"] = matmul(dz, m.x, /*transpose_a=*/true);
  m.hand_grads["fc.bias"] = sum(dz, {0});
}

// Trains 60 SGD steps, checks the loss, saves; returns the per-step losses.
std::vector<float> train_linear2(bool hand, const std::string& ckpt) {
  Linear2 m;
  build_linear2(m, Mode::Train);
  CompileOptions opt{.mode = Mode::Train, .optimizer = SGD{.lr = 0.5, .momentum = 0.9}, .backend = Backend::Cpu};
  if (hand) opt.gradients = m.hand_grads;
  Session s = compile(m.g, opt);
  std::vector<float> losses;
  for (int k = 0; k < 60; ++k) {
    s.set_input("x", kPoints);
    s.set_input("labels", kLabels);
    s.step();
    losses.push_back(s.read_scalar("loss"));
  }
  s.save_checkpoint(ckpt);
  return losses;
}

void deploy_linear2(const std::string& ckpt) {
  Linear2 m;
  build_linear2(m, Mode::Infer);
  Session inf = compile(m.g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  inf.load_checkpoint(ckpt);
  inf.set_input("x", kPoints);
  inf.run();
  std::vector<float> z = inf.read("logits");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(z[size_t(2 * i + 1)] > z[size_t(2 * i)] ? 1 : 0, kLabels[size_t(i)]) << "point " << i;
}

void check_losses(const std::vector<float>& losses) {
  EXPECT_NEAR(losses[0], std::log(2.0), 1e-6);  // the first step's loss is of the zero-initialized model
  EXPECT_LT(losses[1], losses[0]);
  EXPECT_LT(losses.back(), 0.1);
}

bool have_autodiff() {
#if __has_include("mgn/autodiff.h")
  return true;
#else
  return false;
#endif
}

}  // namespace

TEST(TrainToDeploy, TwoClassLinearHandGradients) {
  fs::path dir = temp_dir("lin_hand");
  std::string ckpt = (dir / "linear.safetensors").string();
  check_losses(train_linear2(true, ckpt));
  deploy_linear2(ckpt);
  fs::remove_all(dir);
}

TEST(TrainToDeploy, TwoClassLinearAutodiff) {
  if (!have_autodiff()) GTEST_SKIP() << "autodiff is not built in";
  fs::path dir = temp_dir("lin_ad");
  std::string ckpt = (dir / "linear.safetensors").string();
  std::vector<float> ad = train_linear2(false, ckpt);
  check_losses(ad);
  deploy_linear2(ckpt);
  // The closed-form gradients and autodiff give the same training run.
  std::vector<float> hand = train_linear2(true, (dir / "hand.safetensors").string());
  for (size_t k = 0; k < ad.size(); ++k) EXPECT_NEAR(ad[k], hand[k], 1e-5 * (1 + hand[k])) << "step " << k;
  fs::remove_all(dir);
}

namespace {

// The MLP's logits computed on the host from parameters read out of a session (double accumulation).
std::vector<int32_t> host_mlp_predictions(Session& s, const Dataset& d) {
  std::vector<float> w1 = s.read("fc1.weight"), b1 = s.read("fc1.bias"), w2 = s.read("fc2.weight"),
                     b2 = s.read("fc2.bias");
  int64_t hidden = int64_t(b1.size());
  std::vector<int32_t> pred;
  std::vector<double> h(static_cast<size_t>(hidden), 0.0);
  for (int64_t n = 0; n < d.count; ++n) {
    const float* x = d.features.data() + n * 784;
    for (int64_t j = 0; j < hidden; ++j) {
      double acc = b1[size_t(j)];
      for (int64_t k = 0; k < 784; ++k) acc += double(w1[size_t(j * 784 + k)]) * x[k];
      h[size_t(j)] = std::max(acc, 0.0);
    }
    int32_t best = 0;
    double best_z = -1e300;
    for (int c = 0; c < 10; ++c) {
      double z = b2[size_t(c)];
      for (int64_t j = 0; j < hidden; ++j) z += double(w2[size_t(c * hidden + j)]) * h[size_t(j)];
      if (z > best_z) best_z = z, best = c;
    }
    pred.push_back(best);
  }
  return pred;
}

}  // namespace

TEST(TrainToDeploy, FashionMnistMlpSubset) {
  if (!have_autodiff()) GTEST_SKIP() << "autodiff is not built in";
  if (!fs::exists(fashion_mnist_dir() + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "no Fashion-MNIST";
  fs::path dir = temp_dir("fmnist");
  std::string ckpt = (dir / "mlp.safetensors").string();
  Dataset train = load_fashion_mnist(fashion_mnist_dir(), Split::Train, 2000);
  Dataset test = load_fashion_mnist(fashion_mnist_dir(), Split::Test, 500);

  Graph g = models::fashion_mnist({.arch = models::FashionArch::Mlp, .batch = 50, .mode = Mode::Train, .hidden = 64});
  Session s = compile(g, {.mode = Mode::Train, .optimizer = AdamW{.lr = 2e-3}, .backend = Backend::Cpu});
  BatchLoader loader(train, {.batch = 50, .seed = 3});
  std::vector<StepReport> seen;
  Trainer trainer(s, {.epochs = 2, .checkpoint = ckpt, .logits = "logits",
                      .on_step = [&](const StepReport& sr) { seen.push_back(sr); }});
  std::vector<EpochReport> r = trainer.fit(loader);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(s.step_count(), 80);
  const std::vector<float>& L = trainer.losses();
  ASSERT_EQ(L.size(), 80u);
  // Every step reaches the callback, in order, with the trainer's loss and the session's lr.
  ASSERT_EQ(seen.size(), 80u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].step, int64_t(i) + 1);
    EXPECT_EQ(seen[i].epoch, int64_t(i) / 40);
    EXPECT_EQ(seen[i].step_in_epoch, int64_t(i) % 40 + 1);
    EXPECT_EQ(seen[i].steps_in_epoch, 40);
    EXPECT_EQ(seen[i].epochs, 2);
    EXPECT_EQ(float(seen[i].loss), L[i]);
    EXPECT_DOUBLE_EQ(seen[i].lr, 2e-3);
    EXPECT_GE(seen[i].batch_accuracy, 0.0);
    EXPECT_LE(seen[i].batch_accuracy, 1.0);
    EXPECT_GT(seen[i].samples_per_second, 0.0);
  }
  EXPECT_NEAR(seen[39].mean_loss, r[0].mean_loss, 1e-9);
  // The batch accuracy is near chance at the start and well above it at the end (closed form: argmax of
  // the logits against the labels, computed by the trainer; the mean over the last 10 batches).
  double acc_last = 0;
  for (size_t k = 70; k < 80; ++k) acc_last += seen[k].batch_accuracy / 10;
  EXPECT_GT(acc_last, 0.6);
  EXPECT_NEAR(L[0], std::log(10.0), 0.3);  // torch's default init gives near-uniform logits
  double first = 0, last = 0;
  for (int k = 0; k < 10; ++k) first += L[size_t(k)] / 10, last += L[L.size() - 1 - size_t(k)] / 10;
  EXPECT_LT(last, 0.6 * first);
  EXPECT_LT(r[1].mean_loss, r[0].mean_loss);

  // Deploy: a fresh inference graph with another batch size and another init seed, loaded from the file.
  Graph gi = models::fashion_mnist({.arch = models::FashionArch::Mlp, .batch = 100, .mode = Mode::Infer, .hidden = 64, .seed = 77});
  Session inf = compile(gi, {.mode = Mode::Infer, .backend = Backend::Cpu});
  inf.load_checkpoint(ckpt);
  EvalResult ev = evaluate_classifier(inf, test);
  std::vector<int32_t> want = host_mlp_predictions(s, test);
  int differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += ev.predictions[i] != want[i];
  EXPECT_EQ(differ, 0);
  EXPECT_GT(ev.accuracy, 0.6);  // 2000 images, 2 epochs: far above chance (0.1)

  // accuracy_every: the batch accuracy only on steps whose number is a multiple of it.
  std::vector<StepReport> sparse;
  Trainer again(s, {.logits = "logits", .accuracy_every = 3,
                    .on_step = [&](const StepReport& sr) { sparse.push_back(sr); }});
  again.fit(loader);
  ASSERT_EQ(sparse.size(), 40u);
  for (const StepReport& sr : sparse) EXPECT_EQ(sr.batch_accuracy >= 0, sr.step % 3 == 0) << sr.step;
  fs::remove_all(dir);
}

TEST(Session, InputChecksAndBackendErrors) {
  Linear2 m;
  build_linear2(m, Mode::Infer);
  Session s = compile(m.g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([&] { s.set_input("x", std::vector<float>(5)); }).find("'x'"), std::string::npos);
  EXPECT_NE(msg([&] { s.set_input("y", std::vector<float>(16)); }).find("'y'"), std::string::npos);
  EXPECT_NE(msg([&] { s.set_input("x", std::vector<int32_t>(16)); }).find("dtype"), std::string::npos);
  EXPECT_NE(msg([&] { s.read("logits"); }).find("not run"), std::string::npos);
  EXPECT_THROW(s.step(), Error);
  EXPECT_EQ(s.shape_of("logits"), (Shape{8, 2}));
  EXPECT_STREQ(s.backend(), "cpu");
  Linear2 m2;
  build_linear2(m2, Mode::Infer);
  std::string e = msg([&] { compile(m2.g, {.mode = Mode::Infer, .backend = Backend::Vulkan, .device = test::device_options()}); });
  // Either a Vulkan engine is registered in this build, or the error says there is none.
  if (!e.empty()) {
    EXPECT_NE(e.find("Vulkan"), std::string::npos) << e;
  }
  Linear2 m3;
  build_linear2(m3, Mode::Train);
  e = msg([&] { compile(m3.g, {.mode = Mode::Train, .backend = Backend::Cpu, .loss = "nope"}); });
  EXPECT_NE(e.find("'nope'"), std::string::npos) << e;
}
