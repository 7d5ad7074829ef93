// DINOv3 ViT builder (include/mgn/dinov3.h): HF config parsing, the model graph with HF tensor names, axial
// RoPE tables, its two initializations and validated weight loading.
#include "mgn/dinov3.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>

#include "hf_files.h"
#include "mgn/checkpoint.h"
#include "mgn/session.h"

namespace mgn::dinov3 {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

// Sizes beyond these are not a DINOv3 model but a damaged or hostile file: refuse them before any
// allocation is sized from them.
constexpr int64_t kMaxWidth = 1 << 16, kMaxLayers = 1024, kMaxPatch = 1024, kMaxImage = 1 << 16,
                  kMaxRegisters = 1024;

}  // namespace

// ---- config

void Config::validate(const std::string& origin) const {
  auto in_range = [&](int64_t v, int64_t hi, const char* field) {
    if (v <= 0 || v > hi)
      throw Error(origin + ": " + field + " must be in 1.." + str(hi) + ", got " + str(v));
  };
  in_range(hidden_size, kMaxWidth, "hidden_size");
  in_range(num_hidden_layers, kMaxLayers, "num_hidden_layers");
  in_range(num_attention_heads, kMaxWidth, "num_attention_heads");
  in_range(intermediate_size, 16 * kMaxWidth, "intermediate_size");
  in_range(patch_size, kMaxPatch, "patch_size");
  in_range(num_channels, 64, "num_channels");
  in_range(image_size, kMaxImage, "image_size");
  if (num_register_tokens < 0 || num_register_tokens > kMaxRegisters)
    throw Error(origin + ": num_register_tokens must be in 0.." + str(kMaxRegisters) + ", got " +
                str(num_register_tokens));
  if (hidden_size % num_attention_heads != 0)
    throw Error(origin + ": hidden_size (" + str(hidden_size) +
                ") is not divisible by num_attention_heads (" + str(num_attention_heads) + ")");
  if (head_dim() % 4 != 0)
    throw Error(origin + ": the head dim (" + str(head_dim()) + ") must be divisible by 4 for axial RoPE");
  if (!(layer_norm_eps > 0) || !std::isfinite(layer_norm_eps))
    throw Error(origin + ": layer_norm_eps must be positive");
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) throw Error(origin + ": rope_theta must be positive");
  if (!std::isfinite(layerscale_value)) throw Error(origin + ": layerscale_value must be finite");
}

Config Config::from_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(origin + ": expected a JSON object");
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  auto get_int = [&](const char* key, int64_t fallback) -> int64_t {
    if (!present(key)) return fallback;
    const auto& v = j[key];
    if (!v.is_number_integer())
      throw Error(origin + ": field \"" + key + "\" must be an integer, got " + v.dump());
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      throw Error(origin + ": field \"" + key + "\" is out of range: " + v.dump());
    return v.get<int64_t>();
  };
  auto get_num = [&](const char* key, double fallback) -> double {
    if (!present(key)) return fallback;
    if (!j[key].is_number())
      throw Error(origin + ": field \"" + key + "\" must be a number, got " + j[key].dump());
    return j[key].get<double>();
  };
  auto get_bool = [&](const char* key, bool fallback) -> bool {
    if (!present(key)) return fallback;
    if (!j[key].is_boolean())
      throw Error(origin + ": field \"" + key + "\" must be true or false, got " + j[key].dump());
    return j[key].get<bool>();
  };
  Config c;
  c.hidden_size = get_int("hidden_size", 384);
  c.num_hidden_layers = get_int("num_hidden_layers", 12);
  c.num_attention_heads = get_int("num_attention_heads", 6);
  c.intermediate_size = get_int("intermediate_size", 1536);
  c.patch_size = get_int("patch_size", 16);
  c.num_channels = get_int("num_channels", 3);
  c.image_size = get_int("image_size", 224);
  c.num_register_tokens = get_int("num_register_tokens", 0);
  c.rope_theta = get_num("rope_theta", 100.0);
  c.layer_norm_eps = get_num("layer_norm_eps", 1e-5);
  c.layerscale_value = get_num("layerscale_value", 1.0);
  c.query_bias = get_bool("query_bias", true);
  c.key_bias = get_bool("key_bias", false);
  c.value_bias = get_bool("value_bias", true);
  c.proj_bias = get_bool("proj_bias", true);
  c.mlp_bias = get_bool("mlp_bias", true);
  if (present("hidden_act") && j["hidden_act"] != "gelu")
    throw Error(origin + ": hidden_act " + j["hidden_act"].dump() +
                " is not supported (DINOv3 ViT-S/B/L use \"gelu\", erf-exact)");
  if (get_bool("use_gated_mlp", false))
    throw Error(origin + ": use_gated_mlp (the SwiGLU MLP of the larger DINOv3 models) is not supported");
  c.validate(origin);
  return c;
}

Config Config::from_file(const std::string& path) { return from_json(models::read_text_file(path, "dinov3 config"), path); }

Config Config::vits16() {
  return {};
}

// ---- parameters

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size, p = c.patch_size;
  std::vector<std::pair<std::string, Shape>> s = {{"embeddings.cls_token", {1, 1, d}}};
  if (c.num_register_tokens > 0) s.push_back({"embeddings.register_tokens", {1, c.num_register_tokens, d}});
  s.push_back({"embeddings.mask_token", {1, 1, d}});
  s.push_back({"embeddings.patch_embeddings.weight", {d, c.num_channels, p, p}});
  s.push_back({"embeddings.patch_embeddings.bias", {d}});
  const std::pair<const char*, bool> projs[] = {
      {"q_proj", c.query_bias}, {"k_proj", c.key_bias}, {"v_proj", c.value_bias}, {"o_proj", c.proj_bias}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string l = "layer." + str(i) + ".";
    s.push_back({l + "norm1.weight", {d}});
    s.push_back({l + "norm1.bias", {d}});
    for (auto& [proj, bias] : projs) {
      s.push_back({l + "attention." + proj + ".weight", {d, d}});
      if (bias) s.push_back({l + "attention." + proj + ".bias", {d}});
    }
    s.push_back({l + "layer_scale1.lambda1", {d}});
    s.push_back({l + "norm2.weight", {d}});
    s.push_back({l + "norm2.bias", {d}});
    s.push_back({l + "mlp.up_proj.weight", {f, d}});
    if (c.mlp_bias) s.push_back({l + "mlp.up_proj.bias", {f}});
    s.push_back({l + "mlp.down_proj.weight", {d, f}});
    if (c.mlp_bias) s.push_back({l + "mlp.down_proj.bias", {d}});
    s.push_back({l + "layer_scale2.lambda1", {d}});
  }
  s.push_back({"norm.weight", {d}});
  s.push_back({"norm.bias", {d}});
  return s;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(c)) n += numel(shape);
  return n;
}

std::pair<std::vector<float>, std::vector<float>> rope_tables(const Config& c, int64_t gh, int64_t gw) {
  const int64_t hd = c.head_dim(), q = hd / 4, half = hd / 2, prefix = c.prefix_tokens();
  const int64_t S = prefix + gh * gw;
  std::vector<float> cs(size_t(S * half), 1.0f), sn(size_t(S * half), 0.0f);
  // As transformers computes them, all in f32: inv_freq = 1 / θ^(arange(0, 1, 4/hd)); coords = 2·((i + ½)/n)
  // - 1; angle = (2π·coord)·inv_freq.
  std::vector<float> inv(static_cast<size_t>(q));
  for (int64_t k = 0; k < q; ++k) {
    const float e = float(k) * (4.0f / float(hd));
    inv[size_t(k)] = 1.0f / std::pow(float(c.rope_theta), e);
  }
  auto coord = [](int64_t i, int64_t n) { return 2.0f * ((float(i) + 0.5f) / float(n)) - 1.0f; };
  const float two_pi = float(2.0 * std::numbers::pi);
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t col = 0; col < gw; ++col) {
      const int64_t row = prefix + r * gw + col;
      const float yx[2] = {two_pi * coord(r, gh), two_pi * coord(col, gw)};
      for (int64_t a = 0; a < 2; ++a)
        for (int64_t k = 0; k < q; ++k) {
          const float angle = yx[a] * inv[size_t(k)];
          cs[size_t(row * half + a * q + k)] = std::cos(angle);
          sn[size_t(row * half + a * q + k)] = std::sin(angle);
        }
    }
  return {cs, sn};
}

namespace {

bool is_norm(const std::string& name) {
  return name.find("norm1.") != std::string::npos || name.find("norm2.") != std::string::npos ||
         name.starts_with("norm.");
}

mgn::Init init_of(const Config& c, const std::string& name, const Shape& shape, const GraphOptions& opt) {
  const bool norm = is_norm(name), weight = name.ends_with(".weight");
  const bool lambda = name.ends_with(".lambda1");
  if (opt.init == Init::PaperSine) return mgn::Init::paper_sine(0.02, (norm && weight) || lambda ? 1.0 : 0.0);
  if (lambda) return mgn::Init::constant(c.layerscale_value);
  if (norm) return weight ? mgn::Init::ones() : mgn::Init::zeros();
  if (name == "embeddings.mask_token" || name.ends_with(".bias")) return mgn::Init::zeros();
  return mgn::Init::normal(0.0, 0.02, opt.seed);
}

}  // namespace

Graph vit_graph(const Config& c, const GraphOptions& opt, Mode mode) {
  c.validate();
  const int64_t H = opt.height ? opt.height : c.image_size, W = opt.width ? opt.width : c.image_size;
  const int64_t p = c.patch_size;
  if (opt.batch <= 0) throw Error("dinov3::vit_graph: batch must be positive, got " + str(opt.batch));
  if (H <= 0 || W <= 0 || H % p != 0 || W % p != 0 || H > kMaxImage || W > kMaxImage)
    throw Error("dinov3::vit_graph: the image size " + str(H) + "x" + str(W) +
                " is not a positive multiple of the patch size " + str(p));
  if (opt.layers < 0 || opt.layers > c.num_hidden_layers)
    throw Error("dinov3::vit_graph: layers must be in 0.." + str(c.num_hidden_layers) + ", got " +
                str(opt.layers));
  const int64_t L = opt.layers ? opt.layers : c.num_hidden_layers;
  const int64_t B = opt.batch, D = c.hidden_size, NH = c.num_attention_heads, hd = c.head_dim();
  const int64_t gh = H / p, gw = W / p, N = gh * gw, S = c.prefix_tokens() + N;

  Graph g;
  std::map<std::string, Tensor> w;
  for (auto& [name, shape] : parameter_shapes(c)) {
    if (name.starts_with("layer.") && std::stoll(name.substr(6)) >= L) continue;
    if (name == "embeddings.mask_token")  // only used for masked-image training: held, not trained
      w[name] = g.state(name, shape, init_of(c, name, shape, opt));
    else
      w[name] = g.parameter(name, shape, init_of(c, name, shape, opt));
  }
  Tensor px = g.input("pixel_values", {B, c.num_channels, H, W});
  Tensor patches = conv2d(px, w["embeddings.patch_embeddings.weight"], {.stride = {p, p}},
                          w["embeddings.patch_embeddings.bias"]);  // [B, D, gh, gw]
  patches = transpose(reshape(patches, {B, D, N}), 1, 2);          // [B, N, D]
  std::vector<Tensor> tokens = {expand(w["embeddings.cls_token"], {B, 1, D})};
  if (c.num_register_tokens > 0)
    tokens.push_back(expand(w["embeddings.register_tokens"], {B, c.num_register_tokens, D}));
  tokens.push_back(patches);
  Tensor x = concat(tokens, 1);  // [B, S, D]

  auto [cs, sn] = rope_tables(c, gh, gw);
  Tensor rc = g.constant({S, hd / 2}, cs), rs = g.constant({S, hd / 2}, sn);
  auto heads = [&](Tensor t) { return transpose(reshape(t, {B, S, NH, hd}), 1, 2); };  // [B, NH, S, hd]
  auto opt_bias = [&](const std::string& n) -> std::optional<Tensor> {
    auto it = w.find(n);
    if (it == w.end()) return std::nullopt;
    return it->second;
  };
  const double eps = c.layer_norm_eps;
  for (int64_t i = 0; i < L; ++i) {
    const std::string l = "layer." + str(i) + ".";
    auto q_ = [&](const std::string& n) { return w.at(l + n); };
    Tensor h = layer_norm(x, q_("norm1.weight"), q_("norm1.bias"), eps);
    Tensor q =
        rope(heads(linear(h, q_("attention.q_proj.weight"), opt_bias(l + "attention.q_proj.bias"))), rc, rs);
    Tensor k =
        rope(heads(linear(h, q_("attention.k_proj.weight"), opt_bias(l + "attention.k_proj.bias"))), rc, rs);
    Tensor v = heads(linear(h, q_("attention.v_proj.weight"), opt_bias(l + "attention.v_proj.bias")));
    Tensor o = attention(q, k, v, {.scale = 1.0 / std::sqrt(double(hd))});
    o = reshape(transpose(o, 1, 2), {B, S, D});
    x = x + linear(o, q_("attention.o_proj.weight"), opt_bias(l + "attention.o_proj.bias")) *
                q_("layer_scale1.lambda1");
    h = layer_norm(x, q_("norm2.weight"), q_("norm2.bias"), eps);
    h = gelu(linear(h, q_("mlp.up_proj.weight"), opt_bias(l + "mlp.up_proj.bias")));
    x = x + linear(h, q_("mlp.down_proj.weight"), opt_bias(l + "mlp.down_proj.bias")) *
                q_("layer_scale2.lambda1");
  }
  if (opt.final_norm) x = layer_norm(x, w["norm.weight"], w["norm.bias"], eps);
  g.output("last_hidden_state", x);
  g.output("pooler_output", reshape(slice(x, 1, 0, 1), {B, D}));
  if (mode == Mode::Train) g.output("loss", mean(square(x)));
  return g;
}

// ---- weights

std::map<std::string, std::vector<float>> read_weights(const Config& c, const std::string& path,
                                                       int64_t layers) {
  if (layers < 0 || layers > c.num_hidden_layers)
    throw Error("dinov3::read_weights: layers must be in 0.." + str(c.num_hidden_layers) + ", got " +
                str(layers));
  const std::string file = models::weights_file(path);
  TensorSet ts = read_tensor_set(file);
  std::string prefix;
  bool found = false;
  for (const char* p : {"", "dinov3_vit.", "model."})
    if (ts.find(std::string(p) + "embeddings.patch_embeddings.weight")) {
      prefix = p;
      found = true;
      break;
    }
  if (!found)
    throw Error("'" + file +
                "' holds no DINOv3 ViT: no tensor embeddings.patch_embeddings.weight (nor under dinov3_vit. "
                "or model.)");
  const int64_t L = layers ? layers : c.num_hidden_layers;
  auto layer_of = [](const std::string& local) -> int64_t {
    if (!local.starts_with("layer.")) return -1;
    try {
      return std::stoll(local.substr(6));
    } catch (const std::exception&) {
      return -1;
    }
  };
  std::map<std::string, std::vector<float>> out;
  std::set<std::string> known;
  for (auto& [name, shape] : parameter_shapes(c)) {
    known.insert(name);
    if (layer_of(name) >= L) continue;
    const std::string stored = prefix + name;
    if (!ts.find(stored)) {
      if (name == "embeddings.mask_token") continue;  // unused at inference; some exports drop it
      throw Error("'" + file + "' has no tensor '" + stored + "' (the model of this config: " +
                  str(c.num_hidden_layers) + " layers, hidden_size " + str(c.hidden_size) + ")");
    }
    out[name] = ts.values_f32(stored, shape);  // names the mis-shaped tensor
  }
  // A tensor under the model's prefix that the config does not know means config and weights disagree.
  for (auto& [name, t] : ts.tensors) {
    if (!name.starts_with(prefix)) continue;
    const std::string local = name.substr(prefix.size());
    if (!(local.starts_with("layer.") || local.starts_with("embeddings.") || local.starts_with("norm.")))
      continue;
    if (!known.count(local))
      throw Error("'" + file + "': unknown DINOv3 tensor '" + name + "' for this config (" +
                  str(c.num_hidden_layers) + " layers, " + str(c.num_register_tokens) + " register tokens)");
  }
  return out;
}

void load_weights(Session& s, const std::map<std::string, std::vector<float>>& weights) {
  std::vector<std::string> names = s.state_names();
  std::set<std::string> held(names.begin(), names.end());
  for (auto& [name, values] : weights)
    if (held.count(name)) s.write_parameter(name, values);
}

}  // namespace mgn::dinov3
