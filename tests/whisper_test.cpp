// Whisper encoder builder (include/mgn/whisper.h) against closed forms and a plain-torch re-implementation
// (tests/ref/whisper_ref.py): the parameter arithmetic of the spec, config parsing and its refusals, the
// sinusoidal positions, the paper's sine init, weight loading under every HF prefix, and forward + every
// gradient of a reduced config on the CPU executor (f64 and f32), the CPU backend and Vulkan, at batch 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/session.h"
#include "mgn/whisper.h"
#include "support/gates.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

// 2 layers, d_model 64 (4 heads of 16), FFN 96, 80 mels, 150 positions (300 frames): the code paths of the
// real model at a size lavapipe runs in seconds.
whisper::Config reduced() {
  return {.d_model = 64, .encoder_layers = 2, .encoder_attention_heads = 4, .encoder_ffn_dim = 96,
          .num_mel_bins = 80, .max_source_positions = 150};
}

// Random weights (uniform, scaled like trained ones) with the real sinusoids as positions.
std::map<std::string, std::vector<float>> random_weights(const whisper::Config& c, uint64_t seed) {
  std::map<std::string, std::vector<float>> w;
  for (auto& [name, shape] : whisper::parameter_shapes(c)) {
    if (name == "embed_positions.weight") {
      w[name] = whisper::sinusoids(shape[0], shape[1]);
      continue;
    }
    const bool norm_weight = name.find("layer_norm.weight") != std::string::npos;
    const double fan = shape.size() >= 2 ? double(numel(shape) / shape[0]) : 1.0;
    const double scale = shape.size() >= 2 ? 1.0 / std::sqrt(fan) : 0.1;
    std::vector<double> v = test::random_uniform(size_t(numel(shape)), seed++, -scale * std::sqrt(3.0), scale * std::sqrt(3.0));
    w[name].assign(v.begin(), v.end());
    if (norm_weight)
      for (float& x : w[name]) x += 1.0f;
  }
  return w;
}

std::vector<StoredTensor> ref_inputs(const whisper::Config& c, const std::map<std::string, std::vector<float>>& w,
                                     const std::vector<float>& mel, int64_t B, int64_t frames, bool f64) {
  std::vector<double> cfg = {double(c.d_model), double(c.encoder_layers), double(c.encoder_attention_heads),
                             double(c.encoder_ffn_dim), double(c.num_mel_bins), double(c.max_source_positions),
                             f64 ? 1.0 : 0.0};
  std::vector<StoredTensor> in = {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg),
                                  StoredTensor::from_f32("mel", {B, c.num_mel_bins, frames}, mel)};
  for (auto& [name, shape] : whisper::parameter_shapes(c)) in.push_back(StoredTensor::from_f32("w." + name, shape, w.at(name)));
  return in;
}

std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST(Whisper, ParameterArithmeticOfTheSpec) {
  // workload-specs.md §3: per layer 3·147,840 + 147,456 + 2·768 + 591,360 + 590,208 = 1,774,080; conv1 92,544,
  // conv2 442,752, final norm 768: 7,632,384 trainable, plus the 1500 x 384 positional table.
  whisper::Config c = whisper::Config::tiny();
  EXPECT_EQ(whisper::trainable_parameter_count(c), 7'632'384);
  int64_t all = 0;
  for (auto& [name, shape] : whisper::parameter_shapes(c)) all += numel(shape);
  EXPECT_EQ(all, 8'208'384);
  // Other sizes follow the same formula: d·(mels·3 + 1) + d·(3d + 1) + L·(4d² + 3d + 4d + 2df + f + d) + 2d.
  for (whisper::Config s : {whisper::Config::base(), whisper::Config::small()}) {
    const int64_t d = s.d_model, f = s.encoder_ffn_dim, L = s.encoder_layers;
    EXPECT_EQ(whisper::trainable_parameter_count(s),
              d * (80 * 3 + 1) + d * (3 * d + 1) + L * (4 * d * d + 3 * d + 4 * d + 2 * d * f + f + d) + 2 * d);
  }
  // The graph holds exactly these tensors: autodiff finds a gradient for every one but the positions (state).
  Graph g = whisper::encoder_graph(c, {.batch = 1, .frames = 20}, Mode::Train);
  Gradients grads = backward(g, *g.find_output("loss"));
  int64_t trainable = 0;
  for (auto& [name, t] : grads.params) trainable += numel(t.shape());
  EXPECT_EQ(trainable, 7'632'384);
  EXPECT_EQ(grads.params.count("embed_positions.weight"), 0u);
  EXPECT_EQ(g.get("embed_positions.weight").shape(), (Shape{1500, 384}));
}

TEST(Whisper, ConfigFromHuggingFaceJsonAndItsRefusals) {
  // The encoder fields of openai/whisper-tiny's config.json (the decoder fields are ignored).
  const std::string hf = R"({"activation_function": "gelu", "d_model": 384, "decoder_attention_heads": 6,
    "decoder_ffn_dim": 1536, "decoder_layers": 4, "encoder_attention_heads": 6, "encoder_ffn_dim": 1536,
    "encoder_layers": 4, "max_source_positions": 1500, "num_mel_bins": 80, "vocab_size": 51865,
    "model_type": "whisper", "scale_embedding": false})";
  whisper::Config c = whisper::Config::from_json(hf);
  EXPECT_EQ(c.d_model, 384);
  EXPECT_EQ(c.encoder_layers, 4);
  EXPECT_EQ(c.encoder_attention_heads, 6);
  EXPECT_EQ(c.encoder_ffn_dim, 1536);
  EXPECT_EQ(c.frames(), 3000);
  EXPECT_NE(error_of([] { whisper::Config::from_json(R"({"d_model": 384})", "x.json"); }).find("encoder_layers"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              whisper::Config::from_json(R"({"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 5,
                                            "encoder_ffn_dim": 8})");
            }).find("not divisible"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              whisper::Config::from_json(R"({"d_model": 384, "encoder_layers": 4294967296,
                                            "encoder_attention_heads": 6, "encoder_ffn_dim": 8})");
            }).find("encoder_layers must be in"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              whisper::Config::from_json(R"({"d_model": 18446744073709551615, "encoder_layers": 4,
                                            "encoder_attention_heads": 6, "encoder_ffn_dim": 8})");
            }).find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              whisper::Config::from_json(R"({"d_model": 384, "encoder_layers": 4, "encoder_attention_heads": 6,
                                            "encoder_ffn_dim": 8, "activation_function": "relu"})");
            }).find("not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { whisper::Config::from_json("[1, 2"); }).find("not valid JSON"), std::string::npos);
  // A frame count whose positions exceed the table.
  EXPECT_NE(error_of([] { whisper::encoder_graph(reduced(), {.frames = 302}); }).find("max_source_positions"),
            std::string::npos);
}

TEST(Whisper, SinusoidsAndPaperSineInitAreTheClosedForms) {
  const int64_t L = 50, C = 16;
  std::vector<float> s = whisper::sinusoids(L, C);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t i = 0; i < C / 2; ++i) {
      const double a = double(t) * std::exp(-std::log(10000.0) / double(C / 2 - 1) * double(i));
      EXPECT_NEAR(s[size_t(t * C + i)], std::sin(a), 2e-5);
      EXPECT_NEAR(s[size_t(t * C + C / 2 + i)], std::cos(a), 2e-5);
    }
  // Paper init: t[j] = 0.02 sin(0.01 j + seed(name)), generated [in, out] for 2-D weights.
  whisper::Config c = reduced();
  Graph g = whisper::encoder_graph(c, {.batch = 1, .frames = 300, .init = whisper::Init::PaperSine});
  Session sess = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto seed_of = [](const std::string& n) {
    uint64_t h = 0;
    for (unsigned char ch : n) h = (h * 31 + ch) % 4294967296ull;
    return double(h % 10000);
  };
  const std::string fc1 = "layers.1.fc1.weight";  // [96, 64]: element (o, i) is generated at j = i·96 + o
  std::vector<float> v = sess.read(fc1);
  for (int64_t o : {0, 5, 95})
    for (int64_t i : {0, 7, 63})
      EXPECT_NEAR(v[size_t(o * 64 + i)], 0.02 * std::sin(0.01 * double(i * 96 + o) + seed_of(fc1)), 1e-7);
  const std::string ln = "layers.0.final_layer_norm.weight";
  std::vector<float> n = sess.read(ln);
  for (int64_t j : {0, 33})
    EXPECT_NEAR(n[size_t(j)], 1.0 + 0.02 * std::sin(0.01 * double(j) + seed_of(ln)), 1e-7);
}

TEST(Whisper, ReadsWeightsUnderEveryHuggingFacePrefixAndNamesWhatIsMissing) {
  whisper::Config c = reduced();
  auto w = random_weights(c, 7);
  const std::string dir = test::make_temp_dir("whisper_weights");
  for (const std::string& prefix : {std::string("model.encoder."), std::string("encoder."), std::string()}) {
    std::vector<StoredTensor> t;
    for (auto& [name, shape] : whisper::parameter_shapes(c)) t.push_back(StoredTensor::from_f32(prefix + name, shape, w.at(name)));
    if (!prefix.empty()) t.push_back(StoredTensor::from_f32("model.decoder.layer_norm.weight", {4}, {1, 1, 1, 1}));
    write_safetensors(dir + "/model.safetensors", t);
    auto got = whisper::read_weights(c, dir);
    ASSERT_EQ(got.size(), w.size()) << prefix;
    for (auto& [name, v] : w) EXPECT_EQ(got.at(name), v) << prefix << name;
  }
  // A missing encoder tensor is named, with the file.
  std::vector<StoredTensor> t;
  for (auto& [name, shape] : whisper::parameter_shapes(c))
    if (name != "layers.1.fc2.bias") t.push_back(StoredTensor::from_f32("model.encoder." + name, shape, w.at(name)));
  write_safetensors(dir + "/model.safetensors", t);
  std::string e = error_of([&] { whisper::read_weights(c, dir); });
  EXPECT_NE(e.find("model.encoder.layers.1.fc2.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  // A config with fewer layers than the file: the extra layer is refused, not ignored.
  whisper::Config one = c;
  one.encoder_layers = 1;
  t.clear();
  for (auto& [name, shape] : whisper::parameter_shapes(c)) t.push_back(StoredTensor::from_f32(name, shape, w.at(name)));
  write_safetensors(dir + "/model.safetensors", t);
  e = error_of([&] { whisper::read_weights(one, dir); });
  EXPECT_NE(e.find("unknown encoder tensor"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// Forward, the paper loss and every gradient against plain torch (f64), at batch 2 with a frame count
// shorter than the full window (positions cut), then the f32 backends against torch in f32.
TEST(Whisper, ForwardLossAndEveryGradientMatchTorch) {
  whisper::Config c = reduced();
  const int64_t B = 2, frames = 300, T = 150;
  auto w = random_weights(c, 11);
  std::vector<double> md = test::random_normal(size_t(B * c.num_mel_bins * frames), 3);
  std::vector<float> mel(md.begin(), md.end());

  auto ref = test::run_torch("tests/ref/whisper_ref.py", ref_inputs(c, w, mel, B, frames, true));
  Graph g = whisper::encoder_graph(c, {.batch = B, .frames = frames}, Mode::Train);
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  ASSERT_EQ(int64_t(grads.params.size()), int64_t(whisper::parameter_shapes(c).size()) - 1);  // not the positions

  cpu::Executor ex(g.ir(), {.float64 = true});
  for (auto& [name, v] : w) ex.set_state(name, wide(v));
  ex.set_input("mel", md);
  ex.run();
  ASSERT_EQ(ex.output("last_hidden_state").v.size(), size_t(B * T * c.d_model));
  // (1e-7, not 1e-14: the executor's f64 mode keeps a few constants, e.g. GELU's, at f32 precision.)
  EXPECT_LT(test::rel_l2(ex.output("last_hidden_state").v, ref.at("last_hidden_state").to_f64()), 1e-7);
  EXPECT_NEAR(ex.output("loss").v[0], ref.at("loss").to_f64()[0], 1e-7 * std::fabs(ref.at("loss").to_f64()[0]));
  for (auto& [name, t] : grads.params)
    EXPECT_LT(test::rel_l2(ex.output("grad." + name).v, ref.at("grad." + name).to_f64()), 1e-7) << name;

  // The f32 sessions (CPU backend; Vulkan where there is a device) against the same f64 reference: forward
  // rel-L2 <= 1e-4, every gradient rel-L2 <= 1e-3 (the strict gates of bench/compare.py).
  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph gs = whisper::encoder_graph(c, {.batch = B, .frames = frames}, Mode::Train);
    Gradients gr = backward(gs, Tensor(&gs.ir(), *gs.ir().find_output("loss")));
    for (auto& [name, t] : gr.params) gs.output("grad." + name, t);
    std::optional<Session> s;
    s.emplace(compile(gs, {.mode = Mode::Infer, .backend = b, .device = test::device_options()}));
    if (b == Backend::Auto && std::string(s->backend()) == "cpu") continue;  // no Vulkan device here
    whisper::load_weights(*s, w);
    s->set_input("mel", mel);
    s->run();
    const std::string who = s->backend();
    EXPECT_LT(test::rel_l2(wide(s->read("last_hidden_state")), ref.at("last_hidden_state").to_f64()), 1e-4) << who;
    test::expect_loss_and_gradients(*s, ref, gr.params);
  }
}

// Training with the paper objective on the CPU backend: AdamW steps lower mean(h²), and a batch-1 session
// computes what row 0 of a batch-2 session computes (any batch, one function).
TEST(Whisper, TrainsAndBatchRowsAreIndependent) {
  whisper::Config c = reduced();
  c.encoder_layers = 1;
  const int64_t frames = 60;
  auto w = random_weights(c, 21);
  std::vector<double> md = test::random_normal(size_t(2 * c.num_mel_bins * frames), 5);
  std::vector<float> mel(md.begin(), md.end());
  Graph g2 = whisper::encoder_graph(c, {.batch = 2, .frames = frames}), g1 = whisper::encoder_graph(c, {.batch = 1, .frames = frames});
  Session two = compile(g2, {.mode = Mode::Infer, .backend = Backend::Cpu});
  Session one = compile(g1, {.mode = Mode::Infer, .backend = Backend::Cpu});
  whisper::load_weights(two, w);
  whisper::load_weights(one, w);
  two.set_input("mel", mel);
  one.set_input("mel", std::vector<float>(mel.begin(), mel.begin() + c.num_mel_bins * frames));
  two.run();
  one.run();
  std::vector<float> a = one.read("last_hidden_state"), b = two.read("last_hidden_state");
  b.resize(a.size());
  EXPECT_LT(test::rel_l2(wide(a), wide(b)), 1e-6);

  Graph gt = whisper::encoder_graph(c, {.batch = 2, .frames = frames}, Mode::Train);
  Session train = compile(gt, {.mode = Mode::Train, .optimizer = AdamW{.lr = 1e-3}, .backend = Backend::Cpu});
  whisper::load_weights(train, w);
  train.set_input("mel", mel);
  train.step();
  const float first = train.read_scalar("loss");
  for (int i = 0; i < 5; ++i) train.step();
  EXPECT_LT(train.read_scalar("loss"), 0.9f * first);
}
