// Whisper encoder builder (include/mgn/whisper.h): HF config parsing, the encoder graph with HF tensor names,
// its two initializations and validated weight loading.
#include "mgn/whisper.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mgn/audio.h"
#include "hf_files.h"
#include "mgn/checkpoint.h"
#include "mgn/nn.h"
#include "mgn/session.h"

namespace mgn::whisper {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Sizes beyond these are not a Whisper model but a damaged or hostile file: refuse them before any
// allocation is sized from them.
constexpr int64_t kMaxWidth = 1 << 16, kMaxLayers = 1024, kMaxPositions = 1 << 20, kMaxMels = 4096;

}  // namespace

// ---- config

void Config::validate(const std::string& origin) const {
  auto in_range = [&](int64_t v, int64_t hi, const char* field) {
    if (v <= 0 || v > hi)
      throw Error(origin + ": " + field + " must be in 1.." + str(hi) + ", got " + str(v));
  };
  in_range(d_model, kMaxWidth, "d_model");
  in_range(encoder_layers, kMaxLayers, "encoder_layers");
  in_range(encoder_attention_heads, kMaxWidth, "encoder_attention_heads");
  in_range(encoder_ffn_dim, 4 * kMaxWidth, "encoder_ffn_dim");
  in_range(num_mel_bins, kMaxMels, "num_mel_bins");
  in_range(max_source_positions, kMaxPositions, "max_source_positions");
  if (d_model % encoder_attention_heads != 0)
    throw Error(origin + ": d_model (" + str(d_model) + ") is not divisible by encoder_attention_heads (" +
                str(encoder_attention_heads) + ")");
  if (d_model % 2 != 0 || d_model < 4)
    throw Error(origin + ": d_model must be even and at least 4 for the sinusoidal positions, got " + str(d_model));
  if (!(layer_norm_eps > 0)) throw Error(origin + ": layer_norm_eps must be positive");
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
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      throw Error(origin + ": field \"" + key + "\" is out of range: " + v.dump());
    return v.get<int64_t>();
  };
  Config c;
  c.d_model = get_int("d_model", true, 0);
  c.encoder_layers = get_int("encoder_layers", true, 0);
  c.encoder_attention_heads = get_int("encoder_attention_heads", true, 0);
  c.encoder_ffn_dim = get_int("encoder_ffn_dim", true, 0);
  c.num_mel_bins = get_int("num_mel_bins", false, 80);
  c.max_source_positions = get_int("max_source_positions", false, 1500);
  if (j.contains("activation_function") && j["activation_function"] != "gelu")
    throw Error(origin + ": activation_function " + j["activation_function"].dump() +
                " is not supported (Whisper's encoder uses \"gelu\", erf-exact)");
  c.validate(origin);
  return c;
}

Config Config::from_file(const std::string& path) { return from_json(models::read_text_file(path, "whisper config"), path); }

Config Config::tiny() { return {.d_model = 384, .encoder_layers = 4, .encoder_attention_heads = 6, .encoder_ffn_dim = 1536}; }
Config Config::base() { return {.d_model = 512, .encoder_layers = 6, .encoder_attention_heads = 8, .encoder_ffn_dim = 2048}; }
Config Config::small() {
  return {.d_model = 768, .encoder_layers = 12, .encoder_attention_heads = 12, .encoder_ffn_dim = 3072};
}

// ---- parameters

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& c) {
  const int64_t d = c.d_model, f = c.encoder_ffn_dim;
  std::vector<std::pair<std::string, Shape>> p = {{"conv1.weight", {d, c.num_mel_bins, 3}},
                                                  {"conv1.bias", {d}},
                                                  {"conv2.weight", {d, d, 3}},
                                                  {"conv2.bias", {d}}};
  for (int64_t i = 0; i < c.encoder_layers; ++i) {
    const std::string l = "layers." + str(i) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      p.push_back({l + "self_attn." + proj + ".weight", {d, d}});
      if (std::string(proj) != "k_proj") p.push_back({l + "self_attn." + proj + ".bias", {d}});
    }
    p.push_back({l + "self_attn_layer_norm.weight", {d}});
    p.push_back({l + "self_attn_layer_norm.bias", {d}});
    p.push_back({l + "fc1.weight", {f, d}});
    p.push_back({l + "fc1.bias", {f}});
    p.push_back({l + "fc2.weight", {d, f}});
    p.push_back({l + "fc2.bias", {d}});
    p.push_back({l + "final_layer_norm.weight", {d}});
    p.push_back({l + "final_layer_norm.bias", {d}});
  }
  p.push_back({"layer_norm.weight", {d}});
  p.push_back({"layer_norm.bias", {d}});
  p.push_back({"embed_positions.weight", {c.max_source_positions, d}});
  return p;
}

int64_t trainable_parameter_count(const Config& c) {
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(c))
    if (name != "embed_positions.weight") n += numel(shape);
  return n;
}

std::vector<float> sinusoids(int64_t length, int64_t channels) {
  const int64_t half = channels / 2;
  const double step = std::log(10000.0) / double(half - 1);
  std::vector<float> out(size_t(length * channels));
  for (int64_t t = 0; t < length; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // As transformers computes it: the inverse timescale rounded to f32, the product in f32.
      const float inv = float(std::exp(-step * double(i)));
      const float angle = float(t) * inv;
      out[size_t(t * channels + i)] = std::sin(angle);
      out[size_t(t * channels + half + i)] = std::cos(angle);
    }
  return out;
}

namespace {

mgn::Init init_of(const std::string& name, const Shape& shape, const GraphOptions& opt) {
  const bool norm = name.find("layer_norm") != std::string::npos;
  const bool weight = name.ends_with(".weight");
  if (opt.init == Init::PaperSine) return mgn::Init::paper_sine(0.02, norm && weight ? 1.0 : 0.0);
  if (norm) return weight ? mgn::Init::ones() : mgn::Init::zeros();
  if (!weight) return mgn::Init::zeros();
  return mgn::Init::normal(0.0, 0.02, opt.seed);
}

}  // namespace

Graph encoder_graph(const Config& c, const GraphOptions& opt, Mode mode) {
  c.validate();
  const int64_t frames = opt.frames ? opt.frames : c.frames();
  if (opt.batch <= 0) throw Error("whisper::encoder_graph: batch must be positive, got " + str(opt.batch));
  if (frames <= 0) throw Error("whisper::encoder_graph: frames must be positive, got " + str(frames));
  const int64_t T = (frames - 1) / 2 + 1;  // conv2: kernel 3, stride 2, padding 1
  if (T > c.max_source_positions)
    throw Error("whisper::encoder_graph: " + str(frames) + " mel frames give " + str(T) +
                " positions, more than max_source_positions " + str(c.max_source_positions));
  const int64_t B = opt.batch, D = c.d_model, H = c.encoder_attention_heads, hd = c.head_dim();

  Graph g;
  std::map<std::string, Tensor> w;
  for (auto& [name, shape] : parameter_shapes(c)) {
    if (name == "embed_positions.weight")
      w[name] = g.state(name, shape, mgn::Init::from_data(sinusoids(shape[0], shape[1])));
    else
      w[name] = g.parameter(name, shape, init_of(name, shape, opt));
  }
  Tensor mel = opt.audio_input ? audio::log_mel(g, g.input("audio", {B, 1, frames * 160 + 400}),
                                                {.n_mels = c.num_mel_bins})
                                : g.input("mel", {B, c.num_mel_bins, frames});
  Tensor x = gelu(conv1d(mel, w["conv1.weight"], {.padding = 1}, w["conv1.bias"]));
  x = gelu(conv1d(x, w["conv2.weight"], {.stride = 2, .padding = 1}, w["conv2.bias"]));  // [B, D, T]
  x = transpose(x, 1, 2);                                                                  // [B, T, D]
  Tensor pos = w["embed_positions.weight"];
  if (T < c.max_source_positions) pos = slice(pos, 0, 0, T);
  x = x + pos;

  auto heads = [&](Tensor t) { return transpose(reshape(t, {B, T, H, hd}), 1, 2); };  // [B, H, T, hd]
  const double eps = c.layer_norm_eps;
  for (int64_t i = 0; i < c.encoder_layers; ++i) {
    const std::string l = "layers." + str(i) + ".";
    auto p = [&](const std::string& n) { return w.at(l + n); };
    Tensor h = layer_norm(x, p("self_attn_layer_norm.weight"), p("self_attn_layer_norm.bias"), eps);
    Tensor q = heads(linear(h, p("self_attn.q_proj.weight"), p("self_attn.q_proj.bias")));
    Tensor k = heads(linear(h, p("self_attn.k_proj.weight")));
    Tensor v = heads(linear(h, p("self_attn.v_proj.weight"), p("self_attn.v_proj.bias")));
    Tensor o = attention(q, k, v, {.scale = 1.0 / std::sqrt(double(hd))});
    o = reshape(transpose(o, 1, 2), {B, T, D});
    x = x + linear(o, p("self_attn.out_proj.weight"), p("self_attn.out_proj.bias"));
    h = layer_norm(x, p("final_layer_norm.weight"), p("final_layer_norm.bias"), eps);
    h = gelu(linear(h, p("fc1.weight"), p("fc1.bias")));
    x = x + linear(h, p("fc2.weight"), p("fc2.bias"));
  }
  x = layer_norm(x, w["layer_norm.weight"], w["layer_norm.bias"], eps);
  g.output("last_hidden_state", x);
  if (mode == Mode::Train) g.output("loss", mean(square(x)));
  return g;
}

// ---- weights

std::map<std::string, std::vector<float>> read_weights(const Config& c, const std::string& path) {
  const std::string file = models::weights_file(path);
  TensorSet ts = read_tensor_set(file);
  // The prefix the file uses: the one under which conv1.weight is found.
  std::string prefix;
  bool found = false;
  for (const char* p : {"model.encoder.", "encoder.", ""})
    if (ts.find(std::string(p) + "conv1.weight")) {
      prefix = p;
      found = true;
      break;
    }
  if (!found)
    throw Error("'" + file + "' holds no Whisper encoder: no tensor model.encoder.conv1.weight, encoder.conv1.weight or "
                "conv1.weight");
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, shape] : parameter_shapes(c)) {
    const std::string stored = prefix + name;
    if (!ts.find(stored))
      throw Error("'" + file + "' has no tensor '" + stored + "' (the encoder of this config: " +
                  str(c.encoder_layers) + " layers, d_model " + str(c.d_model) + ")");
    out[name] = ts.values_f32(stored, shape);  // names the mis-shaped tensor
  }
  // A tensor under the encoder's prefix that the config does not know means config and weights disagree.
  for (auto& [name, t] : ts.tensors) {
    if (!name.starts_with(prefix) || (prefix.empty() && name.find("decoder") != std::string::npos)) continue;
    const std::string local = name.substr(prefix.size());
    if (prefix.empty() && (local.starts_with("proj_out") || local.starts_with("decoder."))) continue;
    if (!out.count(local))
      throw Error("'" + file + "': unknown encoder tensor '" + name + "' for this config (" + str(c.encoder_layers) +
                  " layers)");
  }
  return out;
}

void load_weights(Session& s, const std::map<std::string, std::vector<float>>& weights) {
  for (auto& [name, values] : weights) s.write_parameter(name, values);
}

}  // namespace mgn::whisper
