// NNEF import checked against PyTorch: tests/ref/nnef_models.py writes hand-written NNEF models (graph.nnef
// plus .dat files written with its own struct-based writer) and PyTorch's float64 results of the same graphs;
// the imported graph runs on the CPU executor (f64) and on Vulkan (lavapipe in CI, validation on) and must
// match. Gradients and an SGD step are checked against torch autograd; malformed files must fail with a clear
// mgn::Error naming the file, line:column or tensor.
#include "mgn/nnef.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "backend/cpu/executor.h"
#ifdef MGN_HAVE_VULKAN
#include "backend/vulkan/context.h"
#include "backend/vulkan/graph_executor.h"
#endif
#include "mgn/autodiff.h"
#include "mgn/optim.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "support/test_util.h"

namespace mgn {
using test::error_of;
namespace {

using test::read_bytes;

// Runs the generator once per test process (cached under the temp dir, keyed by the script's contents).
const std::string& model_dir() {
  static const std::string dir =
      test::generated_dir("nnef-models", "tests/ref/nnef_models.py", {"tests/ref/st_io.py"});
  return dir;
}

#ifdef MGN_HAVE_VULKAN
vk::Context& vulkan() {
  static vk::Context* ctx = new vk::Context(test::device_options());
  return *ctx;
}
#endif

// Imports case `name`, feeds every "in.<x>" of its reference file and compares every output with "out.<y>".
void check_case(const std::string& name, double tol_f64 = 1e-9) {
  const std::string dir = model_dir() + "/" + name;
  SafetensorsFile ref = SafetensorsFile::read(dir + "/ref.safetensors");
  nnef::Imported m = nnef::import_path(dir);
  EXPECT_EQ(m.version, "1.0");
  ASSERT_FALSE(m.outputs.empty());
  cpu::Executor ex(m.graph.ir(), {.float64 = true});
  for (const std::string& in : m.inputs) ex.set_input(in, ref.get("in." + in).to_f64());
  ex.run();
  for (const std::string& out : m.outputs) {
    const StoredTensor& want = ref.get("out." + out);
    const cpu::Buffer& got = ex.output(out);
    EXPECT_EQ(got.shape, want.shape) << name << " " << out;
    if (got.v.size() != size_t(want.numel())) continue;
    EXPECT_LE(test::rel_l2(got.v, want.to_f64()), tol_f64) << name << " " << out << " (CPU, f64)";
  }
#ifdef MGN_HAVE_VULKAN
  vk::Context& ctx = vulkan();
  vk::GraphExecutor gx(m.graph.ir(), ctx, {.cache_dir = "", .poison = true});
  for (const std::string& in : m.inputs) gx.set_input(in, ref.get("in." + in).to_f32());
  gx.run();
  for (const std::string& out : m.outputs) {
    std::vector<float> y = gx.read_output(out);
    std::vector<double> got(y.begin(), y.end());
    const StoredTensor& want = ref.get("out." + out);
    if (got.size() != size_t(want.numel())) {
      ADD_FAILURE() << name << " " << out << ": Vulkan gave " << got.size() << " values";
      continue;
    }
    EXPECT_LE(test::rel_l2(got, want.to_f64()), 1e-4) << name << " " << out << " (Vulkan)";
  }
  for (const std::string& msg : ctx.validation_messages()) ADD_FAILURE() << msg;
  ctx.clear_validation_messages();
#endif
}

TEST(Nnef, MlpLinearMatmulActivationsSoftmaxMatchTorch) { check_case("mlp"); }
TEST(Nnef, UnaryBinaryComparisonSelectClampMatchTorch) { check_case("unary"); }
TEST(Nnef, ConvDepthwiseDilatedPoolsBatchNormBoxLrnDeconvMatchTorch) { check_case("conv"); }
TEST(Nnef, ReshapeTransposeConcatSliceSplitPadTileReductionsMatchTorch) { check_case("shapes"); }
TEST(Nnef, Conv1dLogicalAndIntegerTensorsConstantMatchTorch) { check_case("conv1d"); }
TEST(Nnef, Float16WeightsConvLinearNetMatchesTorch) { check_case("train"); }

const std::vector<std::string> kTrainParams = {"conv/filter", "conv/bias", "fc/weight", "fc/bias"};

// Gradients of loss = sum(y * y) through the imported (trainable) graph against torch autograd.
TEST(Nnef, VariablesAreTrainableParametersWithTorchGradients) {
  const std::string dir = model_dir() + "/train";
  SafetensorsFile ref = SafetensorsFile::read(dir + "/ref.safetensors");
  nnef::Imported m = nnef::import_path(dir + "/graph.nnef", {.trainable = true});
  EXPECT_EQ(m.parameter_count, 3 * 2 * 3 * 3 + 3 + 4 * 27 + 4);
  Graph& g = m.graph;
  Tensor y = *g.find_output("y");
  Gradients grads = backward(g, sum(y * y));
  for (const std::string& n : kTrainParams) {
    ASSERT_TRUE(grads.params.count(n)) << n;
    g.output("grad." + n, grads.params.at(n));
  }
  cpu::Executor ex(g.ir(), {.float64 = true});
  ex.set_input("x", ref.get("in.x").to_f64());
  ex.run();
  for (const std::string& n : kTrainParams) {
    const StoredTensor& want = ref.get("grad." + n);
    EXPECT_EQ(ex.output("grad." + n).shape, want.shape) << n;
    EXPECT_LE(test::rel_l2(ex.output("grad." + n).v, want.to_f64()), 1e-9) << n;
  }
}

// Frozen by default: no parameter takes a gradient.
TEST(Nnef, VariablesAreFrozenUnlessTrainable) {
  nnef::Imported m = nnef::import_path(model_dir() + "/train");
  for (const Tensor& p : m.graph.parameters()) EXPECT_FALSE(m.graph.ir().node(p.id()).trainable);
}

// One SGD step through mgn::compile (Vulkan when present): the loss is torch's and every parameter moves by
// -lr times torch's gradient.
TEST(Nnef, ImportedNetTrainsWithSgdLikeTorch) {
  const std::string dir = model_dir() + "/train";
  SafetensorsFile ref = SafetensorsFile::read(dir + "/ref.safetensors");
  nnef::Imported m = nnef::import_path(dir, {.trainable = true});
  Graph& g = m.graph;
  Tensor y = *g.find_output("y");
  g.output("loss", sum(y * y));
  const double lr = 0.01;
  Session s = compile(g, {.mode = Mode::Train, .optimizer = SGD{.lr = lr}, .device = test::device_options()});
  std::map<std::string, std::vector<float>> before;
  for (const std::string& n : kTrainParams) before[n] = s.read(n);
  s.set_input("x", ref.get("in.x").to_f32());
  s.step();
  double want_loss = 0;
  for (double v : ref.get("out.y").to_f64()) want_loss += v * v;
  EXPECT_NEAR(s.read_scalar("loss"), want_loss, 1e-5 * want_loss);
  for (const std::string& n : kTrainParams) {
    std::vector<double> grad = ref.get("grad." + n).to_f64(), step(grad.size()), want(grad.size());
    std::vector<float> after = s.read(n);
    ASSERT_EQ(after.size(), grad.size()) << n;
    for (size_t i = 0; i < grad.size(); ++i) {
      step[i] = double(after[i]) - double(before[n][i]);
      want[i] = -lr * grad[i];
    }
    EXPECT_LE(test::rel_l2(step, want), 1e-3) << n << " (update vs -lr * torch gradient)";
  }
}

// Three SGD steps (lr 0.002; the loss falls): the loss before each step and the final variables follow torch's SGD on the same net.
TEST(Nnef, ImportedNetTrainsThreeStepsLikeTorch) {
  const std::string dir = model_dir() + "/train";
  SafetensorsFile ref = SafetensorsFile::read(dir + "/ref.safetensors");
  nnef::Imported m = nnef::import_path(dir, {.trainable = true});
  Tensor y = *m.graph.find_output("y");
  m.graph.output("loss", sum(y * y));
  Session s = compile(m.graph, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.002}, .device = test::device_options()});
  s.set_input("x", ref.get("in.x").to_f32());
  for (int step = 0; step < 3; ++step) {
    s.step();
    double want = ref.get("loss." + std::to_string(step)).to_f64()[0];
    EXPECT_NEAR(s.read_scalar("loss"), want, 1e-5 * want) << "step " << step;
  }
  for (const std::string& n : kTrainParams) {
    std::vector<float> got = s.read(n);
    EXPECT_LE(test::rel_l2(std::vector<double>(got.begin(), got.end()), ref.get("final." + n).to_f64()), 1e-5) << n;
  }
}

TEST(Nnef, InputShapesRebindTheBatch) {
  nnef::Imported m = nnef::import_path(model_dir() + "/mlp", {.input_shapes = {{"x", {7, 10}}}});
  EXPECT_EQ(m.graph.find_output("y")->shape(), (Shape{7, 5}));
  std::string msg = error_of([] { nnef::import_path(model_dir() + "/mlp", {.input_shapes = {{"x", {7}}}}); });
  EXPECT_NE(msg.find("declared rank 2"), std::string::npos) << msg;
  msg = error_of([] { nnef::import_path(model_dir() + "/mlp", {.input_shapes = {{"nope", {7}}}}); });
  EXPECT_NE(msg.find("'nope', which is not a graph input"), std::string::npos) << msg;
}

// ---- the binary tensor format

TEST(Nnef, TensorFileRoundTripsEveryItemType) {
  const std::vector<double> v = {0, 1, -2, 3.5, 1000, -0.25};
  for (auto [type, bits] : std::vector<std::pair<nnef::ItemType, uint32_t>>{
           {nnef::ItemType::Float, 16}, {nnef::ItemType::Float, 32}, {nnef::ItemType::Float, 64}}) {
    nnef::TensorData t = nnef::read_tensor_bytes(nnef::write_tensor_bytes({2, 3}, v, type, bits), "t.dat");
    EXPECT_EQ(t.shape, (Shape{2, 3}));
    EXPECT_EQ(t.values, v) << bits;
  }
  const std::vector<double> iv = {0, 1, -2, 3, 100, -7};
  for (uint32_t bits : {8u, 16u, 32u, 64u})
    EXPECT_EQ(nnef::read_tensor_bytes(nnef::write_tensor_bytes({6}, iv, nnef::ItemType::Int, bits), "i").values, iv);
  const std::vector<double> lv = {1, 0, 0, 1, 1, 1, 0, 1, 1};
  for (uint32_t bits : {1u, 8u})
    EXPECT_EQ(nnef::read_tensor_bytes(nnef::write_tensor_bytes({9}, lv, nnef::ItemType::Bool, bits), "l").values, lv);
  // 1-bit logicals pack the first item into the most significant bit.
  std::string packed = nnef::write_tensor_bytes({9}, lv, nnef::ItemType::Bool, 1);
  ASSERT_EQ(packed.size(), 128u + 2u);
  EXPECT_EQ(static_cast<unsigned char>(packed[128]), 0b10011101);
  EXPECT_EQ(static_cast<unsigned char>(packed[129]), 0b10000000);
}

TEST(Nnef, TensorFileErrorsAreClear) {
  const std::string good = nnef::write_tensor_bytes({2, 2}, {1, 2, 3, 4});
  auto err = [](const std::string& bytes) { return error_of([&] { nnef::read_tensor_bytes(bytes, "w.dat"); }); };
  std::string msg = err(good.substr(0, 100));
  EXPECT_NE(msg.find("w.dat"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  msg = err(good.substr(0, good.size() - 3));
  EXPECT_NE(msg.find("truncated: the data holds 13 bytes, shape [2,2] needs 16"), std::string::npos) << msg;
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_NE(err(bad).find("bad magic"), std::string::npos) << err(bad);
  bad = good;
  bad[2] = 2;
  EXPECT_NE(err(bad).find("version 2.0"), std::string::npos) << err(bad);
  EXPECT_NE(err(good + "pad!").find("4 bytes after the data"), std::string::npos);
  bad = good;
  bad[48] = 2;  // quantized unsigned
  EXPECT_NE(err(bad).find("quantized unsigned integer items are not supported"), std::string::npos) << err(bad);
  bad = good;
  bad[4] = 99;  // data length
  EXPECT_NE(err(bad).find("data length 99 disagrees"), std::string::npos) << err(bad);
  bad = good;
  bad[44] = 12;  // bits per item
  EXPECT_NE(err(bad).find("12-bit float items are not supported"), std::string::npos) << err(bad);
  bad = good;
  bad[8] = 9;  // rank
  EXPECT_NE(err(bad).find("rank 9"), std::string::npos) << err(bad);
}

// ---- graph errors, each naming the file and line:column

// Imports `graph` with the given .dat files (label -> bytes).
nnef::Imported import_with(const std::string& graph, const std::map<std::string, std::string>& dats = {}) {
  return nnef::import_text(graph, "g.nnef", [&](const std::string& label) -> std::optional<std::string> {
    auto it = dats.find(label);
    if (it == dats.end()) return std::nullopt;
    return it->second;
  });
}

const char* kHead = "version 1.0;\ngraph G( x ) -> ( y )\n{\n  x = external(shape = [2, 3]);\n";

TEST(Nnef, SyntaxErrorsNameLineAndColumn) {
  auto err = [](const std::string& body) { return error_of([&] { import_with(std::string(kHead) + body); }); };
  std::string msg = err("  y = relu(x)\n}\n");
  EXPECT_NE(msg.find("g.nnef:6:1: expected ';', found '}'"), std::string::npos) << msg;
  msg = err("  y = relu(x, );\n}\n");
  EXPECT_NE(msg.find("g.nnef:5:15: expected a value"), std::string::npos) << msg;
  msg = err("  y = relu('x);\n}\n");
  EXPECT_NE(msg.find("g.nnef:5:12: unterminated string"), std::string::npos) << msg;
  msg = err("  y = relu(x) $;\n}\n");
  EXPECT_NE(msg.find("g.nnef:5:15: unexpected character '$'"), std::string::npos) << msg;
  msg = err("  y = relu(x);\n");
  EXPECT_NE(msg.find("no closing '}'"), std::string::npos) << msg;
  msg = error_of([] { import_with("graph G( x ) -> ( y ) { }"); });
  EXPECT_NE(msg.find("g.nnef:1:1: expected 'version', found 'graph'"), std::string::npos) << msg;
  msg = error_of([] { import_with("version 1.0;\nfragment f( x: tensor<scalar> ) -> ( y: tensor<scalar> );"); });
  EXPECT_NE(msg.find("g.nnef:2:1: fragment definitions are not supported"), std::string::npos) << msg;
  msg = err("  3 = relu(x);\n}\n");
  EXPECT_NE(msg.find("g.nnef:5:3: the left side of '=' must be identifiers"), std::string::npos) << msg;
}

TEST(Nnef, UnknownOpsAreAllListedWithTheirLines) {
  std::string msg = error_of([] { import_with(std::string(kHead) + "  a = relu(x);\n  b = frobnicate(a);\n  y = add(b, argmax_pool(a));\n}\n"); });
  EXPECT_NE(msg.find("2 operation(s) are not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("g.nnef:6:7: 'frobnicate'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("g.nnef:7:14: 'argmax_pool'"), std::string::npos) << msg;
}

TEST(Nnef, BadArgumentsAreClearErrors) {
  auto err = [](const std::string& body) { return error_of([&] { import_with(std::string(kHead) + body + "}\n"); }); };
  std::string msg = err("  y = softmax(x, axis = [1]);\n");
  EXPECT_NE(msg.find("g.nnef:5:25: 'softmax': unknown argument 'axis' (expected: x, axes)"), std::string::npos) << msg;
  msg = err("  y = reshape(x, shape = [4, -1]);\n");
  EXPECT_NE(msg.find("g.nnef:5:7: 'reshape': cannot infer -1"), std::string::npos) << msg;
  msg = err("  y = transpose(x, axes = [0, 0]);\n");
  EXPECT_NE(msg.find("is not a permutation"), std::string::npos) << msg;
  msg = err("  y = relu(z);\n");
  EXPECT_NE(msg.find("g.nnef:5:12: 'relu': argument 'x': 'z' is not defined before this line"), std::string::npos) << msg;
  msg = err("  y = pad(x, padding = [(1, 1), (0, 0)], border = 'wrap');\n");
  EXPECT_NE(msg.find("border 'wrap' is not supported here (supported: 'constant', 'replicate', 'reflect', 'reflect-even')"),
            std::string::npos) << msg;
  msg = err("  y = pad(x, padding = [(2, 0), (0, 0)], border = 'reflect');\n");
  EXPECT_NE(msg.find("border 'reflect' cannot pad axis 0 of extent 2 by (2, 0) (at most 1)"), std::string::npos) << msg;
  msg = err("  y = slice(x, axes = [1], begin = 'a', end = [2]);\n");
  EXPECT_NE(msg.find("argument 'begin' must be an array of integers"), std::string::npos) << msg;
  msg = err("  y = add(x, x);\n  y = relu(x);\n");
  EXPECT_NE(msg.find("g.nnef:6:3: 'y' is assigned twice"), std::string::npos) << msg;
  msg = err("  y = matmul(x, x);\n");
  EXPECT_NE(msg.find("g.nnef:5:7: 'matmul':"), std::string::npos) << msg;
  msg = error_of([] { import_with("version 1.0;\ngraph G( x ) -> ( y )\n{\n  y = relu(x);\n}\n"); });
  EXPECT_NE(msg.find("'x' is not defined before this line"), std::string::npos) << msg;
}

TEST(Nnef, VariableFileErrorsNameTheTensor) {
  const std::string g = std::string(kHead) + "  w = variable(shape = [4, 3], label = 'fc/w');\n  y = linear(x, w);\n}\n";
  std::string msg = error_of([&] { import_with(g); });
  EXPECT_NE(msg.find("g.nnef:5:7: 'variable': variable 'fc/w': the tensor file 'fc/w.dat' is missing"), std::string::npos)
      << msg;
  const std::string w = nnef::write_tensor_bytes({4, 3}, std::vector<double>(12, 0.5));
  EXPECT_NO_THROW(import_with(g, {{"fc/w", w}}));
  msg = error_of([&] { import_with(g, {{"fc/w", w.substr(0, w.size() - 5)}}); });
  EXPECT_NE(msg.find("fc/w.dat: not a valid NNEF tensor file: truncated"), std::string::npos) << msg;
  msg = error_of([&] { import_with(g, {{"fc/w", nnef::write_tensor_bytes({3, 4}, std::vector<double>(12, 0.5))}}); });
  EXPECT_NE(msg.find("'fc/w.dat' holds shape [3,4], the graph declares [4,3]"), std::string::npos) << msg;
  msg = error_of([&] {
    import_with(g, {{"fc/w", nnef::write_tensor_bytes({4, 3}, std::vector<double>(12, 1), nnef::ItemType::Int, 32)}});
  });
  EXPECT_NE(msg.find("holds 32-bit integer items, the graph declares scalar"), std::string::npos) << msg;
  std::string bad = w;
  bad[1] = 0;
  msg = error_of([&] { import_with(g, {{"fc/w", bad}}); });
  EXPECT_NE(msg.find("fc/w.dat: not a valid NNEF tensor file: bad magic"), std::string::npos) << msg;
  msg = error_of([&] { import_with(std::string(kHead) + "  w = variable(shape = [4, 3], label = '../w');\n  y = linear(x, w);\n}\n"); });
  EXPECT_NE(msg.find("must be a relative path inside the model's folder"), std::string::npos) << msg;
  msg = error_of([&] { import_with(std::string(kHead) + "  w = variable(shape = [4, 3], label = 'fc/w');\n  y = linear(x, w);\n}\n", {{"fc/w", w}}); });
  EXPECT_EQ(msg, "");
  msg = error_of([&] { import_with(std::string(kHead) + "  w = variable(shape = [4, 5], label = 'w');\n  y = linear(x, w);\n}\n",
                                   {{"w", nnef::write_tensor_bytes({4, 5}, std::vector<double>(20, 0.5))}}); });
  EXPECT_NE(msg.find("'linear': filter [4,5] does not take input [2,3]"), std::string::npos) << msg;
}

TEST(Nnef, MissingFolderAndOutputsAreClearErrors) {
  std::string msg = error_of([] { nnef::import_path(test::make_temp_dir("nnef_empty")); });
  EXPECT_NE(msg.find("holds no graph.nnef"), std::string::npos) << msg;
  msg = error_of([] { import_with(std::string(kHead) + "  z = relu(x);\n}\n"); });
  EXPECT_NE(msg.find("graph output 'y' is not computed by any statement"), std::string::npos) << msg;
}

TEST(Nnef, InspectListsInputsOpsAndVariables) {
  std::string s = nnef::inspect(model_dir() + "/conv");
  EXPECT_NE(s.find("NNEF 1.0, graph 'conv'"), std::string::npos) << s;
  EXPECT_NE(s.find("x: [2, 3, 9, 9]"), std::string::npos) << s;
  EXPECT_NE(s.find("conv x4"), std::string::npos) << s;
  EXPECT_NE(s.find("conv1/filter [4, 3, 3, 3]"), std::string::npos) << s;
  s = nnef::inspect_text(std::string(kHead) + "  y = frobnicate(x);\n}\n", "g.nnef");
  EXPECT_NE(s.find("frobnicate x1  (unsupported)"), std::string::npos) << s;
}

TEST(Nnef, SupportedOpsCoverTheSpecSetAndConv) {
  std::vector<std::string> ops = nnef::supported_ops();
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  for (const char* op : {"external", "variable", "constant", "add", "sub", "mul", "div", "relu", "sigmoid", "neg",
                         "abs", "log", "rcp", "silu", "gelu", "softmax", "matmul", "linear", "reshape", "transpose",
                         "concat", "copy", "conv", "max_pool", "avg_pool", "batch_normalization", "mean_reduce"})
    EXPECT_TRUE(std::binary_search(ops.begin(), ops.end(), op)) << op;
  // docs/nnef.md's table lists exactly these.
  const std::string doc = read_bytes(std::string(MGN_SOURCE_DIR) + "/docs/nnef.md");
  for (const std::string& op : ops) EXPECT_NE(doc.find("`" + op + "`"), std::string::npos) << op << " missing from docs/nnef.md";
}

// ---- export: a graph written as NNEF and read back computes the same values

// Runs graph `g` on the CPU (f64) with `inputs`; returns every output by name.
std::map<std::string, std::vector<double>> run_cpu(const Graph& g, const std::map<std::string, std::vector<double>>& inputs) {
  cpu::Executor ex(g.ir(), {.float64 = true});
  for (const auto& [n, v] : inputs) ex.set_input(n, v);
  ex.run();
  std::map<std::string, std::vector<double>> out;
  for (const auto& [n, id] : g.ir().outputs()) out[n] = ex.output(n).v;
  return out;
}

void check_round_trip(const Graph& g, const std::map<std::string, std::vector<double>>& inputs, const std::string& tag) {
  const std::string dir = test::make_temp_dir("nnef_export_" + tag);
  nnef::export_graph(g, dir);
  nnef::Imported m = nnef::import_path(dir);
  auto want = run_cpu(g, inputs);
  auto got = run_cpu(m.graph, inputs);
  ASSERT_EQ(got.size(), want.size()) << tag;
  for (const auto& [n, v] : want) {
    ASSERT_TRUE(got.count(n)) << tag << " " << n;
    EXPECT_EQ(m.graph.find_output(n)->shape(), g.find_output(n)->shape()) << tag << " " << n;
    EXPECT_LE(test::rel_l2(got[n], v), 1e-12) << tag << " " << n;
  }
}

TEST(Nnef, ExportedMlpGraphReimportsWithTheSameOutputs) {
  Graph g;
  Tensor x = g.input("x", {3, 8});
  Tensor w = g.parameter("fc.weight", {5, 8}, Init::normal(0, 0.5, 1));
  Tensor b = g.parameter("fc.bias", {5}, Init::normal(0, 0.5, 2));
  Tensor lw = g.parameter("ln/weight", {8}, Init::normal(1, 0.1, 3));
  Tensor h = layer_norm(x, lw, std::nullopt, 1e-5);
  Tensor y = linear(gelu(h), w, b);
  g.output("probs", softmax(y, 1));
  g.output("logp", log_softmax(y, -1));
  g.output("lse", logsumexp(y, 1, false));
  g.output("r", rms_norm(x, lw) * 2.0 + clamp(pow(abs(x) + 1.0, 1.5), 0.5, 3.0));
  Tensor e = expand(reshape(sum(x, {1}), {3, 1}), {2, 3, 8});
  g.output("e", where(greater(e, g.scalar(0)), e, neg(e)));
  g.output("s", slice(pad(x, {1, 0, 0, 2}, 0.5), 1, 1, 9, 2));
  g.output("c", concat({mean(x, {1}, true), max(x, {1}, true), x}, 1));
  g.output("m", min(x, {0}, false));
  g.output("t", matmul(x, x, true, false) + permute(matmul(x, x, true, false), {1, 0}));
  std::vector<double> xv = test::random_normal(24, 7);
  check_round_trip(g, {{"x", xv}}, "mlp");
}

TEST(Nnef, ExportedCnnGraphReimportsWithTheSameOutputs) {
  Graph g;
  Tensor x = g.input("x", {2, 4, 8, 8});
  Tensor w1 = g.parameter("conv1/weight", {6, 2, 3, 3}, Init::normal(0, 0.3, 4));
  Tensor w2 = g.parameter("up/weight", {6, 3, 3, 3}, Init::normal(0, 0.3, 5));
  Tensor c = conv2d(x, w1, {.stride = {2, 1}, .padding = {1, 0, 0, 2}, .dilation = {1, 2}, .groups = 2});
  g.output("c", c);
  g.output("mp", max_pool2d(relu(c), {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}}));
  g.output("ap", avg_pool2d(silu(c), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false}));
  g.output("up", upsample_nearest2d(sigmoid(c), 2, 3));
  g.output("dc", conv_transpose2d(tanh(c), w2, {.stride = {2, 2}, .padding = {1, 1}, .output_padding = {1, 0}}));
  g.output("f", reshape(permute(c, {0, 2, 3, 1}), {2, -1}));
  Tensor gw = g.parameter("gn/weight", {6}, Init::normal(1, 0.2, 6)), gb = g.parameter("gn/bias", {6}, Init::normal(0, 0.2, 7));
  g.output("gn", group_norm(c, 3, gw, gb, 1e-4));
  g.output("bn", batch_norm(c, gw, gb, 1e-3));
  check_round_trip(g, {{"x", test::random_normal(2 * 4 * 64, 8)}}, "cnn");
}

// A trained model exported with the session's values: the files hold exactly what the session trained.
TEST(Nnef, TrainedVariablesExportAndReload) {
  const std::string dir = model_dir() + "/train";
  SafetensorsFile ref = SafetensorsFile::read(dir + "/ref.safetensors");
  nnef::Imported m = nnef::import_path(dir, {.trainable = true});
  Tensor y = *m.graph.find_output("y");
  m.graph.output("loss", sum(y * y));
  Session s = compile(m.graph, {.mode = Mode::Train, .optimizer = SGD{.lr = 0.01}, .device = test::device_options()});
  s.set_input("x", ref.get("in.x").to_f32());
  s.step();
  const std::string out = test::make_temp_dir("nnef_trained");
  // compile() added the training step to m.graph: export the inference graph of a fresh import.
  nnef::export_graph(nnef::import_path(dir).graph, out,
                     {.values = [&](const std::string& n) -> std::optional<std::vector<float>> { return s.read(n); }});
  nnef::Imported back = nnef::import_path(out);
  for (const std::string& n : kTrainParams) {
    std::vector<float> trained = s.read(n);
    nnef::TensorData t = nnef::read_tensor_file(out + "/" + n + ".dat");
    EXPECT_EQ(t.values, std::vector<double>(trained.begin(), trained.end())) << n;
    EXPECT_NE(trained, std::vector<float>(ref.get("grad." + n).numel(), 0.0f)) << n;
  }
  EXPECT_EQ(back.outputs, std::vector<std::string>{"y"});
}

TEST(Nnef, ExportListsOpsWithoutAnNnefForm) {
  Graph g;
  Tensor q = g.input("q", {1, 2, 4, 8});
  g.output("o", attention(q, q, q));
  g.output("e", erf(q));
  std::string msg = error_of([&] { nnef::export_graph(g, test::make_temp_dir("nnef_bad_export")); });
  EXPECT_NE(msg.find("2 node(s) have no NNEF form"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(attention)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(erf)"), std::string::npos) << msg;
}

}  // namespace
}  // namespace mgn
