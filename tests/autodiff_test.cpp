// Autodiff against central finite differences: for every differentiable op of the op table, the CPU
// executor in float64 computes d sum(out * cot) / d input, compared with (f(x+h) - f(x-h)) / 2h in double.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/graph.h"
#include "passes/autodiff_table.h"

namespace {

using mgn::DType;
using mgn::Graph;
using mgn::Shape;
using mgn::Tensor;
using mgn::ir::Op;

// Builds the forward graph of one case: float inputs (the leaves to differentiate) with random values.
struct Case {
  Graph& g;
  std::mt19937_64 rng{1234};
  std::vector<std::pair<Tensor, std::vector<double>>> leaves;

  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  // Values in [lo, hi] at least `gap` away from each kink (so finite differences never straddle one).
  Tensor in(const Shape& s, double lo = -1, double hi = 1, std::vector<double> kinks = {}, double gap = 0.05) {
    std::vector<double> v(size_t(mgn::numel(s)));
    for (double& x : v) {
      bool ok;
      do {
        x = uniform(lo, hi);
        ok = true;
        for (double k : kinks) ok = ok && std::fabs(x - k) > gap;
      } while (!ok);
    }
    Tensor t = g.input("x" + std::to_string(leaves.size()), s);
    leaves.emplace_back(t, v);
    return t;
  }
  Tensor ints(const Shape& s, std::vector<int32_t> v) { return g.constant_i32(s, v); }
};

using CaseFn = std::function<Tensor(Case&)>;

Tensor flat(Tensor t) { return mgn::reshape(t, {t.numel()}); }

// One (or more) small graphs per differentiable op. The op-table walk below fails for an op without one.
const std::map<Op, CaseFn>& cases() {
  using namespace mgn;
  static const std::map<Op, CaseFn> m = {
      {Op::Neg, [](Case& c) { return neg(c.in({2, 3})); }},
      {Op::Abs, [](Case& c) { return abs(c.in({2, 3}, -1, 1, {0.0})); }},
      {Op::Exp, [](Case& c) { return exp(c.in({2, 3})); }},
      {Op::Log, [](Case& c) { return log(c.in({2, 3}, 0.3, 2)); }},
      {Op::Sqrt, [](Case& c) { return sqrt(c.in({2, 3}, 0.3, 2)); }},
      {Op::Rsqrt, [](Case& c) { return rsqrt(c.in({2, 3}, 0.3, 2)); }},
      {Op::Reciprocal, [](Case& c) { return reciprocal(c.in({2, 3}, 0.3, 2)); }},
      {Op::Square, [](Case& c) { return square(c.in({2, 3})); }},
      {Op::Relu, [](Case& c) { return relu(c.in({2, 3}, -1, 1, {0.0})); }},
      {Op::LeakyRelu, [](Case& c) { return leaky_relu(c.in({2, 3}, -1, 1, {0.0}), 0.1); }},
      {Op::GeluErf, [](Case& c) { return gelu(c.in({2, 3}, -3, 3)); }},
      {Op::GeluTanh, [](Case& c) { return gelu_tanh(c.in({2, 3}, -3, 3)); }},
      {Op::Silu, [](Case& c) { return silu(c.in({2, 3}, -3, 3)); }},
      {Op::Sigmoid, [](Case& c) { return sigmoid(c.in({2, 3}, -3, 3)); }},
      {Op::Tanh, [](Case& c) { return tanh(c.in({2, 3}, -2, 2)); }},
      // Also above PyTorch's threshold 20, where softplus is linear.
      {Op::Softplus, [](Case& c) { return softplus(c.in({2, 4}, -3, 25, {20.0}, 0.5)); }},
      {Op::Erf, [](Case& c) { return erf(c.in({2, 3}, -2, 2)); }},
      {Op::Sin, [](Case& c) { return sin(c.in({2, 3}, -3, 3)); }},
      {Op::Cos, [](Case& c) { return cos(c.in({2, 3}, -3, 3)); }},
      {Op::PowScalar, [](Case& c) { return pow(c.in({2, 3}, 0.3, 2), 2.5); }},
      {Op::Clamp, [](Case& c) { return clamp(c.in({3, 4}, -2, 2, {-0.5, 0.7}), -0.5, 0.7); }},
      {Op::Cast, [](Case& c) { return cast(cast(c.in({2, 3}), DType::F16), DType::F32); }},
      // Closed form, not finite differences: out = x * stop_gradient(x) has d/dx = x, not 2x.
      {Op::StopGradient, [](Case& c) { Tensor x = c.in({2, 3}); return x * stop_gradient(x); }},
      {Op::Add, [](Case& c) { return c.in({2, 3}) + c.in({3}); }},
      {Op::Sub, [](Case& c) { return c.in({2, 1}) - c.in({2, 3}); }},
      {Op::Mul, [](Case& c) { return c.in({2, 1, 4}) * c.in({3, 1}); }},
      {Op::Div, [](Case& c) { return c.in({2, 3}) / c.in({1, 3}, 0.5, 2); }},
      {Op::Maximum, [](Case& c) { return maximum(c.in({2, 3}), c.in({3})); }},
      {Op::Minimum, [](Case& c) { return minimum(c.in({2, 1}), c.in({2, 3})); }},
      {Op::Where,
       [](Case& c) {
         Tensor sel = c.g.constant({2, 3}, std::vector<float>{1, -1, 2, -3, 1, 1});
         return where(greater(sel, c.g.scalar(0)), c.in({2, 3}), c.in({3}));
       }},
      {Op::ReduceSum, [](Case& c) { Tensor x = c.in({2, 3, 4}); return concat({flat(sum(x, {1})), flat(sum(x, {0, 2}, true)), flat(sum(x))}, 0); }},
      {Op::ReduceMean, [](Case& c) { Tensor x = c.in({2, 3, 4}); return concat({flat(mean(x, {-1})), flat(mean(x, {0, 1}, true)), flat(mean(x))}, 0); }},
      {Op::ReduceMax, [](Case& c) { Tensor x = c.in({2, 3, 4}); return concat({flat(max(x, {1})), flat(max(x, {}, true))}, 0); }},
      {Op::ReduceMin, [](Case& c) { Tensor x = c.in({2, 3, 4}); return concat({flat(min(x, {0, 2})), flat(min(x))}, 0); }},
      {Op::Softmax, [](Case& c) { return softmax(c.in({2, 3, 4}, -2, 2), 1); }},
      {Op::LogSoftmax, [](Case& c) { return log_softmax(c.in({3, 5}, -2, 2)); }},
      {Op::LogSumExp, [](Case& c) { Tensor x = c.in({3, 4}, -2, 2); return concat({logsumexp(x, 0), flat(logsumexp(x, -1, true))}, 0); }},
      {Op::MatMul,
       [](Case& c) {
         Tensor a = c.in({2, 3, 4}), b = c.in({4, 5}), at = c.in({4, 3}), bt = c.in({2, 1, 5, 4});
         // A matrix shared by the batches (a linear layer's weight, stored [out, in] or [in, out]; its gradient
         // folds the batch into the rows), over 3-D and 4-D batches, and under a transposed batched a (no fold).
         Tensor w = c.in({5, 4}), a4 = c.in({2, 2, 3, 4}), abt = c.in({2, 4, 3});
         return concat({flat(matmul(a, b)), flat(matmul(at, b, true, false)), flat(matmul(a, bt, false, true)),
                        flat(matmul(at, bt, true, true)), flat(matmul(a, w, false, true)), flat(matmul(a4, b)),
                        flat(matmul(a4, w, false, true)), flat(matmul(abt, b, true, false))},
                       0);
       }},
      {Op::LayerNorm, [](Case& c) { return layer_norm(c.in({3, 5}, -2, 2), c.in({5}), c.in({5}), 1e-5); }},
      {Op::RmsNorm, [](Case& c) { return rms_norm(c.in({2, 3, 4}, -2, 2), c.in({4}), 1e-5); }},
      {Op::GroupNorm, [](Case& c) { return group_norm(c.in({2, 4, 2, 3}, -2, 2), 2, c.in({4}), c.in({4}), 1e-5); }},
      {Op::BatchNorm, [](Case& c) { return batch_norm(c.in({3, 2, 2, 2}, -2, 2), c.in({2}), c.in({2}), 1e-5); }},
      {Op::Conv2d,
       [](Case& c) {
         Tensor x = c.in({2, 4, 5, 5}), w = c.in({6, 2, 3, 3});
         Tensor y1 = conv2d(x, w, {.stride = {2, 1}, .padding = {1, 0, 0, 1}, .dilation = {1, 1}, .groups = 2});
         Tensor y2 = conv2d(x, slice(slice(w, 0, 0, 4), 1, 0, 1), {.stride = {1, 1}, .padding = {0, 0}, .dilation = {2, 2}, .groups = 4});
         return concat({flat(y1), flat(y2)}, 0);
       }},
      // The transposed convolution (conv_transpose2d is conv2d_grad_input): asymmetric padding, output padding,
      // groups and dilation.
      {Op::Conv2dGradInput,
       [](Case& c) {
         Tensor x = c.in({2, 4, 3, 3}), w = c.in({4, 2, 3, 2});
         Tensor y1 = conv_transpose2d(x, w, {.stride = {2, 1}, .padding = {1, 0, 0, 1}, .output_padding = {1, 0},
                                             .dilation = {1, 2}, .groups = 2});
         Tensor y2 = conv_transpose2d(slice(x, 1, 0, 2), slice(w, 0, 0, 2), {.stride = {1, 2}});
         return concat({flat(y1), flat(y2)}, 0);
       }},
      {Op::MaxPool2d, [](Case& c) { return max_pool2d(c.in({1, 2, 5, 5}), {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}}); }},
      {Op::AvgPool2d,
       [](Case& c) {
         Tensor x = c.in({1, 2, 5, 5});
         return concat({flat(avg_pool2d(x, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false})),
                        flat(avg_pool2d(x, {.kernel = {2, 2}, .stride = {1, 2}, .padding = {1, 1}}))},
                       0);
       }},
      {Op::Upsample2d, [](Case& c) { return upsample_nearest2d(c.in({1, 2, 2, 3}), 2, 3); }},
      {Op::Attention,
       [](Case& c) {
         Tensor q = c.in({1, 4, 3, 4}), k = c.in({1, 2, 5, 4}), v = c.in({1, 2, 5, 3});
         Tensor mask = c.g.constant({3, 5}, std::vector<float>{0, -1, 0, 0.5, 0, 0, 0, -2, 0, 0, 1, 0, 0, 0, -0.5});
         return concat({flat(attention(q, k, v, {.causal = true})), flat(attention(q, k, v, {.scale = 0.7, .mask = mask}))}, 0);
       }},
      {Op::Rope, [](Case& c) { return rope(c.in({1, 2, 3, 4}), c.in({3, 2}), c.in({3, 2})); }},
      {Op::Reshape, [](Case& c) { return reshape(c.in({2, 3, 2}), {3, -1}); }},
      {Op::Permute, [](Case& c) { return permute(c.in({2, 3, 4}), {2, 0, 1}); }},
      {Op::Slice, [](Case& c) { return slice(c.in({3, 7}), 1, 1, 7, 2); }},
      {Op::Concat, [](Case& c) { return concat({c.in({2, 3}), c.in({2, 1}), c.in({2, 2})}, 1); }},
      {Op::Pad, [](Case& c) { return pad(c.in({2, 3}), {1, 0, 2, 1}, 0.5); }},
      {Op::Expand, [](Case& c) { return expand(c.in({3, 1}), {2, 3, 4}); }},
      {Op::Gather,
       [](Case& c) {
         Tensor t = c.in({5, 3});
         Tensor rows = gather(t, c.ints({2, 2}, {4, 1, 1, 0}), 0);  // repeated index: contributions add
         Tensor cols = gather(t, c.ints({3}, {2, 2, 0}), 1);
         return concat({flat(rows), flat(cols)}, 0);
       }},
      {Op::GatherElements,
       [](Case& c) {
         Tensor t = c.in({3, 4});
         // Repeated indices (their contributions add) and a negative one (counts from the end).
         Tensor rows = gather_elements(t, c.ints({2, 4}, {2, 0, 1, 2, 2, -1, 0, 0}), 0);
         Tensor cols = gather_elements(t, c.ints({3, 2}, {3, 3, 0, 1, 2, 0}), 1);
         return concat({flat(rows), flat(cols)}, 0);
       }},
      {Op::ScatterElements,
       [](Case& c) {
         Tensor d = c.in({3, 4}), u = c.in({2, 4}), v = c.in({3, 2});
         // none: distinct indices per column; add: repeated ones.
         Tensor none = scatter_elements(d, c.ints({2, 4}, {2, 0, 1, 2, 0, 1, 0, 1}), u, 0);
         Tensor add = scatter_elements(d, c.ints({3, 2}, {3, 3, 0, 1, 2, 2}), v, 1, ScatterReduction::Add);
         return concat({flat(none), flat(add)}, 0);
       }},
      {Op::CrossEntropy,
       [](Case& c) {
         Tensor z = c.in({4, 5}, -2, 2);
         Tensor labels = c.ints({4}, {3, -100, 0, 4});
         return cross_entropy(z, labels) + cross_entropy(z, labels, {.label_smoothing = 0.1}) * 2.0;
       }},
  };
  return m;
}

std::vector<double> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

bool pending(const mgn::Error& e) { return std::string(e.what()).find("CPU kernel pending") != std::string::npos; }

// Builds the case, appends backward of sum(out * cot) w.r.t. every leaf, and returns the analytic gradient
// and the finite-difference one per leaf.
struct GradCheck {
  std::vector<std::vector<double>> analytic, numeric, values, cot_times_x;
};

GradCheck run_case(const CaseFn& fn) {
  Graph g;
  Case c{g};
  Tensor out = fn(c);
  int n_fwd = g.ir().size();
  int64_t fwd_max = 0;
  for (const auto& n : g.ir().nodes()) fwd_max = std::max(fwd_max, mgn::numel(n.shape));
  Tensor cot = g.input("cot", out.shape());
  std::vector<double> cot_v = random_values(size_t(out.numel()), 99);
  Tensor loss = mgn::sum(out * cot);
  std::vector<Tensor> leaves;
  for (auto& [t, v] : c.leaves) leaves.push_back(t);
  mgn::Gradients gr = mgn::backward(g, loss, {.inputs = leaves});
  // No rule may materialize a tensor much larger than the forward graph's largest tensor.
  for (int id = n_fwd; id < g.ir().size(); ++id)
    EXPECT_LE(mgn::numel(g.ir().node(id).shape), fwd_max) << g.ir().describe(id);
  g.output("loss", loss);
  for (size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_EQ(gr.inputs[i].shape(), leaves[i].shape());
    g.output("grad" + std::to_string(i), gr.inputs[i]);
  }
  mgn::cpu::Executor ex(g.ir(), {.float64 = true});
  ex.set_input("cot", cot_v);
  for (auto& [t, v] : c.leaves) ex.set_input(g.ir().node(t.id()).name, v);
  ex.run();
  GradCheck r;
  for (size_t i = 0; i < leaves.size(); ++i) r.analytic.push_back(ex.output("grad" + std::to_string(i)).v);
  const double h = 1e-6;
  for (auto& [t, v] : c.leaves) {
    const std::string& name = g.ir().node(t.id()).name;
    std::vector<double> fd(v.size());
    for (size_t j = 0; j < v.size(); ++j) {
      std::vector<double> p = v;
      p[j] = v[j] + h;
      ex.set_input(name, p);
      ex.run();
      double lp = ex.output("loss").v[0];
      p[j] = v[j] - h;
      ex.set_input(name, p);
      ex.run();
      double lm = ex.output("loss").v[0];
      fd[j] = (lp - lm) / (2 * h);
    }
    ex.set_input(name, v);
    r.numeric.push_back(fd);
    r.values.push_back(v);
  }
  r.cot_times_x.push_back(cot_v);
  return r;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-6);
}

std::vector<Op> differentiable_ops() {
  std::vector<Op> ops;
  for (int i = 0; i < mgn::ir::kOpCount; ++i)
    if (mgn::ir::op_info(Op(i)).differentiable) ops.push_back(Op(i));
  return ops;
}

TEST(AutodiffTable, RulesExactlyForDifferentiableOps) {
  for (int i = 0; i < mgn::ir::kOpCount; ++i) {
    Op op = Op(i);
    EXPECT_EQ(mgn::ir::has_gradient_rule(op), mgn::ir::op_info(op).differentiable) << mgn::ir::op_name(op);
  }
}

class OpGrad : public ::testing::TestWithParam<Op> {};

TEST_P(OpGrad, MatchesFiniteDifferences) {
  Op op = GetParam();
  auto it = cases().find(op);
  ASSERT_NE(it, cases().end()) << "differentiable op '" << mgn::ir::op_name(op)
                               << "' has no gradient test case in tests/autodiff_test.cpp";
  GradCheck r;
  try {
    r = run_case(it->second);
  } catch (const mgn::Error& e) {
    if (pending(e)) GTEST_SKIP() << e.what();
    throw;
  }
  for (size_t i = 0; i < r.analytic.size(); ++i) {
    if (op == Op::StopGradient) {
      // d sum(cot * x * sg(x)) / dx = cot * x.
      std::vector<double> want(r.values[i].size());
      for (size_t j = 0; j < want.size(); ++j) want[j] = r.cot_times_x[0][j] * r.values[i][j];
      EXPECT_LT(rel_l2(r.analytic[i], want), 1e-12);
      continue;
    }
    double e = rel_l2(r.analytic[i], r.numeric[i]);
    EXPECT_LT(e, 1e-6) << "input " << i << " of " << mgn::ir::op_name(op);
  }
}

INSTANTIATE_TEST_SUITE_P(AllDifferentiableOps, OpGrad, ::testing::ValuesIn(differentiable_ops()),
                         [](const ::testing::TestParamInfo<Op>& info) {
                           return std::string(mgn::ir::op_name(info.param));
                         });

// ---- behaviour of the transformation itself (closed forms)

std::vector<double> run1(Graph& g, const std::map<std::string, std::vector<double>>& in, const std::string& out) {
  mgn::cpu::Executor ex(g.ir(), {.float64 = true});
  for (const auto& [k, v] : in) ex.set_input(k, v);
  ex.run();
  return ex.output(out).v;
}

TEST(Autodiff, PathsAreSummed) {
  Graph g;
  Tensor x = g.input("x", {3});
  Tensor loss = mgn::sum(x * x + x * 3.0);  // d/dx = 2x + 3: three uses of x
  mgn::Gradients gr = mgn::backward(g, loss, {.inputs = {x}});
  g.output("dx", gr.inputs[0]);
  auto dx = run1(g, {{"x", {1, -2, 0.5}}}, "dx");
  EXPECT_DOUBLE_EQ(dx[0], 5);
  EXPECT_DOUBLE_EQ(dx[1], -1);
  EXPECT_DOUBLE_EQ(dx[2], 4);
}

TEST(Autodiff, BroadcastingIsSummed) {
  Graph g;
  Tensor x = g.input("x", {2, 3});
  Tensor b = g.parameter("b", {3}, mgn::Init::constant(0.5));
  Tensor s = g.parameter("s", {}, mgn::Init::constant(2.0));
  Tensor loss = mgn::sum((x + b) * s);
  mgn::Gradients gr = mgn::backward(g, loss);
  ASSERT_EQ(gr.params.size(), 2u);
  EXPECT_EQ(gr.params.at("b").shape(), Shape({3}));
  EXPECT_EQ(gr.params.at("s").shape(), Shape({}));
  g.output("db", gr.params.at("b"));
  g.output("ds", gr.params.at("s"));
  std::map<std::string, std::vector<double>> in = {{"x", {1, 2, 3, 4, 5, 6}}};
  auto db = run1(g, in, "db");
  EXPECT_EQ(db, (std::vector<double>{4, 4, 4}));      // s summed over the 2 rows
  EXPECT_DOUBLE_EQ(run1(g, in, "ds")[0], 21 + 3.0);  // sum(x + b)
}

TEST(Autodiff, StopGradientFrozenAndUnreached) {
  Graph g;
  Tensor x = g.input("x", {2});
  Tensor w = g.parameter("w", {2}, mgn::Init::constant(3.0));
  Tensor frozen = g.parameter("enc.w", {2}, mgn::Init::constant(1.0));
  Tensor unused = g.parameter("unused", {2});
  Tensor blocked = g.parameter("blocked", {2}, mgn::Init::constant(1.0));
  Tensor other = g.input("other", {2});
  g.freeze("enc.");
  Tensor loss = mgn::sum(x * w * frozen + mgn::stop_gradient(blocked * x));
  g.output("unused_out", unused * 2.0);
  mgn::Gradients gr = mgn::backward(g, loss, {.inputs = {x, other}});
  EXPECT_EQ(gr.params.count("w"), 1u);
  EXPECT_EQ(gr.params.count("enc.w"), 0u) << "frozen parameter got a gradient";
  EXPECT_EQ(gr.params.count("unused"), 0u) << "unreached parameter got a gradient";
  EXPECT_EQ(gr.params.count("blocked"), 0u) << "stop_gradient did not block";
  g.output("dx", gr.inputs[0]);
  g.output("dother", gr.inputs[1]);
  std::map<std::string, std::vector<double>> in = {{"x", {1, 2}}, {"other", {5, 6}}};
  EXPECT_EQ(run1(g, in, "dx"), (std::vector<double>{3, 3}));  // w * frozen; the stopped path adds nothing
  EXPECT_EQ(run1(g, in, "dother"), (std::vector<double>{0, 0}));
}

// Ties: PyTorch's amax and torch.maximum share the gradient evenly between equal elements.
TEST(Autodiff, TiesSplitEvenlyLikePyTorch) {
  Graph g;
  Tensor x = g.input("x", {4});
  Tensor y = g.input("y", {4});
  Tensor loss = mgn::max(x) + mgn::sum(mgn::maximum(x, y));
  mgn::Gradients gr = mgn::backward(g, loss, {.inputs = {x, y}});
  g.output("dx", gr.inputs[0]);
  g.output("dy", gr.inputs[1]);
  std::map<std::string, std::vector<double>> in = {{"x", {3, 1, 3, 0}}, {"y", {0, 1, 5, -1}}};
  // max(x): the two 3s share 1. maximum: x wins at 0 and 3, tie at 1, y wins at 2.
  EXPECT_EQ(run1(g, in, "dx"), (std::vector<double>{0.5 + 1, 0.5, 0.5, 1}));
  EXPECT_EQ(run1(g, in, "dy"), (std::vector<double>{0, 0.5, 1, 0}));
}

TEST(Autodiff, Errors) {
  Graph g;
  Tensor x = g.input("x", {2, 3});
  Tensor ids = g.input("ids", {2}, DType::I32);
  try {
    mgn::backward(g, x * 2.0);
    FAIL() << "non-scalar loss accepted";
  } catch (const mgn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scalar"), std::string::npos) << e.what();
  }
  try {
    mgn::backward(g, mgn::sum(x), {.inputs = {ids}});
    FAIL() << "integer input accepted";
  } catch (const mgn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ids'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  Tensor q = g.input("q", {1, 1, 2, 2});
  Tensor mask = g.parameter("mask", {2, 2});
  EXPECT_THROW(mgn::backward(g, mgn::sum(mgn::attention(q, q, q, {.mask = mask}))), mgn::Error);
}

}  // namespace
