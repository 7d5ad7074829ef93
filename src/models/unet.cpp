// The conditioned U-Net (include/mgn/unet.h): config, parameter table, graph with the paper's canonical
// names, its initializations, validated weight loading, and the DDPM / DDIM arithmetic.
#include "mgn/unet.h"

#include <cmath>

#include "hf_files.h"
#include "mgn/checkpoint.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"

namespace mgn::unet {

namespace {

std::string str(int64_t v) {
  return std::to_string(v);
}

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + str(s[i]);
  return out + "]";
}

constexpr int64_t kMaxWidth = 1 << 16, kMaxLevels = 8, kMaxSide = 1 << 14, kMaxContext = 1 << 16;

// The parameters of one ResBlock(ci -> co) under `p`.
void resblock_shapes(std::vector<std::pair<std::string, Shape>>& out, const std::string& p, int64_t ci,
                     int64_t co, int64_t temb) {
  out.push_back({p + "norm1.weight", {ci}});
  out.push_back({p + "norm1.bias", {ci}});
  out.push_back({p + "conv1.weight", {co, ci, 3, 3}});
  out.push_back({p + "time_proj.weight", {co, temb}});
  out.push_back({p + "time_proj.bias", {co}});
  out.push_back({p + "norm2.weight", {co}});
  out.push_back({p + "norm2.bias", {co}});
  out.push_back({p + "conv2.weight", {co, co, 3, 3}});
  if (ci != co) out.push_back({p + "res_conv.weight", {co, ci, 1, 1}});
}

// The parameters of one SpatialTransformer(c) under `p`.
void attn_shapes(std::vector<std::pair<std::string, Shape>>& out, const std::string& p, int64_t c,
                 int64_t ctx) {
  out.push_back({p + "norm.weight", {c}});
  out.push_back({p + "norm.bias", {c}});
  out.push_back({p + "proj_in.weight", {c, c, 1, 1}});
  const std::string t = p + "transformer.";
  out.push_back({t + "norm1.weight", {c}});
  out.push_back({t + "norm1.bias", {c}});
  for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"})
    out.push_back({t + "self_attn." + proj + ".weight", {c, c}});
  out.push_back({t + "norm2.weight", {c}});
  out.push_back({t + "norm2.bias", {c}});
  out.push_back({t + "cross_attn.q_proj.weight", {c, c}});
  out.push_back({t + "cross_attn.k_proj.weight", {c, ctx}});
  out.push_back({t + "cross_attn.v_proj.weight", {c, ctx}});
  out.push_back({t + "cross_attn.out_proj.weight", {c, c}});
  out.push_back({t + "norm3.weight", {c}});
  out.push_back({t + "norm3.bias", {c}});
  out.push_back({t + "ff.fc1.weight", {4 * c, c}});
  out.push_back({t + "ff.fc1.bias", {4 * c}});
  out.push_back({t + "ff.fc2.weight", {c, 4 * c}});
  out.push_back({t + "ff.fc2.bias", {c}});
  out.push_back({p + "proj_out.weight", {c, c, 1, 1}});
}

bool is_norm(const std::string& name) {
  return name.find(".norm") != std::string::npos;
}

mgn::Init init_of(const std::string& name, const Shape& shape, const GraphOptions& opt) {
  const bool weight = name.ends_with(".weight");
  if (is_norm(name)) return weight ? mgn::Init::ones() : mgn::Init::zeros();
  if (opt.init == Init::PaperSine) return mgn::Init::paper_sine();
  if (weight) return mgn::Init::kaiming_uniform(std::sqrt(5.0), opt.seed);
  return mgn::Init::zeros();  // biases: set below from the weight's fan-in
}

}  // namespace

// ---- config

void Config::validate(const std::string& origin) const {
  auto in_range = [&](int64_t v, int64_t hi, const char* field) {
    if (v <= 0 || v > hi)
      throw Error(origin + ": " + field + " must be in 1.." + str(hi) + ", got " + str(v));
  };
  in_range(in_channels, kMaxWidth, "in_channels");
  in_range(base_channels, kMaxWidth, "base_channels");
  in_range(levels, kMaxLevels, "levels");
  in_range(groups, kMaxWidth, "groups");
  in_range(time_input_dim, kMaxWidth, "time_input_dim");
  in_range(time_embed_dim, kMaxWidth, "time_embed_dim");
  in_range(context_dim, kMaxWidth, "context_dim");
  in_range(context_len, kMaxContext, "context_len");
  in_range(head_dim, kMaxWidth, "head_dim");
  in_range(latent, kMaxSide, "latent");
  if (base_channels % groups != 0)
    throw Error(origin + ": base_channels (" + str(base_channels) + ") is not divisible by groups (" +
                str(groups) + ")");
  if (levels > 1 && channels(1) % head_dim != 0)
    throw Error(origin + ": the attention channels (" + str(channels(1)) +
                ") are not divisible by head_dim (" + str(head_dim) + ")");
  if (levels == 1 && base_channels % head_dim != 0)
    throw Error(origin + ": base_channels (" + str(base_channels) + ") is not divisible by head_dim (" +
                str(head_dim) + ")");
  if (time_input_dim % 2 != 0)
    throw Error(origin + ": time_input_dim must be even, got " + str(time_input_dim));
  if (latent % (int64_t(1) << (levels - 1)) != 0)
    throw Error(origin + ": latent (" + str(latent) + ") must be divisible by " +
                str(int64_t(1) << (levels - 1)) + " for " + str(levels) + " levels");
  if (!(eps > 0)) throw Error(origin + ": eps must be positive");
}

Config Config::small() {
  return {};
}
Config Config::tiny() {
  return {.in_channels = 4,
          .base_channels = 32,
          .levels = 3,
          .groups = 8,
          .time_input_dim = 32,
          .time_embed_dim = 128,
          .context_dim = 768,
          .context_len = 77,
          .head_dim = 32,
          .latent = 16};
}

// ---- parameters

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& c) {
  c.validate();
  const int64_t temb = c.time_embed_dim, ctx = c.context_dim;
  std::vector<std::pair<std::string, Shape>> p = {{"time_mlp.fc1.weight", {temb, c.time_input_dim}},
                                                  {"time_mlp.fc1.bias", {temb}},
                                                  {"time_mlp.fc2.weight", {temb, temb}},
                                                  {"time_mlp.fc2.bias", {temb}},
                                                  {"conv_in.weight", {c.base_channels, c.in_channels, 3, 3}}};
  int64_t prev = c.base_channels;
  for (int64_t l = 0; l < c.levels; ++l) {
    const std::string e = "encoder." + str(l) + ".";
    resblock_shapes(p, e + "resblock.", prev, c.channels(l), temb);
    if (l > 0) attn_shapes(p, e + "attn.", c.channels(l), ctx);
    if (l < c.levels - 1) p.push_back({e + "downsample.weight", {c.channels(l), c.channels(l), 3, 3}});
    prev = c.channels(l);
  }
  resblock_shapes(p, "middle.resblock.", prev, prev, temb);
  attn_shapes(p, "middle.attn.", prev, ctx);
  for (int64_t l = c.levels - 1; l >= 0; --l) {
    const std::string d = "decoder." + str(l) + ".";
    resblock_shapes(p, d + "resblock.", prev + c.channels(l), c.channels(l), temb);
    if (l > 0) attn_shapes(p, d + "attn.", c.channels(l), ctx);
    prev = c.channels(l);
  }
  p.push_back({"conv_out.norm.weight", {c.base_channels}});
  p.push_back({"conv_out.norm.bias", {c.base_channels}});
  p.push_back({"conv_out.weight", {c.in_channels, c.base_channels, 3, 3}});
  return p;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (auto& [name, shape] : parameter_shapes(c)) n += numel(shape);
  return n;
}

// ---- inputs

Shape input_shape(const Config& c, const GraphOptions& o, const std::string& name) {
  const int64_t side = o.latent ? o.latent : c.latent, L = o.context_len ? o.context_len : c.context_len;
  if (name == "noisy_latent" || name == "noise_target") return {o.batch, c.in_channels, side, side};
  if (name == "timestep_embedding") return {o.batch, c.time_input_dim};
  if (name == "text_context") return {o.batch, L, c.context_dim};
  throw Error(
      "unet: no input named '" + name +
      "' (the inputs are noisy_latent, timestep_embedding, text_context and, to train, noise_target)");
}

void check_input(const Config& c, const GraphOptions& o, const std::string& name, const Shape& got,
                 const std::string& what) {
  const Shape want = input_shape(c, o, name);
  if (got != want)
    throw Error(what + ": " + name + " must be " + shape_text(want) + ", got " + shape_text(got));
}

// ---- graph

Graph graph(const Config& c, const GraphOptions& opt, Mode mode) {
  c.validate();
  const int64_t B = opt.batch, side = opt.latent ? opt.latent : c.latent;
  const int64_t L = opt.context_len ? opt.context_len : c.context_len;
  if (B <= 0) throw Error("unet::graph: batch must be positive, got " + str(B));
  if (side <= 0 || side > kMaxSide)
    throw Error("unet::graph: latent side must be in 1.." + str(kMaxSide) + ", got " + str(side));
  if (L <= 0 || L > kMaxContext)
    throw Error("unet::graph: context length must be in 1.." + str(kMaxContext) + ", got " + str(L));
  const int64_t down = int64_t(1) << (c.levels - 1);
  if (side % down != 0)
    throw Error("unet::graph: the latent side (" + str(side) + ") must be divisible by " + str(down) +
                " for " + str(c.levels) + " levels");

  Graph g;
  std::map<std::string, Tensor> w;
  std::map<std::string, int64_t> fan_in;  // Init::Torch biases: U(±1/√fan_in of their weight)
  for (auto& [name, shape] : parameter_shapes(c))
    if (name.ends_with(".weight") && shape.size() >= 2)
      fan_in[name.substr(0, name.size() - 7)] = numel(shape) / shape[0];
  for (auto& [name, shape] : parameter_shapes(c)) {
    mgn::Init init = init_of(name, shape, opt);
    if (opt.init == Init::Torch && !is_norm(name) && name.ends_with(".bias")) {
      const double bound = 1.0 / std::sqrt(double(fan_in.at(name.substr(0, name.size() - 5))));
      init = mgn::Init::uniform(-bound, bound, opt.seed);
    }
    w[name] = g.parameter(name, shape, init);
  }
  auto W = [&](const std::string& n) { return w.at(n); };

  Tensor x = g.input("noisy_latent", input_shape(c, opt, "noisy_latent"));
  Tensor temb_in = g.input("timestep_embedding", input_shape(c, opt, "timestep_embedding"));
  Tensor context = g.input("text_context", input_shape(c, opt, "text_context"));
  Tensor temb = linear(silu(linear(temb_in, W("time_mlp.fc1.weight"), W("time_mlp.fc1.bias"))),
                       W("time_mlp.fc2.weight"), W("time_mlp.fc2.bias"));  // [B, temb]

  const int64_t G = c.groups;
  const double eps = c.eps;
  auto conv3 = [&](Tensor t, const std::string& n, int64_t stride = 1) {
    return conv2d(t, W(n), {.stride = {stride, stride}, .padding = {1, 1}});
  };
  auto gn_silu = [&](Tensor t, const std::string& n) {
    return silu(group_norm(t, G, W(n + ".weight"), W(n + ".bias"), eps));
  };
  auto resblock = [&](Tensor t, const std::string& p) {
    const int64_t co = W(p + "conv1.weight").dim(0);
    Tensor h = conv3(gn_silu(t, p + "norm1"), p + "conv1.weight");
    h = h + reshape(linear(temb, W(p + "time_proj.weight"), W(p + "time_proj.bias")), {B, co, 1, 1});
    h = conv3(gn_silu(h, p + "norm2"), p + "conv2.weight");
    return h + (w.count(p + "res_conv.weight") ? conv2d(t, W(p + "res_conv.weight")) : t);
  };
  auto spatial = [&](Tensor t, const std::string& p) {
    const int64_t ch = t.dim(1), H = t.dim(2), Wd = t.dim(3), S = H * Wd, nh = ch / c.head_dim,
                  hd = c.head_dim;
    const std::string tp = p + "transformer.";
    Tensor h =
        conv2d(group_norm(t, G, W(p + "norm.weight"), W(p + "norm.bias"), eps), W(p + "proj_in.weight"));
    Tensor tok = transpose(reshape(h, {B, ch, S}), 1, 2);  // [B, S, c], row-major over (h, w)
    auto heads = [&](Tensor u, int64_t len) { return transpose(reshape(u, {B, len, nh, hd}), 1, 2); };
    auto merge = [&](Tensor u) { return reshape(transpose(u, 1, 2), {B, S, ch}); };
    const double scale = 1.0 / std::sqrt(double(hd));
    Tensor n1 = layer_norm(tok, W(tp + "norm1.weight"), W(tp + "norm1.bias"), eps);
    Tensor a = attention(heads(linear(n1, W(tp + "self_attn.q_proj.weight")), S),
                         heads(linear(n1, W(tp + "self_attn.k_proj.weight")), S),
                         heads(linear(n1, W(tp + "self_attn.v_proj.weight")), S), {.scale = scale});
    tok = tok + linear(merge(a), W(tp + "self_attn.out_proj.weight"));
    Tensor n2 = layer_norm(tok, W(tp + "norm2.weight"), W(tp + "norm2.bias"), eps);
    a = attention(heads(linear(n2, W(tp + "cross_attn.q_proj.weight")), S),
                  heads(linear(context, W(tp + "cross_attn.k_proj.weight")), L),
                  heads(linear(context, W(tp + "cross_attn.v_proj.weight")), L), {.scale = scale});
    tok = tok + linear(merge(a), W(tp + "cross_attn.out_proj.weight"));
    Tensor n3 = layer_norm(tok, W(tp + "norm3.weight"), W(tp + "norm3.bias"), eps);
    tok = tok + linear(gelu_tanh(linear(n3, W(tp + "ff.fc1.weight"), W(tp + "ff.fc1.bias"))),
                       W(tp + "ff.fc2.weight"), W(tp + "ff.fc2.bias"));
    h = reshape(transpose(tok, 1, 2), {B, ch, H, Wd});
    return t + conv2d(h, W(p + "proj_out.weight"));
  };

  x = conv3(x, "conv_in.weight");
  std::vector<Tensor> skips;
  for (int64_t l = 0; l < c.levels; ++l) {
    const std::string e = "encoder." + str(l) + ".";
    x = resblock(x, e + "resblock.");
    if (l > 0) x = spatial(x, e + "attn.");
    skips.push_back(x);
    if (l < c.levels - 1) x = conv3(x, e + "downsample.weight", 2);
  }
  x = resblock(x, "middle.resblock.");
  x = spatial(x, "middle.attn.");
  for (int64_t l = c.levels - 1; l >= 0; --l) {
    const std::string d = "decoder." + str(l) + ".";
    if (l < c.levels - 1) x = upsample_nearest2d(x, 2, 2);
    x = concat({x, skips[size_t(l)]}, 1);
    x = resblock(x, d + "resblock.");
    if (l > 0) x = spatial(x, d + "attn.");
  }
  x = conv3(gn_silu(x, "conv_out.norm"), "conv_out.weight");
  g.output("noise_pred", x);
  if (mode == Mode::Train) {
    Tensor target = g.input("noise_target", input_shape(c, opt, "noise_target"));
    g.output("loss", mean(square(x - target)));
  }
  return g;
}

// ---- weights

std::map<std::string, std::vector<float>> read_weights(const Config& c, const std::string& path) {
  const std::string file = models::weights_file(path);
  TensorSet ts = read_tensor_set(file);
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, shape] : parameter_shapes(c)) {
    const StoredTensor* t = ts.find(name);
    if (!t)
      throw Error("'" + file + "' has no tensor '" + name + "' (expected shape " + shape_text(shape) +
                  " for this U-Net config: base " + str(c.base_channels) + ", " + str(c.levels) + " levels)");
    if (t->shape != shape)
      throw Error("'" + file + "': tensor '" + name + "' has shape " + shape_text(t->shape) + ", expected " +
                  shape_text(shape) + " for this U-Net config (base " + str(c.base_channels) + ", " +
                  str(c.levels) + " levels)");
    out[name] = ts.values_f32(name, shape);
  }
  for (auto& [name, t] : ts.tensors)
    if (!out.count(name))
      throw Error("'" + file + "': unknown tensor '" + name + "' for this U-Net config (base " +
                  str(c.base_channels) + ", " + str(c.levels) + " levels)");
  return out;
}

void load_weights(Session& s, const std::map<std::string, std::vector<float>>& weights) {
  for (auto& [name, values] : weights) s.write_parameter(name, values);
}

void write_weights(Session& s, const Config& c, const std::string& path) {
  std::vector<StoredTensor> ts;
  for (auto& [name, shape] : parameter_shapes(c))
    ts.push_back(StoredTensor::from_f32(name, shape, s.read(name)));
  write_safetensors(path, ts);
}

// ---- diffusion

std::vector<float> timestep_embedding(std::span<const int64_t> timesteps, int64_t dim) {
  if (dim <= 0 || dim % 2 != 0)
    throw Error("unet::timestep_embedding: dim must be positive and even, got " + str(dim));
  const int64_t half = dim / 2;
  std::vector<float> out(timesteps.size() * size_t(dim));
  for (size_t b = 0; b < timesteps.size(); ++b)
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::exp(-std::log(10000.0) * double(i) / double(half));
      const double a = double(timesteps[b]) * f;
      out[b * size_t(dim) + size_t(i)] = float(std::cos(a));
      out[b * size_t(dim) + size_t(half + i)] = float(std::sin(a));
    }
  return out;
}

Schedule linear_schedule(int64_t steps, double beta_start, double beta_end) {
  if (steps <= 1) throw Error("unet::linear_schedule: steps must be at least 2, got " + str(steps));
  if (!(beta_start > 0 && beta_end < 1 && beta_start <= beta_end))
    throw Error("unet::linear_schedule: need 0 < beta_start <= beta_end < 1");
  Schedule s;
  double prod = 1.0;
  for (int64_t t = 0; t < steps; ++t) {
    const double beta = beta_start + (beta_end - beta_start) * double(t) / double(steps - 1);
    prod *= 1.0 - beta;
    s.betas.push_back(beta);
    s.alphas_cumprod.push_back(prod);
  }
  return s;
}

std::vector<float> add_noise(const Schedule& s, std::span<const float> x0, std::span<const float> noise,
                             std::span<const int64_t> t) {
  if (x0.size() != noise.size()) throw Error("unet::add_noise: x0 and noise differ in size");
  if (t.empty() || x0.size() % t.size() != 0)
    throw Error("unet::add_noise: the batch does not divide the sample count");
  const size_t per = x0.size() / t.size();
  std::vector<float> out(x0.size());
  for (size_t b = 0; b < t.size(); ++b) {
    if (t[b] < 0 || t[b] >= s.steps())
      throw Error("unet::add_noise: timestep " + str(t[b]) + " out of range");
    const double a = s.alphas_cumprod[size_t(t[b])], sa = std::sqrt(a), sn = std::sqrt(1.0 - a);
    for (size_t i = b * per; i < (b + 1) * per; ++i)
      out[i] = float(sa * double(x0[i]) + sn * double(noise[i]));
  }
  return out;
}

std::vector<int64_t> ddim_timesteps(const Schedule& s, int64_t count) {
  if (count <= 0 || count > s.steps())
    throw Error("unet::ddim_timesteps: count must be in 1.." + str(s.steps()) + ", got " + str(count));
  const int64_t ratio = s.steps() / count;
  std::vector<int64_t> out;
  for (int64_t k = count - 1; k >= 0; --k) out.push_back(k * ratio);
  return out;
}

std::vector<float> ddim_step(const Schedule& s, std::span<const float> x, std::span<const float> eps,
                             int64_t t, int64_t t_prev, double clip) {
  if (x.size() != eps.size()) throw Error("unet::ddim_step: x and eps differ in size");
  if (t < 0 || t >= s.steps() || t_prev >= t) throw Error("unet::ddim_step: need 0 <= t_prev < t < steps");
  const double a = s.alphas_cumprod[size_t(t)], ap = t_prev >= 0 ? s.alphas_cumprod[size_t(t_prev)] : 1.0;
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = (double(x[i]) - std::sqrt(1.0 - a) * double(eps[i])) / std::sqrt(a);
    double e = double(eps[i]);
    if (clip > 0) {
      x0 = std::fmin(clip, std::fmax(-clip, x0));
      e = (double(x[i]) - std::sqrt(a) * x0) / std::sqrt(1.0 - a);  // the noise that clamped x0 implies
    }
    out[i] = float(std::sqrt(ap) * x0 + std::sqrt(1.0 - ap) * e);
  }
  return out;
}

}  // namespace mgn::unet
