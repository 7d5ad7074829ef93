// Byte-level BPE tokenizer (include/mgn/tokenizer.h): tokenizer.json parsing and validation, added-token
// matching, the GPT-2 split over Unicode classes, rank-ordered merging with a per-word cache, decoding.
#include "mgn/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "mgn/types.h"

namespace mgn {

namespace {

using json = nlohmann::json;

struct CodeRange {
  uint32_t lo, hi;
};
#include "tokenizer_unicode.inc"

// ---- Unicode

constexpr uint32_t kInvalid = 0xFFFFFFFF;  // an ill-formed UTF-8 subsequence

template <size_t N>
bool in_ranges(const CodeRange (&r)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(r), std::end(r), cp,
                             [](uint32_t v, const CodeRange& c) { return v < c.lo; });
  return it != std::begin(r) && cp <= std::prev(it)->hi;
}

// \s: the White_Space property, which Oniguruma and Rust's regex use (not C's isspace).
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

enum class CharClass : uint8_t { Space, Letter, Number, Other };

CharClass classify(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::Letter;
    if (cp >= '0' && cp <= '9') return CharClass::Number;
    return is_white_space(cp) ? CharClass::Space : CharClass::Other;
  }
  if (cp == kInvalid) return CharClass::Other;
  if (is_white_space(cp)) return CharClass::Space;
  if (in_ranges(kLetterRanges, cp)) return CharClass::Letter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::Number;
  return CharClass::Other;
}

struct Utf8Char {
  uint32_t cp;  // kInvalid for an ill-formed subsequence
  size_t len;  // bytes; for an ill-formed one, its maximal subpart (at least 1), as U+FFFD replacement counts
};

Utf8Char next_char(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  size_t need = 0;
  uint32_t cp = 0;
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the next byte (narrower after E0, ED, F0, F4)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kInvalid, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return {kInvalid, k};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return {kInvalid, k};
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  return {cp, need + 1};
}

// The character that ends at byte `end` (> 0).
Utf8Char prev_char(std::string_view s, size_t end) {
  for (size_t back = 1; back <= 4 && back <= end; ++back) {
    Utf8Char c = next_char(s, end - back);
    if (c.len == back) return c;
  }
  return {kInvalid, 1};
}

bool is_word_char(uint32_t cp) {
  CharClass c = classify(cp);
  return c == CharClass::Letter || c == CharClass::Number || cp == '_';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

// Each maximal ill-formed subsequence becomes one U+FFFD (Rust's from_utf8_lossy, Python's "replace").
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    Utf8Char c = next_char(s, i);
    if (c.cp == kInvalid)
      out += "\xEF\xBF\xBD";
    else
      out.append(s.substr(i, c.len));
    i += c.len;
  }
  return out;
}

// ---- GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest for U+0100 onwards.

struct ByteAlphabet {
  std::array<std::string, 256> utf8;   // byte -> its character
  std::array<int16_t, 0x144> byte_of;  // character -> byte, -1 if none (every character is < U+0144)

  ByteAlphabet() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      append_utf8(utf8[b], cp);
      byte_of[cp] = int16_t(b);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// ---- string-keyed maps that look up by string_view

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>>;

struct Merge {
  int32_t rank;
  int32_t id;  // of the merged token
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

constexpr size_t kMaxCachedWord = 256;        // bytes
constexpr size_t kMaxCacheEntries = 1 << 16;  // cleared when full
constexpr int64_t kMaxId = int64_t(1) << 26;

}  // namespace

struct Tokenizer::Impl {
  std::string origin;

  // Model.
  TokenMap vocab;
  std::unordered_map<uint64_t, Merge> merges;  // (left id, right id) -> rank, merged id
  std::array<int32_t, 256> byte_id{};          // id of each byte's character, -1 if not in the vocab
  std::optional<int32_t> unk;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<int32_t, 256> fallback_id{};  // id of "<0xXX>", -1 if none

  // Ids: the model's tokens and the added tokens (whose content wins where both name an id).
  std::vector<std::string> id_token;
  std::vector<uint8_t> id_known, id_special;

  // Added tokens, and for each first byte the indices of those to match, longest first: raw (matched in
  // the input text) and normalized (matched after normalization, which is the identity here).
  std::vector<AddedToken> added;
  std::array<std::vector<size_t>, 256> raw_index, norm_index;
  bool any_raw = false, any_norm = false;

  // Pre-tokenizer.
  enum class Digits : uint8_t { None, Individual, Runs } digits = Digits::None;
  bool add_prefix_space = true, use_regex = true;

  // Post-processor (single sequence) and decoder.
  std::vector<int32_t> post_before, post_after;
  bool byte_level_decoder = true;

  std::optional<int32_t> bos, eos;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StrHash, std::equal_to<>> cache;

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(origin + ": " + (where.empty() ? "" : where + ": ") + what);
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  template <class Emit>
  void split_added(std::string_view s, const std::array<std::vector<size_t>, 256>& index, bool any,
                   Emit&& emit) const;
  void encode_plain(std::string_view seg, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_word(std::string_view word) const;
  std::string token_bytes(int32_t id) const;
  const std::string& token(int32_t id) const;
};

// ---- encoding

// `tokenizers`' AddedVocabulary::find_matches: leftmost-longest matches; a single_word match inside a word is
// dropped (and the scan goes on after it); lstrip / rstrip pull the neighbouring whitespace into the token.
template <class Emit>
void Tokenizer::Impl::split_added(std::string_view s, const std::array<std::vector<size_t>, 256>& index,
                                  bool any, Emit&& emit) const {
  if (!any) {
    if (!s.empty()) emit(s, nullptr);
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const AddedToken* best = nullptr;
    for (size_t k : index[static_cast<unsigned char>(s[pos])]) {
      if (s.compare(pos, added[k].content.size(), added[k].content) == 0) {
        best = &added[k];
        break;
      }
    }
    if (!best) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + best->content.size();
    pos = stop;
    if (best->single_word) {
      bool free_before = start == 0 || !is_word_char(prev_char(s, start).cp);
      bool free_after = stop == s.size() || !is_word_char(next_char(s, stop).cp);
      if (!free_before || !free_after) continue;
    }
    if (best->lstrip) {
      while (start > start_offset) {
        Utf8Char c = prev_char(s, start);
        if (!is_white_space(c.cp)) break;
        start -= c.len;
      }
    }
    if (best->rstrip) {
      while (stop < s.size()) {
        Utf8Char c = next_char(s, stop);
        if (!is_white_space(c.cp)) break;
        stop += c.len;
      }
      pos = stop;
    }
    if (start_offset < start) emit(s.substr(start_offset, start - start_offset), nullptr);
    emit(s.substr(start, stop - start), best);
    start_offset = stop;
  }
  if (start_offset < s.size()) emit(s.substr(start_offset), nullptr);
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  split_added(text, raw_index, any_raw, [&](std::string_view seg, const AddedToken* tok) {
    if (tok) {
      out.push_back(tok->id);
      return;
    }
    split_added(seg, norm_index, any_norm, [&](std::string_view seg2, const AddedToken* tok2) {
      if (tok2)
        out.push_back(tok2->id);
      else
        encode_plain(seg2, out);
    });
  });
}

namespace {

// The GPT-2 pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  as a
// scanner: alternatives in order, each greedy, as a backtracking engine takes them. Every character is
// matched by some alternative, so the pieces cover the input.
template <class Emit>
void gpt2_split(std::string_view s, Emit&& emit) {
  struct Ch {
    size_t off;
    CharClass cls;
    uint32_t cp;
  };
  std::vector<Ch> ch;
  for (size_t i = 0; i < s.size();) {
    Utf8Char c = next_char(s, i);
    ch.push_back({i, classify(c.cp), c.cp});
    i += c.len;
  }
  const size_t n = ch.size();
  auto off = [&](size_t k) { return k < n ? ch[k].off : s.size(); };
  auto run = [&](size_t k, CharClass cls) {
    while (k < n && ch[k].cls == cls) ++k;
    return k;
  };
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    if (ch[i].cp == '\'' && i + 1 < n) {
      uint32_t a = ch[i + 1].cp, b = i + 2 < n ? ch[i + 2].cp : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        end = i + 3;
    }
    if (!end) {
      // " ?X+" for X in letters, numbers, other: the optional space only when X follows it.
      size_t j = ch[i].cp == ' ' && i + 1 < n && ch[i + 1].cls != CharClass::Space ? i + 1 : i;
      if (ch[j].cls != CharClass::Space) {
        end = run(j, ch[j].cls);
      } else {
        size_t k = run(i, CharClass::Space);
        // \s+(?!\S) backs off one character when a non-space follows; \s+ takes a lone space.
        end = k == n || k - i == 1 ? k : k - 1;
      }
    }
    emit(s.substr(off(i), off(end) - off(i)));
    i = end;
  }
}

}  // namespace

void Tokenizer::Impl::encode_plain(std::string_view seg, std::vector<int32_t>& out) const {
  auto byte_level = [&](std::string_view piece) {
    std::string prefixed;
    if (add_prefix_space && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed += ' ';
      prefixed += piece;
      piece = prefixed;
    }
    if (use_regex)
      gpt2_split(piece, [&](std::string_view w) { encode_word(w, out); });
    else
      encode_word(piece, out);
  };
  if (digits == Digits::None) {
    byte_level(seg);
    return;
  }
  // Digits: every number character alone (Individual) or each run of them (Runs) becomes its own piece.
  size_t start = 0;
  bool prev_num = false;
  for (size_t i = 0; i < seg.size();) {
    Utf8Char c = next_char(seg, i);
    bool num = classify(c.cp) == CharClass::Number;
    if (i > start && (num != prev_num || (num && digits == Digits::Individual))) {
      byte_level(seg.substr(start, i - start));
      start = i;
    }
    prev_num = num;
    i += c.len;
  }
  if (start < seg.size()) byte_level(seg.substr(start));
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxCachedWord) {
    std::vector<int32_t> ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(word), std::move(ids));
}

// One pre-tokenized piece (raw bytes) -> ids. The symbols start as the piece's byte-level characters and the
// adjacent pair of lowest merge rank (leftmost among equals) is merged until no pair has a rank: the order of
// `tokenizers`' Word::merge_all, with a heap of candidate pairs checked against the current symbols on pop.
std::vector<int32_t> Tokenizer::Impl::merge_word(std::string_view word) const {
  const ByteAlphabet& abc = alphabet();
  if (ignore_merges) {
    std::string mapped;
    for (char b : word) mapped += abc.utf8[static_cast<unsigned char>(b)];
    auto it = vocab.find(std::string_view(mapped));
    if (it != vocab.end()) return {it->second};
  }
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Sym> sym;
  sym.reserve(word.size());
  auto add = [&](int32_t id) {
    int32_t k = int32_t(sym.size());
    sym.push_back({id, k - 1, k + 1, true});
  };
  bool pending_unk = false;  // fuse_unk: one unk for a run of unknown characters
  for (char ch : word) {
    const auto b = static_cast<unsigned char>(ch);
    if (byte_id[b] >= 0) {
      if (pending_unk) add(*unk), pending_unk = false;
      add(byte_id[b]);
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char u : abc.utf8[b]) all = all && fallback_id[static_cast<unsigned char>(u)] >= 0;
      if (all) {
        for (char u : abc.utf8[b]) add(fallback_id[static_cast<unsigned char>(u)]);
        continue;
      }
    }
    if (unk) {
      if (pending_unk && !fuse_unk) add(*unk);
      pending_unk = true;
    }
    // Without unk_token the character is dropped, as `tokenizers` does.
  }
  if (pending_unk) add(*unk);
  if (sym.empty()) return {};
  sym.back().next = -1;

  struct Cand {
    int32_t rank, pos, right, left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    auto it = merges.find(pair_key(sym[size_t(l)].id, sym[size_t(r)].id));
    if (it != merges.end())
      heap.push({it->second.rank, l, r, sym[size_t(l)].id, sym[size_t(r)].id, it->second.id});
  };
  for (size_t k = 0; k + 1 < sym.size(); ++k) consider(int32_t(k), int32_t(k + 1));
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& l = sym[size_t(c.pos)];
    Sym& r = sym[size_t(c.right)];
    if (!l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
    l.id = c.merged;
    l.next = r.next;
    r.alive = false;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.pos;
    consider(l.prev, c.pos);
    consider(c.pos, l.next);
  }
  std::vector<int32_t> ids;
  for (int32_t k = 0; k >= 0; k = sym[size_t(k)].next) ids.push_back(sym[size_t(k)].id);
  return ids;
}

// ---- decoding

const std::string& Tokenizer::Impl::token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_token.size() || !id_known[size_t(id)])
    throw Error(origin + ": token id " + std::to_string(id) + " is not in the vocabulary (size " +
                std::to_string(id_token.size()) + ")");
  return id_token[size_t(id)];
}

// The ByteLevel decoder: a token whose characters are all in the byte alphabet stands for those bytes; any
// other (an added token with a space, say) for its own text.
std::string Tokenizer::Impl::token_bytes(int32_t id) const {
  const std::string& t = token(id);
  if (!byte_level_decoder) return t;
  const ByteAlphabet& abc = alphabet();
  std::string out;
  for (size_t i = 0; i < t.size();) {
    Utf8Char c = next_char(t, i);
    if (c.cp >= abc.byte_of.size() || abc.byte_of[c.cp] < 0) return t;
    out += char(abc.byte_of[c.cp]);
    i += c.len;
  }
  return out;
}

// ---- parsing

namespace {

struct Reader {
  const Tokenizer::Impl& t;

  bool flag(const json& obj, const char* key, bool def, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) t.fail(where + "." + key, "expected true or false, got " + it->dump());
    return it->get<bool>();
  }
  std::optional<std::string> opt_string(const json& obj, const char* key, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) t.fail(where + "." + key, "expected a string, got " + it->dump());
    return it->get<std::string>();
  }
  std::string type_of(const json& obj, const std::string& where) const {
    if (!obj.is_object()) t.fail(where, "expected an object, got " + obj.dump());
    auto ty = opt_string(obj, "type", where);
    if (!ty) t.fail(where, "has no \"type\"");
    return *ty;
  }
  int32_t id(const json& v, const std::string& where) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxId)
      t.fail(where, "expected a token id (an integer from 0 to " + std::to_string(kMaxId - 1) + "), got " +
                        v.dump());
    return int32_t(v.get<int64_t>());
  }
};

void read_model(Tokenizer::Impl& t, const json& root) {
  Reader rd{t};
  auto mit = root.find("model");
  if (mit == root.end() || mit->is_null()) t.fail("model", "missing (expected a BPE model object)");
  const json& m = *mit;
  if (!m.is_object()) t.fail("model", "expected an object, got " + m.dump());
  if (auto ty = rd.opt_string(m, "type", "model"); ty && *ty != "BPE")
    t.fail("model.type", "'" + *ty + "' is not supported (only byte-level \"BPE\")");
  if (auto d = m.find("dropout"); d != m.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0))
    t.fail("model.dropout", "BPE dropout is not supported (it makes encoding random), got " + d->dump());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto v = rd.opt_string(m, k, "model"); v && !v->empty())
      t.fail(std::string("model.") + k, "'" + *v + "' is not supported (byte-level BPE has none)");
  t.fuse_unk = rd.flag(m, "fuse_unk", false, "model");
  t.byte_fallback = rd.flag(m, "byte_fallback", false, "model");
  t.ignore_merges = rd.flag(m, "ignore_merges", false, "model");

  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object())
    t.fail("model.vocab", vit == m.end() ? "missing" : "expected an object of token -> id");
  t.vocab.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it)
    t.vocab[it.key()] = rd.id(it.value(), "model.vocab['" + it.key() + "']");

  auto git = m.find("merges");
  if (git == m.end() || !git->is_array())
    t.fail("model.merges",
           git == m.end() ? "missing" : std::string("expected an array, got ") + git->type_name());
  t.merges.reserve(git->size());
  auto lookup = [&](const std::string& s, const std::string& where) {
    auto it = t.vocab.find(s);
    if (it == t.vocab.end()) t.fail(where, "'" + s + "' is not in the vocabulary");
    return it->second;
  };
  for (size_t i = 0; i < git->size(); ++i) {
    const json& e = (*git)[i];
    const std::string where = "model.merges[" + std::to_string(i) + "]";
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() ||
          s.find(' ', sp + 1) != std::string::npos)
        t.fail(where, "expected \"left right\" (two tokens, one space), got " + e.dump());
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      t.fail(where, "expected \"left right\" or [\"left\", \"right\"], got " + e.dump());
    }
    int32_t ia = lookup(a, where), ib = lookup(b, where), im = lookup(a + b, where + " (merged)");
    t.merges[pair_key(ia, ib)] = {int32_t(i), im};  // a repeated pair takes its last rank, as in `tokenizers`
  }

  if (auto u = rd.opt_string(m, "unk_token", "model")) t.unk = lookup(*u, "model.unk_token");
  const ByteAlphabet& abc = alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = t.vocab.find(abc.utf8[size_t(b)]);
    t.byte_id[size_t(b)] = it == t.vocab.end() ? -1 : it->second;
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto f = t.vocab.find(std::string_view(name));
    t.fallback_id[size_t(b)] = f == t.vocab.end() ? -1 : f->second;
  }
}

void read_added(Tokenizer::Impl& t, const json& root) {
  Reader rd{t};
  auto ait = root.find("added_tokens");
  if (ait == root.end() || ait->is_null()) return;
  if (!ait->is_array()) t.fail("added_tokens", "expected an array, got " + ait->dump());
  for (size_t i = 0; i < ait->size(); ++i) {
    const json& e = (*ait)[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) t.fail(where, "expected an object, got " + e.dump());
    AddedToken a;
    auto content = rd.opt_string(e, "content", where);
    if (!content || content->empty()) t.fail(where + ".content", "missing or empty");
    a.content = *content;
    if (!e.contains("id")) t.fail(where + ".id", "missing");
    a.id = rd.id(e["id"], where + ".id");
    a.special = rd.flag(e, "special", false, where);
    a.single_word = rd.flag(e, "single_word", false, where);
    a.lstrip = rd.flag(e, "lstrip", false, where);
    a.rstrip = rd.flag(e, "rstrip", false, where);
    a.normalized = rd.flag(e, "normalized", !a.special, where);
    t.added.push_back(std::move(a));
  }
  for (size_t k = 0; k < t.added.size(); ++k) {
    const AddedToken& a = t.added[k];
    (a.normalized ? t.norm_index : t.raw_index)[static_cast<unsigned char>(a.content[0])].push_back(k);
    (a.normalized ? t.any_norm : t.any_raw) = true;
  }
  for (auto* index : {&t.raw_index, &t.norm_index})
    for (auto& v : *index)
      std::stable_sort(v.begin(), v.end(), [&](size_t x, size_t y) {
        return t.added[x].content.size() > t.added[y].content.size();
      });
}

void read_ids(Tokenizer::Impl& t) {
  int64_t n = 0;
  for (auto& [tok, id] : t.vocab) n = std::max<int64_t>(n, int64_t(id) + 1);
  for (auto& a : t.added) n = std::max<int64_t>(n, int64_t(a.id) + 1);
  t.id_token.assign(size_t(n), {});
  t.id_known.assign(size_t(n), 0);
  t.id_special.assign(size_t(n), 0);
  for (auto& [tok, id] : t.vocab) {
    if (t.id_known[size_t(id)])
      t.fail("model.vocab", "id " + std::to_string(id) + " is used by both '" + t.id_token[size_t(id)] +
                                "' and '" + tok + "'");
    t.id_token[size_t(id)] = tok;
    t.id_known[size_t(id)] = 1;
  }
  for (auto& a : t.added) {
    t.id_token[size_t(a.id)] = a.content;
    t.id_known[size_t(a.id)] = 1;
    t.id_special[size_t(a.id)] = a.special;
  }
}

void read_normalizer(Tokenizer::Impl& t, const json& root) {
  Reader rd{t};
  auto it = root.find("normalizer");
  if (it == root.end() || it->is_null()) return;
  std::string ty = rd.type_of(*it, "normalizer");
  if (ty == "Sequence" && it->contains("normalizers") && (*it)["normalizers"].is_array() &&
      (*it)["normalizers"].empty())
    return;
  t.fail("normalizer", "type '" + ty + "' is not supported (only byte-level BPE without a normalizer)");
}

void read_byte_level(Tokenizer::Impl& t, const json& p, const std::string& where) {
  Reader rd{t};
  t.add_prefix_space = rd.flag(p, "add_prefix_space", true, where);
  t.use_regex = rd.flag(p, "use_regex", true, where);
}

void read_pre_tokenizer(Tokenizer::Impl& t, const json& root) {
  Reader rd{t};
  auto it = root.find("pre_tokenizer");
  if (it == root.end() || it->is_null())
    t.fail("pre_tokenizer", "missing (only byte-level BPE, with a ByteLevel pre-tokenizer, is supported)");
  std::string ty = rd.type_of(*it, "pre_tokenizer");
  if (ty == "ByteLevel") {
    read_byte_level(t, *it, "pre_tokenizer");
    return;
  }
  if (ty != "Sequence")
    t.fail("pre_tokenizer", "type '" + ty + "' is not supported (ByteLevel, or Digits then ByteLevel)");
  auto steps = it->find("pretokenizers");
  if (steps == it->end() || !steps->is_array())
    t.fail("pre_tokenizer.pretokenizers", "missing or not an array");
  bool byte_level = false;
  for (size_t i = 0; i < steps->size(); ++i) {
    const std::string where = "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]";
    std::string sty = rd.type_of((*steps)[i], where);
    if (sty == "ByteLevel" && !byte_level) {
      read_byte_level(t, (*steps)[i], where);
      byte_level = true;
    } else if (sty == "Digits" && !byte_level && t.digits == Tokenizer::Impl::Digits::None) {
      t.digits = rd.flag((*steps)[i], "individual_digits", false, where) ? Tokenizer::Impl::Digits::Individual
                                                                         : Tokenizer::Impl::Digits::Runs;
    } else {
      t.fail(where, "type '" + sty + "' is not supported here (the sequence must be [Digits,] ByteLevel)");
    }
  }
  if (!byte_level)
    t.fail("pre_tokenizer", "the sequence has no ByteLevel step (only byte-level BPE is supported)");
}

void read_post_processor(Tokenizer::Impl& t, const json& p, const std::string& where) {
  Reader rd{t};
  std::string ty = rd.type_of(p, where);
  auto known = [&](const json& v, const std::string& w) {
    int32_t id = rd.id(v, w);
    if (!std::any_of(t.added.begin(), t.added.end(), [&](const AddedToken& a) { return a.id == id; }) &&
        !std::any_of(t.vocab.begin(), t.vocab.end(), [&](const auto& kv) { return kv.second == id; }))
      t.fail(w, "id " + std::to_string(id) + " is not a token");
    return id;
  };
  if (ty == "ByteLevel") return;
  if (ty == "Sequence") {
    auto ps = p.find("processors");
    if (ps == p.end() || !ps->is_array()) t.fail(where + ".processors", "missing or not an array");
    for (size_t i = 0; i < ps->size(); ++i)
      read_post_processor(t, (*ps)[i], where + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (ty == "RobertaProcessing" || ty == "BertProcessing") {
    for (const char* k : {"cls", "sep"}) {
      auto v = p.find(k);
      if (v == p.end() || !v->is_array() || v->size() != 2) t.fail(where + "." + k, "expected [token, id]");
      (std::string(k) == "cls" ? t.post_before : t.post_after)
          .push_back(known((*v)[1], where + "." + k + "[1]"));
    }
    return;
  }
  if (ty != "TemplateProcessing")
    t.fail(where, "type '" + ty +
                      "' is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, "
                      "ByteLevel)");
  auto single = p.find("single");
  if (single == p.end() || !single->is_array()) t.fail(where + ".single", "missing or not an array");
  auto specials = p.find("special_tokens");
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& piece = (*single)[i];
    const std::string w = where + ".single[" + std::to_string(i) + "]";
    if (piece.is_object() && piece.contains("Sequence") && !seen_sequence) {
      seen_sequence = true;
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken") || !piece["SpecialToken"].is_object())
      t.fail(w, "expected one {\"Sequence\": ...} and {\"SpecialToken\": ...} pieces, got " + piece.dump());
    auto name = rd.opt_string(piece["SpecialToken"], "id", w + ".SpecialToken");
    if (!name) t.fail(w + ".SpecialToken.id", "missing");
    if (specials == p.end() || !specials->is_object() || !specials->contains(*name))
      t.fail(where + ".special_tokens", "has no entry '" + *name + "'");
    // find(), never a const operator[] on a key that may be absent (nlohmann asserts there).
    const json& entry = specials->find(*name).value();
    auto ids_it = entry.is_object() ? entry.find("ids") : entry.end();
    if (!entry.is_object() || ids_it == entry.end() || !ids_it->is_array())
      t.fail(where + ".special_tokens['" + *name + "'].ids", "missing or not an array");
    const json& ids = *ids_it;
    for (size_t k = 0; k < ids.size(); ++k)
      (seen_sequence ? t.post_after : t.post_before)
          .push_back(
              known(ids[k], where + ".special_tokens['" + *name + "'].ids[" + std::to_string(k) + "]"));
  }
  if (!seen_sequence) t.fail(where + ".single", "has no {\"Sequence\": ...} piece");
}

void read_decoder(Tokenizer::Impl& t, const json& root) {
  Reader rd{t};
  auto it = root.find("decoder");
  if (it == root.end() || it->is_null()) {
    t.byte_level_decoder = false;  // `tokenizers` then joins the tokens with spaces
    return;
  }
  std::string ty = rd.type_of(*it, "decoder");
  if (ty == "ByteLevel") return;
  if (ty == "Sequence" && it->contains("decoders") && (*it)["decoders"].is_array() &&
      !(*it)["decoders"].empty()) {
    const json& ds = (*it)["decoders"];
    for (size_t i = 0; i < ds.size(); ++i)
      if (std::string sty = rd.type_of(ds[i], "decoder.decoders[" + std::to_string(i) + "]");
          sty != "ByteLevel")
        t.fail("decoder.decoders[" + std::to_string(i) + "]",
               "type '" + sty + "' is not supported (ByteLevel)");
    return;
  }
  t.fail("decoder", "type '" + ty + "' is not supported (ByteLevel)");
}

std::optional<int32_t> special_named(const Tokenizer::Impl& t, std::initializer_list<const char*> names) {
  for (const char* n : names)
    for (const AddedToken& a : t.added)
      if (a.special && a.content == n) return a.id;
  return std::nullopt;
}

void read_all_sections(Tokenizer::Impl& t, const json& root) {
  read_model(t, root);
  read_added(t, root);
  read_ids(t);
  read_normalizer(t, root);
  read_pre_tokenizer(t, root);
  if (auto it = root.find("post_processor"); it != root.end() && !it->is_null())
    read_post_processor(t, *it, "post_processor");
  read_decoder(t, root);
  if (t.post_before.size() == 1) t.bos = t.post_before[0];
  if (t.post_after.size() == 1) t.eos = t.post_after[0];
  if (!t.bos) t.bos = special_named(t, {"<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"});
  if (!t.eos) t.eos = special_named(t, {"<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"});
}

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder, expected a JSON file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open the file");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": read error");
  return ss.str();
}

}  // namespace

// ---- public API

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& origin) {
  auto t = std::make_unique<Impl>();
  t->origin = origin;
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double (1e995)
    t->fail("", std::string("not valid JSON (") + e.what() + ")");
  }
  if (!root.is_object()) t->fail("", "expected a JSON object at the top level");
  // The readers check each field's type; a shape they do not expect that slips past them (an array where an
  // object belongs) surfaces as a json exception, which is the file's fault too.
  try {
    read_all_sections(*t, root);
  } catch (const json::exception& e) {
    t->fail("", std::string("malformed tokenizer (") + e.what() + ")");
  }
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  Tokenizer tok = from_json(read_text(path), path);
  std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(config, ec)) return tok;
  tok.apply_config(read_text(config.string()), config.string(), path);
  return tok;
}

void Tokenizer::apply_config(const std::string& text, const std::string& origin, const std::string& tokenizer) {
  // bos_token / eos_token: a string or {"content": ...}; the file names them, tokenizer.json gives the ids.
  json c;
  try {
    c = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, out_of_range (a number past a double)
    throw Error(origin + ": not valid JSON (" + e.what() + ")");
  }
  if (!c.is_object()) throw Error(origin + ": expected a JSON object at the top level");
  std::optional<int32_t> ids[2] = {impl_->bos, impl_->eos};
  const char* keys[2] = {"bos_token", "eos_token"};
  for (int k = 0; k < 2; ++k) {
    const char* key = keys[k];
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) continue;
    const json* v = &*it;
    if (it->is_object()) {
      auto content = it->find("content");
      if (content == it->end()) throw Error(origin + ": " + key + ": an object without \"content\": " + it->dump());
      v = &*content;
    }
    if (!v->is_string()) throw Error(origin + ": " + key + ": expected a token string, got " + it->dump());
    const std::string& name = v->get_ref<const std::string&>();
    std::optional<int32_t> id = token_to_id(name);
    if (!id) throw Error(origin + ": " + key + " '" + name + "' is not a token of " + tokenizer);
    ids[k] = id;
  }
  impl_->bos = ids[0], impl_->eos = ids[1];
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = impl_->post_before;
  impl_->encode_text(text, out);
  if (add_special) out.insert(out.end(), impl_->post_after.begin(), impl_->post_after.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    std::string b = impl_->token_bytes(id);  // throws for an unknown id even when it would be skipped
    if (skip_special && impl_->id_special[size_t(id)]) continue;
    if (!impl_->byte_level_decoder && !first) bytes += ' ';
    bytes += b;
    first = false;
  }
  return utf8_lossy(bytes);
}

std::string Tokenizer::token_bytes(int32_t id) const {
  return impl_->token_bytes(id);
}

int64_t Tokenizer::vocab_size() const {
  return int64_t(impl_->id_token.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  return impl_->token(id);
}

bool Tokenizer::has_token(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_known.size() && impl_->id_known[size_t(id)];
}

std::vector<std::string> Tokenizer::merges() const {
  std::vector<std::pair<int32_t, uint64_t>> byrank;
  byrank.reserve(impl_->merges.size());
  for (const auto& [key, m] : impl_->merges) byrank.emplace_back(m.rank, key);
  std::sort(byrank.begin(), byrank.end());
  std::vector<std::string> out;
  out.reserve(byrank.size());
  for (const auto& [rank, key] : byrank)
    out.push_back(impl_->token(int32_t(key >> 32)) + " " + impl_->token(int32_t(key & 0xffffffffu)));
  return out;
}

Tokenizer::DigitSplit Tokenizer::digit_split() const {
  switch (impl_->digits) {
    case Impl::Digits::None: return DigitSplit::None;
    case Impl::Digits::Individual: return DigitSplit::Individual;
    case Impl::Digits::Runs: return DigitSplit::Runs;
  }
  return DigitSplit::None;
}

bool Tokenizer::is_special(int32_t id) const {
  impl_->token(id);
  return impl_->id_special[size_t(id)];
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}

}  // namespace mgn
