// Llama builder (include/mgn/llama.h) on the CPU reference executor against a plain-PyTorch LlamaForCausalLM
// (tests/ref/llama_ref.py) with the same random weights: prefill logits, loss and every parameter gradient,
// greedy KV-cache decoding vs prefill-only decoding vs the reference; config and weight-file errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/executor.h"
#include "mgn/autodiff.h"
#include "mgn/llama.h"
#include "mgn/session.h"
#include "support/test_util.h"

using namespace mgn;
namespace fs = std::filesystem;

namespace {

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Random weights, exactly representable in f32 so that both sides start from identical values. Matrices are
// larger than HF's 0.02 init so that the logits are far from uniform (a meaningful comparison); norms
// deviate from one so that a dropped weight would show.
std::map<std::string, std::vector<float>> random_weights(const llama::Config& c, uint64_t seed) {
  std::map<std::string, std::vector<float>> w;
  uint64_t k = seed;
  for (auto& [name, shape] : llama::parameter_shapes(c)) {
    bool norm = shape.size() == 1;
    std::vector<double> r = test::random_normal(size_t(numel(shape)), ++k, norm ? 0.2 : 0.15);
    std::vector<float> f(r.size());
    for (size_t i = 0; i < r.size(); ++i) f[i] = float(norm ? 1.0 + r[i] : r[i]);
    w[name] = f;
  }
  return w;
}

std::vector<StoredTensor> ref_inputs(const llama::Config& c, const std::map<std::string, std::vector<float>>& w,
                                     bool f64, int64_t gen_steps) {
  std::vector<double> cfg = {double(c.vocab_size), double(c.hidden_size), double(c.num_hidden_layers),
                             double(c.num_attention_heads), double(c.kv_heads()), double(c.head_size()),
                             double(c.intermediate_size), c.rms_norm_eps, c.rope_theta,
                             c.tie_word_embeddings ? 1.0 : 0.0, double(gen_steps), f64 ? 1.0 : 0.0};
  std::vector<StoredTensor> in = {StoredTensor::from_f64("cfg", {int64_t(cfg.size())}, cfg)};
  for (auto& [name, shape] : llama::parameter_shapes(c)) in.push_back(StoredTensor::from_f32(name, shape, w.at(name)));
  return in;
}

void load(cpu::Executor& ex, const std::map<std::string, std::vector<float>>& w) {
  for (auto& [name, v] : w) ex.set_state(name, to_f64(v));
}

std::vector<int32_t> random_ids(size_t n, int64_t vocab, uint64_t seed) {
  std::vector<double> u = test::random_uniform(n, seed, 0.0, double(vocab));
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = std::min(int32_t(vocab - 1), int32_t(u[i]));
  return ids;
}

int32_t argmax_row(const std::vector<double>& v, size_t begin, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (v[begin + i] > v[begin + best]) best = i;
  return int32_t(best);
}

}  // namespace

TEST(Llama, ConfigFromHfJson) {
  // The published SmolLM2-135M config.json fields (abridged to what the builder reads, plus extras it ignores).
  std::string text = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "hidden_act": "silu",
    "hidden_size": 576, "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49152})";
  llama::Config c = llama::Config::from_json(text);
  llama::Config want = llama::Config::smollm2_135m();
  EXPECT_EQ(c.vocab_size, want.vocab_size);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.kv_heads(), 3);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  // Parameter count in closed form: the paper's 134.5M.
  int64_t total = 0;
  for (auto& [name, shape] : llama::parameter_shapes(c)) total += numel(shape);
  const int64_t layer = 2 * 576 + 2 * 576 * 576 + 2 * 192 * 576 + 3 * 1536 * 576;
  EXPECT_EQ(total, 49152 * 576 + 30 * layer + 576);
  EXPECT_EQ(total, 134515008);

  auto expect_error = [](const std::string& json, const std::string& needle) {
    try {
      llama::Config::from_json(json, "cfg.json");
      ADD_FAILURE() << "no error for " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::string base = R"("vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 4)";
  expect_error("{" + base + "}", "num_attention_heads");  // missing required field
  expect_error("{" + base + R"(, "num_attention_heads": 3})", "not divisible");
  expect_error("{" + base + R"(, "num_attention_heads": 4, "num_key_value_heads": 3})", "multiple");
  expect_error("{" + base + R"(, "num_attention_heads": "2"})", "must be an integer");
  expect_error("{" + base + R"(, "num_attention_heads": 2, "rope_scaling": {"type": "linear"}})", "rope_scaling");
  expect_error("{" + base + R"(, "num_attention_heads": 2, "hidden_act": "gelu"})", "hidden_act");
  expect_error("{" + base + R"(, "num_attention_heads": 2, "hidden_size": -8})", "hidden_size");
  expect_error("{not json", "not valid JSON");
  expect_error(R"({"a": 1e995})", "not valid JSON");  // past a double: out_of_range, not parse_error
  // Sizes without an upper bound died in allocation (issue 30: layer counts and vocab sizes of 2^31..2^32).
  expect_error(R"({"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2147483648, "intermediate_size": 4,
                   "num_attention_heads": 2})",
               "num_hidden_layers = 2147483648 is implausibly large");
  expect_error(R"({"vocab_size": 4294967295, "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 4,
                   "num_attention_heads": 2})",
               "vocab_size = 4294967295 is implausibly large");
  expect_error("{" + base + R"(, "num_attention_heads": 2, "num_key_value_heads": 4})", "num_key_value_heads");
  // Each size plausible alone, their product not: 100 layers of a 131072-wide model with 524288-wide MLPs.
  expect_error(R"({"vocab_size": 1000, "hidden_size": 131072, "num_hidden_layers": 100,
                   "intermediate_size": 524288, "num_attention_heads": 1024})",
               "billion parameters");
  EXPECT_NO_THROW(llama::Config::from_json("{" + base + R"(, "num_attention_heads": 2})"));
  EXPECT_THROW(llama::Config::from_file("/nonexistent/config.json"), Error);
}

TEST(Llama, GraphNamesAndShapes) {
  llama::Config c = llama::Config::tiny();
  Graph g = llama::prefill_graph(c, {.batch = 2, .seq = 5});
  EXPECT_EQ(g.get("ids").shape(), (Shape{2, 5}));
  EXPECT_EQ(g.get("model.layers.1.self_attn.k_proj.weight").shape(), (Shape{32, 64}));
  EXPECT_EQ(g.get("model.layers.0.mlp.down_proj.weight").shape(), (Shape{64, 128}));
  EXPECT_FALSE(g.find("lm_head.weight").has_value());  // tied
  c.tie_word_embeddings = false;
  Graph u = llama::prefill_graph(c, {.batch = 1, .seq = 3});
  EXPECT_EQ(u.get("lm_head.weight").shape(), (Shape{512, 64}));
  Graph d = llama::decode_graph(c, {.batch = 1, .seq = 16});
  EXPECT_EQ(d.get(llama::cache_name(1, true)).shape(), (Shape{1, 2, 16, 16}));
  EXPECT_THROW(llama::prefill_graph(c, {.batch = 1, .seq = 1000}), Error);  // > max_position_embeddings
}

class LlamaVsTorch : public ::testing::TestWithParam<bool> {};  // param: untied lm_head

TEST_P(LlamaVsTorch, PrefillLogitsLossAndEveryGradient) {
  llama::Config c = llama::Config::tiny();
  c.tie_word_embeddings = !GetParam();
  const int64_t B = 2, S = 7;
  auto w = random_weights(c, 100);
  std::vector<int32_t> ids = random_ids(size_t(B * S), c.vocab_size, 5);
  // Row 1 is padded at its last two positions (HF convention: label -100 there).
  std::vector<int32_t> hf_labels = ids;
  hf_labels[size_t(S + S - 1)] = hf_labels[size_t(S + S - 2)] = -100;

  auto in = ref_inputs(c, w, /*f64=*/true, 0);
  in.push_back(StoredTensor::from_i32("ids", {B, S}, ids));
  in.push_back(StoredTensor::from_i32("labels", {B, S}, hf_labels));
  auto ref = test::run_torch("tests/ref/llama_ref.py", in);

  Graph g = llama::loss_graph(c, {.batch = B, .seq = S});
  Gradients grads = backward(g, Tensor(&g.ir(), *g.ir().find_output("loss")));
  for (auto& [name, t] : grads.params) g.output("grad." + name, t);
  ASSERT_EQ(grads.params.size(), llama::parameter_shapes(c).size());

  cpu::Executor ex(g.ir(), {.float64 = true});
  load(ex, w);
  ex.set_input("ids", ids);
  ex.set_input("labels", llama::next_token_labels(hf_labels, B, S));
  ex.run();
  EXPECT_LT(test::rel_l2(ex.output("logits").v, ref.at("logits").to_f64()), 1e-5);
  double loss = ex.output("loss").v[0], ref_loss = ref.at("loss").to_f64()[0];
  EXPECT_LT(std::fabs(loss - ref_loss) / std::fabs(ref_loss), 1e-6) << loss << " vs " << ref_loss;
  for (auto& [name, t] : grads.params) {
    double e = test::rel_l2(ex.output("grad." + name).v, ref.at("grad." + name).to_f64());
    EXPECT_LT(e, 1e-5) << name;
  }

  // f32 storage (each result rounded like a real backend) against PyTorch in f32.
  auto in32 = ref_inputs(c, w, /*f64=*/false, 0);
  in32.push_back(StoredTensor::from_i32("ids", {B, S}, ids));
  auto ref32 = test::run_torch("tests/ref/llama_ref.py", in32);
  Graph p = llama::prefill_graph(c, {.batch = B, .seq = S});
  cpu::Executor ex32(p.ir());
  load(ex32, w);
  ex32.set_input("ids", ids);
  ex32.run();
  EXPECT_LT(test::rel_l2(ex32.output("logits").v, ref32.at("logits").to_f64()), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, LlamaVsTorch, ::testing::Values(false, true));

TEST(Llama, KvCacheDecodeMatchesPrefillAndReference) {
  llama::Config c = llama::Config::tiny();
  auto w = random_weights(c, 300);
  const std::vector<int32_t> prompt = {17, 402, 3, 99, 250};
  const int64_t steps = 12, cache = 20;

  // Reference greedy tokens (full recomputation every step, f64).
  auto in = ref_inputs(c, w, true, steps);
  in.push_back(StoredTensor::from_i32("ids", {1, int64_t(prompt.size())}, prompt));
  in.push_back(StoredTensor::from_i32("prompt", {int64_t(prompt.size())}, prompt));
  auto ref = test::run_torch("tests/ref/llama_ref.py", in);
  std::vector<int32_t> want = ref.at("generated").to_i32();
  ASSERT_EQ(int64_t(want.size()), steps);

  // Decode with the KV cache on the executor, step by step; each step's logits must equal the prefill logits
  // of the same prefix at its last position (prefill-only greedy decoding, one graph per length).
  Graph d = llama::decode_graph(c, {.batch = 1, .seq = cache});
  cpu::Executor dec(d.ir(), {.float64 = true});
  load(dec, w);
  std::vector<int32_t> seq = prompt, got_cache, got_prefill;
  for (int64_t p = 0; p < int64_t(prompt.size()) + steps - 1; ++p) {
    dec.set_input("ids", std::vector<int32_t>{seq[size_t(p)]});
    dec.set_input("pos", std::vector<int32_t>{int32_t(p)});
    dec.run();
    if (p + 1 < int64_t(prompt.size())) continue;
    const std::vector<double>& lg = dec.output("logits").v;
    int32_t next = argmax_row(lg, 0, size_t(c.vocab_size));

    const int64_t len = p + 1;
    Graph pg = llama::prefill_graph(c, {.batch = 1, .seq = len});
    cpu::Executor pre(pg.ir(), {.float64 = true});
    load(pre, w);
    pre.set_input("ids", std::vector<int32_t>(seq.begin(), seq.begin() + len));
    pre.run();
    const std::vector<double>& pl = pre.output("logits").v;
    std::vector<double> last(pl.end() - c.vocab_size, pl.end());
    EXPECT_LT(test::rel_l2(lg, last), 1e-10) << "position " << p;
    got_prefill.push_back(argmax_row(last, 0, size_t(c.vocab_size)));
    got_cache.push_back(next);
    seq.push_back(next);
  }
  // Position prompt+steps-2 fed the 11th generated token and produced the 12th: `steps` tokens each way.
  EXPECT_EQ(got_prefill, want);
  EXPECT_EQ(got_cache, want);

  // The public path: a CPU session with load_weights + generate (f32), twice (the cache is reused unreset).
  Session s = compile(d, {.mode = Mode::Infer, .backend = Backend::Cpu});
  llama::load_weights(s, w);
  for (int round = 0; round < 2; ++round) {
    std::vector<int32_t> gen = llama::generate(s, c, prompt, {.max_new_tokens = steps});
    EXPECT_EQ(gen, want) << "round " << round;
  }
  EXPECT_THROW(llama::generate(s, c, prompt, {.max_new_tokens = cache}), Error);  // exceeds the cache
  // Sampling with top_k = 1 is greedy whatever the temperature.
  EXPECT_EQ(llama::generate(s, c, prompt, {.max_new_tokens = 4, .temperature = 0.8, .top_k = 1, .seed = 3}),
            std::vector<int32_t>(want.begin(), want.begin() + 4));
}

TEST(Llama, WeightFilesAreValidatedByName) {
  llama::Config c = llama::Config::tiny();
  c.num_hidden_layers = 1;
  auto w = random_weights(c, 7);
  std::string dir = test::make_temp_dir("llama_weights");
  auto tensors = [&](const std::map<std::string, std::vector<float>>& m) {
    std::vector<StoredTensor> ts;
    auto shapes = llama::parameter_shapes(c);
    for (auto& [name, v] : m) {
      Shape sh = {int64_t(v.size())};
      for (auto& [n2, s2] : shapes)
        if (n2 == name && numel(s2) == int64_t(v.size())) sh = s2;
      ts.push_back(StoredTensor::from_f32(name, sh, v, DType::BF16));
    }
    return ts;
  };
  // A model directory with bf16 weights: read back widened, equal to the bf16 rounding of the originals.
  write_safetensors(dir + "/model.safetensors", tensors(w));
  auto back = llama::read_weights(c, dir);
  ASSERT_EQ(back.size(), w.size());
  for (auto& [name, v] : w)
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(back[name][i], bf16_to_float(float_to_bf16(v[i]))) << name;

  auto expect_error = [&](std::map<std::string, std::vector<float>> m, const std::string& needle) {
    write_safetensors(dir + "/bad.safetensors", tensors(m));
    try {
      llama::read_weights(c, dir + "/bad.safetensors");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto missing = w;
  missing.erase("model.layers.0.mlp.up_proj.weight");
  expect_error(missing, "model.layers.0.mlp.up_proj.weight");
  auto unknown = w;
  unknown["model.layers.1.input_layernorm.weight"] = std::vector<float>(64, 1.f);
  expect_error(unknown, "model.layers.1.input_layernorm.weight");
  auto misshaped = w;
  misshaped["model.norm.weight"] = std::vector<float>(63, 1.f);
  expect_error(misshaped, "model.norm.weight");
  // A tied model tolerates a stored lm_head copy.
  auto with_head = w;
  with_head["lm_head.weight"] = w["model.embed_tokens.weight"];
  write_safetensors(dir + "/head.safetensors", tensors(with_head));
  EXPECT_EQ(llama::read_weights(c, dir + "/head.safetensors").count("lm_head.weight"), 0u);
  EXPECT_THROW(llama::read_weights(c, dir + "/empty_dir_does_not_exist"), Error);
  fs::remove_all(dir);
}
