// ResNet builder (include/mgn/models.h) against torchvision (tests/ref/resnet_ref.py): the state_dict names
// and parameter counts; the real ResNet-50 loaded from torchvision's state_dict, eval logits (running
// statistics) and train-mode logits, loss and running-statistic updates (batch statistics) on the CPU
// reference executor in float64; every parameter gradient and one AdamW step of narrow ResNet-50 / ResNet-18
// against torch autograd and torch.optim.AdamW; and, where a Vulkan device exists, one forward + backward of
// a narrow ResNet-50 on Vulkan against the CPU executor.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/models.h"
#include "mgn/optim.h"
#include "mgn/session.h"
#include "plan/plan.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

constexpr const char* kRef = "tests/ref/resnet_ref.py";

struct RefRun {
  int depth = 50;
  int64_t width = 64, classes = 1000, batch = 2, image = 64;
  bool grads = false, adamw_step = false;
  AdamW opt{};
};

std::vector<float> input_images(const RefRun& r) {
  std::vector<double> d = test::random_normal(size_t(r.batch * 3 * r.image * r.image), 21);
  return {d.begin(), d.end()};
}

std::vector<int32_t> input_labels(const RefRun& r) {
  std::vector<int32_t> l(size_t(r.batch));
  for (int64_t i = 0; i < r.batch; ++i) l[size_t(i)] = int32_t((i * 37 + 5) % r.classes);
  return l;
}

std::map<std::string, StoredTensor> run_reference(const RefRun& r) {
  std::vector<double> cfg = {double(r.depth), double(r.width), double(r.classes), 1234.0, 1.0,
                             r.grads ? 1.0 : 0.0, r.adamw_step ? 1.0 : 0.0, r.opt.lr, r.opt.beta1,
                             r.opt.beta2, r.opt.eps, r.opt.weight_decay};
  return test::run_torch(kRef, {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg),
                                StoredTensor::from_f32("x", {r.batch, 3, r.image, r.image}, input_images(r)),
                                StoredTensor::from_i32("labels", {r.batch}, input_labels(r))});
}

models::ResNetConfig config(const RefRun& r, Mode mode) {
  return {.depth = r.depth, .batch = r.batch, .image_size = r.image, .num_classes = r.classes, .width = r.width,
          .mode = mode};
}

// Parameter and state names of the model (optimizer state excluded), in graph order.
std::vector<std::string> model_names(const Graph& g) {
  std::vector<std::string> names;
  for (int id : g.ir().parameters()) {
    const std::string& n = g.ir().node(id).name;
    if (n.rfind("optim.", 0) != 0) names.push_back(n);
  }
  return names;
}

// Loads torchvision's state_dict ("w.<key>") into the executor; the key sets must be equal.
void load_torch_weights(cpu::Executor& ex, const Graph& g, const std::map<std::string, StoredTensor>& ref) {
  std::set<std::string> ours, theirs;
  for (const std::string& n : model_names(g)) ours.insert(n);
  for (auto& [k, t] : ref)
    if (k.rfind("w.", 0) == 0) theirs.insert(k.substr(2));
  ASSERT_EQ(ours, theirs);
  for (const std::string& n : ours) {
    const StoredTensor& t = ref.at("w." + n);
    ASSERT_EQ(t.shape, g.get(n).shape()) << n;
    ex.set_state(n, t.to_f64());
  }
}

double rel_to(const std::vector<double>& got, const StoredTensor& want) { return test::rel_l2(got, want.to_f64()); }

}  // namespace

TEST(ResNet, NamesShapesAndParameterCountsMatchTorchvision) {
  // torchvision's published parameter counts (sum of p.numel() over model.parameters()).
  const std::pair<int, int64_t> counts[] = {{18, 11689512}, {34, 21797672}, {50, 25557032}, {101, 44549160}};
  for (auto [depth, want] : counts) {
    Graph g = models::resnet({.depth = depth, .mode = Mode::Infer});
    int64_t total = 0;
    for (Tensor p : g.parameters())
      if (g.ir().node(p.id()).trainable) total += p.numel();
    EXPECT_EQ(total, want) << "resnet" << depth;
  }
  Graph g = models::resnet({.depth = 50, .batch = 4, .mode = Mode::Train});
  EXPECT_EQ(g.get("x").shape(), (Shape{4, 3, 224, 224}));
  EXPECT_EQ(g.get("labels").dtype(), DType::I32);
  EXPECT_EQ(g.get("conv1.weight").shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(g.get("layer1.0.conv3.weight").shape(), (Shape{256, 64, 1, 1}));
  EXPECT_EQ(g.get("layer2.0.conv2.weight").shape(), (Shape{128, 128, 3, 3}));
  EXPECT_EQ(g.get("layer2.0.downsample.0.weight").shape(), (Shape{512, 256, 1, 1}));
  EXPECT_EQ(g.get("layer4.2.bn3.running_var").shape(), (Shape{2048}));
  EXPECT_EQ(g.get("fc.weight").shape(), (Shape{1000, 2048}));
  EXPECT_FALSE(g.find("layer1.1.downsample.0.weight").has_value());
  EXPECT_FALSE(g.ir().node(g.get("bn1.running_mean").id()).trainable);
  EXPECT_EQ(g.ir().assigns().size(), size_t(2 * 53));  // running mean and var of each of the 53 BNs
  EXPECT_TRUE(models::resnet({.depth = 50, .mode = Mode::Infer}).ir().assigns().empty());
  Graph r18 = models::resnet({.depth = 18, .num_classes = 10, .width = 16, .mode = Mode::Infer});
  EXPECT_EQ(r18.get("layer3.0.downsample.0.weight").shape(), (Shape{64, 32, 1, 1}));
  EXPECT_EQ(r18.get("fc.weight").shape(), (Shape{10, 128}));
  EXPECT_THROW(models::resnet({.depth = 20}), Error);
  EXPECT_THROW(models::resnet({.depth = 50, .blocks = {1, 1, 1}}), Error);
  EXPECT_THROW(models::resnet({.width = 0}), Error);
}

TEST(ResNet, InitializerFollowsTorchvision) {
  // kaiming_normal_(fan_out, relu) for convs: std sqrt(2 / (out · k · k)); BN 1 / 0; running 0 / 1.
  Graph g = models::resnet({.depth = 18, .batch = 1, .image_size = 32, .mode = Mode::Infer, .seed = 3});
  cpu::Executor ex(g.ir());
  auto sd = [](const std::vector<double>& v) {
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    double m = s / double(v.size());
    return std::sqrt(s2 / double(v.size()) - m * m);
  };
  EXPECT_NEAR(sd(ex.state("layer3.1.conv2.weight")) / std::sqrt(2.0 / (256 * 9)), 1.0, 0.02);
  EXPECT_NEAR(sd(ex.state("conv1.weight")) / std::sqrt(2.0 / (64 * 49)), 1.0, 0.05);
  // nn.Linear: U(-1/sqrt(in), 1/sqrt(in)) for weight (kaiming_uniform, a = sqrt 5) and bias.
  EXPECT_NEAR(sd(ex.state("fc.weight")) / (1.0 / std::sqrt(512.0) / std::sqrt(3.0)), 1.0, 0.02);
  for (double v : ex.state("layer2.1.bn2.weight")) ASSERT_EQ(v, 1.0);
  for (double v : ex.state("layer2.1.bn2.bias")) ASSERT_EQ(v, 0.0);
  for (double v : ex.state("layer2.1.bn2.running_var")) ASSERT_EQ(v, 1.0);
}

// The real ResNet-50 (width 64, 1000 classes) on a 2 x 3 x 64 x 64 batch, weights from torchvision's state_dict.
TEST(ResNet, Resnet50LogitsLossAndRunningStatsMatchTorchvision) {
  RefRun r;
  auto ref = run_reference(r);
  const std::vector<float> x = input_images(r);

  Graph ge = models::resnet(config(r, Mode::Infer));
  cpu::Executor eval(ge.ir(), {.float64 = true});
  load_torch_weights(eval, ge, ref);
  eval.set_input("x", x);
  eval.run();
  double e_eval = rel_to(eval.output("logits").v, ref.at("eval.logits"));
  EXPECT_LT(e_eval, 1e-9);

  Graph gt = models::resnet(config(r, Mode::Train));
  cpu::Executor train(gt.ir(), {.float64 = true});
  load_torch_weights(train, gt, ref);
  train.set_input("x", x);
  train.set_input("labels", input_labels(r));
  train.run();
  double e_train = rel_to(train.output("logits").v, ref.at("train.logits"));
  EXPECT_LT(e_train, 1e-9);
  double loss = train.output("loss").v[0], want = ref.at("train.loss").to_f64()[0];
  EXPECT_LT(std::fabs(loss - want) / std::fabs(want), 1e-10) << loss << " vs " << want;
  int stats = 0;
  double worst = 0;
  for (auto& [k, t] : ref)
    if (k.rfind("running.", 0) == 0) {
      double e = rel_to(train.state(k.substr(8)), t);
      EXPECT_LT(e, 1e-9) << k;
      worst = std::max(worst, e);
      ++stats;
    }
  EXPECT_EQ(stats, 2 * 53);
  std::printf("resnet50 vs torchvision: eval logits %.2e, train logits %.2e, loss %.2e, running stats <= %.2e\n",
              e_eval, e_train, std::fabs(loss - want) / std::fabs(want), worst);
}

// Narrow models (width 8, 10 classes): every parameter gradient of a train-mode step and the parameters and
// running statistics after one AdamW step, against torch autograd and torch.optim.AdamW.
class ResNetNarrow : public ::testing::TestWithParam<int> {};  // param: depth

TEST_P(ResNetNarrow, EveryGradientAndOneAdamWStepMatchTorch) {
  RefRun r{.depth = GetParam(), .width = 8, .classes = 10, .batch = 2, .image = 64, .adamw_step = true};
  r.opt = AdamW{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
  auto ref = run_reference(r);

  Graph g = models::resnet(config(r, Mode::Train));
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  UpdatePlan up = append_optimizer(g, grads.params, r.opt);
  g.verify();
  cpu::Executor ex(g.ir(), {.float64 = true});
  load_torch_weights(ex, g, ref);
  ex.set_input("x", input_images(r));
  ex.set_input("labels", input_labels(r));
  std::vector<float> sc = up.scalar_inputs(r.opt.lr, 0);
  for (size_t i = 0; i < sc.size(); ++i) ex.set_input(up.inputs[i], std::vector<double>{sc[i]});
  ex.run();

  double loss = ex.output("loss").v[0], want = ref.at("train.loss").to_f64()[0];
  EXPECT_LT(std::fabs(loss - want) / std::fabs(want), 1e-10);
  EXPECT_LT(rel_to(ex.output("logits").v, ref.at("train.logits")), 1e-9);
  size_t trainable = 0;
  double worst_grad = 0, worst_step = 0, worst_stat = 0;
  for (const std::string& n : model_names(g)) {
    if (n.find("running_") != std::string::npos) {
      double e = rel_to(ex.state(n), ref.at("running." + n));
      EXPECT_LT(e, 1e-9) << n;
      worst_stat = std::max(worst_stat, e);
      continue;
    }
    ++trainable;
    ASSERT_TRUE(grads.params.count(n)) << n;
    double eg = rel_to(ex.output("grad." + n).v, ref.at("grad." + n));
    EXPECT_LT(eg, 1e-4) << n;
    worst_grad = std::max(worst_grad, eg);
    // The update itself (new - old), so that the tolerance does not hide in the size of the weight. Adam
    // normalizes per element, so a gradient element near eps (1e-8) turns its tiny absolute error into a
    // visible update error (bn1.bias: ~1e-6); the runtime scalars (lr, bias corrections) are f32 (~5e-8).
    std::vector<double> before = ref.at("w." + n).to_f64(), after = ref.at("step." + n).to_f64();
    std::vector<double> got = ex.state(n);
    for (size_t i = 0; i < before.size(); ++i) after[i] -= before[i], got[i] -= before[i];
    double es = test::rel_l2(got, after);
    EXPECT_LT(es, 1e-5) << n;
    if (std::getenv("MGN_RESNET_VERBOSE")) std::printf("  %-40s grad %.2e  update %.2e\n", n.c_str(), eg, es);
    worst_step = std::max(worst_step, es);
  }
  EXPECT_EQ(trainable, grads.params.size());
  std::printf("resnet%d width 8 vs torch: gradients <= %.2e, AdamW updates <= %.2e, running stats <= %.2e "
              "(%zu parameters)\n",
              r.depth, worst_grad, worst_step, worst_stat, trainable);
}

INSTANTIATE_TEST_SUITE_P(Depths, ResNetNarrow, ::testing::Values(50, 18));

// The static plan on a whole ResNet training step (narrow ResNet-50, AdamW, train-mode BN): the CPU executor
// run through the plan (arena poisoned every step, a group's reads before its writes) must equal the
// run with separate memory per tensor bitwise over two steps, outputs and every state tensor, including the optimizer's
// intermediates that the plan writes into their parameter's or moment's memory.
TEST(ResNet, PlannedTrainingStepsEqualSeparateMemory) {
  Graph g = models::resnet({.depth = 50, .batch = 2, .image_size = 32, .num_classes = 10, .width = 8,
                            .mode = Mode::Train, .seed = 9});
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  UpdatePlan up = append_optimizer(g, grads.params, AdamW{});
  g.verify();
  cpu::Executor plain(g.ir(), {.plan = test::separate_memory_plan()}), planned(g.ir(), {.plan = plan::PlanOptions{}});
  const plan::Plan& p = planned.plan();
  int borrowed = 0;  // step-local results living in a parameter's or state's memory
  for (int i = 0; i < g.ir().size(); ++i)
    if (p.in_place_of[size_t(i)] && plan::is_pinned(p.storages[size_t(p.storage_of[size_t(i)])].cls)) ++borrowed;
  EXPECT_GT(borrowed, 0);
  RefRun r{.width = 8, .classes = 10, .batch = 2, .image = 32};
  for (int step = 0; step < 2; ++step) {
    std::vector<float> sc = up.scalar_inputs(1e-3, step);
    for (cpu::Executor* e : {&plain, &planned}) {
      e->set_input("x", test::random_normal(size_t(2 * 3 * 32 * 32), 40 + uint64_t(step)));
      e->set_input("labels", input_labels(r));
      for (size_t i = 0; i < sc.size(); ++i) e->set_input(up.inputs[i], std::vector<double>{sc[i]});
      e->run();
    }
    for (auto& [name, id] : g.ir().outputs()) EXPECT_EQ(plain.output(name).v, planned.output(name).v) << name;
    for (const std::string& n : plain.state_names())
      ASSERT_EQ(plain.state(n), planned.state(n)) << n << " step " << step;
  }
  std::printf("narrow resnet50 step: %d dispatches in %d groups, %d results borrow a parameter's memory\n",
              p.num_dispatches(), p.num_groups(), borrowed);
}

#ifdef MGN_HAVE_VULKAN
// One forward + backward of a narrow ResNet-50 (train-mode BN) on Vulkan and on the CPU executor, both f32,
// against the CPU executor in float64 (same initial weights, from the graph's initializers). Vulkan must be
// within 1e-3 (gradients; 1e-4 logits, loss, running statistics) of the float64 result, or no worse than 3x
// the f32 CPU executor's own error: a BN bias gradient is a sum over batch and space with heavy cancellation,
// where f32 rounding alone reaches ~1e-3.
// 64 x 64 images: layer4 is then 2 x 2, so its BNs see 8 values per channel (at 1 x 1 they would see 2, and
// normalizing two values has a vanishing Jacobian: the gradient below it would be rounding noise).
TEST(ResNetVulkan, ForwardAndEveryGradientMatchCpu) {
  const models::ResNetConfig cfg{.depth = 50, .batch = 2, .image_size = 64, .num_classes = 10, .width = 8,
                                 .mode = Mode::Train, .seed = 5};
  auto flb = [&] {
    Graph g = models::resnet(cfg);
    Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
    for (auto& [name, t] : grads.params) g.output("grad." + name, t);
    return g;
  };
  Graph gc = flb(), gv = flb(), g64 = flb();
  Session cpu = compile(gc, {.mode = Mode::Infer, .backend = Backend::Cpu});
  Session gpu = compile(gv, {.mode = Mode::Infer, .backend = Backend::Auto, .device = test::device_options()});
  if (std::string(gpu.backend()) == "cpu") GTEST_SKIP() << "no Vulkan device";
  RefRun r{.width = 8, .classes = 10, .batch = 2, .image = 64};
  for (Session* s : {&cpu, &gpu}) {
    s->set_input("x", input_images(r));
    s->set_input("labels", input_labels(r));
    s->run();
  }
  cpu::Executor exact(g64.ir(), {.float64 = true});
  exact.set_input("x", input_images(r));
  exact.set_input("labels", input_labels(r));
  exact.run();
  auto err = [&](Session& s, const std::string& key, bool state) {
    std::vector<float> v = s.read(key);
    return test::rel_l2(std::vector<double>(v.begin(), v.end()), state ? exact.state(key) : exact.output(key).v);
  };
  auto check = [&](const std::string& key, bool state, double tol) {
    double ev = err(gpu, key, state), ec = err(cpu, key, state);
    EXPECT_TRUE(ev < tol || ev < 3 * ec) << key << ": Vulkan " << ev << ", CPU f32 " << ec;
    if (std::getenv("MGN_RESNET_VERBOSE")) std::printf("  %-40s vulkan %.2e  cpu-f32 %.2e\n", key.c_str(), ev, ec);
    return ev;
  };
  check("logits", false, 1e-4);
  check("loss", false, 1e-4);
  double worst = 0;
  int n = 0;
  for (const std::string& name : model_names(gc)) {
    bool stat = name.find("running_") != std::string::npos;
    double e = check(stat ? name : "grad." + name, stat, stat ? 1e-4 : 1e-3);
    if (!stat) worst = std::max(worst, e), ++n;
  }
  std::printf("resnet50 width 8 on %s vs float64: %d gradients, worst rel L2 %.2e\n", gpu.backend(), n, worst);
}
#endif
