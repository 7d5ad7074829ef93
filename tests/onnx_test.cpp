// ONNX import checked against PyTorch: tests/ref/onnx_export.py exports small torch models (and builds one
// with onnx.helper) and stores the input and the float64 PyTorch output; the imported graph runs on the CPU
// executor (f64 and f32) and on Vulkan (lavapipe in CI, validation layer on, poisoned intermediates) and
// must match. Malformed files must fail with a clear mgn::Error.
#include "mgn/onnx.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <sstream>

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

// The export script's output directory (made once, cached: test::generated_dir).
const std::string& model_dir() {
  static const std::string dir = test::generated_dir("onnx-models", "tests/ref/onnx_export.py");
  return dir;
}

#ifdef MGN_HAVE_VULKAN
// One device for the whole test process (validation on: any message fails the model's check).
vk::Context& vulkan() {
  static vk::Context* ctx = [] {
    return new vk::Context(test::device_options());
  }();
  return *ctx;
}

// The imported graph on Vulkan with input "x"; returns output "y".
std::vector<double> run_vulkan(const ir::Graph& g, const std::vector<float>& x) {
  vk::Context& ctx = vulkan();
  vk::GraphExecutor ex(g, ctx, {.cache_dir = "", .poison = true});
  ex.set_input("x", x);
  ex.run();
  std::vector<float> y = ex.read_output("y");
  for (const std::string& m : ctx.validation_messages()) ADD_FAILURE() << m;
  ctx.clear_validation_messages();
  return std::vector<double>(y.begin(), y.end());
}
#endif

// Imports NAME.onnx, runs it on x from NAME.safetensors and compares y with PyTorch's.
void check_model(const std::string& name, int want_opset) {
  const std::string& dir = model_dir();
  SafetensorsFile ref = SafetensorsFile::read(dir + "/" + name + ".safetensors");
  const StoredTensor& x = ref.get("x");
  const StoredTensor& y = ref.get("y");
  onnx::Imported m = onnx::import_file(dir + "/" + name + ".onnx", {.input_shapes = {{"x", x.shape}}});
  EXPECT_EQ(m.opset, want_opset);
  ASSERT_EQ(m.inputs, std::vector<std::string>{"x"});
  ASSERT_EQ(m.outputs, std::vector<std::string>{"y"});
  EXPECT_GT(m.parameter_count, 0);
  cpu::Executor ex(m.graph.ir(), {.float64 = true});
  ex.set_input("x", x.to_f64());
  ex.run();
  const cpu::Buffer& out = ex.output("y");
  EXPECT_EQ(out.shape, y.shape) << name;
  ASSERT_EQ(out.v.size(), size_t(y.numel())) << name;
  double err = test::rel_l2(out.v, y.to_f64());
  EXPECT_LE(err, 1e-4) << name;
  // The default executor rounds every result to f32, as a deployed graph runs.
  cpu::Executor ex32(m.graph.ir());
  ex32.set_input("x", x.to_f32());
  ex32.run();
  EXPECT_LE(test::rel_l2(ex32.output("y").v, y.to_f64()), 1e-4) << name << " (f32)";
#ifdef MGN_HAVE_VULKAN
  std::vector<double> got = run_vulkan(m.graph.ir(), x.to_f32());
  ASSERT_EQ(got.size(), size_t(y.numel())) << name;
  EXPECT_LE(test::rel_l2(got, y.to_f64()), 1e-4) << name << " (Vulkan)";
#endif
}

TEST(Onnx, MlpLinearReluGeluSoftmaxMatchesPyTorch) {
  check_model("mlp", 13);
}
TEST(Onnx, ExternalDataInitializersLoad) {
  check_model("mlp_ext", 13);
  // Without its data file the model is a clear error naming the missing location.
  const std::string& dir = model_dir();
  std::string bytes = read_bytes(dir + "/mlp_ext.onnx");
  std::string err = error_of([&] { onnx::import_bytes(bytes, "mlp_ext (moved)", {.external_data_dir = "/nonexistent"}); });
  EXPECT_NE(err.find("mlp_ext.data"), std::string::npos) << err;
}
TEST(Onnx, CnnConvBatchNormPoolsMatchesPyTorch) {
  check_model("cnn", 15);
}
TEST(Onnx, CnnWithoutConstantFoldingMatchesPyTorch) {
  check_model("cnn_bn", 16);
}
TEST(Onnx, TransformerBlockOpset17MatchesPyTorch) {
  check_model("block", 17);
}
TEST(Onnx, TransformerBlockOpset14DecomposedLayerNormMatchesPyTorch) {
  check_model("block_op14", 14);
}
TEST(Onnx, HelperBuiltWhereExpandGatherConcatSliceClipTriluMatchesTorch) {
  check_model("helper_ops", 14);
}
TEST(Onnx, HelperBuiltNotAndOrXorOnRuntimeTensorsMatchesTorch) {
  check_model("helper_logic", 13);
}
TEST(Onnx, MlpDynamicBatchBoundAtImportMatchesPyTorch) {
  check_model("mlp_dyn", 13);
}
TEST(Onnx, TransformerDynamicBatchAndSequenceMatchesPyTorch) {
  check_model("block_dyn", 17);
}
TEST(Onnx, TorchvisionResnet18BatchNormFoldedMatchesPyTorch) {
  check_model("resnet18", 13);
}
TEST(Onnx, TorchvisionResnet18BatchNormalizationNodesMatchesPyTorch) {
  check_model("resnet18_bn", 17);
}
TEST(Onnx, VitBlockPatchEmbedClassTokenMultiheadAttentionMatchesPyTorch) {
  check_model("vit", 17);
}
TEST(Onnx, VitBlockOpset13WithoutConstantFoldingMatchesPyTorch) {
  check_model("vit_op13", 13);
}
TEST(Onnx, LlamaBlockRopeRmsNormCausalSwiGluMatchesPyTorch) {
  check_model("llama", 17);
}
TEST(Onnx, LlamaBlockOpset14WithoutConstantFoldingMatchesPyTorch) {
  check_model("llama_nofold", 14);
}
TEST(Onnx, LlamaBlockDynamicSequenceRangeAndMaskFromShapeMatchesPyTorch) {
  check_model("llama_dyn", 15);
}

TEST(Onnx, DecoderConvTransposeGatherScatterElementsMatchesPyTorch) { check_model("decoder", 17); }

TEST(Onnx, DynamicAxesMustBeBoundToValidInputs) {
  std::string path = model_dir() + "/mlp_dyn.onnx";
  std::string unbound = error_of([&] { onnx::import_file(path); });
  EXPECT_NE(unbound, "");
  EXPECT_NE(unbound.find("'x'"), std::string::npos) << unbound;
  std::string wrong = error_of([&] {
    onnx::import_file(path, {.input_shapes = {{"x", {2, 10}}, {"nope", {2, 10}}}});
  });
  EXPECT_NE(wrong.find("'nope'"), std::string::npos) << wrong;
  std::string mismatch = error_of([&] { onnx::import_file(path, {.input_shapes = {{"x", {2, 11}}}}); });
  EXPECT_NE(mismatch, "");
}

TEST(Onnx, InitializersBecomeNamedParameters) {
  onnx::Imported m = onnx::import_file(model_dir() + "/mlp.onnx");
  // fc1 10x16+16, fc2 16x12+12, fc3 12x5+5.
  EXPECT_EQ(m.parameter_count, 10 * 16 + 16 + 16 * 12 + 12 + 12 * 5 + 5);
  EXPECT_EQ(m.graph.get("fc1.weight").shape(), (Shape{16, 10}));
  EXPECT_EQ(m.graph.get("fc3.bias").shape(), (Shape{5}));
}

// Gradients of loss = sum(y * y) through an imported (trainable) graph against torch autograd.
void check_gradients(const std::string& name, const std::vector<std::string>& params) {
  const std::string& dir = model_dir();
  SafetensorsFile ref = SafetensorsFile::read(dir + "/" + name + ".safetensors");
  onnx::Imported m = onnx::import_file(dir + "/" + name + ".onnx", {.trainable = true});
  Graph& g = m.graph;
  std::optional<int> yid = g.ir().find_output("y");
  ASSERT_TRUE(yid.has_value());
  Tensor y(&g.ir(), *yid);
  Tensor loss = sum(y * y);
  Gradients grads = backward(g, loss);
  for (const std::string& n : params) {
    ASSERT_TRUE(grads.params.count(n)) << n;
    g.output("grad." + n, grads.params.at(n));
  }
  cpu::Executor ex(g.ir(), {.float64 = true});
  ex.set_input("x", ref.get("x").to_f64());
  ex.run();
  EXPECT_LE(test::rel_l2(ex.output("y").v, ref.get("y").to_f64()), 1e-4);
  for (const std::string& n : params) {
    const StoredTensor& want = ref.get("grad." + n);
    const cpu::Buffer& got = ex.output("grad." + n);
    EXPECT_EQ(got.shape, want.shape) << n;
    EXPECT_LE(test::rel_l2(got.v, want.to_f64()), 1e-4) << name << " " << n;
  }
}

TEST(Onnx, MlpGradientsMatchTorchAutograd) {
  check_gradients("mlp_grad", {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
}
TEST(Onnx, CnnGradientsMatchTorchAutograd) {
  check_gradients("cnn_grad", {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"});
}

// An imported graph trains through mgn::compile: one SGD step moves every parameter by -lr times torch's
// gradient (closed form), and the checkpoint it saves loads into a fresh import whose output equals the
// trained session's.
TEST(Onnx, ImportedCnnTrainsSavesAndReloads) {
  const std::string& dir = model_dir();
  SafetensorsFile ref = SafetensorsFile::read(dir + "/cnn_grad.safetensors");
  onnx::Imported m = onnx::import_file(dir + "/cnn_grad.onnx", {.trainable = true});
  Graph& g = m.graph;
  Tensor y(&g.ir(), *g.ir().find_output("y"));
  g.output("loss", sum(y * y));
  const double lr = 0.01;
  Session s = compile(g, {.mode = Mode::Train, .optimizer = SGD{.lr = lr}, .device = test::device_options()});
  const std::vector<std::string> params = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc.weight", "fc.bias"};
  std::map<std::string, std::vector<float>> before;
  for (const std::string& n : params) before[n] = s.read(n);
  s.set_input("x", ref.get("x").to_f32());
  s.step();
  const std::vector<double> y_ref = ref.get("y").to_f64();
  double want_loss = 0;
  for (double v : y_ref) want_loss += v * v;
  EXPECT_NEAR(s.read_scalar("loss"), want_loss, 1e-5 * want_loss);
  for (const std::string& n : params) {
    std::vector<double> grad = ref.get("grad." + n).to_f64(), step(grad.size()), want_step(grad.size());
    std::vector<float> after = s.read(n);
    for (size_t i = 0; i < grad.size(); ++i) {
      step[i] = double(after[i]) - double(before[n][i]);
      want_step[i] = -lr * grad[i];
    }
    EXPECT_LE(test::rel_l2(step, want_step), 1e-3) << n << " (update vs -lr * torch gradient)";
  }
  const std::string ckpt = test::make_temp_dir("onnx_train") + "/cnn.safetensors";
  s.save_checkpoint(ckpt);
  onnx::Imported fresh = onnx::import_file(dir + "/cnn_grad.onnx", {.trainable = true});
  Session infer = compile(fresh.graph, {.mode = Mode::Infer, .device = test::device_options()});
  infer.load_checkpoint(ckpt);
  infer.set_input("x", ref.get("x").to_f32());
  infer.run();
  std::vector<float> y2 = infer.read("y");
  // Reference for the reloaded output: the trained parameters in the CPU executor.
  onnx::Imported check = onnx::import_file(dir + "/cnn_grad.onnx", {.trainable = true});
  cpu::Executor ex(check.graph.ir());
  for (const std::string& n : params) {
    std::vector<float> v = s.read(n);
    ex.set_state(n, std::vector<double>(v.begin(), v.end()));
  }
  ex.set_input("x", ref.get("x").to_f32());
  ex.run();
  EXPECT_LE(test::rel_l2(std::vector<double>(y2.begin(), y2.end()), ex.output("y").v), 1e-5);
}

TEST(Onnx, TruncatedFileIsAClearError) {
  std::string bytes = read_bytes(model_dir() + "/mlp.onnx");
  ASSERT_GT(bytes.size(), 100u);
  for (size_t keep : {bytes.size() / 2, bytes.size() - 7, size_t(10)}) {
    std::string msg = error_of([&] { onnx::import_bytes(bytes.substr(0, keep), "truncated.onnx"); });
    EXPECT_NE(msg, "") << keep;
    EXPECT_NE(msg.find("truncated.onnx"), std::string::npos) << msg;
  }
}

TEST(Onnx, RandomBytesAndEmptyInputAreClearErrors) {
  std::mt19937_64 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes;
    size_t n = 1 + size_t(rng() % 4096);
    for (size_t i = 0; i < n; ++i) bytes.push_back(char(rng() & 0xff));
    std::string msg = error_of([&] { onnx::import_bytes(bytes, "random.onnx"); });
    EXPECT_NE(msg, "") << trial;
  }
  EXPECT_NE(error_of([] { onnx::import_bytes("", "empty.onnx"); }), "");
  EXPECT_NE(error_of([] { onnx::import_file("/nonexistent/dir/model.onnx"); }), "");
}

// Single-byte corruptions of valid models: each import either succeeds or throws mgn::Error (never another
// exception type, never a crash or a hang).
TEST(Onnx, CorruptedBytesNeverCrash) {
  std::mt19937_64 rng(99);
  for (const char* name : {"helper_ops", "cnn", "block"}) {
    const std::string bytes = read_bytes(model_dir() + "/" + name + ".onnx");
    for (int trial = 0; trial < 500; ++trial) {
      std::string b = bytes;
      size_t at = size_t(rng() % b.size());
      b[at] = char(rng() & 0xff);
      try {
        onnx::Imported m = onnx::import_bytes(b, "corrupt.onnx");
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << name << " byte " << at << ": not an mgn::Error: " << e.what();
      }
    }
  }
}

TEST(Onnx, UnsupportedOpsetAndShortInitializerAreClearErrors) {
  std::string opset = error_of([] { onnx::import_file(model_dir() + "/bad_opset.onnx"); });
  EXPECT_NE(opset.find("opset 21"), std::string::npos) << opset;
  std::string init = error_of([] { onnx::import_file(model_dir() + "/bad_init_size.onnx"); });
  EXPECT_NE(init.find("'b'"), std::string::npos) << init;
}

TEST(Onnx, MissingInitializerNamesTheValue) {
  std::string msg = error_of([] { onnx::import_file(model_dir() + "/bad_missing_init.onnx"); });
  ASSERT_NE(msg, "");
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
}

TEST(Onnx, UnknownOpsAreAllListedInOneError) {
  std::string msg = error_of([] { onnx::import_file(model_dir() + "/bad_unknown_ops.onnx"); });
  ASSERT_NE(msg, "");
  EXPECT_NE(msg.find("NonMaxSuppression"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RoiAlign"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("Relu"), std::string::npos) << msg;
  std::string summary = onnx::inspect(model_dir() + "/bad_unknown_ops.onnx");
  EXPECT_NE(summary.find("NonMaxSuppression"), std::string::npos) << summary;
  EXPECT_NE(summary.find("RoiAlign"), std::string::npos) << summary;
}

TEST(Onnx, SupportedOpsAreSortedAndCoverTheExports) {
  std::vector<std::string> ops = onnx::supported_ops();
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  for (const char* op :
       {"Gemm", "Conv", "ConvTranspose", "GatherElements", "ScatterElements", "BatchNormalization",
        "LayerNormalization", "Softmax", "Where", "Trilu"})
    EXPECT_TRUE(std::find(ops.begin(), ops.end(), op) != ops.end()) << op;
  EXPECT_TRUE(std::find(ops.begin(), ops.end(), "NonMaxSuppression") == ops.end());
}

// README.md lists the supported operators between markers; the list must be the importer's own.
TEST(Onnx, ReadmeListsExactlyTheSupportedOps) {
  std::string readme = read_bytes(std::string(MGN_SOURCE_DIR) + "/README.md");
  const std::string begin = "<!-- onnx-ops:begin -->", end = "<!-- onnx-ops:end -->";
  size_t a = readme.find(begin), b = readme.find(end);
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  std::istringstream words(readme.substr(a + begin.size(), b - a - begin.size()));
  std::vector<std::string> listed{std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
  EXPECT_EQ(listed, onnx::supported_ops()) << "regenerate the README list with `mgn inspect --supported-ops`";
}

}  // namespace
}  // namespace mgn
