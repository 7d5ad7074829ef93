// DINOv3 ViT builder (include/mgn/dinov3.h) against closed forms and a plain-torch re-implementation
// (tests/ref/dinov3_ref.py): the parameter count of the spec, config parsing and its refusals, the axial RoPE
// tables, LayerScale on every token, weight loading under every prefix, and forward + every gradient of a
// reduced config on a non-square image on the CPU executor (f64), the CPU backend and Vulkan (f32), at
// batch 2.
#include "mgn/dinov3.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numbers>

#include "backend/cpu/executor.h"
#include "ir/graph.h"
#include "mgn/autodiff.h"
#include "mgn/session.h"
#include "support/gates.h"
#include "support/test_util.h"

using namespace mgn;
using test::error_of;

namespace {

// 2 layers, hidden 64 (4 heads of 16), MLP 96, patch 16, 4 registers: the code paths of ViT-S/16 at a size
// lavapipe runs in seconds.
dinov3::Config reduced() {
  dinov3::Config c;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 96;
  c.image_size = 64;
  return c;
}

// Random weights (uniform, scaled like trained ones); LayerNorm weights and λ around 1.
std::map<std::string, std::vector<float>> random_weights(const dinov3::Config& c, uint64_t seed) {
  std::map<std::string, std::vector<float>> w;
  for (auto& [name, shape] : dinov3::parameter_shapes(c)) {
    const bool around_one =
        name.ends_with("lambda1") || (name.find("norm") != std::string::npos && name.ends_with("weight"));
    const double fan = shape.size() >= 2 && !name.starts_with("embeddings.") ? double(numel(shape) / shape[0])
                       : name == "embeddings.patch_embeddings.weight"        ? double(numel(shape) / shape[0])
                                                                             : 1.0;
    const double scale = shape.size() >= 2 && fan > 1 ? 1.0 / std::sqrt(fan) : 0.3;
    std::vector<double> v =
        test::random_uniform(size_t(numel(shape)), seed++, -scale * std::sqrt(3.0), scale * std::sqrt(3.0));
    w[name].assign(v.begin(), v.end());
    if (around_one)
      for (float& x : w[name]) x += 1.0f;
  }
  return w;
}

std::vector<StoredTensor> ref_inputs(const dinov3::Config& c,
                                     const std::map<std::string, std::vector<float>>& w,
                                     const std::vector<float>& px, int64_t B, int64_t H, int64_t W, bool f64,
                                     int64_t layers = 0, bool final_norm = true) {
  std::vector<double> cfg = {double(c.hidden_size),
                             double(layers ? layers : c.num_hidden_layers),
                             double(c.num_attention_heads),
                             double(c.intermediate_size),
                             double(c.patch_size),
                             double(c.num_register_tokens),
                             c.rope_theta,
                             c.layer_norm_eps,
                             f64 ? 1.0 : 0.0,
                             final_norm ? 1.0 : 0.0};
  std::vector<StoredTensor> in = {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg),
                                  StoredTensor::from_f32("pixel_values", {B, c.num_channels, H, W}, px)};
  for (auto& [name, shape] : dinov3::parameter_shapes(c))
    in.push_back(StoredTensor::from_f32("w." + name, shape, w.at(name)));
  return in;
}

std::vector<double> wide(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// The smallest cosine similarity between matching rows of width D.
double min_row_cosine(const std::vector<double>& a, const std::vector<double>& b, int64_t D) {
  double worst = 1.0;
  for (size_t r = 0; r < a.size() / size_t(D); ++r) {
    double ab = 0, aa = 0, bb = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double x = a[r * size_t(D) + size_t(j)], y = b[r * size_t(D) + size_t(j)];
      ab += x * y, aa += x * x, bb += y * y;
    }
    worst = std::min(worst, ab / std::sqrt(aa * bb));
  }
  return worst;
}

void add_gradients(Graph& g, Gradients& grads) {
  grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
}

}  // namespace

TEST(DinoV3, ParameterCountOfTheSpec) {
  // workload-specs.md §4: 21,596,544 values including the mask token. Per layer 4·384² + 3·384 (q, v, o
  // biases) + 4·384 (norms) + 2·384 (λ) + 1536·384 + 1536 + 384·1536 + 384 = 1,774,848; patch embed 295,296;
  // CLS, 4 registers, mask 6·384; final norm 768.
  dinov3::Config c = dinov3::Config::vits16();
  EXPECT_EQ(dinov3::parameter_count(c), 21'596'544);
  EXPECT_EQ(dinov3::parameter_count(c), 295'296 + 6 * 384 + 12 * 1'774'848 + 768);
  // The graph holds exactly these tensors; autodiff finds a gradient for every one but the mask token
  // (state).
  Graph g = dinov3::vit_graph(c, {.batch = 1, .height = 32, .width = 32}, Mode::Train);
  Gradients grads = backward(g, *g.find_output("loss"));
  int64_t trainable = 0;
  for (auto& [name, t] : grads.params) trainable += numel(t.shape());
  EXPECT_EQ(trainable, 21'596'544 - 384);
  EXPECT_EQ(grads.params.count("embeddings.mask_token"), 0u);
  EXPECT_EQ(grads.params.count("layer.0.attention.k_proj.bias"), 0u);  // no key bias
  EXPECT_EQ(g.get("embeddings.mask_token").shape(), (Shape{1, 1, 384}));
  // Outputs follow the image: 224² -> 5 + 196 tokens.
  Graph g224 = dinov3::vit_graph(c, {.batch = 2, .layers = 1});
  EXPECT_EQ(g224.find_output("last_hidden_state")->shape(), (Shape{2, 201, 384}));
  EXPECT_EQ(g224.find_output("pooler_output")->shape(), (Shape{2, 384}));
}

TEST(DinoV3, ConfigFromHuggingFaceJsonAndItsRefusals) {
  // The fields of facebook/dinov3-vits16-pretrain-lvd1689m's config.json as transformers writes it.
  const std::string hf = R"({"architectures": ["DINOv3ViTModel"], "hidden_act": "gelu", "hidden_size": 384,
    "image_size": 224, "intermediate_size": 1536, "key_bias": false, "layer_norm_eps": 1e-05,
    "layerscale_value": 1.0, "mlp_bias": true, "model_type": "dinov3_vit", "num_attention_heads": 6,
    "num_channels": 3, "num_hidden_layers": 12, "num_register_tokens": 4, "patch_size": 16,
    "pos_embed_rescale": 2.0, "proj_bias": true, "query_bias": true, "rope_theta": 100.0,
    "use_gated_mlp": false, "value_bias": true})";
  dinov3::Config c = dinov3::Config::from_json(hf);
  EXPECT_EQ(dinov3::parameter_count(c), 21'596'544);
  EXPECT_EQ(c.num_register_tokens, 4);
  EXPECT_EQ(c.head_dim(), 64);
  EXPECT_EQ(dinov3::Config::from_json("{}").num_register_tokens, 0);  // transformers' default
  EXPECT_NE(error_of([] {
              dinov3::Config::from_json(R"({"hidden_size": 384, "num_attention_heads": 5})", "x.json");
            }).find("not divisible"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              dinov3::Config::from_json(R"({"hidden_size": 40, "num_attention_heads": 4})");
            }).find("divisible by 4"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              dinov3::Config::from_json(R"({"num_hidden_layers": 4294967296})");
            }).find("num_hidden_layers must be in"),
            std::string::npos);
  EXPECT_NE(error_of([] { dinov3::Config::from_json(R"({"hidden_act": "silu"})"); }).find("not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { dinov3::Config::from_json(R"({"use_gated_mlp": true})"); }).find("use_gated_mlp"),
            std::string::npos);
  EXPECT_NE(error_of([] { dinov3::Config::from_json(R"({"key_bias": 1})"); }).find("true or false"),
            std::string::npos);
  EXPECT_NE(error_of([] { dinov3::Config::from_json("[1, 2"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { dinov3::vit_graph(reduced(), {.height = 40}); }).find("multiple of the patch size"),
            std::string::npos);
  EXPECT_NE(error_of([] { dinov3::vit_graph(reduced(), {.layers = 3}); }).find("layers must be in"),
            std::string::npos);
}

TEST(DinoV3, RopeTablesAreTheAxialFormula) {
  // inv_freq[k] = 100^(-k/16); patch (r, c) centre y = 2(r + ½)/h - 1, x = 2(c + ½)/w - 1; the row holds
  // [2π·y·inv_freq (16), 2π·x·inv_freq (16)]; the 5 prefix rows are the identity (cos 1, sin 0).
  dinov3::Config c = dinov3::Config::vits16();
  const int64_t gh = 14, gw = 10;
  auto [cs, sn] = dinov3::rope_tables(c, gh, gw);
  ASSERT_EQ(cs.size(), size_t((5 + gh * gw) * 32));
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t j = 0; j < 32; ++j) {
      EXPECT_EQ(cs[size_t(r * 32 + j)], 1.0f);
      EXPECT_EQ(sn[size_t(r * 32 + j)], 0.0f);
    }
  for (int64_t r : {0, 3, 13})
    for (int64_t col : {0, 5, 9})
      for (int64_t j = 0; j < 32; ++j) {
        const double coord = j < 16 ? 2 * (r + 0.5) / gh - 1 : 2 * (col + 0.5) / gw - 1;
        const double angle = 2 * std::numbers::pi * coord * std::pow(100.0, -double(j % 16) / 16.0);
        const size_t at = size_t((5 + r * gw + col) * 32 + j);
        EXPECT_NEAR(cs[at], std::cos(angle), 2e-6) << r << " " << col << " " << j;
        EXPECT_NEAR(sn[at], std::sin(angle), 2e-6) << r << " " << col << " " << j;
      }
}

// Forward, the paper loss and every gradient against plain torch (f64), at batch 2 on a 64 x 48 image (4 x 3
// patches: the RoPE grid is not square), then the f32 backends against the same reference.
TEST(DinoV3, ForwardLossAndEveryGradientMatchTorch) {
  dinov3::Config c = reduced();
  const int64_t B = 2, H = 64, W = 48, S = 5 + 4 * 3;
  auto w = random_weights(c, 11);
  std::vector<double> pd = test::random_normal(size_t(B * 3 * H * W), 3);
  std::vector<float> px(pd.begin(), pd.end());

  auto ref = test::run_torch("tests/ref/dinov3_ref.py", ref_inputs(c, w, px, B, H, W, true));
  const std::vector<double> want = ref.at("last_hidden_state").to_f64();
  ASSERT_EQ(want.size(), size_t(B * S * c.hidden_size));
  Graph g = dinov3::vit_graph(c, {.batch = B, .height = H, .width = W}, Mode::Train);
  Gradients grads;
  add_gradients(g, grads);
  ASSERT_EQ(int64_t(grads.params.size()),
            int64_t(dinov3::parameter_shapes(c).size()) - 1);  // not the mask token

  cpu::Executor ex(g.ir(), {.float64 = true});
  for (auto& [name, v] : w) ex.set_state(name, wide(v));
  ex.set_input("pixel_values", pd);
  ex.run();
  EXPECT_LT(test::rel_l2(ex.output("last_hidden_state").v, want), 1e-7);
  EXPECT_NEAR(ex.output("loss").v[0], ref.at("loss").to_f64()[0],
              1e-7 * std::fabs(ref.at("loss").to_f64()[0]));
  for (auto& [name, t] : grads.params)
    EXPECT_LT(test::rel_l2(ex.output("grad." + name).v, ref.at("grad." + name).to_f64()), 1e-7) << name;

  // The f32 sessions (CPU backend; Vulkan where there is a device): forward rel-L2 <= 1e-4, CLS and every
  // patch cosine > 0.9999, every gradient rel-L2 <= 1e-3 (the strict gates of bench/compare.py).
  for (Backend b : {Backend::Cpu, Backend::Auto}) {
    Graph gs = dinov3::vit_graph(c, {.batch = B, .height = H, .width = W}, Mode::Train);
    Gradients gr;
    add_gradients(gs, gr);
    std::optional<Session> s;
    s.emplace(compile(gs, {.mode = Mode::Infer, .backend = b, .device = test::device_options()}));
    if (b == Backend::Auto && std::string(s->backend()) == "cpu") continue;  // no Vulkan device here
    dinov3::load_weights(*s, w);
    s->set_input("pixel_values", px);
    s->run();
    const std::string who = s->backend();
    const std::vector<double> got = wide(s->read("last_hidden_state"));
    EXPECT_LT(test::rel_l2(got, want), 1e-4) << who;
    EXPECT_GT(min_row_cosine(got, want, c.hidden_size), 0.9999) << who;
    std::vector<double> cls = wide(s->read("pooler_output")), want_cls;
    for (int64_t b2 = 0; b2 < B; ++b2)
      want_cls.insert(want_cls.end(), want.begin() + b2 * S * c.hidden_size,
                      want.begin() + (b2 * S + 1) * c.hidden_size);
    EXPECT_LT(test::rel_l2(cls, want_cls), 1e-4) << who;
    test::expect_loss_and_gradients(*s, ref, gr.params);
  }
}

// The first N layers without the final norm (DinoVision's encoder) against torch run for N layers.
TEST(DinoV3, FirstLayersOnlyMatchTorch) {
  dinov3::Config c = reduced();
  const int64_t B = 1, H = 32, W = 32;
  auto w = random_weights(c, 5);
  std::vector<double> pd = test::random_normal(size_t(B * 3 * H * W), 9);
  std::vector<float> px(pd.begin(), pd.end());
  auto ref = test::run_torch("tests/ref/dinov3_ref.py", ref_inputs(c, w, px, B, H, W, true, 1, false));
  Graph g = dinov3::vit_graph(c, {.batch = B, .height = H, .width = W, .layers = 1, .final_norm = false});
  cpu::Executor ex(g.ir(), {.float64 = true});
  for (auto& [name, v] : w)
    if (!name.starts_with("layer.1.") && name != "embeddings.mask_token") ex.set_state(name, wide(v));
  ex.set_input("pixel_values", pd);
  ex.run();
  EXPECT_LT(test::rel_l2(ex.output("last_hidden_state").v, ref.at("last_hidden_state").to_f64()), 1e-7);
}

// LayerScale multiplies every token: the paper's own code once updated only the first (CLS) token. With λ = 0
// every block is skipped, so each output row is norm(its input token), registers included; a change of λ
// changes every patch token's row, not only row 0.
TEST(DinoV3, LayerScaleActsOnEveryToken) {
  dinov3::Config c = reduced();
  const int64_t H = 32, W = 32, S = 5 + 4, D = c.hidden_size;
  auto w = random_weights(c, 17);
  std::vector<double> pd = test::random_normal(size_t(3 * H * W), 4);
  std::vector<float> px(pd.begin(), pd.end());
  Graph g = dinov3::vit_graph(c, {.batch = 1, .height = H, .width = W});
  Session s = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto run_with = [&](float scale) {
    auto v = w;
    for (auto& [name, values] : v)
      if (name.ends_with("lambda1"))
        for (float& x : values) x *= scale;
    dinov3::load_weights(s, v);
    s.set_input("pixel_values", px);
    s.run();
    return s.read("last_hidden_state");
  };
  const std::vector<float> full = run_with(1.0f), half = run_with(0.5f);
  // λ = 0 on a black image: register row r is the final norm of register_tokens[r], and every patch row the
  // final norm of the patch bias (what the patch conv gives for zero pixels). Were λ applied to row 0 only
  // (the paper code's bug), these rows would carry both blocks' updates.
  std::fill(px.begin(), px.end(), 0.0f);
  const std::vector<float> zero_black = run_with(0.0f);
  auto final_norm = [&](const float* v) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < D; ++j) mean += v[j] / double(D);
    for (int64_t j = 0; j < D; ++j) var += (v[j] - mean) * (v[j] - mean) / double(D);
    std::vector<double> out(static_cast<size_t>(D));
    for (int64_t j = 0; j < D; ++j)
      out[size_t(j)] = (v[j] - mean) / std::sqrt(var + c.layer_norm_eps) * w["norm.weight"][size_t(j)] +
                       w["norm.bias"][size_t(j)];
    return out;
  };
  for (int64_t t = 1; t < S; ++t) {
    const float* in = t < 5 ? w["embeddings.register_tokens"].data() + (t - 1) * D
                            : w["embeddings.patch_embeddings.bias"].data();
    std::vector<double> want = final_norm(in),
                        got(zero_black.begin() + t * D, zero_black.begin() + (t + 1) * D);
    EXPECT_LT(test::max_abs_diff(got, want), 1e-4) << "token " << t;
  }
  // Every token's row moves with λ.
  for (int64_t t = 0; t < S; ++t) {
    std::vector<double> a(full.begin() + t * D, full.begin() + (t + 1) * D),
        b(half.begin() + t * D, half.begin() + (t + 1) * D);
    EXPECT_GT(test::rel_l2(b, a), 1e-2) << "token " << t;
  }
}

TEST(DinoV3, ReadsWeightsUnderEveryPrefixAndNamesWhatIsMissing) {
  dinov3::Config c = reduced();
  auto w = random_weights(c, 7);
  const std::string dir = test::make_temp_dir("dinov3_weights");
  for (const std::string& prefix : {std::string(), std::string("dinov3_vit.")}) {
    std::vector<StoredTensor> t;
    for (auto& [name, shape] : dinov3::parameter_shapes(c))
      t.push_back(StoredTensor::from_f32(prefix + name, shape, w.at(name)));
    write_safetensors(dir + "/model.safetensors", t);
    auto got = dinov3::read_weights(c, dir);
    ASSERT_EQ(got.size(), w.size()) << prefix;
    for (auto& [name, v] : w) EXPECT_EQ(got.at(name), v) << prefix << name;
    // The first layer only: later layers are skipped, not refused.
    auto first = dinov3::read_weights(c, dir, 1);
    EXPECT_EQ(first.count("layer.1.norm1.weight"), 0u);
    EXPECT_EQ(first.count("layer.0.norm1.weight"), 1u);
  }
  // A missing tensor is named, with the file.
  std::vector<StoredTensor> t;
  for (auto& [name, shape] : dinov3::parameter_shapes(c))
    if (name != "layer.1.mlp.down_proj.bias") t.push_back(StoredTensor::from_f32(name, shape, w.at(name)));
  write_safetensors(dir + "/model.safetensors", t);
  std::string e = error_of([&] { dinov3::read_weights(c, dir); });
  EXPECT_NE(e.find("layer.1.mlp.down_proj.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  // A key bias the config says is absent, and a layer the config does not have, are refused.
  t.clear();
  for (auto& [name, shape] : dinov3::parameter_shapes(c))
    t.push_back(StoredTensor::from_f32(name, shape, w.at(name)));
  t.push_back(StoredTensor::from_f32("layer.0.attention.k_proj.bias", {64}, std::vector<float>(64, 0.0f)));
  write_safetensors(dir + "/model.safetensors", t);
  e = error_of([&] { dinov3::read_weights(c, dir); });
  EXPECT_NE(e.find("unknown DINOv3 tensor 'layer.0.attention.k_proj.bias'"), std::string::npos) << e;
  dinov3::Config one = c;
  one.num_hidden_layers = 1;
  t.pop_back();
  write_safetensors(dir + "/model.safetensors", t);
  e = error_of([&] { dinov3::read_weights(one, dir); });
  EXPECT_NE(e.find("unknown DINOv3 tensor"), std::string::npos) << e;
  // A mis-shaped tensor is named.
  dinov3::Config wide_cfg = c;
  wide_cfg.intermediate_size = 128;
  e = error_of([&] { dinov3::read_weights(wide_cfg, dir); });
  EXPECT_NE(e.find("up_proj"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// The paper's sine init is the closed form (LayerNorm weights and λ around 1).
TEST(DinoV3, PaperSineInit) {
  dinov3::Config c = reduced();
  Graph g = dinov3::vit_graph(c, {.batch = 1, .height = 32, .width = 32});
  Session sess = compile(g, {.mode = Mode::Infer, .backend = Backend::Cpu});
  auto seed_of = [](const std::string& n) {
    uint64_t h = 0;
    for (unsigned char ch : n) h = (h * 31 + ch) % 4294967296ull;
    return double(h % 10000);
  };
  const std::string up =
      "layer.1.mlp.up_proj.weight";  // [96, 64]: element (o, i) is generated at j = i·96 + o
  std::vector<float> v = sess.read(up);
  for (int64_t o : {0, 5, 95})
    for (int64_t i : {0, 7, 63})
      EXPECT_NEAR(v[size_t(o * 64 + i)], 0.02 * std::sin(0.01 * double(i * 96 + o) + seed_of(up)), 1e-7);
  for (const char* n : {"layer.0.layer_scale2.lambda1", "norm.weight"}) {
    std::vector<float> l = sess.read(n);
    for (int64_t j : {0, 33})
      EXPECT_NEAR(l[size_t(j)], 1.0 + 0.02 * std::sin(0.01 * double(j) + seed_of(n)), 1e-7);
  }
}

// Any batch, one function: a batch-1 session computes what row 1 of a batch-3 session computes, and a
// training session lowers the paper objective with AdamW (CPU backend).
TEST(DinoV3, BatchRowsAreIndependentAndItTrains) {
  dinov3::Config c = reduced();
  c.num_hidden_layers = 1;
  const int64_t H = 32, W = 48, per = 3 * H * W;
  auto w = random_weights(c, 23);
  std::vector<double> pd = test::random_normal(size_t(3 * per), 8);
  std::vector<float> px(pd.begin(), pd.end());
  Graph g3 = dinov3::vit_graph(c, {.batch = 3, .height = H, .width = W});
  Graph g1 = dinov3::vit_graph(c, {.batch = 1, .height = H, .width = W});
  Session three = compile(g3, {.mode = Mode::Infer, .backend = Backend::Cpu});
  Session one = compile(g1, {.mode = Mode::Infer, .backend = Backend::Cpu});
  dinov3::load_weights(three, w);
  dinov3::load_weights(one, w);
  three.set_input("pixel_values", px);
  one.set_input("pixel_values", std::vector<float>(px.begin() + per, px.begin() + 2 * per));
  three.run();
  one.run();
  std::vector<float> a = one.read("last_hidden_state"), b = three.read("last_hidden_state");
  const size_t rows = a.size();
  EXPECT_LT(test::rel_l2(wide(a), wide(std::vector<float>(b.begin() + ptrdiff_t(rows),
                                                          b.begin() + ptrdiff_t(2 * rows)))),
            1e-6);

  Graph gt = dinov3::vit_graph(c, {.batch = 3, .height = H, .width = W}, Mode::Train);
  Session train = compile(gt, {.mode = Mode::Train, .optimizer = AdamW{.lr = 1e-3}, .backend = Backend::Cpu});
  dinov3::load_weights(train, w);
  train.set_input("pixel_values", px);
  train.step();
  const float first = train.read_scalar("loss");
  for (int i = 0; i < 5; ++i) train.step();
  EXPECT_LT(train.read_scalar("loss"), 0.9f * first);
}
