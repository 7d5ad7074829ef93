// `mgn generate`: tokenizer.json encodes the prompt (with the post-processor's special tokens, as HF's
// tokenizer(prompt) does), llama::generate runs the decode graph token by token, and each new token's bytes
// are written as it arrives (a character split across tokens completes on the terminal).
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/llama.h"
#include "mgn/tokenizer.h"

namespace mgn::tool {

namespace {

struct GenerateArgs {
  std::string dir, prompt, weights;
  int64_t max_tokens = 64, top_k = 0;
  double temperature = 0;
  uint64_t seed = 0;
  CompileFlags compile;
};

int generate_text(const GenerateArgs& a, const Context& c) {
  llama::Config cfg = llama::Config::from_file(a.dir + "/config.json");
  Tokenizer tok = Tokenizer::from_file(a.dir + "/tokenizer.json");
  std::vector<int32_t> prompt = tok.encode(a.prompt, true);
  if (prompt.empty() && tok.bos_id()) prompt.push_back(*tok.bos_id());
  if (prompt.empty()) throw Error("the prompt encodes to no tokens and the tokenizer has no bos token");
  const int64_t cache = int64_t(prompt.size()) + a.max_tokens;
  if (cache > cfg.max_position_embeddings)
    throw UsageError("the prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens " +
                     std::to_string(a.max_tokens) + " exceeds max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));

  auto t0 = std::chrono::steady_clock::now();
  Graph g = llama::decode_graph(cfg, {.batch = 1, .seq = cache});
  Session s = compile(g, compile_options(c, a.compile, Mode::Infer));
  const std::string weights = a.weights.empty() ? a.dir : a.weights;
  if (weights != "random") llama::load_weights(s, llama::read_weights(cfg, weights));
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "%s: %lld layers, hidden %lld, vocab %lld; backend %s; prompt %zu tokens; loaded in %.1f s\n",
               a.dir.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size,
               (long long)cfg.vocab_size, s.backend(), prompt.size(), load_s);

  std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
  std::fflush(stdout);
  auto t1 = std::chrono::steady_clock::now();
  auto emit = [](int32_t id, void* user) {
    const Tokenizer& t = *static_cast<const Tokenizer*>(user);
    std::string bytes;
    try {
      if (t.is_special(id)) return;  // eos and the like
      bytes = t.token_bytes(id);
    } catch (const Error&) {  // a model row past the tokenizer's vocabulary
      bytes = "[" + std::to_string(id) + "]";
    }
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
  };
  llama::SampleOptions opt{.max_new_tokens = a.max_tokens,
                           .temperature = a.temperature,
                           .top_k = a.top_k,
                           .seed = a.seed,
                           .eos_id = tok.eos_id().value_or(-1)};
  std::vector<int32_t> out = llama::generate(s, cfg, prompt, opt, emit, &tok);
  double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("\n");
  std::fprintf(stderr, "%zu new tokens in %.2f s (%.1f tokens/s, prompt included)\n", out.size(), gen_s,
               double(out.size()) / gen_s);
  return 0;
}

}  // namespace

Run declare_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  add_model_dir(app, a->dir);
  app.add_option("--prompt", a->prompt, "the text to continue")->required();
  app.add_option("--max-tokens", a->max_tokens, "new tokens at most (eos ends earlier)")->check(at_least(1));
  app.add_option("--temperature", a->temperature, "0: greedy; else sampling at this temperature")
      ->check(number_at_least(0));
  app.add_option("--top-k", a->top_k, "sample among the k likeliest tokens (0: all)")->check(at_least(0));
  app.add_option("--seed", a->seed, "sampling seed")->check(at_least(0));
  app.add_option(
         "--weights", a->weights,
         "weights file or folder (default MODEL_DIR); random keeps the random initialization (timing)")
      ->type_name("PATH|random");
  add_compile_flags(app, a->compile);
  app.footer(
      "Streams a continuation of the prompt with the KV-cache decode graph; temperature 0 (the default) is\n"
      "greedy.");
  return [a](const Context& c) { return generate_text(*a, c); };
}

}  // namespace mgn::tool
