// `mgn finetune MODEL_DIR --text FILE --out DIR [--steps N] [--batch B] [--seq S] [--lr X]
//               [--backend auto|cpu|vulkan] [--device D] [--precision P] [--weights PATH|random] [--seed S]
//               [--replicas N] [--devices LIST] [--data-parallel none|mpi]`
//
// Fine-tunes a Hugging Face Llama-family model on a text file: tokenizer.json encodes the file, the token
// stream is cut into [B, S] windows (in order, wrapping around), and each AdamW step trains next-token
// cross-entropy on one window batch. DIR receives config.json, tokenizer.json (and tokenizer_config.json
// when the model has one) and model.safetensors with the trained weights under their HF names, written
// atomically, so `mgn generate DIR` and `mgn finetune DIR` load it like the original.
//
// Data-parallel (--replicas, --devices, --data-parallel mpi; docs/multi-device.md): --batch is the global
// batch; every process encodes the text and cuts the same windows, replica r of R takes windows [r B/R, (r+1)
// B/R) of each step, and DataParallelTrainer averages the replicas' gradients (GradientScale::Mean). The loss
// is a mean over the non-ignored labels, and every window has seq - 1 of them (the last position is -100), so
// equal shards make the mean of the shard means the full-batch mean. Rank 0 alone prints, writes the metrics,
// the log and the output folder.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "data_parallel_cli.h"
#include "metrics.h"
#include "mgn/checkpoint.h"
#include "mgn/data_parallel.h"
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
  std::string dir, text, out, weights, metrics, log;
  int64_t steps = 100, batch = 4, seq = 128;
  double lr = 1e-4;
  uint64_t seed = 0;
  CompileFlags compile;
  DataParallelFlags dp;
};

// The single-device Session or the data-parallel trainer, behind the few calls the loop makes.
struct Trainee {
  std::optional<Session> session;
  std::unique_ptr<DataParallelTrainer> dp;
  Session& first() { return session ? *session : dp->gradient_session(0); }
  void write_parameter(const std::string& name, const std::vector<float>& v) {
    if (session)
      session->write_parameter(name, v);
    else
      dp->write_parameter(name, v);
  }
  double lr() const { return session ? session->lr() : dp->lr(); }
  float step(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels) {
    if (!session) {
      dp->set_input("ids", ids);
      dp->set_input("labels", labels);
      return dp->step();  // the replicas' losses reduced as the gradients: the full-batch loss
    }
    session->set_input("ids", ids);
    session->set_input("labels", labels);
    session->step();
    return session->read_scalar("loss");
  }
  std::vector<float> read(const std::string& name) { return session ? session->read(name) : dp->read(name); }
  // For --log: the sessions' device memory (data-parallel: replica 0's gradient and update sessions).
  DeviceMemoryReport memory() {
    if (session) return session->device_memory();
    DeviceMemoryReport m = dp->gradient_session(0).device_memory();
    m.allocated_bytes += dp->update_session(0).device_memory().allocated_bytes;
    return m;
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open --text file " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// `place` is this process's place among the data-parallel processes (one process, rank 0, without MPI).
int finetune(const FinetuneArgs& a, const Context& c, const DataParallelPlace& place) {
  const std::string& dir = a.dir;
  const std::string& out = a.out;
  const int64_t steps = a.steps, batch = a.batch, seq = a.seq;
  const bool parallel = a.dp.enabled(), root = place.root();
  const int64_t replicas = parallel ? global_replicas(a.dp, place) : 1;
  CompileOptions copt = compile_options(c, a.compile, Mode::Train);
  copt.optimizer = AdamW{.lr = a.lr};
  // The data-parallel combinations before anything is read or compiled.
  std::vector<DeviceOptions> devices;
  if (parallel) {
    check_batch_split(a.dp, place, batch);
    devices = replica_devices(a.dp, place, copt.device);
  }
  if (std::filesystem::weakly_canonical(dir) == std::filesystem::weakly_canonical(out))
    throw UsageError("--out must differ from the model directory (the original is never overwritten)");
  // The output folder before any training: a path that cannot be written fails now, not after the last step.
  if (root) {
    std::filesystem::create_directories(out);
    check_output_path(out + "/model.safetensors");
  }

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

  // Every rank must cut the same windows for as many steps at the same lr.
  uint64_t text_hash = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int32_t tk : tokens)
    for (int i = 0; i < 4; ++i)
      text_hash = (text_hash ^ ((uint32_t(tk) >> (8 * i)) & 0xffu)) * 1099511628211ull;
  int64_t lr_bits;
  std::memcpy(&lr_bits, &a.lr, sizeof lr_bits);
  check_ranks_agree(place,
                    {{steps, "--steps"},
                     {seq, "--seq"},
                     {int64_t(a.seed), "--seed"},
                     {lr_bits, "--lr (its bits)"},
                     {int64_t(tokens.size()), "the text's token count"},
                     {int64_t(text_hash & 0x7fffffffffffffffull), "the text (a hash of its token ids)"}});

  // The graph at the per-replica batch; the trainer gives every replica rank 0's initial weights, and every
  // process reads the same weights file into all its replicas.
  Graph g = llama::loss_graph(cfg, {.batch = batch / replicas, .seq = seq, .seed = a.seed});
  Trainee t;
  if (parallel)
    t.dp = std::make_unique<DataParallelTrainer>(
        g, DataParallelOptions{.compile = copt, .devices = devices, .group = place.group});
  else
    t.session.emplace(compile(g, copt));
  Session& s = t.first();
  const std::string weights = a.weights.empty() ? dir : a.weights;
  if (weights != "random")
    for (const auto& [name, values] : llama::read_weights(cfg, weights)) t.write_parameter(name, values);
  if (root) {
    std::fprintf(stderr, "%s: %lld layers, hidden %lld; %zu tokens of text; %lld steps of %lldx%lld on %s\n",
                 dir.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size, tokens.size(),
                 (long long)steps, (long long)batch, (long long)seq, s.backend());
    if (parallel)
      std::fprintf(stderr, "data-parallel: batch %lld = %lld replicas x %lld (%d process(es) x %lld)\n",
                   (long long)batch, (long long)replicas, (long long)(batch / replicas), place.ranks,
                   (long long)a.dp.replicas);
  }

  const std::string metrics_path = !root || a.metrics == "none" ? std::string()
                                   : a.metrics.empty()          ? out + "/metrics.jsonl"
                                                                : a.metrics;
  MetricsLog metrics(metrics_path);
  nlohmann::json run = {{"command", "finetune"},          {"model", dir},   {"backend", s.backend()},
                        {"device_type", s.device_type()}, {"batch", batch}, {"seq", seq},
                        {"optimizer", "AdamW"},           {"lr", a.lr},     {"steps", steps},
                        {"text_tokens", tokens.size()}};
  if (parallel) {
    run["replicas"] = replicas;
    run["processes"] = place.ranks;
  }
  metrics.write("run", run);
  Progress bar("finetune", steps, "steps", root);
  // Windows of seq tokens in text order; the stream wraps around when it runs out.
  size_t cursor = 0;
  std::vector<int32_t> ids(size_t(batch * seq));
  const auto t0 = std::chrono::steady_clock::now();
  float first = 0, last = 0;
  // --log: one line per step, the loss's bits first (two runs compare bitwise with cmp), then the device
  // memory the session holds and the process's device-local heap usage (bench/soak.sh reads it for leaks).
  // Data-parallel: rank 0's, with replica 0's two sessions' bytes.
  std::FILE* log = a.log.empty() || !root ? nullptr : std::fopen(a.log.c_str(), "w");
  if (!a.log.empty() && root && !log) throw Error("cannot create the log '" + a.log + "'");
  for (int64_t step = 0; step < steps; ++step) {
    for (int64_t b = 0; b < batch; ++b) {
      if (cursor + size_t(seq) > tokens.size()) cursor = 0;
      std::copy(tokens.begin() + std::ptrdiff_t(cursor),
                tokens.begin() + std::ptrdiff_t(cursor + size_t(seq)), ids.begin() + std::ptrdiff_t(b * seq));
      cursor += size_t(seq);
    }
    const double lr = t.lr();
    last = t.step(ids, llama::next_token_labels(ids, batch, seq));
    if (step == 0) first = last;
    if (log) {
      uint32_t bits;
      std::memcpy(&bits, &last, 4);
      const DeviceMemoryReport m = t.memory();
      std::fprintf(log, "%lld %08x %.6f %llu %llu\n", (long long)step, bits, double(last),
                   (unsigned long long)m.allocated_bytes, (unsigned long long)m.heap_usage_bytes);
    }
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
  if (log && std::fclose(log) != 0) throw Error("cannot write the log '" + a.log + "'");
  if (!root) return 0;  // rank 0 writes the folder

  std::filesystem::create_directories(out);
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"}) {
    const std::filesystem::path src = std::filesystem::path(dir) / file;
    if (std::filesystem::exists(src))
      std::filesystem::copy_file(src, std::filesystem::path(out) / file,
                                 std::filesystem::copy_options::overwrite_existing);
  }
  std::vector<StoredTensor> tensors;
  for (const auto& [name, shape] : llama::parameter_shapes(cfg))
    tensors.push_back(StoredTensor::from_f32(name, shape, t.read(name)));
  write_safetensors(out + "/model.safetensors", tensors,
                    {{"format", "pt"}, {"mgn.finetune_steps", std::to_string(steps)}});
  std::printf("loss: first step %.4f, last step %.4f\n", first, last);
  std::printf("saved: %s/model.safetensors (%zu tensors), config.json, tokenizer.json\n", out.c_str(),
              tensors.size());
  if (metrics.enabled()) std::printf("metrics: %s\n", metrics.path().c_str());
  if (parallel) {
    const DataParallelTrainer::Timing& tm = t.dp->timing();
    const double step_s = tm.gradients_s + tm.reduce_s + tm.update_s;
    std::printf(
        "data-parallel steps (rank 0, %lld replicas): forward+backward %.2f s, gradient reduction %.2f s "
        "(%.1f%%), update and weight copy %.2f s\n",
        (long long)replicas, tm.gradients_s, tm.reduce_s, 100 * tm.reduce_s / std::max(step_s, 1e-12),
        tm.update_s);
  }
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
  app.add_option("--log", a->log,
                 "per-step log: step, loss bits (hex), loss, session device bytes, device-local heap usage")
      ->type_name("FILE");
  add_compile_flags(app, a->compile);
  add_data_parallel_flags(app, a->dp);
  app.footer(
      "AdamW next-token training on a text file (tokenizer.json of MODEL_DIR) with a progress bar; DIR gets\n"
      "config.json, tokenizer.json and model.safetensors, loadable by `mgn generate DIR`. With --replicas,\n"
      "--devices or --data-parallel mpi, --batch is split over the replicas (docs/multi-device.md).");
  return [a](const Context& c) {
    return run_data_parallel(a->dp, "finetune",
                             [&](const DataParallelPlace& p) { return finetune(*a, c, p); });
  };
}

}  // namespace mgn::tool
