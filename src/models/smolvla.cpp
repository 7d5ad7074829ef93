// SmolVLA action expert (include/mgn/smolvla.h): config, the expert graph with the spec's tensor names, its
// initializations, validated weight and input loading, and flow matching (targets, time features, Euler sampler).
#include "mgn/smolvla.h"

#include <cmath>
#include <numbers>
#include <optional>
#include <random>

#include "hf_files.h"
#include "mgn/checkpoint.h"
#include "mgn/session.h"

namespace mgn::smolvla {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

constexpr int64_t kMaxWidth = 1 << 16, kMaxLayers = 1024, kMaxTokens = 1 << 16;

std::string layer_prefix(int64_t i) { return "model.vlm_with_expert.lm_expert.layers." + str(i) + "."; }

bool is_cross(int64_t layer) { return layer % 2 == 1; }

}  // namespace

// ---- config

void Config::validate(const std::string& origin) const {
  auto in_range = [&](int64_t v, int64_t hi, const char* field) {
    if (v <= 0 || v > hi) throw Error(origin + ": " + field + " must be in 1.." + str(hi) + ", got " + str(v));
  };
  in_range(hidden, kMaxWidth, "hidden");
  in_range(layers, kMaxLayers, "layers");
  in_range(heads, kMaxWidth, "heads");
  in_range(kv_heads, kMaxWidth, "kv_heads");
  in_range(head_dim, kMaxWidth, "head_dim");
  in_range(intermediate, 16 * kMaxWidth, "intermediate");
  in_range(action_dim, kMaxWidth, "action_dim");
  in_range(chunk, kMaxTokens, "chunk");
  in_range(time_dim, 16 * kMaxWidth, "time_dim");
  in_range(vlm_kv_dim, kMaxWidth, "vlm_kv_dim");
  in_range(vlm_tokens, kMaxTokens, "vlm_tokens");
  if (heads % kv_heads != 0)
    throw Error(origin + ": heads (" + str(heads) + ") is not divisible by kv_heads (" + str(kv_heads) + ")");
  if (time_dim % 2 != 0 || time_dim < 4)
    throw Error(origin + ": time_dim must be even and at least 4 (sin and cos halves), got " + str(time_dim));
  if (!(rms_norm_eps > 0)) throw Error(origin + ": rms_norm_eps must be positive");
  if (attention == Attention::Lerobot) {
    if (head_dim % 2 != 0) throw Error(origin + ": head_dim must be even for RoPE, got " + str(head_dim));
    if (vlm_kv_dim != kv_heads * head_dim)
      throw Error(origin + ": the Lerobot variant concatenates the VLM K/V with the expert's, so vlm_kv_dim (" +
                  str(vlm_kv_dim) + ") must equal kv_heads x head_dim (" + str(kv_heads * head_dim) + ")");
    if (!(rope_theta > 0)) throw Error(origin + ": rope_theta must be positive");
  }
}

Config Config::paper() { return {}; }

Config Config::reduced() {
  return {.hidden = 48, .layers = 4, .heads = 3, .kv_heads = 1, .head_dim = 16, .intermediate = 64,
          .action_dim = 8, .chunk = 6, .time_dim = 24, .vlm_kv_dim = 16, .vlm_tokens = 5};
}

// ---- parameters and inputs

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& c) {
  const int64_t H = c.hidden, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, F = c.intermediate;
  std::vector<std::pair<std::string, Shape>> p = {
      {"model.action_in_proj.weight", {H, c.action_dim}},   {"model.action_in_proj.bias", {H}},
      {"model.action_time_mlp_in.weight", {H, c.time_dim}}, {"model.action_time_mlp_in.bias", {H}},
      {"model.action_time_mlp_out.weight", {H, H}},         {"model.action_time_mlp_out.bias", {H}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = layer_prefix(i);
    const int64_t kin = is_cross(i) ? c.vlm_kv_dim : H;
    p.push_back({l + "input_layernorm.weight", {H}});
    p.push_back({l + "self_attn.q_proj.weight", {q, H}});
    p.push_back({l + "self_attn.k_proj.weight", {kv, kin}});
    p.push_back({l + "self_attn.v_proj.weight", {kv, kin}});
    p.push_back({l + "self_attn.o_proj.weight", {H, q}});
    p.push_back({l + "post_attention_layernorm.weight", {H}});
    p.push_back({l + "mlp.gate_proj.weight", {F, H}});
    p.push_back({l + "mlp.up_proj.weight", {F, H}});
    p.push_back({l + "mlp.down_proj.weight", {H, F}});
  }
  p.push_back({"model.action_out_proj.weight", {c.action_dim, H}});
  p.push_back({"model.action_out_proj.bias", {c.action_dim}});
  return p;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(c)) n += numel(shape);
  return n;
}

std::vector<std::pair<std::string, Shape>> input_shapes(const Config& c, const GraphOptions& opt, Mode mode) {
  const int64_t B = opt.batch, S = opt.chunk ? opt.chunk : c.chunk, P = c.vlm_tokens;
  std::vector<std::pair<std::string, Shape>> r = {{"noisy_actions", {B, S, c.action_dim}},
                                                  {"timestep", {B, c.time_dim}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    if (c.attention == Attention::Paper) {
      if (is_cross(i)) r.push_back({"vlm_kv_layer_" + str(i), {B, P, c.vlm_kv_dim}});
    } else {
      r.push_back({"vlm_k_layer_" + str(i), {B, P, c.vlm_kv_dim}});
      r.push_back({"vlm_v_layer_" + str(i), {B, P, c.vlm_kv_dim}});
    }
  }
  if (mode == Mode::Train) r.push_back({"target", {B, S, c.action_dim}});
  return r;
}

namespace {

mgn::Init init_of(const std::string& name, const Shape& shape, const GraphOptions& opt) {
  if (opt.init == Init::PaperSine) return mgn::Init::paper_sine();
  if (shape.size() == 1) return name.ends_with("layernorm.weight") ? mgn::Init::ones() : mgn::Init::zeros();
  return mgn::Init::normal(0.0, 0.02, opt.seed);
}

// RoPE tables for positions first..first+n-1: {cos, sin} [n, head_dim/2].
std::pair<Tensor, Tensor> rope_at(Graph& g, int64_t first, int64_t n, int64_t head_dim, double theta) {
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t s = 0; s < n; ++s) pos[size_t(s)] = int32_t(first + s);
  return rope_tables(g.constant_i32({n}, pos), head_dim, theta);
}

}  // namespace

Graph expert_graph(const Config& c, const GraphOptions& opt, Mode mode) {
  c.validate();
  if (opt.batch <= 0) throw Error("smolvla::expert_graph: batch must be positive, got " + str(opt.batch));
  if (opt.chunk < 0) throw Error("smolvla::expert_graph: chunk must be positive, got " + str(opt.chunk));
  const int64_t B = opt.batch, S = opt.chunk ? opt.chunk : c.chunk, P = c.vlm_tokens, H = c.hidden;
  const int64_t nh = c.heads, kvh = c.kv_heads, hd = c.head_dim;
  const bool lerobot = c.attention == Attention::Lerobot;

  Graph g;
  std::map<std::string, Tensor> w;
  for (auto& [name, shape] : parameter_shapes(c)) w[name] = g.parameter(name, shape, init_of(name, shape, opt));
  std::map<std::string, Tensor> in;
  for (auto& [name, shape] : input_shapes(c, opt, mode)) in[name] = g.input(name, shape);

  Tensor x = linear(in["noisy_actions"], w["model.action_in_proj.weight"], w["model.action_in_proj.bias"]);
  Tensor t = silu(linear(in["timestep"], w["model.action_time_mlp_in.weight"], w["model.action_time_mlp_in.bias"]));
  t = linear(t, w["model.action_time_mlp_out.weight"], w["model.action_time_mlp_out.bias"]);  // [B, H]
  x = x + reshape(t, {B, 1, H});

  auto heads_of = [&](Tensor u, int64_t tokens, int64_t n) {
    return transpose(reshape(u, {B, tokens, n, hd}), 1, 2);  // [B, n, tokens, hd]
  };
  std::optional<std::pair<Tensor, Tensor>> rope_self, rope_cross;
  if (lerobot) {
    rope_self = rope_at(g, P, S, hd, c.rope_theta);
    rope_cross = rope_at(g, 0, S, hd, c.rope_theta);
  }
  const double scale = 1.0 / std::sqrt(double(hd));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string l = layer_prefix(i);
    auto p = [&](const std::string& n) { return w.at(l + n); };
    Tensor h = rms_norm(x, p("input_layernorm.weight"), c.rms_norm_eps);
    Tensor q = heads_of(linear(h, p("self_attn.q_proj.weight")), S, nh);
    Tensor o;
    if (!is_cross(i)) {
      Tensor k = heads_of(linear(h, p("self_attn.k_proj.weight")), S, kvh);
      Tensor v = heads_of(linear(h, p("self_attn.v_proj.weight")), S, kvh);
      if (lerobot) {
        q = rope(q, rope_self->first, rope_self->second);
        k = rope(k, rope_self->first, rope_self->second);
        // [prefix ; actions]: the causal flag aligns the last query with the last key (key j visible to query
        // s iff j <= s + P), so the whole prefix is visible and the actions are causal among themselves.
        k = concat({heads_of(in["vlm_k_layer_" + str(i)], P, kvh), k}, 2);
        v = concat({heads_of(in["vlm_v_layer_" + str(i)], P, kvh), v}, 2);
      }
      o = attention(q, k, v, {.scale = scale, .causal = true});
    } else {
      Tensor ks = lerobot ? in["vlm_k_layer_" + str(i)] : in["vlm_kv_layer_" + str(i)];
      Tensor vs = lerobot ? in["vlm_v_layer_" + str(i)] : in["vlm_kv_layer_" + str(i)];
      Tensor k = heads_of(linear(ks, p("self_attn.k_proj.weight")), P, kvh);
      Tensor v = heads_of(linear(vs, p("self_attn.v_proj.weight")), P, kvh);
      if (lerobot) q = rope(q, rope_cross->first, rope_cross->second);
      o = attention(q, k, v, {.scale = scale});
    }
    x = x + linear(reshape(transpose(o, 1, 2), {B, S, nh * hd}), p("self_attn.o_proj.weight"));
    Tensor m = rms_norm(x, p("post_attention_layernorm.weight"), c.rms_norm_eps);
    Tensor gate = silu(linear(m, p("mlp.gate_proj.weight")));
    x = x + linear(gate * linear(m, p("mlp.up_proj.weight")), p("mlp.down_proj.weight"));
  }
  Tensor out = linear(x, w["model.action_out_proj.weight"], w["model.action_out_proj.bias"]);
  g.output("velocity", out);
  if (mode == Mode::Train) g.output("loss", mean(square(out - in["target"])));
  return g;
}

// ---- weights and inputs

std::map<std::string, std::vector<float>> read_weights(const Config& c, const std::string& path) {
  TensorSet ts = read_tensor_set(path);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, shape] : parameter_shapes(c)) {
    if (!ts.find(name))
      throw Error("'" + path + "' has no tensor '" + name + "' (expected shape " + shape_str(shape) +
                  "; the expert of this config: " + str(c.layers) + " layers, hidden " + str(c.hidden) + ")");
    out[name] = ts.values_f32(name, shape);  // names the mis-shaped tensor and the expected shape
  }
  for (auto& [name, t] : ts.tensors)
    if (name.starts_with("model.") && !out.count(name))
      throw Error("'" + path + "': unknown expert tensor '" + name + "' for this config (" + str(c.layers) +
                  " layers)");
  return out;
}

void load_weights(Session& s, const std::map<std::string, std::vector<float>>& weights) {
  for (auto& [name, values] : weights) s.write_parameter(name, values);
}

std::map<std::string, std::vector<float>> read_inputs(const Config& c, const GraphOptions& opt, const std::string& path,
                                                      const std::vector<std::string>& names) {
  TensorSet ts = read_tensor_set(path);
  std::map<std::string, Shape> shapes;
  for (auto& [name, shape] : input_shapes(c, opt, Mode::Train)) shapes[name] = shape;
  std::map<std::string, std::vector<float>> out;
  for (const std::string& name : names) {
    auto it = shapes.find(name);
    if (it == shapes.end()) throw Error("smolvla::read_inputs: '" + name + "' is no input of this expert");
    const Shape& want = it->second;
    const StoredTensor* t = ts.find(name);
    if (!t)
      throw Error("'" + path + "' has no tensor '" + name + "' (expected shape " + shape_str(want) + ")");
    const Shape unbatched(want.begin() + 1, want.end());
    if (t->shape != want && !(opt.batch == 1 && t->shape == unbatched))
      throw Error("'" + path + "': tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                  shape_str(want) + (opt.batch == 1 ? " (or " + shape_str(unbatched) + ")" : ""));
    out[name] = ts.values_f32(name, t->shape);
  }
  return out;
}

// ---- flow matching

std::vector<float> time_features(const Config& c, std::span<const double> t) {
  const int64_t half = c.time_dim / 2;
  std::vector<float> out(t.size() * size_t(c.time_dim));
  const double lo = 4e-3, hi = 4.0;
  for (size_t b = 0; b < t.size(); ++b)
    for (int64_t k = 0; k < half; ++k) {
      const double period = lo * std::pow(hi / lo, double(k) / double(half - 1));
      const double a = 2.0 * std::numbers::pi * t[b] / period;
      out[b * size_t(c.time_dim) + size_t(k)] = float(std::sin(a));
      out[b * size_t(c.time_dim) + size_t(half + k)] = float(std::cos(a));
    }
  return out;
}

FlowTarget flow_target(std::span<const float> actions, std::span<const float> noise, std::span<const double> t) {
  if (actions.size() != noise.size() || t.empty() || actions.size() % t.size() != 0)
    throw Error("smolvla::flow_target: actions (" + str(int64_t(actions.size())) + " values), noise (" +
                str(int64_t(noise.size())) + ") and times (" + str(int64_t(t.size())) +
                ") disagree: expected equal action and noise sizes, a multiple of the number of times");
  const size_t row = actions.size() / t.size();
  FlowTarget f{std::vector<float>(actions.size()), std::vector<float>(actions.size())};
  for (size_t i = 0; i < actions.size(); ++i) {
    const double tb = t[i / row];
    f.x_t[i] = float(tb * double(noise[i]) + (1.0 - tb) * double(actions[i]));
    f.velocity[i] = noise[i] - actions[i];
  }
  return f;
}

std::vector<double> sample_times(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> t(size_t(std::max<int64_t>(n, 0)));
  for (double& v : t) v = 0.999 * std::pow(u(rng), 1.0 / 1.5) + 0.001;
  return t;
}

std::vector<float> sample_actions(Session& s, const Config& c, std::span<const float> noise, int64_t batch, int steps) {
  if (steps <= 0) throw Error("smolvla::sample_actions: steps must be positive, got " + str(steps));
  const Shape vs = s.shape_of("velocity");
  if (vs.size() != 3 || vs[0] != batch || vs[2] != c.action_dim || int64_t(noise.size()) != numel(vs))
    throw Error("smolvla::sample_actions: noise has " + str(int64_t(noise.size())) +
                " values, the session's velocity is " +
                shape_str(vs) + " (batch " + str(batch) + ")");
  std::vector<float> x(noise.begin(), noise.end());
  const double dt = -1.0 / double(steps);
  for (int k = 0; k < steps; ++k) {
    const double t = 1.0 + double(k) * dt;
    std::vector<double> ts(size_t(batch), t);
    s.set_input("noisy_actions", x);
    s.set_input("timestep", time_features(c, ts));
    s.run();
    std::vector<float> v = s.read("velocity");
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(double(x[i]) + dt * double(v[i]));
  }
  return x;
}

}  // namespace mgn::smolvla
