// The DINOv3 vision transformer (transformers' DINOv3ViTModel) built from a Hugging Face config.json, with
// the base model's state_dict names as the checkpoint contract:
//
//   mgn::dinov3::Config cfg = mgn::dinov3::Config::from_file("dinov3-vits16/config.json");
//   mgn::Graph g = mgn::dinov3::vit_graph(cfg, {.batch = 8});        // "pixel_values" -> "last_hidden_state"
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Infer});
//   mgn::dinov3::load_weights(session, mgn::dinov3::read_weights(cfg, "dinov3-vits16"));
//
// The forward pass: pixel_values [B, 3, H, W] (H, W multiples of patch_size) -> patch conv (kernel = stride =
// patch_size, bias) -> [B, N, D] patch tokens in row-major (r, c) order, N = (H/p)·(W/p) -> tokens [CLS,
// register_0..R-1, patches] (no learned position embedding) -> num_hidden_layers pre-LN layers:
//   x += λ1 ⊙ o_proj(attention(rope(q), rope(k), v))   (q, k, v from norm1(x); key has no bias; scale
//   hd^-1/2) x += λ2 ⊙ down_proj(GELU(up_proj(norm2(x))))         (erf GELU)
// -> final norm. LayerScale λ multiplies every token (the DinoVision paper's own code once scaled only the
// first: tests/dinov3_test.cpp checks a non-first token). Axial RoPE acts on the patch tokens only, per head,
// with half-split pairs (d, d + hd/2): inv_freq[k] = θ^(-4k/hd), k < hd/4; patch centre y = 2(r + ½)/h - 1,
// x = 2(c + ½)/w - 1; angles [2π·y·inv_freq, 2π·x·inv_freq] (hd/2 values), computed in f32 as transformers
// does. The RoPE grid follows the image shape, so any image size that is a multiple of the patch size works.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mgn/graph.h"
#include "mgn/session.h"

namespace mgn {
class Session;
}

namespace mgn::dinov3 {

struct Config {
  int64_t hidden_size = 384;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 6;
  int64_t intermediate_size = 1536;
  int64_t patch_size = 16;
  int64_t num_channels = 3;
  int64_t image_size = 224;  // the default input size (the graph takes any multiple of patch_size)
  int64_t num_register_tokens = 4;
  double rope_theta = 100.0;
  double layer_norm_eps = 1e-5;
  double layerscale_value = 1.0;  // Init::Hf's λ
  bool query_bias = true, key_bias = false, value_bias = true, proj_bias = true, mlp_bias = true;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t prefix_tokens() const { return 1 + num_register_tokens; }
  // Throws mgn::Error naming the field for a non-positive or implausible size, hidden_size not divisible by
  // the heads, or a head dim not divisible by 4 (axial RoPE splits it in four).
  void validate(const std::string& origin = "dinov3 config") const;

  // HF config.json text / file (DINOv3ViTConfig). A missing field takes transformers' default (so a missing
  // num_register_tokens is 0, as transformers reads it; the released checkpoints write 4). Refused rather
  // than ignored: hidden_act other than "gelu", use_gated_mlp true (the 7B / "plus" variants' SwiGLU is not
  // built).
  static Config from_json(const std::string& text, const std::string& origin = "config.json");
  static Config from_file(const std::string& path);

  static Config
  vits16();  // facebook/dinov3-vits16-pretrain-lvd1689m: 384, 12 layers, 6 heads, MLP 1536, 4 registers
};

// How the parameters start when no weights are loaded.
enum class Init : uint8_t {
  Hf,  // transformers' _init_weights: normal(0, 0.02) weights (transformers truncates at ±2σ), zero
       // biases, LayerNorm ones/zeros, CLS/register normal(0, 0.02), mask token zeros, λ = layerscale_value
  PaperSine,  // the paper's deterministic init (workload-specs.md): every tensor t[j] = 0.02·sin(0.01·j +
              // seed(name)), 2-D weights generated [in, out] and transposed, LayerNorm weights and LayerScale
              // λ 1 + that; seed(name) = (h·31 + byte mod 2^32 over the name) mod 10000
};

struct GraphOptions {
  int64_t batch = 1;
  int64_t height = 0, width = 0;  // pixels; 0: cfg.image_size. Multiples of cfg.patch_size.
  // Run only the first `layers` transformer layers (0: all). DinoVision's encoder is the first 3.
  int64_t layers = 0;
  bool final_norm = true;  // apply `norm` to the last layer run
  Init init = Init::PaperSine;
  uint64_t seed = 0;  // Init::Hf only
};

// Every tensor of the model, name -> shape, in checkpoint order (with the unused "embeddings.mask_token",
// which the graph holds as state). vits16(): 21,596,544 values.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);
int64_t parameter_count(const Config& cfg);

// The RoPE tables of an h x w patch grid as the graph uses them: cos, sin [prefix + h·w, head_dim/2]; the
// prefix rows are cos 1, sin 0 (the prefix tokens are not rotated).
std::pair<std::vector<float>, std::vector<float>> rope_tables(const Config& cfg, int64_t grid_h,
                                                              int64_t grid_w);

// Input "pixel_values" f32 [B, C, H, W] -> outputs "last_hidden_state" f32 [B, prefix + N, D] and
// "pooler_output" [B, D] (the CLS row). Mode::Train adds "loss" = mean(last_hidden_state²) (the paper's
// objective: MSE against zero).
Graph vit_graph(const Config& cfg, const GraphOptions& opt, Mode mode = Mode::Infer);

// The model's weights from a safetensors file, a sharded index (*.json) or a model directory
// (model.safetensors.index.json, else model.safetensors), widened to f32. Names may carry the prefix
// "dinov3_vit." / "model." or none (DINOv3ViTModel's own). With `layers` > 0 the tensors of later layers are
// skipped (a truncated encoder); otherwise a layer tensor the config does not know is refused. Throws
// mgn::Error naming the tensor and the file for a missing or mis-shaped tensor, before anything runs.
std::map<std::string, std::vector<float>> read_weights(const Config& cfg, const std::string& path,
                                                       int64_t layers = 0);
// Writes every tensor the session holds (a truncated graph holds fewer; the mask token is skipped when
// absent).
void load_weights(Session& session, const std::map<std::string, std::vector<float>>& weights);

}  // namespace mgn::dinov3
