// The Hugging Face `tokenizers` library itself (its Node binding, npm package "tokenizers": the Rust crate
// compiled to a native module) for tests/tokenizer_test.cpp.
//   node hf_tokenizers_ids.js DIR   (DIR holds what tests/ref/bpe_reference.py wrote)
// 1. encodes and decodes cases.json's strings with each DIR/<config>/tokenizer.json;
// 2. trains the library's own byte-level BPE (default trainer) on DIR/corpus.txt, adds three special
//    tokens, saves it as DIR/hf_trained/tokenizer.json and encodes the same strings with it;
// and writes DIR/hf.json: {"expected", "expected_special", "decoded", "decoded_skip_special"}, keyed by
// config like cases.json, with "hf_trained" as one more config. Exits 3 when the package is not found
// (looked up as usual, then under `npm root -g`).
"use strict";
const fs = require("fs");
const path = require("path");

function load_tokenizers() {
  try {
    return require("tokenizers");
  } catch (e) {
    try {
      const root = require("child_process").execSync("npm root -g", { encoding: "utf8" }).trim();
      return require(path.join(root, "tokenizers"));
    } catch (e2) {
      process.stderr.write("the npm package 'tokenizers' is not installed: " + e.message + "\n");
      process.exit(3);
    }
  }
}
const tokenizers = load_tokenizers();

function train(dir) {
  const tok = new tokenizers.Tokenizer(tokenizers.BPE.empty());
  tok.setPreTokenizer(tokenizers.byteLevelPreTokenizer(false, true));
  tok.train([path.join(dir, "corpus.txt")]);
  tok.addSpecialTokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]);
  fs.mkdirSync(path.join(dir, "hf_trained"), { recursive: true });
  const file = path.join(dir, "hf_trained", "tokenizer.json");
  tok.save(file, true);
  // The binding has no ByteLevel decoder constructor: add it to the saved file.
  const json = JSON.parse(fs.readFileSync(file, "utf8"));
  json.decoder = { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true };
  fs.writeFileSync(file, JSON.stringify(json, null, 1));
}

async function main() {
  const dir = process.argv[2];
  const cases = JSON.parse(fs.readFileSync(path.join(dir, "cases.json"), "utf8"));
  const out = { expected: {}, expected_special: {}, decoded: {}, decoded_skip_special: {} };
  train(dir);
  for (const name of [...Object.keys(cases.expected), "hf_trained"]) {
    const tok = tokenizers.Tokenizer.fromFile(path.join(dir, name, "tokenizer.json"));
    for (const key of Object.keys(out)) out[key][name] = [];
    for (const s of cases.strings) {
      const ids = (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
      out.expected[name].push(ids);
      out.expected_special[name].push((await tok.encode(s, null, { addSpecialTokens: true })).getIds());
      out.decoded[name].push(await tok.decode(ids, false));
      out.decoded_skip_special[name].push(await tok.decode(ids, true));
    }
  }
  fs.writeFileSync(path.join(dir, "hf.json"), JSON.stringify(out));
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
