// `mgn bench`: the benchmark harness of docs/benchmarks.md. Whole models (bench_model.cpp: compile,
// inference, minimal, F+L+B and training-step phases with memory figures and the gate tensors of one step)
// and microbenchmarks (bench_micro.cpp: attention and conv2d against the same inputs as PyTorch).
#include <memory>
#include <string>

#include "bench_common.h"
#include "cli.h"

namespace mgn::tool {

namespace {

struct BenchArgs {
  bench::Args a;
  std::string phases, cache = "default";
  CompileFlags compile;
};

int run_bench(BenchArgs& b, const Context& c) {
  bench::Args& a = b.a;
  a.phases = bench::split_commas(b.phases);
  if (!b.phases.empty() && a.phases.empty()) throw UsageError("--phases needs at least one phase");
  a.cold_cache = b.cache == "cold";
  a.fashion_mnist_dir = c.env.fashion_mnist_dir;
  a.base = compile_options(c, b.compile, Mode::Infer);
  if (bench::is_model_workload(a.workload)) return bench::run_model_bench(a);
  return bench::run_micro_bench(a);
}

}  // namespace

Run declare_bench(CLI::App& app) {
  auto b = std::make_shared<BenchArgs>();
  bench::Args& a = b->a;
  app.add_option("WORKLOAD", a.workload, "what to time")
      ->required()
      ->check(CLI::IsMember({"fashion-cnn", "fashion-mlp", "smollm2-135m", "llama-tiny", "llama", "resnet50",
                             "resnet-tiny", "whisper-tiny-encoder", "whisper-encoder-test", "dinov3-vits16", "dinov3-test",
                             "dinovision", "dinovision-test", "smolvla-expert", "smolvla-expert-test",
                             "smolvla-expert-lerobot", "sd-unet-small", "sd-unet-test", "attention", "conv"}));
  app.add_option(
         "--phases", b->phases,
         "comma-separated: compile, inference, minimal (Llama; SmolVLA: 1 action token), flb, step; attention: forward, fwdbwd; "
         "conv: forward, grad_input, grad_weight (default: all of the workload's)")
      ->type_name("LIST");
  app.add_option("--warmup", a.warmup.calls, "untimed calls before the timed ones, at least")
      ->check(at_least(0));
  app.add_option("--warmup-ms", a.warmup.min_ms, "wall time of the untimed calls, at least")
      ->check(number_at_least(0));
  app.add_option("--samples", a.samples, "timed calls per phase")->check(at_least(1));
  app.add_option("--batch", a.batch, "batch size (default: the workload's)")->check(at_least(1));
  app.add_option("--seq", a.seq, "Llama workloads and attention: sequence length")->check(at_least(2));
  app.add_option("--json", a.json, "also write the JSON lines to this file")->type_name("FILE");
  app.add_option("--weights", a.weights,
                 "model workloads: load this file if it exists, else write the initial weights")
      ->type_name("FILE");
  app.add_option("--outputs", a.outputs, "write the gate tensors (docs/benchmarks.md) to this file")
      ->type_name("FILE");
  app.add_option("--data", a.data, "Fashion-MNIST folder (default MGN_FASHION_MNIST_DIR, else Debian's)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--config", a.config, "llama: a Hugging Face config.json")->check(CLI::ExistingFile);
  app.add_option("--cases", a.cases, "microbenchmarks: comma-separated case names (default all)")
      ->type_name("LIST");
  app.add_option("--cache", b->cache, "cold: compile with an empty shader and pipeline cache")
      ->check(CLI::IsMember({"cold", "default"}));
  app.add_option("--seed", a.seed, "weights and inputs seed")->check(at_least(0));
  app.add_option("--lr", a.lr, "AdamW learning rate of the step phase")->check(positive_number());
  app.add_flag("--tiny", a.tiny, "microbenchmarks: the tiny shapes (CI)");
  app.add_option("--session-cache-mb", a.session_cache_mb,
                 "bound of the compiled-session cache in MiB; 0 turns it off (default: the library's)")
      ->check(at_least(0));
  app.add_flag("--verbose", a.verbose, "model workloads: print each session's compile phases (stderr)");
  add_compile_flags(app, b->compile, kAllCompileFlags, "--mode,--precision");
  app.footer(
      "Times each phase (median, IQR, min, max, raw samples; one JSON line per phase) with the protocol of\n"
      "docs/benchmarks.md; --weights loads the file or writes the initial weights there, --outputs writes "
      "the\n"
      "gate tensors that bench/compare.py checks against the PyTorch side.");
  return [b](const Context& c) { return run_bench(*b, c); };
}

}  // namespace mgn::tool
