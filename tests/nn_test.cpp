// Layer helpers (include/mgn/nn.h): parameter names/shapes/initializers (closed forms), batch-norm running
// statistics (closed form computed here in plain loops), Llama self-attention against PyTorch.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/executor.h"
#include "mgn/nn.h"
#include "support/test_util.h"

using namespace mgn;

TEST(Nn, LinearNamesShapesAndPyTorchInitBounds) {
  Graph g;
  Tensor x = g.input("x", {3, 50});
  Tensor y = nn::linear(g, "fc", x, 40);
  EXPECT_EQ(y.shape(), (Shape{3, 40}));
  Tensor w = g.get("fc.weight"), b = g.get("fc.bias");
  EXPECT_EQ(w.shape(), (Shape{40, 50}));
  EXPECT_EQ(b.shape(), (Shape{40}));
  // kaiming_uniform(a = sqrt 5) on fan_in 50: bound sqrt(6 / ((1 + 5) * 50)) = 1 / sqrt(50); bias the same.
  double bound = 1.0 / std::sqrt(50.0);
  for (const char* name : {"fc.weight", "fc.bias"}) {
    const ir::Node& n = g.ir().node(g.get(name).id());
    std::vector<float> v = materialize(n.init, n.shape, n.name);
    double lo = 1e9, hi = -1e9;
    for (float f : v) lo = std::min(lo, double(f)), hi = std::max(hi, double(f));
    EXPECT_GE(lo, -bound) << name;
    EXPECT_LE(hi, bound) << name;
    EXPECT_GT(hi, 0.8 * bound) << name << ": values do not fill the range";
  }
  EXPECT_THROW(nn::linear(g, "fc", x, 40), Error);  // duplicate parameter names
  Graph other;
  EXPECT_THROW(nn::linear(other, "fc2", x, 4), Error);  // input from another graph
}

TEST(Nn, ConvAndNormParameters) {
  Graph g;
  Tensor x = g.input("x", {2, 4, 9, 9});
  Tensor y = nn::conv2d(g, "c", x, 6, 3, {.stride = {2, 2}, .padding = {1, 1}, .groups = 2});
  EXPECT_EQ(y.shape(), (Shape{2, 6, 5, 5}));
  EXPECT_EQ(g.get("c.weight").shape(), (Shape{6, 2, 3, 3}));
  EXPECT_THROW(nn::conv2d(g, "bad", x, 5, 3, {.groups = 2}), Error);
  nn::layer_norm(g, "ln", x);
  nn::rms_norm(g, "rms", x);
  EXPECT_EQ(g.get("ln.weight").shape(), (Shape{9}));
  EXPECT_EQ(g.get("rms.weight").shape(), (Shape{9}));
  Tensor ids = g.input("ids", {2, 3}, DType::I32);
  EXPECT_EQ(nn::embedding(g, "emb", ids, 11, 5).shape(), (Shape{2, 3, 5}));
}

TEST(Nn, BatchNormTrainUpdatesRunningStatisticsLikeTorch) {
  const int64_t n = 3, c = 2, h = 2, w = 3;
  Graph g;
  Tensor x = g.input("x", {n, c, h, w});
  g.output("y", nn::batch_norm2d(g, "bn", x, nn::Mode::Train, 0.1, 1e-5));
  cpu::Executor ex(g.ir(), {.float64 = true});
  std::vector<double> xv = test::random_normal(size_t(n * c * h * w), 7, 2.0);
  ex.set_input("x", xv);
  ex.run();
  // Closed form: per channel mean and unbiased variance, momentum 0.1 from (0, 1).
  const double m = double(n * h * w);
  std::vector<double> want_mean(c), want_var(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k) s += xv[size_t((i * c + ch) * h * w + k)];
    double mu = s / m;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < h * w; ++k) {
        double d = xv[size_t((i * c + ch) * h * w + k)] - mu;
        s2 += d * d;
      }
    want_mean[size_t(ch)] = 0.1 * mu;
    want_var[size_t(ch)] = 0.9 + 0.1 * s2 / (m - 1);
  }
  EXPECT_LE(test::max_abs_diff(ex.state("bn.running_mean"), want_mean), 1e-12);
  EXPECT_LE(test::max_abs_diff(ex.state("bn.running_var"), want_var), 1e-12);
  // Eval mode on the same parameter names reads the running statistics.
  Graph ge;
  Tensor xe = ge.input("x", {n, c, h, w});
  ge.output("y", nn::batch_norm2d(ge, "bn", xe, nn::Mode::Eval));
  cpu::Executor exe(ge.ir(), {.float64 = true});
  exe.set_state("bn.running_mean", want_mean);
  exe.set_state("bn.running_var", want_var);
  exe.set_input("x", xv);
  exe.run();
  const auto& y = exe.output("y").v;
  for (int64_t i = 0; i < n * c * h * w; ++i) {
    size_t ch = size_t((i / (h * w)) % c);
    double want = (xv[size_t(i)] - want_mean[ch]) / std::sqrt(want_var[ch] + 1e-5);
    ASSERT_NEAR(y[size_t(i)], want, 1e-12) << i;
  }
}

TEST(Nn, SelfAttentionMatchesPyTorchLlamaAttention) {
  const int64_t b = 2, s = 5, hidden = 24, heads = 4, kv_heads = 2;
  const double theta = 10000;
  Graph g;
  Tensor x = g.input("x", {b, s, hidden});
  g.output("y", nn::self_attention(g, "attn", x, {.heads = heads, .kv_heads = kv_heads, .rope_theta = theta}));
  cpu::Executor ex(g.ir(), {.float64 = true});
  std::vector<double> xv = test::random_normal(size_t(b * s * hidden), 3);
  ex.set_input("x", xv);
  ex.run();

  std::vector<StoredTensor> io;
  io.push_back(StoredTensor::from_f64("x", {b, s, hidden}, xv));
  io.push_back(StoredTensor::from_f32("cfg", {3}, {float(heads), float(kv_heads), float(theta)}));
  for (const std::string& name : ex.state_names()) {
    const std::vector<double>& v = ex.state(name);
    io.push_back(StoredTensor::from_f64(name, g.get(name).shape(), v));
  }
  auto ref = test::run_torch("tests/ref/nn_attention_ref.py", io);
  EXPECT_LE(test::rel_l2(ex.output("y").v, ref.at("y").to_f64()), 1e-10);
}
