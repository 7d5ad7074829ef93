// Llama-family decoder builder (include/mgn/llama.h): HF config parsing, prefill / loss / KV-cache decode
// graphs with HF tensor names, validated weight loading, and sampling on top of the decode graph.
#include "mgn/llama.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "hf_files.h"
#include "mgn/checkpoint.h"
#include "mgn/session.h"

namespace mgn::llama {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

}  // namespace

// ---- config

void Config::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) throw Error(origin + ": " + field + " must be positive, got " + str(v));
  };
  // Upper bounds far above any published Llama-family model (vocab 256 k, hidden 16 k, 126 layers, 128 heads,
  // 1 M positions), so a corrupt or hostile config is refused here instead of dying in an allocation.
  auto bounded = [&](int64_t v, const char* field, int64_t max) {
    positive(v, field);
    if (v > max) throw Error(origin + ": " + field + " = " + str(v) + " is implausibly large (at most " + str(max) + ")");
  };
  bounded(vocab_size, "vocab_size", int64_t(1) << 22);
  bounded(hidden_size, "hidden_size", int64_t(1) << 17);
  bounded(num_hidden_layers, "num_hidden_layers", 4096);
  bounded(num_attention_heads, "num_attention_heads", 4096);
  bounded(intermediate_size, "intermediate_size", int64_t(1) << 19);
  bounded(max_position_embeddings, "max_position_embeddings", int64_t(1) << 24);
  if (num_key_value_heads < 0 || num_key_value_heads > num_attention_heads)
    throw Error(origin + ": num_key_value_heads must be from 1 to num_attention_heads (" + str(num_attention_heads) +
                "), got " + str(num_key_value_heads));
  if (head_dim > 4096) throw Error(origin + ": head_dim = " + str(head_dim) + " is implausibly large (at most 4096)");
  if (num_attention_heads % kv_heads() != 0)
    throw Error(origin + ": num_attention_heads (" + str(num_attention_heads) +
                ") must be a multiple of num_key_value_heads (" + str(kv_heads()) + ")");
  if (head_dim < 0) throw Error(origin + ": head_dim must be positive");
  if (!head_dim && hidden_size % num_attention_heads != 0)
    throw Error(origin + ": hidden_size (" + str(hidden_size) + ") is not divisible by num_attention_heads (" +
                str(num_attention_heads) + ") and no head_dim is given");
  if (head_size() % 2) throw Error(origin + ": head_dim must be even for rotary embedding, got " + str(head_size()));
  if (!(rms_norm_eps > 0)) throw Error(origin + ": rms_norm_eps must be positive");
  if (!(rope_theta > 0)) throw Error(origin + ": rope_theta must be positive");
  // The memory the parameters imply (f32), in double so that no product overflows: each field may be
  // plausible alone and their product still absurd.
  const double h = double(hidden_size), hd = double(head_size()), layer =
      h * hd * double(num_attention_heads) * 2 + h * hd * double(kv_heads()) * 2 + 3 * h * double(intermediate_size) + 2 * h;
  const double params = double(vocab_size) * h * (tie_word_embeddings ? 1 : 2) + double(num_hidden_layers) * layer + h;
  constexpr double kMaxParams = double(int64_t(1) << 40);  // 4 TiB of f32 parameters
  if (params > kMaxParams)
    throw Error(origin + ": the sizes imply " + std::to_string(params / 1e9) + " billion parameters (" +
                std::to_string(params * 4 / double(1ull << 30)) + " GiB as f32), implausibly many (at most 2^40)");
}

Config Config::from_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(origin + ": expected a JSON object");
  auto get_int = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) throw Error(origin + ": missing required field \"" + key + "\"");
      return fallback;
    }
    const auto& v = j[key];
    if (!v.is_number_integer()) throw Error(origin + ": field \"" + key + "\" must be an integer, got " + v.dump());
    return v.get<int64_t>();
  };
  auto get_float = [&](const char* key, double fallback) -> double {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number()) throw Error(origin + ": field \"" + key + "\" must be a number, got " + j[key].dump());
    return j[key].get<double>();
  };
  Config c;
  c.vocab_size = get_int("vocab_size", true, 0);
  c.hidden_size = get_int("hidden_size", true, 0);
  c.num_hidden_layers = get_int("num_hidden_layers", true, 0);
  c.num_attention_heads = get_int("num_attention_heads", true, 0);
  c.intermediate_size = get_int("intermediate_size", true, 0);
  c.num_key_value_heads = get_int("num_key_value_heads", false, c.num_attention_heads);
  c.head_dim = get_int("head_dim", false, 0);
  c.max_position_embeddings = get_int("max_position_embeddings", false, 2048);
  c.rms_norm_eps = get_float("rms_norm_eps", 1e-6);
  c.rope_theta = get_float("rope_theta", 10000.0);
  c.initializer_range = get_float("initializer_range", 0.02);
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean())
      throw Error(origin + ": field \"tie_word_embeddings\" must be true or false");
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // Features this builder does not implement: refuse them instead of computing a different model.
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw Error(origin + ": rope_scaling " + j["rope_scaling"].dump() + " is not supported");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>())
      throw Error(origin + ": " + key + " = true is not supported (Llama projections have no bias)");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw Error(origin + ": hidden_act " + j["hidden_act"].dump() + " is not supported (expected \"silu\")");
  c.validate(origin);
  return c;
}

Config Config::from_file(const std::string& path) { return from_json(models::read_text_file(path, "llama config"), path); }

Config Config::smollm2_135m() {
  Config c;
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.num_hidden_layers = 30;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.intermediate_size = 1536;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 8192;
  c.initializer_range = 0.041666666666666664;  // the published config's value (1 / sqrt(576))
  return c;
}

Config Config::tiny() {
  Config c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  c.max_position_embeddings = 256;
  return c;
}

// ---- graphs

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& c) {
  c.validate();
  const int64_t H = c.hidden_size, D = c.head_size(), F = c.intermediate_size;
  const int64_t q = c.num_attention_heads * D, kv = c.kv_heads() * D;
  std::vector<std::pair<std::string, Shape>> r;
  r.push_back({"model.embed_tokens.weight", {c.vocab_size, H}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = "model.layers." + str(i) + ".";
    r.push_back({p + "input_layernorm.weight", {H}});
    r.push_back({p + "self_attn.q_proj.weight", {q, H}});
    r.push_back({p + "self_attn.k_proj.weight", {kv, H}});
    r.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    r.push_back({p + "self_attn.o_proj.weight", {H, q}});
    r.push_back({p + "post_attention_layernorm.weight", {H}});
    r.push_back({p + "mlp.gate_proj.weight", {F, H}});
    r.push_back({p + "mlp.up_proj.weight", {F, H}});
    r.push_back({p + "mlp.down_proj.weight", {H, F}});
  }
  r.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) r.push_back({"lm_head.weight", {c.vocab_size, H}});
  return r;
}

std::string cache_name(int64_t layer, bool value) { return "cache." + str(layer) + (value ? ".v" : ".k"); }

namespace {

// Creates every parameter up front (graph order = parameter_shapes order) so that names and shapes have one
// source of truth.
struct Weights {
  std::map<std::string, Tensor> t;
  Tensor operator()(const std::string& name) const { return t.at(name); }
};

Weights make_parameters(Graph& g, const Config& c, uint64_t seed) {
  Weights w;
  for (auto& [name, shape] : parameter_shapes(c)) {
    bool norm = shape.size() == 1;
    Init init = norm ? Init::ones() : Init::normal(0.0, c.initializer_range, seed);
    w.t[name] = g.parameter(name, shape, init);
  }
  return w;
}

// How one layer's attention sees its keys and values: prefill attends causally over the sequence itself;
// decode writes the new k/v into the cache and attends over the whole cache under a position mask.
struct AttentionContext {
  Tensor cos, sin;                // [S, D/2]
  std::optional<Tensor> select;   // decode: bool [1, 1, Smax, 1], true at row pos
  std::optional<Tensor> mask;     // decode: additive [1, 1, 1, Smax], -inf after pos
  int64_t cache_len = 0;
  int64_t batch = 1;
};

Tensor attention_block(Graph& g, const Config& c, const Weights& w, int64_t layer, Tensor x,
                       const AttentionContext& ctx) {
  const int64_t b = x.dim(0), s = x.dim(1), h = c.num_attention_heads, kvh = c.kv_heads(), d = c.head_size();
  const std::string p = "model.layers." + str(layer) + ".self_attn.";
  auto heads_of = [&](Tensor t, int64_t n) { return transpose(reshape(t, {b, s, n, d}), 1, 2); };  // [B,n,S,D]
  Tensor q = rope(heads_of(linear(x, w(p + "q_proj.weight")), h), ctx.cos, ctx.sin);
  Tensor k = rope(heads_of(linear(x, w(p + "k_proj.weight")), kvh), ctx.cos, ctx.sin);
  Tensor v = heads_of(linear(x, w(p + "v_proj.weight")), kvh);
  Tensor o;
  if (!ctx.select) {
    o = attention(q, k, v, {.causal = true});
  } else {
    Tensor kc = g.state(cache_name(layer, false), {ctx.batch, kvh, ctx.cache_len, d});
    Tensor vc = g.state(cache_name(layer, true), {ctx.batch, kvh, ctx.cache_len, d});
    // The new row replaces row pos; reads in this step see the written cache, the assign commits it.
    Tensor k_all = where(*ctx.select, k, kc);
    Tensor v_all = where(*ctx.select, v, vc);
    assign(kc, k_all);
    assign(vc, v_all);
    o = attention(q, k_all, v_all, {.mask = ctx.mask});
  }
  return linear(reshape(transpose(o, 1, 2), {b, s, h * d}), w(p + "o_proj.weight"));
}

// Embedding -> layers -> final norm -> lm head: logits [B, S, V].
Tensor decoder(Graph& g, const Config& c, const Weights& w, Tensor ids, const AttentionContext& ctx) {
  Tensor x = embedding(w("model.embed_tokens.weight"), ids);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + str(i) + ".";
    Tensor a = rms_norm(x, w(p + "input_layernorm.weight"), c.rms_norm_eps);
    x = x + attention_block(g, c, w, i, a, ctx);
    Tensor m = rms_norm(x, w(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    Tensor gate = silu(linear(m, w(p + "mlp.gate_proj.weight")));
    Tensor up = linear(m, w(p + "mlp.up_proj.weight"));
    x = x + linear(gate * up, w(p + "mlp.down_proj.weight"));
  }
  x = rms_norm(x, w("model.norm.weight"), c.rms_norm_eps);
  return linear(x, w(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"));
}

void check_options(const Config& c, const GraphOptions& opt, const char* who) {
  c.validate();
  if (opt.batch <= 0 || opt.seq <= 0)
    throw Error(std::string(who) + ": batch and seq must be positive, got " + str(opt.batch) + " x " + str(opt.seq));
  if (opt.seq > c.max_position_embeddings)
    throw Error(std::string(who) + ": seq " + str(opt.seq) + " exceeds max_position_embeddings " +
                str(c.max_position_embeddings));
}

Tensor prefill_logits(Graph& g, const Config& c, const GraphOptions& opt, Tensor ids) {
  Weights w = make_parameters(g, c, opt.seed);
  std::vector<int32_t> pos(size_t(opt.seq));
  for (int64_t i = 0; i < opt.seq; ++i) pos[size_t(i)] = int32_t(i);
  AttentionContext ctx;
  std::tie(ctx.cos, ctx.sin) = rope_tables(g.constant_i32({opt.seq}, pos), c.head_size(), c.rope_theta);
  return decoder(g, c, w, ids, ctx);
}

}  // namespace

Graph prefill_graph(const Config& c, const GraphOptions& opt) {
  check_options(c, opt, "llama::prefill_graph");
  Graph g;
  Tensor ids = g.input("ids", {opt.batch, opt.seq}, DType::I32);
  g.output("logits", prefill_logits(g, c, opt, ids));
  return g;
}

Graph loss_graph(const Config& c, const GraphOptions& opt) {
  check_options(c, opt, "llama::loss_graph");
  Graph g;
  Tensor ids = g.input("ids", {opt.batch, opt.seq}, DType::I32);
  Tensor labels = g.input("labels", {opt.batch, opt.seq}, DType::I32);
  Tensor logits = prefill_logits(g, c, opt, ids);
  g.output("logits", logits);
  g.output("loss", cross_entropy(logits, labels, {.ignore_index = -100}));
  return g;
}

std::vector<int32_t> next_token_labels(const std::vector<int32_t>& ids, int64_t batch, int64_t seq) {
  if (int64_t(ids.size()) != batch * seq)
    throw Error("llama::next_token_labels: got " + str(int64_t(ids.size())) + " ids for " + str(batch) + " x " +
                str(seq));
  std::vector<int32_t> out(ids.size(), -100);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t + 1 < seq; ++t) out[size_t(b * seq + t)] = ids[size_t(b * seq + t + 1)];
  return out;
}

Graph decode_graph(const Config& c, const GraphOptions& opt) {
  check_options(c, opt, "llama::decode_graph");
  Graph g;
  Tensor ids = g.input("ids", {opt.batch, 1}, DType::I32);
  Tensor pos = g.input("pos", {1}, DType::I32);
  Weights w = make_parameters(g, c, opt.seed);
  AttentionContext ctx;
  ctx.cache_len = opt.seq;
  ctx.batch = opt.batch;
  std::tie(ctx.cos, ctx.sin) = rope_tables(pos, c.head_size(), c.rope_theta);
  std::vector<int32_t> iota(size_t(opt.seq));
  for (int64_t i = 0; i < opt.seq; ++i) iota[size_t(i)] = int32_t(i);
  ctx.select = equal(g.constant_i32({1, 1, opt.seq, 1}, iota), pos);
  Tensor later = greater(g.constant_i32({1, 1, 1, opt.seq}, iota), pos);
  ctx.mask = where(later, g.scalar(-std::numeric_limits<double>::infinity()), g.scalar(0.0));
  g.output("logits", decoder(g, c, w, ids, ctx));
  return g;
}

// ---- weights

std::map<std::string, std::vector<float>> read_weights(const Config& c, const std::string& path) {
  const std::string file = models::weights_file(path);
  TensorSet ts = read_tensor_set(file);
  auto shapes = parameter_shapes(c);
  std::set<std::string> expected;
  for (auto& [name, shape] : shapes) expected.insert(name);
  for (auto& [name, t] : ts.tensors) {
    if (expected.count(name)) continue;
    if (c.tie_word_embeddings && name == "lm_head.weight") continue;
    if (name.size() > 9 && name.ends_with(".inv_freq")) continue;
    throw Error("'" + file + "': unknown tensor '" + name + "' for this llama config (" +
                str(c.num_hidden_layers) + " layers, " + (c.tie_word_embeddings ? "tied" : "untied") +
                " embeddings)");
  }
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, shape] : shapes) out[name] = ts.values_f32(name, shape);  // names the missing/mis-shaped tensor
  return out;
}

void load_weights(Session& s, const std::map<std::string, std::vector<float>>& weights) {
  for (auto& [name, values] : weights) s.write_parameter(name, values);
}

// ---- sampling

namespace {

int32_t pick(const std::vector<float>& logits, const SampleOptions& opt, std::mt19937_64& rng) {
  const size_t v = logits.size();
  if (opt.temperature <= 0) {
    size_t best = 0;
    for (size_t i = 1; i < v; ++i)
      if (logits[i] > logits[best]) best = i;
    return int32_t(best);
  }
  std::vector<size_t> order(v);
  for (size_t i = 0; i < v; ++i) order[i] = i;
  size_t keep = opt.top_k > 0 ? std::min(v, size_t(opt.top_k)) : v;
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(keep), order.end(),
                    [&](size_t a, size_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> p(keep);
  double top = logits[order[0]], total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((double(logits[order[i]]) - top) / opt.temperature);
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (size_t i = 0; i < keep; ++i) {
    if (u < p[i]) return int32_t(order[i]);
    u -= p[i];
  }
  return int32_t(order[keep - 1]);
}

}  // namespace

std::vector<int32_t> generate(Session& s, const Config& c, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, void (*on_token)(int32_t, void*), void* user) {
  if (prompt.empty()) throw Error("llama::generate: the prompt has no tokens");
  Shape cache = s.shape_of(cache_name(0, false));
  const int64_t cache_len = cache[2];
  if (cache[0] != 1) throw Error("llama::generate: needs a decode graph of batch 1");
  if (opt.max_new_tokens <= 0) return {};
  // The last emitted token is never fed back, so positions 0 .. P + N - 2 are used.
  if (int64_t(prompt.size()) + opt.max_new_tokens - 1 > cache_len)
    throw Error("llama::generate: prompt (" + str(int64_t(prompt.size())) + ") + max_new_tokens (" +
                str(opt.max_new_tokens) + ") exceeds the cache length " + str(cache_len));
  for (int32_t t : prompt)
    if (t < 0 || t >= c.vocab_size) throw Error("llama::generate: prompt token " + std::to_string(t) + " is out of range");
  // Rows after pos are masked out, so a cache left over from an earlier call needs no reset.
  std::mt19937_64 rng(opt.seed);
  std::vector<int32_t> out;
  int32_t next = 0;
  for (int64_t p = 0; p < int64_t(prompt.size()) + opt.max_new_tokens - 1; ++p) {
    int32_t tok = p < int64_t(prompt.size()) ? prompt[size_t(p)] : next;
    s.set_input("ids", std::vector<int32_t>{tok});
    s.set_input("pos", std::vector<int32_t>{int32_t(p)});
    s.run();
    if (p + 1 < int64_t(prompt.size())) continue;
    next = pick(s.read("logits"), opt, rng);
    out.push_back(next);
    if (on_token) on_token(next, user);
    if (next == opt.eos_id) break;
  }
  return out;
}

}  // namespace mgn::llama
