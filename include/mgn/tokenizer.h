// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 / SmolLM2 style):
//
//   mgn::Tokenizer tok = mgn::Tokenizer::from_file("SmolLM2-135M/tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("Hello world");
//   std::string text = tok.decode(ids);
//
// Supported: model type BPE (vocab, merges as "a b" strings or [a, b] pairs, ignore_merges, unk_token);
// pre-tokenizers ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Digits (individual_digits)
// and a Sequence of them; added tokens (matched in the raw text before pre-tokenization, longest first).
// A normalizer or another pre-tokenizer is refused with an error instead of tokenizing differently. Post-
// processing templates (BOS insertion) are not applied: encode returns the tokens of the text alone.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mgn {

class Tokenizer {
 public:
  // Throws mgn::Error naming the origin and the offending field.
  static Tokenizer from_json(const std::string& text, const std::string& origin = "tokenizer.json");
  static Tokenizer from_file(const std::string& path);

  std::vector<int32_t> encode(const std::string& utf8) const;
  // Added tokens decode to their content (skipped when special and skip_special); other tokens map their
  // byte-level characters back to bytes. Throws for an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const;  // one past the largest id
  std::optional<int32_t> token_id(const std::string& token) const;
  const std::string& token(int32_t id) const;  // the stored (byte-level) form

  // The pre-tokenized pieces of a text segment without added tokens (byte-level mapped): for tests.
  std::vector<std::string> pre_tokenize(const std::string& utf8) const;

 private:
  struct PreStep {
    enum class Kind : uint8_t { ByteLevel, Digits } kind = Kind::ByteLevel;
    bool add_prefix_space = false, use_regex = true, individual_digits = false;
  };
  struct Added {
    std::string content;
    int32_t id = 0;
    bool special = false;
  };
  void encode_segment(const std::string& text, std::vector<int32_t>& out) const;
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;

  std::string origin_;
  std::map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::map<std::pair<std::string, std::string>, int32_t> merge_rank_;
  std::vector<PreStep> pre_;
  std::vector<Added> added_;           // longest content first
  std::map<int32_t, size_t> added_of_;  // id -> index in added_
  std::optional<int32_t> unk_;
  bool ignore_merges_ = false;
};

}  // namespace mgn
