// The SmolVLA action expert (the paper's workload, ../shared/reference/workload-specs.md §1) and flow matching
// as SmolVLA uses it. The VLM (SmolVLM-2) is not part of this: its per-layer key/value states are inputs.
//
//   mgn::smolvla::Config cfg = mgn::smolvla::Config::paper();                 // 99,848,592 parameters
//   mgn::Graph g = mgn::smolvla::expert_graph(cfg, {});                        // -> "velocity" [B, 50, 32]
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Infer});
//   mgn::smolvla::load_weights(session, mgn::smolvla::read_weights(cfg, "expert.safetensors"));
//
// The forward pass (names "model." + suffix, HF [out, in] linear weights):
//   x = action_in_proj(noisy_actions) + action_time_mlp_out(SiLU(action_time_mlp_in(timestep)))  (t broadcast
//   over the chunk); layers i = 0..L-1, i even self-attention, i odd cross-attention, each pre-RMSNorm:
//     h = RMSNorm(x)·input_layernorm; q = q_proj(h); self: k, v = k_proj(h), v_proj(h); cross: k, v =
//     k_proj(vlm), v_proj(vlm) over the layer's VLM K/V input; GQA (query head h reads KV head h/(heads/kv));
//     x += o_proj(attn); x += down(SiLU(gate(h2))·up(h2)), h2 = RMSNorm(x)·post_attention_layernorm;
//   velocity = action_out_proj(x). No bias but the four top-level linears; no final norm (the paper graph).
//
// Two attention variants (Config::attention):
//   Paper   the paper's graph: self layers causal over the action tokens only, no RoPE; cross layers read
//           "vlm_kv_layer_{i}" [B, P, vlm_kv_dim] (odd i) as both the K and the V source.
//   Lerobot as lerobot's SmolVLA: self layers attend jointly over [VLM prefix K/V ; the expert's own K/V], the
//           prefix fully visible and the actions causal among themselves; RoPE (half-split pairs, theta
//           rope_theta) on the expert's q and k in self layers at positions P..P+S-1 (the prefix keys come
//           rotated by the VLM); cross layers rotate the queries only, positions re-based to 0..S-1. Inputs
//           "vlm_k_layer_{i}" and "vlm_v_layer_{i}" [B, P, kv_heads·head_dim] for every layer i (self layers use
//           them as they are, cross layers re-project them with their own k_proj/v_proj).
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

namespace mgn::smolvla {

enum class Attention : uint8_t { Paper, Lerobot };

struct Config {
  int64_t hidden = 720;        // expert width (0.75 x the VLM's 960)
  int64_t layers = 16;         // even: self-attention, odd: cross-attention
  int64_t heads = 15;          // query heads
  int64_t kv_heads = 5;
  int64_t head_dim = 64;
  int64_t intermediate = 2048; // SiLU-gated MLP
  int64_t action_dim = 32;     // max_action_dim
  int64_t chunk = 50;          // action tokens
  int64_t time_dim = 1440;     // the timestep feature vector fed to action_time_mlp_in
  int64_t vlm_kv_dim = 320;    // per-token width of the VLM K/V inputs (5 KV heads x 64)
  int64_t vlm_tokens = 16;     // VLM prefix length P
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0; // Attention::Lerobot only
  Attention attention = Attention::Paper;

  // Throws mgn::Error naming the field for a non-positive or implausible size, heads not divisible by
  // kv_heads, an odd head_dim under RoPE, or (Lerobot) vlm_kv_dim != kv_heads·head_dim.
  void validate(const std::string& origin = "smolvla config") const;

  static Config paper();    // the paper's expert: the defaults above, Attention::Paper
  static Config reduced();  // CI: 4 layers, hidden 48, 3 heads / 1 KV head of 16, MLP 64, actions 6 x 8,
                            // time 24, VLM K/V 5 x 16
};

enum class Init : uint8_t {
  PaperSine,  // every parameter t[j] = 0.02·sin(0.01·j + seed(name)), 2-D weights generated [in, out] and
              // transposed; 1-D tensors (RMSNorm weights, biases) name-seeded the same way, not ones
  Default,    // PyTorch-like: normal(0, 0.02) weights, zero biases, RMSNorm weights one (seed below)
};

struct GraphOptions {
  int64_t batch = 1;
  int64_t chunk = 0;       // action tokens; 0: cfg.chunk (the latency shape uses 1)
  Init init = Init::PaperSine;
  uint64_t seed = 0;       // Init::Default only
};

// Every parameter, name -> HF shape [out, in], in graph order.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);
int64_t parameter_count(const Config& cfg);  // paper(): 99,848,592

// The graph's inputs, name -> shape: "noisy_actions" [B, S, action_dim], "timestep" [B, time_dim], then the
// VLM K/V inputs of the variant (see above), in layer order. Mode::Train adds "target" [B, S, action_dim].
std::vector<std::pair<std::string, Shape>> input_shapes(const Config& cfg, const GraphOptions& opt,
                                                        Mode mode = Mode::Infer);

// Output "velocity" [B, S, action_dim]; Mode::Train adds "loss" = mean((velocity - target)²).
Graph expert_graph(const Config& cfg, const GraphOptions& opt, Mode mode = Mode::Infer);

// The parameters from a safetensors file, widened to f32. Throws mgn::Error naming the tensor, the file and
// the expected shape for a missing or mis-shaped parameter, and for a tensor under "model." this config does
// not know.
std::map<std::string, std::vector<float>> read_weights(const Config& cfg, const std::string& path);
void load_weights(Session& session, const std::map<std::string, std::vector<float>>& weights);

// Named f32 input tensors from a safetensors file (e.g. synthetic VLM K/V), each checked against
// input_shapes(): throws mgn::Error naming the file, the tensor and the expected shape when one of `names` is
// missing or mis-shaped. A tensor stored without the batch axis is accepted when the batch is 1.
std::map<std::string, std::vector<float>> read_inputs(const Config& cfg, const GraphOptions& opt,
                                                      const std::string& path, const std::vector<std::string>& names);

// ---- flow matching (SmolVLA's convention)
//
// Time t in [0, 1] runs from data (t = 0) to noise (t = 1): x_t = t·noise + (1 - t)·actions, and the expert
// regresses the velocity u = noise - actions (loss mean((v - u)²)). Training samples t = 0.999·Beta(1.5, 1) +
// 0.001. Sampling integrates dx/dt = v from t = 1 (pure noise) to t = 0 with `steps` Euler steps of dt = -1/steps.

// The timestep features fed to "timestep": [sin(2πt/p_k) for k < D/2, cos(2πt/p_k) for k < D/2], D = time_dim,
// periods p_k = 4e-3·(4/4e-3)^(k/(D/2 - 1)) (lerobot's sinusoidal embedding, min period 4e-3, max 4, at width
// D). One row of D values per t.
std::vector<float> time_features(const Config& cfg, std::span<const double> t);

struct FlowTarget {
  std::vector<float> x_t;       // [B, S, A]: t·noise + (1 - t)·actions, t per row
  std::vector<float> velocity;  // [B, S, A]: noise - actions
};
FlowTarget flow_target(std::span<const float> actions, std::span<const float> noise, std::span<const double> t);

// Samples t for training: 0.999·Beta(1.5, 1) + 0.001 (Beta(1.5, 1) = U^(1/1.5)), deterministic in `seed`.
std::vector<double> sample_times(int64_t n, uint64_t seed);

// The Euler sampler: `session` was compiled from expert_graph(cfg, opt) in Mode::Infer and holds the weights
// and its VLM K/V inputs (set once, reused by every step). Starts at x = noise [B, S, A], runs `steps` times
// x += dt·velocity(x, t) with t = 1, 1 - 1/steps, ...; returns the action chunk (t = 0).
std::vector<float> sample_actions(Session& session, const Config& cfg, std::span<const float> noise, int64_t batch,
                                  int steps = 10);

}  // namespace mgn::smolvla
