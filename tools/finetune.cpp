// `mgn finetune MODEL_DIR --text FILE --out DIR [--steps N] [--batch B] [--seq S] [--lr X]
//               [--backend auto|cpu|vulkan] [--device D] [--precision P] [--weights PATH|random] [--seed S]`
//
// Fine-tunes a Hugging Face Llama-family model on a text file: tokenizer.json encodes the file, the token
// stream is cut into [B, S] windows (in order, wrapping around), and each AdamW step trains next-token
// cross-entropy on one window batch. DIR receives config.json, tokenizer.json (and tokenizer_config.json
// when the model has one) and model.safetensors with the trained weights under their HF names, written
// atomically, so `mgn generate DIR` and `mgn finetune DIR` load it like the original.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "metrics.h"
#include "mgn/llama.h"
#include "mgn/optim.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"
#include "mgn/tokenizer.h"
#include "mgn/types.h"
#include "progress.h"

namespace mgn::tool {
namespace {

struct FinetuneArgs {
  std::string dir, text, out, weights, metrics;
  int64_t steps = 100, batch = 4, seq = 128;
  double lr = 1e-4;
  uint64_t seed = 0;
  CompileFlags compile;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open --text file " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int finetune(const FinetuneArgs& a, const Context& c) {
  const std::string& dir = a.dir;
  const std::string& out = a.out;
  const int64_t steps = a.steps, batch = a.batch, seq = a.seq;
  if (std::filesystem::weakly_canonical(dir) == std::filesystem::weakly_canonical(out))
    throw UsageError("--out must differ from the model directory (the original is never overwritten)");

  llama::Config cfg = llama::Config::from_file(dir + "/config.json");
  Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  if (seq > cfg.max_position_embeddings)
    throw UsageError("--seq " + std::to_string(seq) + " exceeds max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));
  std::vector<int32_t> tokens = tok.encode(read_text(a.text));
  if (int64_t(tokens.size()) < seq)
    throw Error("the text encodes to " + std::to_string(tokens.size()) + " tokens, fewer than --seq " +
                std::to_string(seq));
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg.vocab_size)
      throw Error("token id " + std::to_string(t) + " is outside the model's vocabulary (" +
                  std::to_string(cfg.vocab_size) + "): tokenizer and config do not match");

  Graph g = llama::loss_graph(cfg, {.batch = batch, .seq = seq, .seed = a.seed});
  CompileOptions copt = compile_options(c, a.compile, Mode::Train);
  copt.optimizer = AdamW{.lr = a.lr};
  Session s = compile(g, copt);
  const std::string weights = a.weights.empty() ? dir : a.weights;
  if (weights != "random") llama::load_weights(s, llama::read_weights(cfg, weights));
  std::fprintf(stderr, "%s: %lld layers, hidden %lld; %zu tokens of text; %lld steps of %lldx%lld on %s\n",
               dir.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size, tokens.size(),
               (long long)steps, (long long)batch, (long long)seq, s.backend());

  const std::string metrics_path = a.metrics == "none" ? std::string()
                                   : a.metrics.empty() ? out + "/metrics.jsonl"
                                                       : a.metrics;
  MetricsLog metrics(metrics_path);
  metrics.write("run", {{"command", "finetune"},
                        {"model", dir},
                        {"backend", s.backend()},
                        {"device_type", s.device_type()},
                        {"batch", batch},
                        {"seq", seq},
                        {"optimizer", "AdamW"},
                        {"lr", a.lr},
                        {"steps", steps},
                        {"text_tokens", tokens.size()}});
  Progress bar("finetune", steps, "steps");
  // Windows of seq tokens in text order; the stream wraps around when it runs out.
  size_t cursor = 0;
  std::vector<int32_t> ids(size_t(batch * seq));
  const auto t0 = std::chrono::steady_clock::now();
  float first = 0, last = 0;
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t b = 0; b < batch; ++b) {
      if (cursor + size_t(seq) > tokens.size()) cursor = 0;
      std::copy(tokens.begin() + std::ptrdiff_t(cursor),
                tokens.begin() + std::ptrdiff_t(cursor + size_t(seq)), ids.begin() + std::ptrdiff_t(b * seq));
      cursor += size_t(seq);
    }
    s.set_input("ids", ids);
    s.set_input("labels", llama::next_token_labels(ids, batch, seq));
    const double lr = s.lr();
    s.step();
    last = s.read_scalar("loss");
    if (step == 0) first = last;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char extra[32];
    std::snprintf(extra, sizeof extra, "loss %.4f", last);
    if (step + 1 == steps)
      bar.finish(extra);
    else
      bar.update(step + 1, extra);
    metrics.write("step", {{"step", step + 1},
                           {"loss", last},
                           {"lr", lr},
                           {"tokens_per_s", double((step + 1) * batch * seq) / el},
                           {"samples_per_s", double((step + 1) * batch) / el},
                           {"time_s", el}});
  }
  metrics.write("end", {{"first_loss", first}, {"last_loss", last}, {"steps", steps}});

  std::filesystem::create_directories(out);
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    const std::filesystem::path src = std::filesystem::path(dir) / file;
    if (std::filesystem::exists(src))
      std::filesystem::copy_file(src, std::filesystem::path(out) / file,
                                 std::filesystem::copy_options::overwrite_existing);
  }
  std::vector<StoredTensor> tensors;
  for (const auto& [name, shape] : llama::parameter_shapes(cfg))
    tensors.push_back(StoredTensor::from_f32(name, shape, s.read(name)));
  write_safetensors(out + "/model.safetensors", tensors,
                    {{"format", "pt"}, {"mgn.finetune_steps", std::to_string(steps)}});
  std::printf("loss: first step %.4f, last step %.4f\n", first, last);
  std::printf("saved: %s/model.safetensors (%zu tensors), config.json, tokenizer.json\n", out.c_str(),
              tensors.size());
  if (metrics.enabled()) std::printf("metrics: %s\n", metrics.path().c_str());
  return 0;
}

}  // namespace

Run declare_finetune(CLI::App& app) {
  auto a = std::make_shared<FinetuneArgs>();
  add_model_dir(app, a->dir);
  app.add_option("--text", a->text, "the training text (UTF-8)")->required()->check(CLI::ExistingFile);
  app.add_option("--out", a->out, "output directory (not MODEL_DIR)")->required()->type_name("DIR");
  app.add_option("--steps", a->steps, "AdamW steps")->check(at_least(1));
  app.add_option("--batch", a->batch, "windows per step")->check(at_least(1));
  app.add_option("--seq", a->seq, "tokens per window")->check(at_least(2));
  app.add_option("--lr", a->lr, "AdamW learning rate")->check(positive_number());
  app.add_option("--weights", a->weights,
                 "weights file or folder (default MODEL_DIR); random keeps the random initialization")
      ->type_name("PATH|random");
  app.add_option("--seed", a->seed, "initialization seed")->check(at_least(0));
  app.add_option("--metrics", a->metrics, "JSON Lines metrics file (default DIR/metrics.jsonl; none: off)")
      ->type_name("FILE");
  add_compile_flags(app, a->compile);
  app.footer(
      "AdamW next-token training on a text file (tokenizer.json of MODEL_DIR) with a progress bar; DIR gets\n"
      "config.json, tokenizer.json and model.safetensors, loadable by `mgn generate DIR`.");
  return [a](const Context& c) { return finetune(*a, c); };
}

}  // namespace mgn::tool
