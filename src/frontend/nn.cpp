// Layer helpers (include/mgn/nn.h): parameters named like Hugging Face / PyTorch, PyTorch default inits.
#include "mgn/nn.h"

#include <cmath>

namespace mgn::nn {
namespace {

Graph& check(Graph& g, Tensor x, const std::string& name, const char* layer) {
  if (!x.valid()) throw Error(std::string(layer) + " '" + name + "': input tensor is empty");
  if (x.graph() != &g.ir()) throw Error(std::string(layer) + " '" + name + "': input belongs to another graph");
  return g;
}

Init bias_init(int64_t fan_in, uint64_t seed) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
  return Init::uniform(-bound, bound, seed);
}

}  // namespace

Tensor linear(Graph& g, const std::string& name, Tensor x, int64_t out, const LinearOptions& opt) {
  check(g, x, name, "nn::linear");
  if (x.rank() < 1) throw Error("nn::linear '" + name + "': input must have rank >= 1");
  if (out <= 0) throw Error("nn::linear '" + name + "': out_features must be positive");
  int64_t in = x.dim(-1);
  Tensor w = g.parameter(name + ".weight", {out, in}, Init::kaiming_uniform(std::sqrt(5.0), opt.seed));
  std::optional<Tensor> b;
  if (opt.bias) b = g.parameter(name + ".bias", {out}, bias_init(in, opt.seed));
  return mgn::linear(x, w, b);
}

Tensor conv2d(Graph& g, const std::string& name, Tensor x, int64_t out, int64_t k, const Conv2dLayerOptions& opt) {
  check(g, x, name, "nn::conv2d");
  if (x.rank() != 4) throw Error("nn::conv2d '" + name + "': input must be [N, C, H, W], got " + shape_str(x.shape()));
  if (opt.groups <= 0 || x.dim(1) % opt.groups != 0 || out % opt.groups != 0)
    throw Error("nn::conv2d '" + name + "': channels (" + std::to_string(x.dim(1)) + " in, " + std::to_string(out) +
                " out) must be divisible by groups " + std::to_string(opt.groups));
  Shape ws = {out, x.dim(1) / opt.groups, k, k};
  Tensor w = g.parameter(name + ".weight", ws, Init::kaiming_uniform(std::sqrt(5.0), opt.seed));
  std::optional<Tensor> b;
  if (opt.bias) b = g.parameter(name + ".bias", {out}, bias_init(fan_in(ws), opt.seed));
  return mgn::conv2d(x, w, {.stride = opt.stride, .padding = opt.padding, .dilation = opt.dilation, .groups = opt.groups},
                     b);
}

Tensor embedding(Graph& g, const std::string& name, Tensor ids, int64_t vocab, int64_t dim, double std,
                 uint64_t seed) {
  check(g, ids, name, "nn::embedding");
  Tensor w = g.parameter(name + ".weight", {vocab, dim}, Init::normal(0, std, seed));
  return mgn::embedding(w, ids);
}

Tensor layer_norm(Graph& g, const std::string& name, Tensor x, double eps, bool bias) {
  check(g, x, name, "nn::layer_norm");
  int64_t d = x.dim(-1);
  Tensor w = g.parameter(name + ".weight", {d}, Init::ones());
  std::optional<Tensor> b;
  if (bias) b = g.parameter(name + ".bias", {d}, Init::zeros());
  return mgn::layer_norm(x, w, b, eps);
}

Tensor rms_norm(Graph& g, const std::string& name, Tensor x, double eps) {
  check(g, x, name, "nn::rms_norm");
  Tensor w = g.parameter(name + ".weight", {x.dim(-1)}, Init::ones());
  return mgn::rms_norm(x, w, eps);
}

Tensor group_norm(Graph& g, const std::string& name, Tensor x, int64_t groups, double eps) {
  check(g, x, name, "nn::group_norm");
  if (x.rank() < 2) throw Error("nn::group_norm '" + name + "': input must be [N, C, ...]");
  Tensor w = g.parameter(name + ".weight", {x.dim(1)}, Init::ones());
  Tensor b = g.parameter(name + ".bias", {x.dim(1)}, Init::zeros());
  return mgn::group_norm(x, groups, w, b, eps);
}

Tensor batch_norm2d(Graph& g, const std::string& name, Tensor x, Mode mode, double momentum, double eps) {
  check(g, x, name, "nn::batch_norm2d");
  if (x.rank() < 2) throw Error("nn::batch_norm2d '" + name + "': input must be [N, C, ...], got " + shape_str(x.shape()));
  int64_t c = x.dim(1);
  Tensor w = g.parameter(name + ".weight", {c}, Init::ones());
  Tensor b = g.parameter(name + ".bias", {c}, Init::zeros());
  Tensor rm = g.state(name + ".running_mean", {c}, Init::zeros());
  Tensor rv = g.state(name + ".running_var", {c}, Init::ones());
  if (mode == Mode::Eval) return batch_norm_eval(x, rm, rv, w, b, eps);

  // Running statistics, exactly as torch: mean over every axis but 1, unbiased variance, then
  // r = (1 - momentum) r + momentum * stat. They carry no gradient.
  std::vector<int64_t> axes;
  for (int a = 0; a < x.rank(); ++a)
    if (a != 1) axes.push_back(a);
  int64_t n = x.numel() / c;
  Tensor xs = stop_gradient(x);
  Tensor mu = mean(xs, axes, true);
  Tensor var = sum(square(xs - mu), axes) * (1.0 / double(n > 1 ? n - 1 : 1));
  assign(rm, rm * (1.0 - momentum) + reshape(mu, {c}) * momentum);
  assign(rv, rv * (1.0 - momentum) + var * momentum);
  return mgn::batch_norm(x, w, b, eps);
}

Tensor activate(Tensor x, Activation a) {
  switch (a) {
    case Activation::Relu: return relu(x);
    case Activation::Gelu: return gelu(x);
    case Activation::GeluTanh: return gelu_tanh(x);
    case Activation::Silu: return silu(x);
  }
  throw Error("nn::activate: unknown activation");
}

Tensor mlp(Graph& g, const std::string& name, Tensor x, int64_t hidden, int64_t out, Activation a) {
  Tensor h = activate(linear(g, name + ".fc1", x, hidden), a);
  return linear(g, name + ".fc2", h, out);
}

Tensor swiglu(Graph& g, const std::string& name, Tensor x, int64_t hidden) {
  int64_t d = x.dim(-1);
  Tensor gate = linear(g, name + ".gate_proj", x, hidden, {.bias = false});
  Tensor up = linear(g, name + ".up_proj", x, hidden, {.bias = false});
  return linear(g, name + ".down_proj", silu(gate) * up, d, {.bias = false});
}

Tensor self_attention(Graph& g, const std::string& name, Tensor x, const AttentionConfig& cfg) {
  check(g, x, name, "nn::self_attention");
  if (x.rank() != 3) throw Error("nn::self_attention '" + name + "': input must be [B, S, hidden], got " +
                                 shape_str(x.shape()));
  int64_t b = x.dim(0), s = x.dim(1), hidden = x.dim(2);
  int64_t h = cfg.heads, kvh = cfg.kv_heads ? cfg.kv_heads : cfg.heads;
  if (h <= 0 || kvh <= 0 || h % kvh != 0)
    throw Error("nn::self_attention '" + name + "': heads (" + std::to_string(h) + ") must be a multiple of kv_heads (" +
                std::to_string(kvh) + ")");
  int64_t hd = cfg.head_dim ? cfg.head_dim : hidden / h;
  if (hd * h != hidden && !cfg.head_dim)
    throw Error("nn::self_attention '" + name + "': hidden " + std::to_string(hidden) + " is not divisible by heads " +
                std::to_string(h));
  auto heads_of = [&](Tensor t, int64_t n) { return transpose(reshape(t, {b, s, n, hd}), 1, 2); };  // [B, n, S, hd]
  Tensor q = heads_of(linear(g, name + ".q_proj", x, h * hd, {.bias = cfg.bias}), h);
  Tensor k = heads_of(linear(g, name + ".k_proj", x, kvh * hd, {.bias = cfg.bias}), kvh);
  Tensor v = heads_of(linear(g, name + ".v_proj", x, kvh * hd, {.bias = cfg.bias}), kvh);
  if (cfg.rope_theta > 0) {
    Tensor pos;
    if (cfg.positions) {
      pos = *cfg.positions;
    } else {
      std::vector<int32_t> p(static_cast<size_t>(s));
      for (int64_t i = 0; i < s; ++i) p[size_t(i)] = int32_t(i);
      pos = g.constant_i32({s}, p);
    }
    auto [cos, sin] = rope_tables(pos, hd, cfg.rope_theta);
    q = rope(q, cos, sin);
    k = rope(k, cos, sin);
  }
  Tensor o = attention(q, k, v, {.causal = cfg.causal});                // [B, H, S, hd]
  Tensor merged = reshape(transpose(o, 1, 2), {b, s, h * hd});         // [B, S, H*hd]
  return linear(g, name + ".o_proj", merged, hidden, {.bias = false});
}

}  // namespace mgn::nn
