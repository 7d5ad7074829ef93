// The `mgn` command line: entry point for the main jobs, inspection and benchmarks.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "mgn/checkpoint.h"
#include "mgn/data.h"
#include "mgn/graph.h"
#include "mgn/llama.h"
#include "mgn/models.h"
#include "mgn/plan.h"
#include "mgn/session.h"
#include "tool_options.h"
#include "mgn/tokenizer.h"
#include "mgn/train.h"
#ifdef MGN_HAVE_VULKAN
#include "mgn/device.h"
#endif
#include "bench.h"
#include "bench_common.h"  // bench-gemm: the warm-up and timing rule of mgn bench
#include "finetune.h"
#include "llama_check.h"
#include "onnx_cmd.h"

namespace {

void usage() {
  std::printf(
      "usage: mgn <command> [args]\n"
      "\n"
      "commands:\n"
      "  train-fashion-mnist [--model cnn|mlp] [--epochs N] [--batch B] [--lr X] [--limit-train N]\n"
      "                      [--limit-test N] [--out ckpt.safetensors] [--backend auto|cpu|vulkan]\n"
      "                      [--seed S] [--data DIR] [--no-progress] [--full]\n"
      "      trains with AdamW (default: the CNN, 5 epochs), saves the checkpoint after each epoch, then "
      "builds\n"
      "      a fresh inference graph, loads the checkpoint into it and reports the test accuracy. On a "
      "device\n"
      "      without a GPU (lavapipe, or the CPU executor) and without --epochs/--limit-train it runs a "
      "short\n"
      "      version (1 epoch over 6400 images) unless --full is given\n"
      "  dump-checkpoint FILE  lists the tensors of a safetensors file or sharded index\n"
      "  kernels [--model cnn|mlp] [--mode train|infer] [--batch B] [--filter SUBSTR] [--list]\n"
      "      prints the generated GLSL of every dispatch of the compiled Vulkan session (--list: names)\n"
      "  finetune MODEL_DIR --text FILE --out DIR [--steps N] [--batch B] [--seq S] [--lr X]\n"
      "           [--backend auto|cpu|vulkan] [--weights PATH|random] [--seed S]\n"
      "      AdamW next-token training on a text file (tokenizer.json of MODEL_DIR) with a progress bar;\n"
      "      DIR gets config.json, tokenizer.json and model.safetensors, loadable by generate\n"
      "  llama-check DIR [--backend auto|cpu|vulkan] [--seq S] [--tokens N] [--json FILE] [--no-time]\n"
      "      checks a directory written by bench/pytorch/llama_ref.py (logits, loss, every gradient, greedy\n"
      "      KV-cache decoding vs the reference) and times prefill, one decode token and F+L+B\n"
      "  inspect MODEL.onnx    opset, inputs/outputs with shapes, op histogram (unsupported ops marked),\n"
      "                        initializer and parameter counts; --supported-ops lists the importable ops\n"
      "  run MODEL.onnx [--input NAME=random|zeros|FILE.npy|1x3x224x224]... [--shape NAME=1x3x224x224]...\n"
      "                 [--backend auto|cpu|vulkan] [--seed S] [--save-outputs DIR]\n"
      "      imports the model, runs it once and prints every output (shape, min/max/mean, first values)\n"
      "  plan [--model cnn|mlp|smollm2-135m|llama:CONFIG.json|resnet18|resnet50] [--batch B] [--seq S]\n"
      "       [--image S] [--mode train|infer] [--show all|report] [--reuse on|off]\n"
      "      prints the static plan (barrier groups, buffers with lifetimes and offsets) and the memory\n"
      "      report of one AdamW training step (Fashion-MNIST, a Llama-family model or a ResNet: batch 4,\n"
      "      224x224 by default), as a GPU backend plans it; --mode infer (ResNet) plans the eval-mode "
      "forward\n"
      "  bench-gemm MxNxK... [--f16] [--warmup 5] [--warmup-ms 500] [--samples 20] [--tag NAME] "
      "[--no-check]\n"
      "             [--backend auto|cpu|vulkan]\n"
      "      times matmul sessions (wall clock per synchronized run, after warm-up) on the default backend;\n"
      "      one JSON line per shape (kernel names, TFLOP/s, sampled error vs a double reference). The "
      "kernel\n"
      "      follows MGN_GEMM_VARIANT / MGN_GEMM_TILE / MGN_GEMM_F16_TILE; --f16 marks the matmul "
      "Accelerated\n"
      "      (f16 cooperative-matrix kernel where the device self-test passes)\n"
      "  bench WORKLOAD [--phases compile,inference,minimal,flb,step] [--warmup 5] [--warmup-ms 500] "
      "[--samples 20]\n"
      "        [--batch B] [--json FILE] [--weights FILE] [--outputs FILE] [--backend auto|cpu|vulkan]\n"
      "        [--mode strict|accelerated] [--seed S] [--lr X] (per workload: docs/benchmarks.md)\n"
      "      WORKLOAD: fashion-cnn, fashion-mlp, smollm2-135m, llama-tiny, llama --config FILE, resnet50,\n"
      "      resnet-tiny, attention, conv. Times each phase (median, IQR, min, max, raw samples; one JSON\n"
      "      line per phase); --weights loads the file or writes the initial weights there; --outputs "
      "writes\n"
      "      the gate tensors (docs/benchmarks.md)\n"
      "  generate MODEL_DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--seed S]\n"
      "           [--backend auto|cpu|vulkan] [--weights PATH|random]\n"
      "      streams a continuation of the prompt from a Hugging Face Llama-family directory (config.json,\n"
      "      safetensors weights, tokenizer.json) with the KV-cache decode graph; temperature 0 (the\n"
      "      default) is greedy; --weights random keeps the random initialization (for timing)\n");
}

// --key value pairs (and bare --flags) after the command.
std::map<std::string, std::string> parse_flags(int argc, char** argv, int first) {
  std::map<std::string, std::string> f;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw mgn::Error("unexpected argument '" + a + "'");
    std::string key = a.substr(2);
    if (key == "no-progress" || key == "full" || key == "list") {
      f[key] = "1";
      continue;
    }
    if (i + 1 >= argc) throw mgn::Error("flag --" + key + " needs a value");
    f[key] = argv[++i];
  }
  return f;
}

int64_t int_flag(const std::map<std::string, std::string>& f, const std::string& k, int64_t def) {
  auto it = f.find(k);
  if (it == f.end()) return def;
  char* end = nullptr;
  long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (!end || *end) throw mgn::Error("--" + k + " takes an integer, got '" + it->second + "'");
  return v;
}

double float_flag(const std::map<std::string, std::string>& f, const std::string& k, double def) {
  auto it = f.find(k);
  if (it == f.end()) return def;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (!end || *end) throw mgn::Error("--" + k + " takes a number, got '" + it->second + "'");
  return v;
}

std::string str_flag(const std::map<std::string, std::string>& f, const std::string& k,
                     const std::string& def) {
  auto it = f.find(k);
  return it == f.end() ? def : it->second;
}

int train_fashion_mnist(const std::map<std::string, std::string>& f) {
  static const char* known[] = {"model",       "epochs",     "batch",   "lr",   "limit-train",
                                "limit-test",  "out",        "backend", "seed", "data",
                                "no-progress", "eval-batch", "full"};
  for (auto& [k, v] : f) {
    bool ok = false;
    for (const char* n : known) ok = ok || k == n;
    if (!ok) throw mgn::Error("train-fashion-mnist: unknown flag --" + k);
  }
  using namespace mgn;
  models::FashionArch arch = models::fashion_arch_from_name(str_flag(f, "model", "cnn"));
  int64_t epochs = int_flag(f, "epochs", 5), batch = int_flag(f, "batch", 64);
  int64_t eval_batch = int_flag(f, "eval-batch", 500);
  double lr = float_flag(f, "lr", 1e-3);
  uint64_t seed = uint64_t(int_flag(f, "seed", 0));
  std::string out =
      str_flag(f, "out", std::string("fashion_mnist_") + models::fashion_arch_name(arch) + ".safetensors");
  Backend backend = backend_from_name(str_flag(f, "backend", "auto"));
  std::string dir = str_flag(f, "data", mgn::tool::environment().fashion_mnist_dir);
  bool progress = !f.count("no-progress");

  auto t0 = std::chrono::steady_clock::now();
  Graph g = models::fashion_mnist({.arch = arch, .batch = batch, .mode = Mode::Train, .seed = seed});
  CompileOptions copt = mgn::tool::compile_options(Mode::Train, backend);
  copt.optimizer = AdamW{.lr = lr};
  Session session = compile(g, copt);
  std::fprintf(stderr, "model %s, batch %lld, AdamW lr %g, backend %s (%s)\n",
               models::fashion_arch_name(arch), (long long)batch, lr, session.backend(),
               session.device_type());
  int64_t limit_train = int_flag(f, "limit-train", 0);
  const std::string dev = session.device_type();
  if ((dev == "CPU" || dev == "host") && !f.count("full") && !f.count("epochs") && !f.count("limit-train")) {
    epochs = 1;
    limit_train = 6400;
    std::fprintf(stderr, "no GPU: running the short version (1 epoch over %lld images); --full runs all %s\n",
                 (long long)limit_train, "5 epochs");
  }
  Dataset train = load_fashion_mnist(dir, Split::Train, limit_train);
  Dataset test = load_fashion_mnist(dir, Split::Test, int_flag(f, "limit-test", 0));
  std::fprintf(stderr, "Fashion-MNIST: %lld training and %lld test images from %s\n", (long long)train.count,
               (long long)test.count, dir.c_str());
  BatchLoader loader(train, {.batch = batch, .shuffle = true, .seed = seed});
  Trainer trainer(session, {.epochs = epochs, .progress = progress, .checkpoint = out});
  std::vector<EpochReport> reports = trainer.fit(loader);
  double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The deploy path: a fresh inference graph knows nothing of the training run but the checkpoint.
  Graph gi =
      models::fashion_mnist({.arch = arch, .batch = eval_batch, .mode = Mode::Infer, .seed = seed + 1});
  Session infer = compile(gi, mgn::tool::compile_options(Mode::Infer, backend));
  infer.load_checkpoint(out);
  EvalResult ev = evaluate_classifier(infer, test);
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const EpochReport& r : reports)
    std::printf("epoch %lld: mean loss %.4f (first batch %.4f, last %.4f), %.1f s, %.1f steps/s\n",
                (long long)r.epoch + 1, r.mean_loss, r.first_loss, r.last_loss, r.seconds,
                r.steps_per_second);
  std::printf("checkpoint: %s (%lld steps)\n", out.c_str(), (long long)session.step_count());
  std::printf("test accuracy: %.2f%% on %lld images (fresh inference graph, checkpoint reloaded)\n",
              100 * ev.accuracy, (long long)test.count);
  std::printf("time: %.1f s training (incl. data loading), %.1f s total\n", train_s, total_s);
  return 0;
}

int dump_checkpoint(int argc, char** argv) {
  if (argc != 3) throw mgn::Error("dump-checkpoint takes one file");
  mgn::TensorSet ts = mgn::read_tensor_set(argv[2]);
  for (auto& [k, v] : ts.metadata) std::printf("metadata %s = %s\n", k.c_str(), v.c_str());
  for (auto& [name, t] : ts.tensors)
    std::printf("%-48s %-5s %s\n", name.c_str(), t.dtype.c_str(), mgn::shape_str(t.shape).c_str());
  return 0;
}

// Times Session::run() of a one-matmul inference graph: each run submits the recorded stream and waits for
// the GPU, so the wall time of a run includes submission overhead (a few microseconds), not uploads. The
// kernel is whatever the lowering picks under MGN_GEMM_VARIANT / MGN_GEMM_TILE (src/codegen/matmul.h);
// --f16 marks the matmul Accelerated, which runs the f16 cooperative-matrix kernel where the device has
// GL_NV_cooperative_matrix and its self-test passes (else the f32 kernel, said in the JSON). Each shape's
// result is checked on sampled entries against a double-precision dot product of the same inputs.
int bench_gemm(int argc, char** argv) {
  std::vector<std::array<int64_t, 3>> shapes;
  bool f16 = false, check = true;
  int warmup = 5, samples = 20;
  double warmup_ms = mgn::bench::Warmup{}.min_ms;
  std::string tag;
  mgn::Backend backend = mgn::Backend::Auto;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw mgn::Error("bench-gemm: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--f16") {
      f16 = true;
    } else if (a == "--no-check") {
      check = false;
    } else if (a == "--warmup") {
      warmup = std::max(0, std::atoi(value().c_str()));
    } else if (a == "--warmup-ms") {
      warmup_ms = std::max(0.0, std::atof(value().c_str()));
    } else if (a == "--samples") {
      samples = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--tag") {
      tag = value();
    } else if (a == "--backend") {
      backend = mgn::backend_from_name(value());
    } else {
      long long m = 0, n = 0, k = 0;
      if (std::sscanf(argv[i], "%lldx%lldx%lld", &m, &n, &k) != 3 || m <= 0 || n <= 0 || k <= 0)
        throw mgn::Error(std::string("bench-gemm: shapes are MxNxK, got '") + argv[i] + "'");
      shapes.push_back({m, n, k});
    }
  }
  if (shapes.empty()) shapes.push_back({1024, 1024, 1024});
  std::string coopmat = "n/a";
#ifdef MGN_HAVE_VULKAN
  if (f16) {
    // The engine's own device is private to it; a second context on the same device (same selection rule)
    // runs the self-test, whose verdict is process-wide (and cached per device if the engine runs it too).
    try {
      const mgn::Environment& env = mgn::tool::environment();
      coopmat = mgn::describe_device(env.device, env.kernels).f16_gemm;
    } catch (const std::exception& e) {
      coopmat = std::string("no Vulkan device: ") + e.what();
    }
  }
#endif
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v && *v ? v : "auto");
  };
  auto json_str = [](std::string v) {
    std::string out;
    for (char c : v) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return "\"" + out + "\"";
  };
  for (auto [m, n, k] : shapes) {
    mgn::Graph g;
    mgn::Tensor a = g.input("a", {m, k}), b = g.input("b", {k, n});
    mgn::Tensor c = mgn::matmul(a, b);
    if (f16) c.set_precision(mgn::Precision::Accelerated);
    g.output("c", c);
    auto t0 = std::chrono::steady_clock::now();
    mgn::Session s = mgn::compile(g, mgn::tool::compile_options(mgn::Mode::Infer, backend));
    double compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<float> av(size_t(m * k)), bv(size_t(k * n));
    for (size_t i = 0; i < av.size(); ++i) av[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
    s.set_input("a", av);
    s.set_input("b", bv);
    const mgn::bench::Samples timed =
        mgn::bench::time_calls({.calls = warmup, .min_ms = warmup_ms}, samples, [&] { s.run(); });
    std::vector<double> ms = timed.ms;
    std::sort(ms.begin(), ms.end());
    const size_t h = ms.size() / 2;
    double med = ms.size() % 2 ? ms[h] : (ms[h - 1] + ms[h]) / 2;
    // Error of sampled entries relative to sum_k |a||b| (robust where an entry cancels to ~0).
    double check_err = -1;
    if (check) {
      std::vector<float> cv = s.read("c");
      check_err = 0;
      const int64_t count = std::min<int64_t>(m * n, 512);
      for (int64_t q = 0; q < count; ++q) {
        const int64_t idx =
            count == m * n ? q : int64_t((uint64_t(q) * 2654435761ull + 12345) % uint64_t(m * n));
        const int64_t i = idx / n, j = idx % n;
        double ref = 0, mag = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = double(av[size_t(i * k + l)]) * double(bv[size_t(l * n + j)]);
          ref += x;
          mag += x < 0 ? -x : x;
        }
        const double d = double(cv[size_t(idx)]) - ref;
        check_err = std::max(check_err, (d < 0 ? -d : d) / std::max(mag, 1e-30));
      }
    }
    std::string kernels;
    for (const auto& [name, src] : s.kernel_sources()) kernels += (kernels.empty() ? "" : " ") + name;
    std::printf(
        "{\"side\": \"mgn\", \"backend\": %s, \"m\": %lld, \"n\": %lld, \"k\": %lld, "
        "\"precision\": \"%s\", \"variant\": %s, \"tile\": %s, \"f16_tile\": %s, \"tag\": %s, "
        "\"kernels\": %s, \"compile_ms\": %.1f, \"warmup\": %lld, \"warmup_ms\": %.1f, "
        "\"median_ms\": %.4f, \"min_ms\": %.4f, "
        "\"tflops\": %.3f, \"check_err\": %.3g, \"coopmat\": %s}\n",
        json_str(s.backend()).c_str(), (long long)m, (long long)n, (long long)k, f16 ? "f16" : "strict",
        json_str(env("MGN_GEMM_VARIANT")).c_str(), json_str(env("MGN_GEMM_TILE")).c_str(),
        json_str(env("MGN_GEMM_F16_TILE")).c_str(), json_str(tag).c_str(), json_str(kernels).c_str(),
        compile_ms, (long long)timed.warmup_calls, timed.warmup_ms, med, ms[0],
        2.0 * double(m) * double(n) * double(k) / (med * 1e-3) / 1e12, check_err, json_str(coopmat).c_str());
    std::fflush(stdout);
  }
  return 0;
}

// `mgn generate`: tokenizer.json encodes the prompt (with the post-processor's special tokens, as HF's
// tokenizer(prompt) does), llama::generate runs the decode graph token by token, and each new token's bytes
// are written as it arrives (a character split across tokens completes on the terminal).
int generate_text(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]).rfind("--", 0) == 0)
    throw mgn::Error("expected a model directory first");
  const std::string dir = argv[2];
  std::map<std::string, std::string> f = parse_flags(argc, argv, 3);
  static const char* known[] = {"prompt", "max-tokens", "temperature", "top-k", "seed", "backend", "weights"};
  for (auto& [k, v] : f)
    if (std::find_if(std::begin(known), std::end(known), [&](const char* n) { return k == n; }) ==
        std::end(known))
      throw mgn::Error("unknown flag --" + k);
  if (!f.count("prompt")) throw mgn::Error("--prompt is required");
  using namespace mgn;
  llama::Config cfg = llama::Config::from_file(dir + "/config.json");
  Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  const std::string prompt_text = f["prompt"];
  std::vector<int32_t> prompt = tok.encode(prompt_text, true);
  if (prompt.empty() && tok.bos_id()) prompt.push_back(*tok.bos_id());
  if (prompt.empty()) throw Error("the prompt encodes to no tokens and the tokenizer has no bos token");
  const int64_t max_new = int_flag(f, "max-tokens", 64);
  if (max_new < 1) throw Error("--max-tokens must be positive");
  const int64_t cache = int64_t(prompt.size()) + max_new;
  if (cache > cfg.max_position_embeddings)
    throw Error("the prompt (" + std::to_string(prompt.size()) + " tokens) + --max-tokens " +
                std::to_string(max_new) + " exceeds max_position_embeddings " +
                std::to_string(cfg.max_position_embeddings));

  auto t0 = std::chrono::steady_clock::now();
  Graph g = llama::decode_graph(cfg, {.batch = 1, .seq = cache});
  Session s = compile(g, mgn::tool::compile_options(Mode::Infer, backend_from_name(str_flag(f, "backend", "auto"))));
  const std::string weights = str_flag(f, "weights", dir);
  if (weights != "random") llama::load_weights(s, llama::read_weights(cfg, weights));
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "%s: %lld layers, hidden %lld, vocab %lld; backend %s; prompt %zu tokens; loaded in %.1f s\n",
               dir.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size,
               (long long)cfg.vocab_size, s.backend(), prompt.size(), load_s);

  std::fwrite(prompt_text.data(), 1, prompt_text.size(), stdout);
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
  llama::SampleOptions opt{.max_new_tokens = max_new,
                           .temperature = float_flag(f, "temperature", 0.0),
                           .top_k = int_flag(f, "top-k", 0),
                           .seed = uint64_t(int_flag(f, "seed", 0)),
                           .eos_id = tok.eos_id().value_or(-1)};
  std::vector<int32_t> out = llama::generate(s, cfg, prompt, opt, emit, &tok);
  double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::printf("\n");
  std::fprintf(stderr, "%zu new tokens in %.2f s (%.1f tokens/s, prompt included)\n", out.size(), gen_s,
               double(out.size()) / gen_s);
  return 0;
}

// `mgn kernels`: the generated GLSL of every dispatch of a compiled Fashion-MNIST session.
int print_kernels(const std::map<std::string, std::string>& f) {
  for (auto& [k, v] : f)
    if (k != "model" && k != "batch" && k != "mode" && k != "filter" && k != "list")
      throw mgn::Error("kernels: unknown flag --" + k);
  using namespace mgn;
  const std::string mode = str_flag(f, "mode", "train"), filter = str_flag(f, "filter", "");
  if (mode != "train" && mode != "infer") throw Error("kernels: --mode takes train or infer");
  const Mode m = mode == "train" ? Mode::Train : Mode::Infer;
  Graph g = models::fashion_mnist({.arch = models::fashion_arch_from_name(str_flag(f, "model", "cnn")),
                                   .batch = int_flag(f, "batch", 64),
                                   .mode = m});
  Session s = compile(g, mgn::tool::compile_options(m, Backend::Vulkan));
  int shown = 0;
  for (const auto& [name, glsl] : s.kernel_sources()) {
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    ++shown;
    if (f.count("list"))
      std::printf("%s\n", name.c_str());
    else
      std::printf("// ===== %s\n%s\n", name.c_str(), glsl.c_str());
  }
  if (shown == 0) throw Error("kernels: no kernel matches --filter '" + filter + "'");
  return 0;
}

// `mgn plan`: the static plan of one training step (forward, backward, AdamW update).
int plan_fashion_mnist(const std::map<std::string, std::string>& f) {
  for (auto& [k, v] : f)
    if (k != "model" && k != "batch" && k != "show" && k != "reuse" && k != "seq" && k != "image" &&
        k != "mode")
      throw mgn::Error("plan: unknown flag --" + k);
  using namespace mgn;
  const std::string model = str_flag(f, "model", "cnn");
  const std::string mode = str_flag(f, "mode", "train");
  if (mode != "train" && (mode != "infer" || model.rfind("resnet", 0) != 0))
    throw mgn::Error("plan: --mode takes train, or infer for a ResNet");
  Graph g;
  if (model == "resnet18" || model == "resnet50") {
    g = models::resnet({.depth = model == "resnet18" ? 18 : 50,
                        .batch = int_flag(f, "batch", 4),
                        .image_size = int_flag(f, "image", 224),
                        .mode = mode == "train" ? Mode::Train : Mode::Infer});
  } else if (model == "smollm2-135m" || model.rfind("llama:", 0) == 0) {
    // A Llama-family training step: next-token loss over [batch, seq] tokens.
    llama::Config cfg =
        model == "smollm2-135m" ? llama::Config::smollm2_135m() : llama::Config::from_file(model.substr(6));
    g = llama::loss_graph(cfg, {.batch = int_flag(f, "batch", 1), .seq = int_flag(f, "seq", 128)});
  } else {
    g = models::fashion_mnist({.arch = models::fashion_arch_from_name(model),
                               .batch = int_flag(f, "batch", 64),
                               .mode = Mode::Train});
  }
  std::string show = str_flag(f, "show", "all"), reuse = str_flag(f, "reuse", "on");
  if ((show != "all" && show != "report") || (reuse != "on" && reuse != "off"))
    throw mgn::Error("plan: --show takes all or report, --reuse takes on or off");
  PlanDescribeOptions po{.dump = show == "all", .reuse = reuse == "on"};
  std::fputs(
      (mode == "infer" ? describe_plan(g, po) : describe_training_plan(g, "loss", AdamW{}, po)).c_str(),
      stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "train-fashion-mnist") return train_fashion_mnist(parse_flags(argc, argv, 2));
    if (cmd == "dump-checkpoint") return dump_checkpoint(argc, argv);
    if (cmd == "inspect") return mgn::tool::inspect_command(argc, argv);
    if (cmd == "run") return mgn::tool::run_command(argc, argv);
    if (cmd == "plan") return plan_fashion_mnist(parse_flags(argc, argv, 2));
    if (cmd == "kernels") return print_kernels(parse_flags(argc, argv, 2));
    if (cmd == "bench-gemm") return bench_gemm(argc, argv);
    if (cmd == "bench") return bench_command(argc, argv);
    if (cmd == "generate") return generate_text(argc, argv);
    if (cmd == "llama-check") return llama_check_command(argc, argv);
    if (cmd == "finetune") return mgn::tool::finetune_command(argc, argv);
  } catch (const mgn::Error& e) {
    std::fprintf(stderr, "mgn %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "mgn: unknown command '%s' (see mgn --help)\n", argv[1]);
  return 2;
}
