// `mgn smolvla train|act`: the SmolVLA action expert with flow matching on given VLM K/V tensors (the VLM
// itself is not run here). train: flow-matching regression of the velocity on (VLM K/V, action chunk) examples,
// AdamW, weights written as safetensors under the spec's names. act: the 10-step Euler sampler from Gaussian
// noise, one compiled inference session reused by every step, the VLM K/V set once.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "mgn/checkpoint.h"
#include "mgn/safetensors.h"
#include "mgn/smolvla.h"

namespace mgn::tool {

namespace {

struct SmolArgs {
  std::string action, config = "paper", attention = "paper", data, weights, out;
  int64_t steps = 0, batch = 0, seed = 0, progress = 50, flow_steps = 10, repeat = 1;
  double lr = 1e-4;
  CompileFlags compile;
};

smolvla::Config config_of(const SmolArgs& a) {
  smolvla::Config c = a.config == "reduced" ? smolvla::Config::reduced() : smolvla::Config::paper();
  c.attention = a.attention == "lerobot" ? smolvla::Attention::Lerobot : smolvla::Attention::Paper;
  c.validate("--config " + a.config + " --attention " + a.attention);
  return c;
}

std::vector<std::string> vlm_names(const smolvla::Config& c) {
  std::vector<std::string> r;
  for (auto& [name, shape] : smolvla::input_shapes(c, {}))
    if (name.starts_with("vlm_")) r.push_back(name);
  return r;
}

// Examples in the file: the leading axis of its first VLM K/V tensor (1 when stored without one).
int64_t examples_in(const smolvla::Config& c, const std::string& path) {
  TensorSet ts = read_tensor_set(path, true);
  const std::string first = vlm_names(c).front();
  const StoredTensor* t = ts.find(first);
  if (!t)
    throw Error("'" + path + "' has no tensor '" + first + "' (expected shape [N, " + std::to_string(c.vlm_tokens) +
                ", " + std::to_string(c.vlm_kv_dim) + "])");
  return t->shape.size() == 3 ? t->shape[0] : 1;
}

// Rows [first, first + n) (cyclic over `count`) of a [count, per] tensor.
std::vector<float> rows(const std::vector<float>& v, int64_t count, int64_t first, int64_t n) {
  const size_t per = v.size() / size_t(count);
  std::vector<float> out;
  out.reserve(per * size_t(n));
  for (int64_t r = 0; r < n; ++r) {
    const size_t row = size_t((first + r) % count);
    out.insert(out.end(), v.begin() + ptrdiff_t(row * per), v.begin() + ptrdiff_t((row + 1) * per));
  }
  return out;
}

std::vector<float> gaussian(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

int smolvla_train(const SmolArgs& a, const Context& ctx) {
  using Clock = std::chrono::steady_clock;
  const smolvla::Config c = config_of(a);
  check_output_path(a.out);
  const int64_t N = examples_in(c, a.data), B = a.batch ? a.batch : std::min<int64_t>(N, 8);
  // Everything read and checked before anything compiles.
  std::vector<std::string> names = vlm_names(c);
  auto vlm = smolvla::read_inputs(c, {.batch = N}, a.data, names);
  const Shape want = {N, c.chunk, c.action_dim};
  const TensorSet data = read_tensor_set(a.data);
  if (!data.find("actions"))
    throw Error("'" + a.data + "' has no tensor 'actions' (the action chunks, expected shape " + shape_str(want) + ")");
  const std::vector<float> actions = data.values_f32("actions", want);  // names a mis-shaped tensor
  std::map<std::string, std::vector<float>> init;
  if (!a.weights.empty()) init = smolvla::read_weights(c, a.weights);

  auto t0 = Clock::now();
  const smolvla::GraphOptions o{.batch = B};
  Graph g = smolvla::expert_graph(c, o, Mode::Train);
  CompileOptions co = compile_options(ctx, a.compile, Mode::Train);
  co.optimizer = AdamW{.lr = a.lr};
  Session s = compile(g, co);
  if (!init.empty()) smolvla::load_weights(s, init);
  std::fprintf(stderr, "smolvla train: %lld parameters, %lld examples, batch %lld, backend %s; ready in %.2f s\n",
               (long long)smolvla::parameter_count(c), (long long)N, (long long)B, s.backend(),
               std::chrono::duration<double>(Clock::now() - t0).count());
  std::mt19937_64 rng(uint64_t(a.seed));
  // The flow-matching loss of one step is noisy (fresh noise and times): report the means of the first and
  // the last tenth of the steps.
  const int64_t tenth = std::max<int64_t>(1, a.steps / 10);
  double first = 0, last = 0, loss = 0;
  for (int64_t step = 0; step < a.steps; ++step) {
    const int64_t row = step * B;
    for (const std::string& n : names) s.set_input(n, rows(vlm.at(n), N, row, B));
    std::vector<float> x0 = rows(actions, N, row, B);
    std::vector<float> noise = gaussian(x0.size(), rng);
    std::vector<double> t = smolvla::sample_times(B, rng());
    smolvla::FlowTarget f = smolvla::flow_target(x0, noise, t);
    s.set_input("noisy_actions", f.x_t);
    s.set_input("timestep", smolvla::time_features(c, t));
    s.set_input("target", f.velocity);
    s.step();
    loss = s.read_scalar("loss");
    if (!std::isfinite(loss)) throw Error("smolvla train: the loss is not finite at step " + std::to_string(step + 1));
    if (step < tenth) first += loss / double(tenth);
    if (step >= a.steps - tenth) last += loss / double(tenth);
    if ((step + 1) % a.progress == 0 || step == 0 || step + 1 == a.steps)
      std::printf("step %lld loss %.6f\n", (long long)(step + 1), loss);
  }
  std::vector<StoredTensor> out;
  for (auto& [name, shape] : smolvla::parameter_shapes(c))
    out.push_back(StoredTensor::from_f32(name, shape, s.read(name)));
  write_safetensors(a.out, out, {{"format", "pt"}, {"config", a.config}, {"attention", a.attention},
                                 {"steps", std::to_string(a.steps)}});
  std::printf("trained %lld steps: mean loss of the first / last %lld steps %.6f -> %.6f; wrote %s\n",
              (long long)a.steps, (long long)tenth, first, last, a.out.c_str());
  return 0;
}

int smolvla_act(const SmolArgs& a, const Context& ctx) {
  const smolvla::Config c = config_of(a);
  check_output_path(a.out);
  const int64_t N = examples_in(c, a.data);
  std::vector<std::string> names = vlm_names(c);
  auto vlm = smolvla::read_inputs(c, {.batch = N}, a.data, names);
  auto w = smolvla::read_weights(c, a.weights);
  Graph g = smolvla::expert_graph(c, {.batch = N});
  Session s = compile(g, compile_options(ctx, a.compile, Mode::Infer));
  smolvla::load_weights(s, w);
  for (const std::string& n : names) s.set_input(n, vlm.at(n));  // once: every Euler step reuses them
  std::mt19937_64 rng(uint64_t(a.seed));
  std::vector<float> noise = gaussian(size_t(N * c.chunk * c.action_dim), rng);
  // Each repetition samples the same chunk again (same noise); with --repeat > 1 the first is a warm-up and the
  // median of the others is reported.
  std::vector<float> actions;
  std::vector<double> times;
  for (int64_t r = 0; r < a.repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    actions = smolvla::sample_actions(s, c, noise, N, int(a.flow_steps));
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (times.size() > 1) times.erase(times.begin());
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  const Shape shape = {N, c.chunk, c.action_dim};
  write_safetensors(a.out,
                    {StoredTensor::from_f32("actions", shape, actions), StoredTensor::from_f32("noise", shape, noise)},
                    {{"flow_steps", std::to_string(a.flow_steps)}, {"seed", std::to_string(a.seed)}});
  double sq = 0;
  for (float v : actions) sq += double(v) * v;
  std::printf("%lld action chunk(s) of %lldx%lld in %lld Euler steps (%s%.2f ms, backend %s): rms %.6f; wrote %s\n",
              (long long)N, (long long)c.chunk, (long long)c.action_dim, (long long)a.flow_steps,
              a.repeat > 1 ? "median " : "", ms, s.backend(),
              std::sqrt(sq / double(actions.size())), a.out.c_str());
  return 0;
}

}  // namespace

Run declare_smolvla(CLI::App& app) {
  auto a = std::make_shared<SmolArgs>();
  app.add_option("ACTION", a->action, "train or act")->required()->check(CLI::IsMember({"train", "act"}));
  app.add_option("--data", a->data,
                 "safetensors file of VLM K/V inputs (vlm_kv_layer_{i} [N, P, 320], odd i; lerobot: "
                 "vlm_k_layer_{i}, vlm_v_layer_{i} for every i) and, for train, the action chunks \"actions\" "
                 "[N, 50, 32]")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--weights", a->weights, "expert weights (safetensors, the spec's names); train: the start "
                                          "(default: the paper's sine init); act: required")
      ->check(CLI::ExistingFile);
  app.add_option("--out", a->out, "train: the weights written; act: the actions (and the noise) written")->required();
  app.add_option("--config", a->config, "paper (the paper's expert, 99.85 M) or reduced (4 layers, hidden 48)")
      ->check(CLI::IsMember({"paper", "reduced"}));
  app.add_option("--attention", a->attention,
                 "paper (self layers over the actions only) or lerobot (joint over the VLM prefix, RoPE)")
      ->check(CLI::IsMember({"paper", "lerobot"}));
  app.add_option("--steps", a->steps, "train: AdamW updates")->check(at_least(1));
  app.add_option("--batch", a->batch, "train: examples per step (default: all, at most 8)")->check(at_least(1));
  app.add_option("--lr", a->lr, "train: AdamW learning rate")->check(positive_number());
  app.add_option("--progress", a->progress, "train: print the loss every N steps")->check(at_least(1));
  app.add_option("--flow-steps", a->flow_steps, "act: Euler steps from t = 1 to 0")->check(at_least(1));
  app.add_option("--repeat", a->repeat, "act: sample this many times (the first a warm-up) and print the median time")
      ->check(at_least(1));
  app.add_option("--seed", a->seed, "noise and times")->check(at_least(0));
  add_compile_flags(app, a->compile);
  app.footer(
      "Flow matching as SmolVLA: x_t = t*noise + (1-t)*actions, the expert regresses noise - actions, t ~\n"
      "0.999*Beta(1.5, 1) + 0.001; act integrates from t = 1 (noise) to t = 0 in --flow-steps Euler steps.\n"
      "The timestep input is [sin, cos](2*pi*t/period), periods 4e-3..4 (docs/smolvla.md). The VLM is not\n"
      "run: its per-layer K/V states come from --data.");
  return [a](const Context& c) {
    if (a->action == "train") {
      if (a->steps == 0) throw UsageError("train: --steps N is required");
      return smolvla_train(*a, c);
    }
    if (a->weights.empty()) throw UsageError("act: --weights FILE is required");
    return smolvla_act(*a, c);
  };
}

}  // namespace mgn::tool
