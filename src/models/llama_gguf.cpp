// GGUF export of a Llama-family model for llama.cpp (include/mgn/llama.h, docs/gguf.md): the "llama"
// architecture's metadata, HF tensor names mapped to GGUF's, the q/k rows permuted to GGUF's RoPE layout,
// and the tokenizer as tokenizer.ggml.* (model "gpt2": byte-level BPE).
#include "mgn/llama.h"

#include <algorithm>

#include "mgn/gguf.h"
#include "mgn/tokenizer.h"

namespace mgn::llama {

namespace {

// llama_token_type codes (tokenizer.ggml.token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUnused = 5;

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256 + their order.
std::string byte_token(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;  // UTF-8 of cp (< 0x800 here)
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// HF stores each head's rotary pairs as (i, i + D/2) (rotate_half); GGUF's llama graph rotates adjacent rows
// (2i, 2i + 1). Row 2i + j of a head takes the HF row j * D/2 + i (llama.cpp's converter: reshape to
// [heads, 2, D/2, in], swap axes 1 and 2).
std::vector<float> permute_rows(const std::vector<float>& w, int64_t heads, int64_t d, int64_t in) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < d / 2; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const float* src = w.data() + ((h * d + j * (d / 2) + i) * in);
        std::copy(src, src + in, out.data() + (h * d + 2 * i + j) * in);
      }
  return out;
}

}  // namespace

void export_gguf(const Config& cfg, const std::map<std::string, std::vector<float>>& weights,
                 const std::string& path, const GgufOptions& opt) {
  cfg.validate();
  using gguf::Value;
  const int64_t V = cfg.vocab_size, D = cfg.head_size();

  // Tensors, checked against the config's names and shapes.
  std::vector<gguf::Tensor> tensors;
  auto take = [&](const std::string& hf_name, const std::string& gguf_name, const Shape& shape, int64_t permute_heads) {
    auto it = weights.find(hf_name);
    if (it == weights.end()) throw Error(path + ": weight '" + hf_name + "' is missing (expected " + shape_str(shape) + ")");
    if (int64_t(it->second.size()) != numel(shape))
      throw Error(path + ": weight '" + hf_name + "' has " + std::to_string(it->second.size()) + " values, expected " +
                  shape_str(shape));
    gguf::Tensor t{gguf_name, shape, gguf::TensorType::F32, {}};
    if (shape.size() == 2 && opt.type == GgufType::F16) t.type = gguf::TensorType::F16;
    t.values = permute_heads ? permute_rows(it->second, permute_heads, D, shape[1]) : it->second;
    tensors.push_back(std::move(t));
  };
  for (const auto& [name, shape] : parameter_shapes(cfg)) {
    const std::string pre = "model.layers.";
    std::string g;
    int64_t heads = 0;
    if (name == "model.embed_tokens.weight") g = "token_embd.weight";
    else if (name == "model.norm.weight") g = "output_norm.weight";
    else if (name == "lm_head.weight") g = "output.weight";
    else if (name.compare(0, pre.size(), pre) == 0) {
      const size_t dot = name.find('.', pre.size());
      const std::string blk = "blk." + name.substr(pre.size(), dot - pre.size()) + ".", rest = name.substr(dot + 1);
      static const std::map<std::string, std::string> kLayer = {
          {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.q_proj.weight", "attn_q.weight"},
          {"self_attn.k_proj.weight", "attn_k.weight"},   {"self_attn.v_proj.weight", "attn_v.weight"},
          {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},    {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
      auto m = kLayer.find(rest);
      if (m == kLayer.end()) throw Error(path + ": no GGUF name for weight '" + name + "'");
      g = blk + m->second;
      if (rest == "self_attn.q_proj.weight") heads = cfg.num_attention_heads;
      if (rest == "self_attn.k_proj.weight") heads = cfg.kv_heads();
    } else {
      throw Error(path + ": no GGUF name for weight '" + name + "'");
    }
    take(name, g, shape, heads);
  }

  // Vocabulary.
  std::vector<std::string> tokens(static_cast<size_t>(V));
  std::vector<int32_t> types(size_t(V), kUnused);
  std::vector<std::string> merges;
  std::string pre = opt.pre;
  int64_t bos = -1, eos = -1;
  for (int64_t i = 0; i < V; ++i) tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
  if (opt.tokenizer) {
    const Tokenizer& tok = *opt.tokenizer;
    if (tok.vocab_size() > V)
      throw Error(path + ": the tokenizer has " + std::to_string(tok.vocab_size()) + " ids, the model's vocab_size is " +
                  std::to_string(V));
    for (int32_t i = 0; i < int32_t(tok.vocab_size()); ++i) {
      if (!tok.has_token(i)) continue;
      tokens[size_t(i)] = tok.id_to_token(i);
      types[size_t(i)] = tok.is_special(i) ? kControl : kNormal;
    }
    merges = tok.merges();
    if (pre.empty()) pre = tok.digit_split() == Tokenizer::DigitSplit::Individual ? "smollm" : "gpt-2";
    if (tok.bos_id()) bos = *tok.bos_id();
    if (tok.eos_id()) eos = *tok.eos_id();
  } else {
    if (V < 257)
      throw Error(path + ": the placeholder vocabulary needs vocab_size >= 257 (256 bytes and <|endoftext|>), the model has " +
                  std::to_string(V));
    for (int b = 0; b < 256; ++b) {
      tokens[size_t(b)] = byte_token(b);
      types[size_t(b)] = kNormal;
    }
    tokens[256] = "<|endoftext|>";
    types[256] = kControl;
    bos = eos = 256;
    if (pre.empty()) pre = "gpt-2";
  }

  std::vector<gguf::KeyValue> kv = {
      {"general.architecture", Value::string("llama")},
      {"general.name", Value::string(opt.name)},
      {"general.file_type", Value::u32(opt.type == GgufType::F16 ? 1 : 0)},  // ALL_F32 / MOSTLY_F16
      {"llama.vocab_size", Value::u32(uint32_t(V))},
      {"llama.context_length", Value::u32(uint32_t(cfg.max_position_embeddings))},
      {"llama.embedding_length", Value::u32(uint32_t(cfg.hidden_size))},
      {"llama.block_count", Value::u32(uint32_t(cfg.num_hidden_layers))},
      {"llama.feed_forward_length", Value::u32(uint32_t(cfg.intermediate_size))},
      {"llama.attention.head_count", Value::u32(uint32_t(cfg.num_attention_heads))},
      {"llama.attention.head_count_kv", Value::u32(uint32_t(cfg.kv_heads()))},
      {"llama.attention.key_length", Value::u32(uint32_t(D))},
      {"llama.attention.value_length", Value::u32(uint32_t(D))},
      {"llama.rope.freq_base", Value::f32(float(cfg.rope_theta))},
      {"llama.rope.dimension_count", Value::u32(uint32_t(D))},
      {"llama.attention.layer_norm_rms_epsilon", Value::f32(float(cfg.rms_norm_eps))},
      {"tokenizer.ggml.model", Value::string("gpt2")},
      {"tokenizer.ggml.pre", Value::string(pre)},
      {"tokenizer.ggml.tokens", Value::strings_array(std::move(tokens))},
      {"tokenizer.ggml.token_type", Value::i32_array(types)},
      {"tokenizer.ggml.merges", Value::strings_array(std::move(merges))},
      {"tokenizer.ggml.add_bos_token", Value::boolean(false)},
  };
  if (bos >= 0) kv.push_back({"tokenizer.ggml.bos_token_id", Value::u32(uint32_t(bos))});
  if (eos >= 0) kv.push_back({"tokenizer.ggml.eos_token_id", Value::u32(uint32_t(eos))});
  gguf::write(path, kv, tensors);
}

}  // namespace mgn::llama
