// The Whisper audio encoder (transformers' WhisperEncoder) built from a Hugging Face config.json, with the
// encoder's state_dict names as the checkpoint contract:
//
//   mgn::whisper::Config cfg = mgn::whisper::Config::from_file("whisper-tiny/config.json");
//   mgn::Graph g = mgn::whisper::encoder_graph(cfg, {.batch = 2});         // "mel" -> "last_hidden_state"
//   auto session = mgn::compile(g, {.mode = mgn::Mode::Infer});
//   mgn::whisper::load_weights(session, mgn::whisper::read_weights(cfg, "whisper-tiny"));
//
// The forward pass: mel [B, n_mels, frames] -> conv1 (k3, s1, p1, bias) -> GELU -> conv2 (k3, s2, p1, bias)
// -> GELU -> [B, T, d_model] (T = frames / 2) + embed_positions[:T] (sinusoids; state, not trainable) ->
// encoder_layers pre-LN layers (x += out_proj(attention(self_attn_layer_norm(x))), no key bias, the query
// scaled by head_dim^-1/2; x += fc2(GELU(fc1(final_layer_norm(x))))) -> layer_norm. GELU is erf-exact, as
// transformers' "gelu". Any batch; frames may be shorter than 2·max_source_positions (the positions are cut
// to T), which transformers refuses but which computes the same function on the frames given.
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

namespace mgn::whisper {

struct Config {
  int64_t d_model = 0;
  int64_t encoder_layers = 0;
  int64_t encoder_attention_heads = 0;
  int64_t encoder_ffn_dim = 0;
  int64_t num_mel_bins = 80;
  int64_t max_source_positions = 1500;
  double layer_norm_eps = 1e-5;  // transformers hard-codes 1e-5 for Whisper's LayerNorms

  int64_t head_dim() const { return d_model / encoder_attention_heads; }
  int64_t frames() const { return 2 * max_source_positions; }  // mel frames of a full window (30 s: 3000)
  // Throws mgn::Error naming the field for a non-positive or implausible size, or d_model not divisible by
  // the heads.
  void validate(const std::string& origin = "whisper config") const;

  // HF config.json text / file (WhisperConfig). Required: d_model, encoder_layers, encoder_attention_heads,
  // encoder_ffn_dim. An activation other than "gelu" is refused rather than silently ignored.
  static Config from_json(const std::string& text, const std::string& origin = "config.json");
  static Config from_file(const std::string& path);

  static Config tiny();  // openai/whisper-tiny: d_model 384, 4 layers, 6 heads, FFN 1536, 80 mels, 1500 positions
  static Config base();  // openai/whisper-base: 512, 6 layers, 8 heads, FFN 2048
  static Config small(); // openai/whisper-small: 768, 12 layers, 12 heads, FFN 3072
};

// How the parameters start when no weights are loaded.
enum class Init : uint8_t {
  Hf,         // transformers' _init_weights: normal(0, 0.02) weights, zero biases, LayerNorm ones/zeros
  PaperSine,  // the paper's deterministic init (workload-specs.md): every trainable tensor t[j] =
              // 0.02·sin(0.01·j + seed(name)), 2-D weights generated [in, out] and transposed, LayerNorm
              // weights 1 + that; seed(name) = (h·31 + byte mod 2^32 over the name) mod 10000
};

struct GraphOptions {
  int64_t batch = 1;
  int64_t frames = 0;  // mel frames per row; 0: cfg.frames() (a full 30-s window)
  Init init = Init::PaperSine;
  uint64_t seed = 0;  // Init::Hf only
  // The input is audio, not mel: "audio" f32 [B, 1, frames·160 + 400] (16-kHz samples reflect-padded by 200,
  // audio::reflect_pad), and the log-mel spectrogram (audio::log_mel) runs inside the graph, on the device.
  bool audio_input = false;
};

// Every tensor of the encoder, name -> shape, in graph order; the last is the non-trainable
// "embed_positions.weight".
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg);
int64_t trainable_parameter_count(const Config& cfg);  // whisper-tiny: 7,632,384

// Input "mel" f32 [B, n_mels, frames] (or "audio", GraphOptions::audio_input) -> output "last_hidden_state" f32 [B, ceil(frames / 2), d_model].
// Mode::Train adds the output "loss" = mean(last_hidden_state²) (the paper's objective: MSE against zero).
Graph encoder_graph(const Config& cfg, const GraphOptions& opt, Mode mode = Mode::Infer);

// transformers' sinusoids(length, channels): [sin(t·e^(-i·ln(10^4)/(C/2 - 1))), cos(...)], i < C/2.
std::vector<float> sinusoids(int64_t length, int64_t channels);

// The encoder's weights from a safetensors file, a sharded index (*.json) or a model directory
// (model.safetensors.index.json, else model.safetensors), widened to f32. Names may carry the prefix
// "model.encoder." (WhisperForConditionalGeneration), "encoder." (WhisperModel) or none (WhisperEncoder);
// decoder tensors and "proj_out.weight" are skipped. Throws mgn::Error naming the tensor and the file for a
// missing or mis-shaped encoder tensor, before anything runs.
std::map<std::string, std::vector<float>> read_weights(const Config& cfg, const std::string& path);
void load_weights(Session& session, const std::map<std::string, std::vector<float>>& weights);

}  // namespace mgn::whisper
