// Llama-family decoder (SmolLM2, Llama 2/3 layouts) built from a Hugging Face config.json, with HF tensor
// names as the checkpoint contract:
//
//   mgn::llama::Config cfg = mgn::llama::Config::from_file("SmolLM2-135M/config.json");
//   mgn::Graph g = mgn::llama::prefill_graph(cfg, {.batch = 1, .seq = 128});   // "ids" -> "logits"
//   auto weights = mgn::llama::read_weights(cfg, "SmolLM2-135M");               // validated by name/shape
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Infer});
//   mgn::llama::load_weights(session, weights);
//
// The model follows transformers' LlamaForCausalLM: RMSNorm (weight, eps), rotary embedding with the
// half-split (rotate_half) layout, grouped-query attention (query head h reads kv head h / (H / KVH)),
// SwiGLU MLP, optional tied input/output embedding. Without weights, parameters take HF's random init
// (normal(0, 0.02) for matrices, ones for norms).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mgn/graph.h"

namespace mgn {
class Session;
class Tokenizer;
}

namespace mgn::llama {

struct Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // 0 in a config file means "same as num_attention_heads"
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;

  int64_t kv_heads() const { return num_key_value_heads ? num_key_value_heads : num_attention_heads; }
  int64_t head_size() const { return head_dim ? head_dim : hidden_size / num_attention_heads; }
  // Throws mgn::Error naming the field for a non-positive size, heads not divisible by kv heads, an odd
  // head dimension (RoPE pairs) or hidden not divisible by heads when head_dim is not given.
  void validate(const std::string& origin = "llama config") const;

  // HF config.json text / file. Required: vocab_size, hidden_size, num_hidden_layers,
  // num_attention_heads, intermediate_size. Unsupported features (rope_scaling, attention/mlp biases,
  // an activation other than silu) are refused rather than silently ignored.
  static Config from_json(const std::string& text, const std::string& origin = "config.json");
  static Config from_file(const std::string& path);

  static Config smollm2_135m();
  // 2 layers, hidden 64, 4 heads / 2 KV heads (head dim 16), FFN 128, vocab 512, tied: for tests.
  static Config tiny();
};

struct GraphOptions {
  int64_t batch = 1;
  int64_t seq = 1;  // prefill/loss: tokens per row; decode: cache length (the maximum position + 1)
  uint64_t seed = 0;  // random init seed (all parameters; the names make them differ)
};

// Every parameter the model has, HF name -> shape, in graph order ("lm_head.weight" only when untied).
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);

// Prefill: input "ids" i32 [B, S] (positions 0..S-1) -> output "logits" f32 [B, S, V].
Graph prefill_graph(const Config& cfg, const GraphOptions& opt);

// Training loss: inputs "ids" and "labels" i32 [B, S] -> outputs "loss" (mean next-token cross-entropy over
// labels != -100) and "logits". labels must already be shifted: labels[b, t] is the target of position t
// (next_token_labels() does the shift HF does inside LlamaForCausalLM).
Graph loss_graph(const Config& cfg, const GraphOptions& opt);
// HF's shift: labels[b, t] = ids[b, t + 1] for t < S - 1, and -100 at t = S - 1. `pad` positions (a label
// of -100 in `ids_as_labels`, same shape) stay ignored: pass ids themselves when nothing is padded.
std::vector<int32_t> next_token_labels(const std::vector<int32_t>& ids_as_labels, int64_t batch, int64_t seq);

// One decoding step with a KV cache: inputs "ids" i32 [B, 1] and "pos" i32 [1] (the position of the new
// token, the same for every row, 0 <= pos < opt.seq) -> output "logits" [B, 1, V]. The cache is graph
// state "cache.{i}.k" / "cache.{i}.v" f32 [B, KVH, opt.seq, D] (zeros at start): each step writes the new
// k/v at row pos (a one-hot select over the cache axis, then assign) and attends over the whole cache
// with an additive mask hiding positions > pos. The position is a runtime value: one graph serves every
// token. Feed a prompt token by token to fill the cache.
Graph decode_graph(const Config& cfg, const GraphOptions& opt);
std::string cache_name(int64_t layer, bool value);  // "cache.{layer}.k" / "cache.{layer}.v"

// Weights of a model from a safetensors file, a sharded index (*.json) or a model directory
// (model.safetensors.index.json, else model.safetensors), widened to f32. Throws mgn::Error naming the
// tensor and file for a missing, unknown or mis-shaped tensor. Tolerated and skipped: "lm_head.weight"
// in a tied model (some exports store the tied copy) and rotary "inv_freq" buffers of old exports.
std::map<std::string, std::vector<float>> read_weights(const Config& cfg, const std::string& path);
// Writes every weight into the session's parameters (by name).
void load_weights(Session& session, const std::map<std::string, std::vector<float>>& weights);

// Greedy/sampled generation with the decode graph on a session built from decode_graph(cfg, {1, max}).
struct SampleOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;       // 0: the whole vocabulary
  uint64_t seed = 0;
  int32_t eos_id = -1;  // stop after emitting it (-1: never)
};
// Resets the cache (zeros), feeds the prompt, then emits up to max_new_tokens tokens; on_token (optional)
// is called with each new token as it is produced. Returns the new tokens.
std::vector<int32_t> generate(Session& decode, const Config& cfg, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt, void (*on_token)(int32_t, void*) = nullptr,
                              void* user = nullptr);

// GGUF export for llama.cpp (docs/gguf.md): the "llama" architecture's metadata and tensor names, the q/k
// projection rows permuted from HF's half-split RoPE layout to GGUF's interleaved pairs (as llama.cpp's
// converter does), and the tokenizer's vocabulary, merges and bos/eos ids (tokenizer.ggml.model "gpt2").
// Without a tokenizer the vocabulary is a placeholder: the 256 byte-level tokens, "<|endoftext|>" (id 256,
// bos and eos) and "[PAD<id>]" tokens of type unused up to vocab_size; a tokenizer with fewer ids than
// vocab_size is padded the same way. Norm weights stay f32; with F16 the matrices are rounded to f16.
enum class GgufType { F32, F16 };
struct GgufOptions {
  GgufType type = GgufType::F32;
  const Tokenizer* tokenizer = nullptr;  // null: the placeholder vocabulary
  std::string name = "meganeura export";  // general.name
  std::string pre;  // tokenizer.ggml.pre; empty: "smollm" when digits are split one by one, else "gpt-2"
};
// Writes `path` atomically. Throws mgn::Error naming the tensor for a missing or mis-shaped weight, and for
// a tokenizer with more ids than cfg.vocab_size (or a vocabulary below 257 without one).
void export_gguf(const Config& cfg, const std::map<std::string, std::vector<float>>& weights,
                 const std::string& path, const GgufOptions& opt = {});

}  // namespace mgn::llama
