// mgn::Tokenizer against two references.
//  * tests/ref/bpe_reference.py (always; /usr/bin/python3, stdlib only): an independent byte-level BPE that
//    trains 300 merges on a public-domain text, writes three tokenizer.json files (GPT-2 style; SmolLM2
//    style with Digits(individual) and [a, b] merges; add_prefix_space with Digits runs and a
//    TemplateProcessing post-processor), all with special and non-special added tokens, and the ids its own
//    encoder (Python's `re` with \p{L}/\p{N} spelled out from `unicodedata`, GPT-2's merge loop) gives for
//    strings covering ASCII, accented Latin, Greek, Cyrillic, CJK, Indic and Arabic scripts, emoji, digits,
//    contractions, runs of spaces and newlines, control characters and added tokens.
//  * The Hugging Face `tokenizers` library itself, where it is installed: tests/ref/hf_tokenizers_ids.js runs
//    it through its Node binding (npm package "tokenizers", the Rust crate as a native module) on the same
//    files and on a tokenizer that the library trains itself on the same text. Python's `tokenizers` is
//    not on this machine (`/usr/bin/python3 -c 'import tokenizers'` fails); without the npm package the
//    HuggingFace test is skipped, and it is the step to run on the GPU machine
//    (`npm install tokenizers` beside the script or globally, then this test).
#include "mgn/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mgn/types.h"
#include "support/test_util.h"

namespace mgn {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

using test::read_bytes;

const std::string ref_script = std::string(MGN_SOURCE_DIR) + "/tests/ref/bpe_reference.py";
const std::string hf_script = std::string(MGN_SOURCE_DIR) + "/tests/ref/hf_tokenizers_ids.js";

// Runs `cmd DIR` in a fresh directory DIR (seeded with the files of `seed`, if given) and renames it to
// `cached` once it succeeded, so that a concurrent or interrupted run never leaves half a result (ctest runs
// every test in its own process). Returns the exit status and the log.
std::pair<int, std::string> run_cached(const std::string& cmd, const fs::path& cached, const fs::path& seed) {
  std::string d = test::make_temp_dir("bpe");
  if (!seed.empty()) fs::copy(seed, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::remove(fs::path(d) / "done");
  int rc = std::system((cmd + " " + d + " > " + d + "/log.txt 2>&1").c_str());
  std::string log = read_bytes(d + "/log.txt");
  int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::error_code ec;
  if (status == 0) {
    std::ofstream(d + "/done") << "ok\n";
    fs::rename(d, cached, ec);
  }
  if (fs::exists(d)) fs::remove_all(d, ec);
  return {status, log};
}

fs::path cache_path(const std::string& tag, const std::string& key) {
  return fs::temp_directory_path() / ("mgn-" + tag + "-" + std::to_string(std::hash<std::string>{}(key)));
}

// The Python reference's output directory, cached under the temp dir by the script's contents.
const fs::path& ref_dir() {
  static const fs::path dir = [] {
    std::string text = read_bytes(ref_script);
    if (text.empty()) throw Error("cannot read " + ref_script);
    fs::path cached = cache_path("bpe-ref", text + MGN_TORCH_PYTHON);
    if (!fs::exists(cached / "done")) {
      auto [status, log] = run_cached(std::string(MGN_TORCH_PYTHON) + " " + ref_script, cached, {});
      if (status != 0 && !fs::exists(cached / "done"))
        throw Error("bpe_reference.py failed (status " + std::to_string(status) + "):\n" + log);
    }
    return cached;
  }();
  return dir;
}

const json& cases() {
  static const json c = json::parse(read_bytes((ref_dir() / "cases.json").string()));
  return c;
}

// The `tokenizers` library's results (hf.json, and hf_trained/ beside it), cached like the reference's.
// Empty when node or the npm package is missing (*why says so); a failing script is an error.
const fs::path& hf_dir(std::string* why) {
  static std::string reason;
  static const fs::path dir = [] {
    fs::path cached = cache_path("bpe-hf", read_bytes(hf_script) + read_bytes(ref_script));
    if (fs::exists(cached / "done")) return cached;
    auto [status, log] = run_cached("node " + hf_script, cached, ref_dir());
    if (status == 0 || fs::exists(cached / "done")) return cached;
    if (status == 3 || status == 127) {  // the package, or node itself, is not installed
      reason =
          "the Hugging Face tokenizers library is not available to node (install the npm package "
          "\"tokenizers\"): " +
          log;
      return fs::path();
    }
    throw Error("hf_tokenizers_ids.js failed (status " + std::to_string(status) + "):\n" + log);
  }();
  *why = reason;
  return dir;
}

Tokenizer load(const std::string& config) {
  return Tokenizer::from_file((ref_dir() / config / "tokenizer.json").string());
}

std::string show(const std::string& s) {
  return json(s).dump();
}

// Every string of cases.json through `tok`, against the expectations of `want` (cases.json or hf.json) for
// `config`.
void check_against(const Tokenizer& tok, const json& want, const std::string& config, bool round_trip) {
  const json& strings = cases()["strings"];
  ASSERT_EQ(want["expected"][config].size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string s = strings[i].get<std::string>();
    SCOPED_TRACE(config + " string " + std::to_string(i) + ": " + show(s));
    std::vector<int32_t> ids = tok.encode(s);
    EXPECT_EQ(ids, want["expected"][config][i].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.encode(s, true), want["expected_special"][config][i].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.decode(ids), want["decoded"][config][i].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), want["decoded_skip_special"][config][i].get<std::string>());
    // lstrip on <mask> takes the spaces before it into the token.
    if (round_trip && s.find("<mask>") == std::string::npos) {
      EXPECT_EQ(tok.decode(ids), s);
    }
  }
}

TEST(Tokenizer, MatchesReferenceGpt2Style) {
  check_against(load("gpt2"), cases(), "gpt2", true);
}
TEST(Tokenizer, MatchesReferenceSmolLM2Style) {
  check_against(load("smollm"), cases(), "smollm", true);
}
TEST(Tokenizer, MatchesReferencePrefixSpaceAndTemplate) {
  check_against(load("prefix"), cases(), "prefix", false);
}

TEST(Tokenizer, MatchesHuggingFaceTokenizers) {
  std::string why;
  const fs::path& dir = hf_dir(&why);
  // CI installs the package (scripts/setup-debian.sh) and sets MGN_REQUIRE_REFERENCES: there a missing
  // library fails instead of skipping.
  if (dir.empty() && std::getenv("MGN_REQUIRE_REFERENCES")) FAIL() << why;
  if (dir.empty()) GTEST_SKIP() << why;
  json hf = json::parse(read_bytes((dir / "hf.json").string()));
  for (const char* config : {"gpt2", "smollm", "prefix"}) check_against(load(config), hf, config, false);
  // A tokenizer the library trained itself (its merges, its ids); characters it never saw in training have
  // no token and are dropped, as the library drops them.
  check_against(Tokenizer::from_file((dir / "hf_trained" / "tokenizer.json").string()), hf, "hf_trained",
                false);
}

// Random text drawn from every script of the tests plus raw ASCII controls: decode(encode(s)) == s, and the
// per-word cache (second encode) changes nothing.
TEST(Tokenizer, RoundTripsRandomText) {
  Tokenizer tok = load("smollm");
  const std::vector<uint32_t> pool = {
      'a',   'Z',    ' ',    ' ',    '\n',   '\t',    '\r',    '0',    '7',    '\'',   's',      '!',
      '.',   0x00,   0x1F,   0x7F,   0xA0,   0xE9,    0xDF,    0x3B1,  0x416,  0x5D0,  0x627,    0x915,
      0x94D, 0x3000, 0x4E00, 0x3042, 0xAC00, 0x1F600, 0x1F3FD, 0x200D, 0xFE0F, 0x2028, 0x10FFFF, 0xFFFD};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    int len = int(rng() % 40);
    for (int k = 0; k < len; ++k) {
      uint32_t cp = pool[rng() % pool.size()];
      if (cp < 0x80) {
        s += char(cp);
      } else if (cp < 0x800) {
        s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
      } else {
        s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F)),
            s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
      }
    }
    SCOPED_TRACE(show(s));
    std::vector<int32_t> ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
    EXPECT_EQ(tok.encode(s), ids);
  }
}

TEST(Tokenizer, InvalidUtf8IsKeptAndDecodedLossily) {
  Tokenizer tok = load("gpt2");
  // Bytes that are not UTF-8 still encode (byte-level) and come back byte for byte through token_bytes;
  // decode replaces each maximal ill-formed subsequence with U+FFFD, like Rust's from_utf8_lossy.
  const std::string bad = "ok \xC3 \xE2\x82 \xFF\xFE end\xF0\x9F";
  std::vector<int32_t> ids = tok.encode(bad);
  std::string bytes;
  for (int32_t id : ids) bytes += tok.token_bytes(id);
  EXPECT_EQ(bytes, bad);
  EXPECT_EQ(tok.decode(ids), "ok \xEF\xBF\xBD \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD end\xEF\xBF\xBD");
  // U+00E9 is C3 A9: the byte characters 'Ã' (C3 stands for itself) and '©' (A9).
  int32_t c3 = *tok.token_to_id("\xC3\x83"), a9 = *tok.token_to_id("\xC2\xA9");
  EXPECT_EQ(tok.decode({c3}), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode({c3, a9}), "\xC3\xA9");
}

TEST(Tokenizer, VocabularyAndSpecialTokens) {
  Tokenizer tok = load("gpt2");
  json file = json::parse(read_bytes((ref_dir() / "gpt2" / "tokenizer.json").string()));
  EXPECT_EQ(tok.vocab_size(), int64_t(file["model"]["vocab"].size()));
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 2);
  EXPECT_EQ(tok.token_to_id("\xC4\xA0"), 6 + ' ');  // "Ġ", the space byte; bytes follow the 6 added tokens
  EXPECT_EQ(tok.token_to_id("not a token"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(6 + ' '), "\xC4\xA0");
  EXPECT_EQ(tok.id_to_token(1), "<|im_start|>");
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(4));  // [[mgn]]: added, not special
  EXPECT_FALSE(tok.is_special(100));
  EXPECT_THROW(tok.id_to_token(int32_t(tok.vocab_size())), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
  EXPECT_THROW(tok.decode({int32_t(tok.vocab_size())}, true), Error);
  // No post-processor template: eos by its well-known name, no bos.
  EXPECT_EQ(tok.eos_id(), 0);
  EXPECT_EQ(tok.bos_id(), std::nullopt);
  EXPECT_EQ(tok.decode({1, 6 + 'h', 6 + 'i', 2}), "<|im_start|>hi<|im_end|>");
  EXPECT_EQ(tok.decode({1, 6 + 'h', 6 + 'i', 2}, true), "hi");

  // The template's tokens around the sequence are bos and eos.
  Tokenizer pre = load("prefix");
  EXPECT_EQ(pre.bos_id(), 1);
  EXPECT_EQ(pre.eos_id(), 0);

  // tokenizer_config.json beside the file wins.
  std::string d = test::make_temp_dir("tok_config");
  fs::copy_file(ref_dir() / "gpt2" / "tokenizer.json", fs::path(d) / "tokenizer.json");
  std::ofstream(d + "/tokenizer_config.json")
      << R"({"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>", "special": true}})";
  Tokenizer cfg = Tokenizer::from_file(d + "/tokenizer.json");
  EXPECT_EQ(cfg.bos_id(), 1);
  EXPECT_EQ(cfg.eos_id(), 2);
  std::ofstream(d + "/tokenizer_config.json") << R"({"eos_token": "<|nope|>"})";
  EXPECT_THROW(Tokenizer::from_file(d + "/tokenizer.json"), Error);
  fs::remove_all(d);
}

// A tiny hand-written vocabulary for the model options; the expected ids are what `tokenizers` 0.23.2 gives
// for the same files (checked once by hand with its Node binding).
std::string tiny(const json& model_overrides, const json& top_overrides = json::object()) {
  json j = {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab",
         {{"a", 0}, {"b", 1}, {"ab", 2}, {"<unk>", 3}, {"c", 4}, {"abc", 5}, {"<0x78>", 6}, {"\xC4\xA0", 7}}},
        {"merges", {"a b"}}}}};
  if (model_overrides.is_object()) j["model"].update(model_overrides);  // `{}` arrives as null
  if (top_overrides.is_object()) j.update(top_overrides);
  return j.dump();
}

std::vector<int32_t> enc(const std::string& file, const std::string& text) {
  return Tokenizer::from_json(file).encode(text);
}

TEST(Tokenizer, ModelOptions) {
  EXPECT_EQ(enc(tiny({}), "abyya ab"), (std::vector<int32_t>{2, 0, 7, 2}));  // no unk: 'y' is dropped
  EXPECT_EQ(enc(tiny({{"unk_token", "<unk>"}}), "abyya ab"), (std::vector<int32_t>{2, 3, 3, 0, 7, 2}));
  EXPECT_EQ(enc(tiny({{"unk_token", "<unk>"}, {"fuse_unk", true}}), "abyyaz ab"),
            (std::vector<int32_t>{2, 3, 0, 3, 7, 2}));
  EXPECT_EQ(enc(tiny({{"unk_token", "<unk>"}, {"byte_fallback", true}}), "abxxay"),
            (std::vector<int32_t>{2, 6, 6, 0, 3}));
  EXPECT_EQ(enc(tiny({{"ignore_merges", true}}), "abc ab"), (std::vector<int32_t>{5, 7, 2}));
  EXPECT_EQ(enc(tiny({}), "abc ab"), (std::vector<int32_t>{2, 4, 7, 2}));
  std::string no_regex = tiny(
      {}, {{"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}}});
  EXPECT_EQ(enc(no_regex, "ab a b"), (std::vector<int32_t>{7, 2, 7, 0, 7, 1}));
  // Without a decoder `tokenizers` joins the stored tokens with spaces.
  Tokenizer plain = Tokenizer::from_json(tiny({}, {{"decoder", nullptr}}));
  EXPECT_EQ(plain.decode(plain.encode("ab a b")), "ab \xC4\xA0 a \xC4\xA0 b");
}

// Long inputs: a word longer than the cache limit, and many threads sharing one tokenizer's cache.
TEST(Tokenizer, LongWordsAndThreads) {
  Tokenizer tok = load("smollm");
  std::string word(5000, 'e');
  word += "the";
  EXPECT_EQ(tok.decode(tok.encode(word)), word);
  std::string text;
  for (const auto& s : cases()["strings"]) text += s.get<std::string>() + " ";
  for (int i = 0; i < 4; ++i) text += text;
  std::vector<int32_t> want = tok.encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) threads.emplace_back([&, i] { got[i] = tok.encode(text); });
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Tokenizer, MalformedFilesAreErrors) {
  auto with = [](const std::function<void(json&)>& edit) {
    json j = json::parse(tiny({}));
    edit(j);
    return error_of([&] { Tokenizer::from_json(j.dump(), "bad/tokenizer.json"); });
  };
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find("bad/tokenizer.json") != std::string::npos && msg.find(part) != std::string::npos;
  };
  EXPECT_PRED2(has, error_of([] { Tokenizer::from_json("{\"model\": ", "bad/tokenizer.json"); }),
               "not valid JSON");
  EXPECT_PRED2(has, error_of([] { Tokenizer::from_json("[1, 2]", "bad/tokenizer.json"); }), "top level");
  EXPECT_PRED2(has, with([](json& j) { j.erase("model"); }), "model: missing");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["type"] = "WordPiece"; }), "model.type: 'WordPiece'");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["type"] = "Unigram"; }), "not supported");
  EXPECT_PRED2(has, with([](json& j) { j["model"].erase("merges"); }), "model.merges: missing");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["merges"] = "a b"; }), "model.merges: expected an array");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["merges"] = {"a q"}; }),
               "model.merges[0]: 'q' is not in the vocab");
  EXPECT_PRED2(has, with([](json& j) {
                 j["model"]["merges"] = {"a b", "b c"};
               }),
               "model.merges[1] (merged): 'bc'");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["merges"] = {"ab"}; }),
               "model.merges[0]: expected \"left right\"");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["merges"] = {"a  b"}; }), "model.merges[0]");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["merges"] = json::array({json::array({"a"})}); }),
               "model.merges[0]");
  EXPECT_PRED2(has, with([](json& j) {
                 j["model"]["merges"] = json::array({json::array({"a", 3})});
               }),
               "model.merges[0]");
  EXPECT_PRED2(has, with([](json& j) { j["model"].erase("vocab"); }), "model.vocab: missing");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["vocab"]["a"] = -1; }), "model.vocab['a']");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["vocab"]["a"] = "zero"; }), "model.vocab['a']");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["vocab"]["d"] = 1; }), "id 1 is used by both");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["unk_token"] = "<missing>"; }), "model.unk_token");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["dropout"] = 0.1; }), "model.dropout");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }),
               "continuing_subword_prefix");
  EXPECT_PRED2(has, with([](json& j) { j["model"]["fuse_unk"] = "yes"; }), "model.fuse_unk");
  EXPECT_PRED2(has, with([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }), "normalizer: type 'NFC'");
  EXPECT_PRED2(has, with([](json& j) { j["pre_tokenizer"] = nullptr; }), "pre_tokenizer: missing");
  EXPECT_PRED2(has, with([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Whitespace"}};
               }),
               "pre_tokenizer: type 'Whitespace'");
  EXPECT_PRED2(has, with([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Sequence"},
                                       {"pretokenizers", {{{"type", "Split"}}, {{"type", "ByteLevel"}}}}};
               }),
               "pre_tokenizer.pretokenizers[0]: type 'Split'");
  EXPECT_PRED2(has, with([](json& j) {
                 j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}}}};
               }),
               "no ByteLevel step");
  EXPECT_PRED2(has, with([](json& j) {
                 j["decoder"] = {{"type", "WordPiece"}};
               }),
               "decoder: type 'WordPiece'");
  EXPECT_PRED2(has, with([](json& j) {
                 j["post_processor"] = {{"type", "Mystery"}};
               }),
               "post_processor: type 'Mystery'");
  EXPECT_PRED2(has, with([](json& j) {
                 j["post_processor"] = {
                     {"type", "TemplateProcessing"},
                     {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                     {"special_tokens", json::object()}};
               }),
               "special_tokens: has no entry '<s>'");
  EXPECT_PRED2(has, with([](json& j) { j["added_tokens"] = {{{"id", 9}}}; }), "added_tokens[0].content");
  EXPECT_PRED2(has, with([](json& j) {
                 j["added_tokens"] = {{{"content", "<x>"}}};
               }),
               "added_tokens[0].id: missing");
  EXPECT_PRED2(has, with([](json& j) {
                 j["added_tokens"] = {{{"content", "<x>"}, {"id", 9}, {"special", 1}}};
               }),
               "added_tokens[0].special");
  std::string missing = error_of([] { Tokenizer::from_file("/nonexistent/dir/tokenizer.json"); });
  EXPECT_NE(missing.find("/nonexistent/dir/tokenizer.json: cannot open"), std::string::npos) << missing;
}

// Reproducers of the CLI-level mutation fuzzing (issue 30): each escaped from_json / from_file as a json
// exception other than a parse error and aborted the process. Now each is an mgn::Error naming the file.
TEST(Tokenizer, NonParseJsonExceptionsAreErrors) {
  auto has = [](const std::string& msg, const std::string& file, const std::string& part) {
    return msg.find(file) != std::string::npos && msg.find(part) != std::string::npos;
  };
  // A number past a double: nlohmann throws out_of_range (406), not parse_error.
  std::string big = tiny({});
  big.replace(big.find("\"a\":0"), 5, "\"a\":1e995");
  EXPECT_PRED3(has, error_of([&] { Tokenizer::from_json(big, "bad/tokenizer.json"); }), "bad/tokenizer.json",
               "not valid JSON");
  // An array where post_processor.special_tokens expects an object, and an entry without "ids".
  json tpl = {{"type", "TemplateProcessing"},
              {"single", {{{"SpecialToken", {{"id", "a"}}}}, {{"Sequence", {{"id", "A"}}}}}},
              {"special_tokens", json::array({1, 2})}};
  EXPECT_PRED3(has,
               error_of([&] { Tokenizer::from_json(tiny({}, {{"post_processor", tpl}}), "bad/tokenizer.json"); }),
               "bad/tokenizer.json", "special_tokens");
  tpl["special_tokens"] = {{"a", {{"id", "a"}}}};
  EXPECT_PRED3(has,
               error_of([&] { Tokenizer::from_json(tiny({}, {{"post_processor", tpl}}), "bad/tokenizer.json"); }),
               "bad/tokenizer.json", "ids");
  tpl["special_tokens"] = {{"a", json::array({0})}};
  EXPECT_PRED3(has,
               error_of([&] { Tokenizer::from_json(tiny({}, {{"post_processor", tpl}}), "bad/tokenizer.json"); }),
               "bad/tokenizer.json", "ids");
  // The positive control: the same template with a well-formed entry loads and puts 'a' (id 0) first.
  tpl["special_tokens"] = {{"a", {{"id", "a"}, {"ids", {0}}, {"tokens", {"a"}}}}};
  EXPECT_EQ(Tokenizer::from_json(tiny({}, {{"post_processor", tpl}})).encode("b", true),
            (std::vector<int32_t>{0, 1}));

  // tokenizer_config.json: the same gaps.
  Tokenizer tok = Tokenizer::from_json(tiny({}));
  for (const char* text : {R"({"bos_token": 1e995})", R"({"bos_token": {"content": 1e995}})",
                           R"({"eos_token": {"special": true}})", R"({"eos_token": ["a"]})", R"([1e995])"})
    EXPECT_PRED3(has, error_of([&] { tok.apply_config(text, "bad/tokenizer_config.json", "tok.json"); }),
                 "bad/tokenizer_config.json", "") << text;
  tok.apply_config(R"({"bos_token": "b", "eos_token": {"content": "ab"}})", "ok/tokenizer_config.json", "tok.json");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
}

}  // namespace
}  // namespace mgn
