// `mgn unet train|sample`: the paper's conditioned U-Net used as a diffusion model (docs/unet.md). train:
// DDPM noise prediction (linear betas 1e-4..0.02 over 1,000 steps, uniform timesteps, MSE on the noise) on
// Fashion-MNIST, each 28x28 image padded to 32x32 (halved to 16x16 for a 16-side latent), scaled to [-1, 1]
// and tiled over the input channels, conditioned on its class through a one-token context; sample: DDIM
// (η = 0) from Gaussian noise with one compiled inference session for every step, written as a PNG grid
// (one column per class).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "metrics.h"
#include "mgn/data.h"
#include "mgn/image.h"
#include "mgn/safetensors.h"
#include "mgn/unet.h"

namespace mgn::tool {

namespace {

namespace fs = std::filesystem;

struct UnetArgs {
  std::string action, run_dir = "unet-run", data, out, config = "small", metrics;
  int64_t channels = 4, levels = 0, steps = 2000, batch = 32, limit = 0, seed = 0, progress = 100;
  int64_t sample_steps = 50, per_class = 2;
  double lr = 2e-4, time_limit = 0, clip = 1.0;
  CompileFlags compile;
};

unet::Config config_of(const std::string& name, int64_t channels, int64_t levels) {
  unet::Config c = name == "tiny" ? unet::Config::tiny() : unet::Config::small();
  c.in_channels = channels;
  if (levels > 0) c.levels = levels;
  c.context_len = 1;  // one class token
  c.validate("unet --config " + name);
  return c;
}

nlohmann::json config_json(const unet::Config& c) {
  return {{"in_channels", c.in_channels},
          {"base_channels", c.base_channels},
          {"levels", c.levels},
          {"groups", c.groups},
          {"eps", c.eps},
          {"time_input_dim", c.time_input_dim},
          {"time_embed_dim", c.time_embed_dim},
          {"context_dim", c.context_dim},
          {"context_len", c.context_len},
          {"head_dim", c.head_dim},
          {"latent", c.latent}};
}

unet::Config config_from_json(const nlohmann::json& j, const std::string& origin) {
  unet::Config c;
  try {
    c.in_channels = j.at("in_channels");
    c.base_channels = j.at("base_channels");
    c.levels = j.at("levels");
    c.groups = j.at("groups");
    c.eps = j.at("eps");
    c.time_input_dim = j.at("time_input_dim");
    c.time_embed_dim = j.at("time_embed_dim");
    c.context_dim = j.at("context_dim");
    c.context_len = j.at("context_len");
    c.head_dim = j.at("head_dim");
    c.latent = j.at("latent");
  } catch (const nlohmann::json::exception& e) {
    throw Error(origin + ": bad U-Net config: " + e.what());
  }
  c.validate(origin);
  return c;
}

// The class token: 1 at the context dimensions j ≡ label (mod 10), 0 elsewhere.
std::vector<float> class_context(const std::vector<int32_t>& labels, const unet::Config& c) {
  std::vector<float> ctx(labels.size() * size_t(c.context_dim), 0.0f);
  for (size_t b = 0; b < labels.size(); ++b)
    for (int64_t j = labels[b]; j < c.context_dim; j += 10) ctx[b * size_t(c.context_dim) + size_t(j)] = 1.0f;
  return ctx;
}

// A Fashion-MNIST image [1, 28, 28] in [0, 1] -> [C, side, side] in [-1, 1]: zero-padded by 2 to 32x32, then
// averaged over 2x2 blocks while the side is above `side`, tiled over the channels.
void to_latent(const float* img, const unet::Config& c, float* out) {
  std::vector<float> a(32 * 32, 0.0f);
  for (int y = 0; y < 28; ++y)
    for (int x = 0; x < 28; ++x) a[size_t((y + 2) * 32 + x + 2)] = img[y * 28 + x];
  int64_t s = 32;
  while (s > c.latent) {
    const int64_t h = s / 2;
    std::vector<float> b(size_t(h * h));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < h; ++x)
        b[size_t(y * h + x)] =
            0.25f * (a[size_t(2 * y * s + 2 * x)] + a[size_t(2 * y * s + 2 * x + 1)] +
                     a[size_t((2 * y + 1) * s + 2 * x)] + a[size_t((2 * y + 1) * s + 2 * x + 1)]);
    a.swap(b);
    s = h;
  }
  for (int64_t ch = 0; ch < c.in_channels; ++ch)
    for (int64_t i = 0; i < s * s; ++i) out[ch * s * s + i] = 2.0f * a[size_t(i)] - 1.0f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int unet_train(const UnetArgs& a, const Context& ctx) {
  auto t0 = std::chrono::steady_clock::now();
  const unet::Config c = config_of(a.config, a.channels, a.levels);
  if (c.latent != 32 && c.latent != 16)
    throw UsageError("unet train: the Fashion-MNIST latent must be 32 or 16");
  const std::string dir = a.data.empty() ? ctx.env.fashion_mnist_dir : a.data;
  if (!fs::is_directory(dir))
    throw UsageError(
        "the Fashion-MNIST folder " + dir +
        " does not exist (install dataset-fashion-mnist, or give --data DIR or MGN_FASHION_MNIST_DIR)");
  fs::create_directories(a.run_dir);
  Dataset train = load_fashion_mnist(dir, Split::Train, a.limit);
  const int64_t B = a.batch, per = c.in_channels * c.latent * c.latent;

  const unet::GraphOptions go{
      .batch = B, .context_len = 1, .init = unet::Init::Torch, .seed = uint64_t(a.seed)};
  Graph g = unet::graph(c, go, Mode::Train);
  CompileOptions co = compile_options(ctx, a.compile, Mode::Train);
  co.optimizer = AdamW{.lr = a.lr, .weight_decay = 0.0};
  Session s = compile(g, co);
  const std::string metrics_path = a.metrics.empty() ? a.run_dir + "/metrics.jsonl" : a.metrics;
  MetricsLog metrics(metrics_path == "none" ? std::string() : metrics_path);
  nlohmann::json run = {{"command", "unet train"},
                        {"config", a.config},
                        {"unet", config_json(c)},
                        {"parameters", unet::parameter_count(c)},
                        {"backend", s.backend()},
                        {"batch", B},
                        {"optimizer", "AdamW"},
                        {"lr", a.lr},
                        {"steps", a.steps},
                        {"train_images", train.count},
                        {"schedule", "DDPM linear betas 1e-4..0.02, 1000 steps"},
                        {"seed", a.seed}};
  metrics.write("run", run);
  write_text_atomic(a.run_dir + "/run.json", run.dump(2) + "\n");
  std::fprintf(
      stderr,
      "unet train: %s config, %lld parameters, %lld images, batch %lld, backend %s; ready in %.1f s\n",
      a.config.c_str(), (long long)unet::parameter_count(c), (long long)train.count, (long long)B,
      s.backend(), seconds_since(t0));

  const unet::Schedule sched = unet::linear_schedule(1000, 1e-4, 0.02);
  BatchLoader loader(train, {.batch = B, .shuffle = true, .seed = uint64_t(a.seed)});
  if (loader.batches_per_epoch() == 0)
    throw Error("unet train: " + std::to_string(train.count) + " images make no batch of " +
                std::to_string(B));
  std::mt19937_64 rng(uint64_t(a.seed) * 7919 + 1);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> uniform_t(0, sched.steps() - 1);
  int64_t epoch = 0, step = 0;
  loader.start_epoch(0);
  Batch batch;
  std::vector<float> x0(size_t(B * per)), noise(size_t(B * per));
  std::vector<int64_t> t(static_cast<size_t>(B), 0);
  double window = 0, first_mean = -1, last_mean = 0;
  int64_t in_window = 0;
  auto t_train = std::chrono::steady_clock::now();
  while (step < a.steps) {
    if (a.time_limit > 0 && seconds_since(t_train) > a.time_limit) {
      std::fprintf(stderr, "unet train: --time-limit %.0f s reached after %lld steps\n", a.time_limit,
                   (long long)step);
      break;
    }
    if (!loader.next(batch)) {
      loader.start_epoch(++epoch);
      continue;
    }
    for (int64_t b = 0; b < B; ++b) to_latent(batch.features.data() + b * 28 * 28, c, x0.data() + b * per);
    for (float& v : noise) v = normal(rng);
    for (int64_t& v : t) v = uniform_t(rng);
    s.set_input("noisy_latent", unet::add_noise(sched, x0, noise, t));
    s.set_input("timestep_embedding", unet::timestep_embedding(t, c.time_input_dim));
    s.set_input("text_context", class_context(batch.labels, c));
    s.set_input("noise_target", noise);
    s.step();
    ++step;
    const float loss = s.read_scalar("loss");
    if (!std::isfinite(loss))
      throw Error("unet train: the loss is not finite at step " + std::to_string(step));
    window += loss;
    ++in_window;
    metrics.write("step", {{"step", step},
                           {"epoch", epoch + 1},
                           {"loss", loss},
                           {"lr", s.lr()},
                           {"time_s", seconds_since(t0)}});
    if (step % a.progress == 0 || step == a.steps) {
      last_mean = window / double(in_window);
      if (first_mean < 0) first_mean = last_mean;
      std::fprintf(stderr, "step %lld: mean loss %.4f over %lld steps, %.1f steps/s\n", (long long)step,
                   last_mean, (long long)in_window, double(step) / seconds_since(t_train));
      window = 0;
      in_window = 0;
    }
  }
  const std::string weights = a.run_dir + "/unet.safetensors";
  unet::write_weights(s, c, weights);
  s.save_checkpoint(a.run_dir + "/checkpoint.safetensors");
  metrics.write("end", {{"steps", step},
                        {"checkpoint", a.run_dir + "/checkpoint.safetensors"},
                        {"weights", weights},
                        {"train_seconds", seconds_since(t_train)},
                        {"total_seconds", seconds_since(t0)}});
  std::printf("trained %lld steps in %.1f s; weights %s\n", (long long)step, seconds_since(t_train),
              weights.c_str());
  return 0;
}

int unet_sample(const UnetArgs& a, const Context& ctx) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string run_path = a.run_dir + "/run.json";
  std::ifstream f(run_path);
  if (!f) throw Error("cannot open '" + run_path + "' (train first: mgn unet train --run " + a.run_dir + ")");
  nlohmann::json run;
  try {
    run = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(run_path + ": not valid JSON: " + e.what());
  }
  if (!run.contains("unet")) throw Error(run_path + ": no \"unet\" config");
  const unet::Config c = config_from_json(run["unet"], run_path);
  auto weights = unet::read_weights(c, a.run_dir + "/unet.safetensors");
  const int64_t B = 10 * a.per_class, side = c.latent, per = c.in_channels * side * side;
  Graph g = unet::graph(c, {.batch = B, .context_len = 1}, Mode::Infer);
  Session s = compile(g, compile_options(ctx, a.compile, Mode::Infer));
  unet::load_weights(s, weights);

  const unet::Schedule sched = unet::linear_schedule(1000, 1e-4, 0.02);
  std::vector<int32_t> labels;
  for (int64_t r = 0; r < a.per_class; ++r)
    for (int32_t k = 0; k < 10; ++k) labels.push_back(k);
  s.set_input("text_context", class_context(labels, c));
  std::mt19937_64 rng(uint64_t(a.seed) * 104729 + 3);
  std::normal_distribution<float> normal;
  std::vector<float> x(size_t(B * per));
  for (float& v : x) v = normal(rng);
  const std::vector<float> noise = x;
  const std::vector<int64_t> ts = unet::ddim_timesteps(sched, a.sample_steps);
  auto t1 = std::chrono::steady_clock::now();
  for (size_t k = 0; k < ts.size(); ++k) {
    const int64_t tprev = k + 1 < ts.size() ? ts[k + 1] : -1;
    s.set_input("noisy_latent", x);
    s.set_input("timestep_embedding",
                unet::timestep_embedding(std::vector<int64_t>(size_t(B), ts[k]), c.time_input_dim));
    s.run();
    x = unet::ddim_step(sched, x, s.read("noise_pred"), ts[k], tprev, a.clip);
  }
  const double sample_s = seconds_since(t1);
  // The grid: one column per class, per_class rows; the channel mean, [-1, 1] -> [0, 1], 2-pixel gaps.
  const int64_t gap = 2, H = a.per_class * side + (a.per_class + 1) * gap, W = 10 * side + 11 * gap;
  image::Image im{H, W, std::vector<float>(size_t(3 * H * W), 1.0f), ""};
  for (int64_t b = 0; b < B; ++b) {
    const int64_t top = gap + (b / 10) * (side + gap), left = gap + (b % 10) * (side + gap);
    for (int64_t y = 0; y < side; ++y)
      for (int64_t xx = 0; xx < side; ++xx) {
        double m = 0;
        for (int64_t ch = 0; ch < c.in_channels; ++ch) m += x[size_t(b * per + (ch * side + y) * side + xx)];
        const float v = float(0.5 * (m / double(c.in_channels) + 1.0));
        for (int64_t ch = 0; ch < 3; ++ch) im.data[size_t((ch * H + top + y) * W + left + xx)] = v;
      }
  }
  const std::string out = a.out.empty() ? a.run_dir + "/samples.png" : a.out;
  image::write_png(out, im);
  // The numbers behind the grid: the starting noise, the class tokens and the samples.
  const std::string values = fs::path(out).replace_extension(".safetensors").string();
  const Shape xs = {B, c.in_channels, side, side};
  write_safetensors(
      values,
      {StoredTensor::from_f32("noise", xs, noise),
       StoredTensor::from_f32("text_context", {B, 1, c.context_dim}, class_context(labels, c)),
       StoredTensor::from_f32("samples", xs, x)},
      {{"sampler", "DDIM eta 0"}, {"clip", std::to_string(a.clip)}, {"steps", std::to_string(ts.size())}});
  std::printf("sampled %lld images (%lld DDIM steps, one session) in %.2f s (%.1f ms per step); wrote %s\n",
              (long long)B, (long long)ts.size(), sample_s, 1000.0 * sample_s / double(ts.size()),
              out.c_str());
  std::fprintf(stderr, "unet sample: backend %s, total %.1f s\n", s.backend(), seconds_since(t0));
  return 0;
}

}  // namespace

Run declare_unet(CLI::App& app) {
  auto a = std::make_shared<UnetArgs>();
  app.add_option("ACTION", a->action, "train or sample")
      ->required()
      ->check(CLI::IsMember({"train", "sample"}));
  app.add_option("--run", a->run_dir,
                 "the run folder: train writes run.json, unet.safetensors, checkpoint and "
                 "metrics.jsonl there; sample reads it");
  app.add_option("--data", a->data,
                 "train: the Fashion-MNIST folder (default: MGN_FASHION_MNIST_DIR or Debian's)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--config", a->config, "train: small (the paper's, 10.93 M) or tiny (3.13 M, 16x16 latent)")
      ->check(CLI::IsMember({"small", "tiny"}));
  app.add_option("--channels", a->channels,
                 "train: input channels (4: the image tiled; 1: the 1-channel variant)")
      ->check(CLI::IsMember({1, 4}));
  app.add_option("--levels", a->levels, "train: U-Net levels (default: the config's)")
      ->check(CLI::Range(1, 3));
  app.add_option("--steps", a->steps, "train: AdamW steps")->check(at_least(1));
  app.add_option("--time-limit", a->time_limit, "train: stop after this many seconds of training")
      ->check(positive_number());
  app.add_option("--batch", a->batch, "train: images per step")->check(at_least(1));
  app.add_option("--lr", a->lr, "train: AdamW learning rate (no weight decay)")->check(positive_number());
  app.add_option("--limit", a->limit, "train: use the first N training images (0: all 60,000)")
      ->check(at_least(0));
  app.add_option("--progress", a->progress, "train: print the mean loss every N steps")->check(at_least(1));
  app.add_option("--metrics", a->metrics,
                 "train: the JSON Lines metrics file (default RUN/metrics.jsonl; none: off)");
  app.add_option("--sample-steps", a->sample_steps, "sample: DDIM steps (of the 1,000 training timesteps)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--clip", a->clip, "sample: clamp each predicted x0 to [-CLIP, CLIP] (0: off)")
      ->check(number_at_least(0));
  app.add_option("--per-class", a->per_class, "sample: images per class (rows of the grid)")
      ->check(CLI::Range(1, 16));
  app.add_option(
      "--out", a->out,
      "sample: the grid PNG (default RUN/samples.png); the noise, class tokens and samples go beside it "
      "(.safetensors)");
  app.add_option("--seed", a->seed, "data order, timesteps and noise")->check(at_least(0));
  add_compile_flags(app, a->compile);
  app.footer(
      "train: DDPM noise prediction (linear betas 1e-4..0.02, 1000 steps, t uniform, MSE on the noise) on\n"
      "Fashion-MNIST padded to 32x32, in [-1, 1], tiled over the input channels; the class is a one-token\n"
      "context (1 at dims j = label mod 10). sample: DDIM (eta 0, x0 clipped to [-1, 1] unless --clip 0)\n"
      "with one compiled inference session, a PNG grid with one column per class. docs/unet.md.");
  return [a](const Context& c) {
    if (a->action == "train") {
      if (!a->out.empty()) throw UsageError("train: --out is for sample (train writes into --run)");
      return unet_train(*a, c);
    }
    return unet_sample(*a, c);
  };
}

}  // namespace mgn::tool
