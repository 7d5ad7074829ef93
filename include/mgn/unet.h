// The conditioned SD-1.x-style U-Net of the paper (`SDUNetConfig::small()`, 10,928,768 parameters;
// ../shared/reference/workload-specs.md §2) and its diffusion use: DDPM noise-prediction training and a
// DDIM sampler.
//
//   mgn::unet::Config cfg = mgn::unet::Config::small();
//   mgn::Graph g = mgn::unet::graph(cfg, {.batch = 1}, mgn::Mode::Infer);   // -> "noise_pred"
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Infer});
//   mgn::unet::load_weights(session, mgn::unet::read_weights(cfg, "unet.safetensors"));
//
// Inputs: "noisy_latent" f32 [B, in_channels, latent, latent], "timestep_embedding" f32 [B, time_input_dim]
// (computed by the caller, e.g. timestep_embedding() below; the graph holds no sinusoid), "text_context" f32
// [B, context_len, context_dim]. Output "noise_pred" [B, in_channels, latent, latent]; Mode::Train adds the
// input "noise_target" (same shape) and the output "loss" = mean((noise_pred - noise_target)²).
//
// The network (spec §2): time MLP fc1 -> SiLU -> fc2; conv_in 3x3; per encoder level l (channels base·2^l):
// ResBlock, SpatialTransformer when l > 0, skip saved, 3x3 stride-2 downsample except at the last level;
// middle ResBlock + SpatialTransformer; per decoder level from the last: nearest 2x upsample (not at the last
// level), concat [x, skip], ResBlock, SpatialTransformer when l > 0; GroupNorm -> SiLU -> conv_out 3x3. No
// convolution has a bias. ResBlock: GN -> SiLU -> conv1 3x3, + time_proj(temb), GN -> SiLU -> conv2 3x3,
// + x or res_conv(x) 1x1. SpatialTransformer: GN -> proj_in 1x1 -> tokens [HW, c] -> LN -> self-attention
// (q/k/v/out_proj, no bias, heads c/head_dim) -> LN -> cross-attention over the raw context (k/v 768 -> c)
// -> LN -> ff.fc1 (4c) -> tanh-GELU -> ff.fc2 -> back to [c, H, W] -> proj_out 1x1 -> + block input.
//
// Parameter names are the paper's canonical ones ("encoder.1.attn.transformer.self_attn.q_proj.weight",
// "decoder.2.resblock.res_conv.weight", "conv_out.norm.weight", ...), in PyTorch layouts (linear [out, in],
// conv [Co, Ci, kh, kw]): a torch state_dict with these names exchanges as safetensors.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/session.h"

namespace mgn {
class Session;
}

namespace mgn::unet {

struct Config {
  int64_t in_channels = 4;
  int64_t base_channels = 64;
  int64_t levels = 3;  // channel multiplier 2^l at level l; attention at levels > 0
  int64_t groups = 16;
  double eps = 1e-5;  // GroupNorm and LayerNorm
  int64_t time_input_dim = 64;
  int64_t time_embed_dim = 256;
  int64_t context_dim = 768;
  int64_t context_len = 77;  // the default text_context length (not a weight shape)
  int64_t head_dim = 32;
  int64_t latent = 32;  // the default latent side (not a weight shape)

  int64_t channels(int64_t level) const { return base_channels << level; }
  // Throws mgn::Error naming the field: non-positive or implausible sizes, channels not divisible by the
  // groups or the head dim, a latent side not divisible by 2^(levels-1).
  void validate(const std::string& origin = "unet config") const;

  static Config small();  // the paper's: base 64, 3 levels, 16 groups, time 64 -> 256, context 77x768, 32x32
  // The spec's conditioned tiny(): base 32, 3 levels, 8 groups, time 32 -> 128, context 77x768, head dim 32,
  // latent 16x16 (3,131,712 parameters).
  static Config tiny();
};

enum class Init : uint8_t {
  PaperSine,  // the paper's (workload-specs.md): every tensor t[j] = 0.02·sin(0.01·j + seed(name)), 2-D
              // weights generated [in, out] and stored [out, in]; norm weights 1, norm biases 0
  Torch,  // PyTorch's module defaults: kaiming_uniform(a=√5) weights, U(±1/√fan_in) biases, norms 1 / 0
};

struct GraphOptions {
  int64_t batch = 1;
  int64_t latent = 0;       // 0: cfg.latent
  int64_t context_len = 0;  // 0: cfg.context_len
  Init init = Init::PaperSine;
  uint64_t seed = 0;  // Init::Torch only
};

// Every parameter, name -> shape (PyTorch layout), in graph order.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);
int64_t parameter_count(const Config& cfg);  // small(): 10,928,768

Graph graph(const Config& cfg, const GraphOptions& opt, Mode mode = Mode::Infer);

// The expected shape of a graph input ("noisy_latent", "timestep_embedding", "text_context",
// "noise_target"), and a check of a caller's tensor against it: throws mgn::Error "<what>: <name> must be
// [..], got [..]" (the input named, with the expected shape).
Shape input_shape(const Config& cfg, const GraphOptions& opt, const std::string& name);
void check_input(const Config& cfg, const GraphOptions& opt, const std::string& name, const Shape& got,
                 const std::string& what = "unet");

// Weights from a safetensors file (or sharded index / model directory), widened to f32. Throws mgn::Error
// naming the file, the tensor and the expected shape for a missing or mis-shaped tensor, and refuses a tensor
// the config does not have (a config / weights disagreement).
std::map<std::string, std::vector<float>> read_weights(const Config& cfg, const std::string& path);
void load_weights(Session& session, const std::map<std::string, std::vector<float>>& weights);
// Every parameter of a session as safetensors (f32, these names, PyTorch layouts).
void write_weights(Session& session, const Config& cfg, const std::string& path);

// ---- diffusion

// The sinusoidal timestep embedding the caller feeds as "timestep_embedding" (SD 1.x's: flip_sin_to_cos,
// shift 0): half = dim/2, f_i = exp(-ln(10000)·i/half), emb = [cos(t·f_0..), sin(t·f_0..)]; [T, dim] for
// T timesteps.
std::vector<float> timestep_embedding(std::span<const int64_t> timesteps, int64_t dim);

// DDPM's linear beta schedule: betas linspace(beta_start, beta_end, steps), alphas_cumprod[t] = Π (1 - β).
struct Schedule {
  std::vector<double> betas, alphas_cumprod;
  int64_t steps() const { return int64_t(betas.size()); }
};
Schedule linear_schedule(int64_t steps = 1000, double beta_start = 1e-4, double beta_end = 0.02);

// q(x_t | x_0): x_t = √ᾱ_t·x0 + √(1-ᾱ_t)·noise, per sample b with timestep t[b] (x0, noise [B, ...]).
std::vector<float> add_noise(const Schedule& s, std::span<const float> x0, std::span<const float> noise,
                             std::span<const int64_t> t);

// DDIM's timesteps for `count` steps (diffusers' "leading" spacing): ratio = steps / count, t_k = k·ratio,
// sampled in descending order: [(count-1)·ratio, ..., ratio, 0].
std::vector<int64_t> ddim_timesteps(const Schedule& s, int64_t count);
// One deterministic DDIM step (η = 0) from t to t_prev (t_prev < 0: ᾱ = 1): x0 = (x - √(1-ᾱ_t)·ε) / √ᾱ_t,
// x_prev = √ᾱ_prev·x0 + √(1-ᾱ_prev)·ε. With clip > 0 the predicted x0 is clamped to [-clip, clip].
std::vector<float> ddim_step(const Schedule& s, std::span<const float> x, std::span<const float> eps,
                             int64_t t, int64_t t_prev, double clip = 0);

}  // namespace mgn::unet
