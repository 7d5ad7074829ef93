// The public API the tools use instead of the IR and the planner: Graph::find_output, the conv2d
// derivative builders (checked against the adjoint identity <conv(x, w), dy> = <x, dx> = <w, dw> and against
// autodiff) and summarize_plan (checked against a chain whose plan is known in closed form).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mgn/autodiff.h"
#include "mgn/graph.h"
#include "mgn/plan.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

std::vector<float> to_f32(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

TEST(ToolApi, FindOutputNamesOutputsOnly) {
  Graph g;
  Tensor x = g.input("x", {3});
  Tensor y = exp(x);
  g.output("y", y);
  std::optional<Tensor> found = g.find_output("y");
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->id(), y.id());
  EXPECT_EQ(found->shape(), (Shape{3}));
  EXPECT_FALSE(g.find_output("x").has_value());  // an input, not an output
  EXPECT_FALSE(g.find_output("z").has_value());
  // What the tools do with it: differentiate a model's loss found by name.
  Tensor w = g.parameter("w", {3}, Init::constant(2.0));
  g.output("loss", sum(w * x));
  Gradients gr = backward(g, *g.find_output("loss"));
  EXPECT_EQ(gr.params.count("w"), 1u);
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions opt;
};

TEST(ToolApi, Conv2dGradientBuildersAreTheAdjointsOfConv2d) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 7}, {4, 3, 3, 3}, {}},
      {{1, 2, 9, 8}, {3, 2, 3, 2}, {.stride = {2, 3}, .padding = {1, 0, 2, 1}}},
      {{2, 4, 8, 8}, {6, 2, 3, 3}, {.stride = {1, 1}, .padding = {2, 2}, .dilation = {2, 2}, .groups = 2}},
  };
  uint64_t seed = 1;
  for (const ConvCase& cc : cases) {
    SCOPED_TRACE("x " + shape_str(cc.x) + " w " + shape_str(cc.w));
    Graph g;
    Tensor x = g.input("x", cc.x), w = g.input("w", cc.w);
    Tensor y = conv2d(x, w, cc.opt);
    const Shape ys = y.shape();
    Tensor dy = g.input("dy", ys);
    g.output("y", y);
    g.output("dx", conv2d_grad_input(dy, w, cc.x, cc.opt));
    g.output("dw", conv2d_grad_weight(x, dy, cc.w, cc.opt));
    // The same derivatives from autodiff, which emits these ops itself.
    Gradients gr = backward(g, sum(y * dy), {.inputs = {x, w}});
    g.output("ad.dx", gr.inputs[0]);
    g.output("ad.dw", gr.inputs[1]);
    Session s = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
    const std::vector<float> xv = to_f32(test::random_normal(size_t(numel(cc.x)), seed++));
    const std::vector<float> wv = to_f32(test::random_normal(size_t(numel(cc.w)), seed++));
    const std::vector<float> dyv = to_f32(test::random_normal(size_t(numel(ys)), seed++));
    s.set_input("x", xv);
    s.set_input("w", wv);
    s.set_input("dy", dyv);
    s.run();
    const double ydy = dot(s.read("y"), dyv), xdx = dot(xv, s.read("dx")), wdw = dot(wv, s.read("dw"));
    EXPECT_NEAR(xdx, ydy, 1e-5 * (1 + std::fabs(ydy)));
    EXPECT_NEAR(wdw, ydy, 1e-5 * (1 + std::fabs(ydy)));
    EXPECT_EQ(s.read("dx"), s.read("ad.dx"));
    EXPECT_EQ(s.read("dw"), s.read("ad.dw"));
  }
}

TEST(ToolApi, Conv2dGradientBuildersCheckTheirShapes) {
  Graph g;
  Tensor w = g.input("w", {4, 3, 3, 3}), dy = g.input("dy", {1, 4, 5, 5});
  EXPECT_NO_THROW(conv2d_grad_input(dy, w, {1, 3, 7, 7}));
  EXPECT_THROW(conv2d_grad_input(dy, w, {1, 3, 8, 8}), Error);  // its conv would give [1, 4, 6, 6]
  Tensor x = g.input("x", {1, 3, 7, 7});
  EXPECT_THROW(conv2d_grad_weight(x, dy, {4, 3, 2, 2}), Error);
}

// x [1024] -> a = exp(x) -> b = exp(a) -> c = exp(b), c the output: 4 tensors of 4 KiB. The input and the
// output are pinned; a and b are step-local, and b is written over a (a dies there).
TEST(ToolApi, SummarizePlanOfAChain) {
  Graph g;
  Tensor x = g.input("x", {1024});
  g.output("c", exp(exp(exp(x))));
  const PlanSummary on = summarize_plan(g);
  EXPECT_EQ(on.logical_bytes, 4u * 4096);
  EXPECT_EQ(on.physical_bytes, 3u * 4096);
  EXPECT_EQ(on.peak_live_bytes, 4096u);
  EXPECT_EQ(on.dispatches, 3);
  EXPECT_EQ(on.barrier_groups, 3);
  const PlanSummary off = summarize_plan(g, {.reuse = false});
  EXPECT_EQ(off.logical_bytes, 4u * 4096);
  EXPECT_EQ(off.physical_bytes, 4u * 4096);
  // 2-byte elements halve every figure.
  EXPECT_EQ(summarize_plan(g, {.element_bytes = 2}).physical_bytes, 3u * 2048);
  // describe_plan prints the same plan.
  EXPECT_NE(describe_plan(g, {.dump = false}).find("total"), std::string::npos);
}

}  // namespace
