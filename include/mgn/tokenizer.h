// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 / SmolLM2 style), giving the same
// ids as the `tokenizers` library:
//
//   mgn::Tokenizer tok = mgn::Tokenizer::from_file("SmolLM2-135M/tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("<|im_start|>user\nHello world");
//   std::string text = tok.decode(ids);               // == the input
//   std::optional<int32_t> eos = tok.eos_id();
//
// Pipeline, as in `tokenizers`: added tokens (added_tokens[], special or not) are matched in the raw text
// first (leftmost, longest; single_word / lstrip / rstrip honoured); the text between them is
// pre-tokenized by an optional Digits step (individual_digits or runs) and the ByteLevel step
// (add_prefix_space, the GPT-2 split pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// when use_regex), mapped byte by byte to GPT-2's printable alphabet, and each piece is merged by BPE rank.
// encode(..., add_special = true) then applies the post-processor (TemplateProcessing, Roberta/Bert
// processing, ByteLevel; the single-sequence form). decode maps tokens back to bytes (the ByteLevel
// decoder) and replaces ill-formed UTF-8 with U+FFFD, as `tokenizers` does.
//
// Supported model fields: type "BPE", vocab, merges ("a b" strings or ["a", "b"] pairs), unk_token,
// fuse_unk, byte_fallback, ignore_merges; dropout must be null or 0 and no subword prefix/suffix. A
// normalizer, another pre-tokenizer or decoder, or a malformed file is an mgn::Error naming the file and
// the field, never a silently different tokenization.
//
// Unicode: \p{L} and \p{N} follow the general categories of Unicode 14.0 (src/models/tokenizer_unicode.inc,
// generated from Python's unicodedata), \s the White_Space property. Approximate: a code point assigned
// after Unicode 14.0 counts as neither letter nor number; single_word's word characters are letters,
// numbers and '_' (Rust's \w also counts combining marks and other connector punctuation). Bytes that are
// not valid UTF-8 are kept (each maximal ill-formed subsequence is one "other" character).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mgn {

class Tokenizer {
 public:
  // tokenizer.json text; `origin` names it in error messages.
  static Tokenizer from_json(const std::string& text, const std::string& origin = "tokenizer.json");
  // Also reads bos_token / eos_token from a tokenizer_config.json next to the file when there is one.
  static Tokenizer from_file(const std::string& path);
  // bos_token / eos_token of a tokenizer_config.json's text (`origin` names it, `tokenizer` the file whose
  // tokens it names); from_file calls it. Throws mgn::Error naming `origin` for any malformed content.
  void apply_config(const std::string& text, const std::string& origin, const std::string& tokenizer);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Thread-safe (the per-word merge cache is locked).
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // Throws mgn::Error for an id that names no token.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The bytes one token decodes to, before the UTF-8 check: for streaming output token by token.
  std::string token_bytes(int32_t id) const;

  int64_t vocab_size() const;  // one past the largest id (model vocabulary and added tokens)
  std::optional<int32_t> token_to_id(std::string_view token) const;  // added tokens first, then the vocab
  const std::string& id_to_token(int32_t id) const;  // stored form (byte-level characters); throws if none
  bool is_special(int32_t id) const;

  // From tokenizer_config.json (from_file), else the post-processor's template (the token before / after
  // the sequence), else a special token with a well-known name (<|endoftext|>, </s>, <s>, ...).
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // For exporters (GGUF, src/models/llama_gguf.cpp): whether an id names a token (ids may have gaps), the
  // BPE merges in rank order as "left right" in stored form (as tokenizer.json lists them; a pair listed
  // twice appears once, at its last rank), and the pre-tokenizer's digit rule before the byte-level step.
  bool has_token(int32_t id) const;
  std::vector<std::string> merges() const;
  enum class DigitSplit { None, Individual, Runs };
  DigitSplit digit_split() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mgn
