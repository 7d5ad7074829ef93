// IR tests: shape inference and broadcasting rules (closed forms), errors, verifier and text dump.
#include <gtest/gtest.h>

#include "ir/graph.h"
#include "mgn/graph.h"
#include "mgn/session.h"

using namespace mgn;

TEST(Ir, OpTableIsComplete) {
  for (int i = 0; i < ir::kOpCount; ++i) {
    const ir::OpInfo& info = ir::op_info(ir::Op(i));
    EXPECT_EQ(int(info.op), i);
    ir::Op back;
    ASSERT_TRUE(ir::op_from_name(info.name, &back)) << info.name;
    EXPECT_EQ(back, info.op) << "duplicate op name " << info.name;
  }
}

TEST(Ir, BroadcastShapes) {
  EXPECT_EQ(ir::broadcast_shapes({3, 1, 5}, {4, 1}, "t"), (Shape{3, 4, 5}));
  EXPECT_EQ(ir::broadcast_shapes({}, {2, 3}, "t"), (Shape{2, 3}));
  EXPECT_THROW(ir::broadcast_shapes({3, 2}, {3}, "t"), Error);
}

TEST(Ir, ShapesOfCommonOps) {
  Graph g;
  Tensor x = g.input("x", {2, 3, 8, 8});
  Tensor w = g.parameter("w", {4, 3, 3, 3});
  EXPECT_EQ(conv2d(x, w, {.stride = {2, 2}, .padding = {1, 1}}).shape(), (Shape{2, 4, 4, 4}));
  EXPECT_EQ(max_pool2d(x, {.kernel = {2, 2}}).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(sum(x, {1, -1}, true).shape(), (Shape{2, 1, 8, 1}));
  EXPECT_EQ(sum(x).shape(), Shape{});
  EXPECT_EQ(argmax(x, 1).dtype(), DType::I32);
  Tensor a = g.input("a", {5, 1, 4, 6});
  Tensor b = g.input("b", {3, 6, 7});
  EXPECT_EQ(matmul(a, b).shape(), (Shape{5, 3, 4, 7}));
  EXPECT_EQ(reshape(x, {2, -1}).shape(), (Shape{2, 192}));
  EXPECT_EQ(permute(x, {0, 2, 3, 1}).shape(), (Shape{2, 8, 8, 3}));
  EXPECT_EQ(slice(x, 2, 1, 8, 3).shape(), (Shape{2, 3, 3, 8}));
  EXPECT_EQ(concat({x, x}, 1).shape(), (Shape{2, 6, 8, 8}));
  Tensor q = g.input("q", {1, 6, 5, 16}), k = g.input("k", {1, 2, 7, 16});
  EXPECT_EQ(attention(q, k, k, {.causal = true}).shape(), (Shape{1, 6, 5, 16}));
  Tensor ids = g.input("ids", {2, 5}, DType::I32);
  Tensor table = g.parameter("emb", {11, 4});
  EXPECT_EQ(embedding(table, ids).shape(), (Shape{2, 5, 4}));
  EXPECT_EQ(cross_entropy(g.input("logits", {2, 5, 11}), ids).shape(), Shape{});
}

TEST(Ir, PermuteOfSizeOneAxesIsAView) {
  // A permutation that keeps the axes longer than 1 in order moves no element: the builder emits a Reshape
  // (no dispatch). Otherwise, and for a malformed perm, a Permute (whose shape rule gives the error).
  Graph g;
  Tensor x = g.input("x", {1, 1, 3, 4});  // a decode step's [B, S = 1, H, D]
  Tensor heads = permute(x, {0, 2, 1, 3});
  EXPECT_EQ(heads.shape(), (Shape{1, 3, 1, 4}));
  EXPECT_EQ(g.ir().node(heads.id()).op, ir::Op::Reshape);
  EXPECT_EQ(g.ir().node(transpose(x, 0, -3).id()).op, ir::Op::Reshape);  // two size-1 axes swapped
  EXPECT_EQ(g.ir().node(transpose(x, -1, 0).id()).op, ir::Op::Permute);  // [4, 1, 3, 1]: 4 before 3, moved
  EXPECT_EQ(g.ir().node(transpose(x, 2, 3).id()).op, ir::Op::Permute);   // [1, 1, 4, 3]: moved
  Tensor y = g.input("y", {2, 1, 3});
  EXPECT_EQ(g.ir().node(permute(y, {1, 0, 2}).id()).op, ir::Op::Reshape);
  EXPECT_EQ(g.ir().node(permute(y, {2, 1, 0}).id()).op, ir::Op::Permute);
  EXPECT_THROW(permute(y, {0, 0, 1}), Error);
  EXPECT_THROW(permute(y, {0, 1}), Error);
  // Values, closed form: out[0, h, 0, d] = x[0, 0, h, d], and the moved transpose's out[0, 0, d, h] = x[0, 0, h, d].
  g.output("heads", heads);
  g.output("swapped", transpose(x, 2, 3));
  Session s = compile(g, {.backend = Backend::Cpu});
  std::vector<float> xv(12);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(i) * 0.5f - 2.0f;
  s.set_input("x", xv);
  s.set_input("y", std::vector<float>(6, 0.0f));
  s.run();
  const std::vector<float> h = s.read("heads"), w = s.read("swapped");
  for (int hh = 0; hh < 3; ++hh)
    for (int d = 0; d < 4; ++d) {
      EXPECT_EQ(h[size_t(hh * 4 + d)], xv[size_t(hh * 4 + d)]);
      EXPECT_EQ(w[size_t(d * 3 + hh)], xv[size_t(hh * 4 + d)]);
    }
}

TEST(Ir, ErrorsNameTheProblem) {
  Graph g;
  Tensor a = g.input("a", {2, 3});
  Tensor b = g.input("b", {4, 5});
  try {
    matmul(a, b);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inner dimensions"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a + b, Error);
  EXPECT_THROW(g.input("a", {1}), Error);                   // duplicate name
  EXPECT_THROW(g.input("z", {0, 3}), Error);                // non-positive dim
  EXPECT_THROW(g.input("r7", {1, 1, 1, 1, 1, 1, 1}), Error);  // rank 7
  EXPECT_THROW(reshape(a, {7}), Error);
  EXPECT_THROW(sum(a, {2}), Error);
  Tensor i = g.input("i", {2, 3}, DType::I32);
  EXPECT_THROW(a + i, Error);  // dtype mismatch
  EXPECT_THROW(exp(i), Error);
  Graph other;
  Tensor c = other.input("c", {2, 3});
  EXPECT_THROW(a + c, Error);  // different graphs
  EXPECT_THROW(g.get("nope"), Error);
}

TEST(Ir, VerifyAndDump) {
  Graph g;
  Tensor x = g.input("x", {4, 8});
  Tensor w = g.parameter("fc.weight", {3, 8}, Init::kaiming_uniform());
  Tensor y = relu(linear(x, w)) * 2.0;
  g.output("y", y);
  g.verify();
  std::string text = g.dump();
  EXPECT_NE(text.find("matmul"), std::string::npos);
  EXPECT_NE(text.find("'fc.weight'"), std::string::npos);
  EXPECT_NE(text.find("output 'y'"), std::string::npos);
  EXPECT_NE(text.find("f32[4,3]"), std::string::npos);
}

TEST(Ir, PrecisionPolicy) {
  Graph g;
  Tensor x = g.input("x", {2, 2});
  EXPECT_FALSE((x * x).precision().has_value());  // unset: CompileOptions::default_precision decides
  g.set_precision(Precision::Accelerated);
  Tensor y = matmul(x, x);
  EXPECT_EQ(y.precision(), Precision::Accelerated);
  y.set_precision(Precision::Strict);
  EXPECT_EQ(y.precision(), Precision::Strict);
}
