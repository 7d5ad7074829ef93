// `mgn bench`: times the phases of a whole model (compile, inference, F+L+B, training step) and writes the
// outputs of one step from given weights and inputs, for bench/compare.py to gate against PyTorch.
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"  // the node of the "loss" output, to append the backward pass of the F+L+B graph
#include "mgn/autodiff.h"
#include "mgn/data.h"
#include "mgn/graph.h"
#include "mgn/models.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

const char* const kPhases[] = {"compile", "inference", "flb", "step"};

struct BenchArgs {
  std::string workload;
  std::vector<std::string> phases = {"compile", "inference", "flb", "step"};
  int64_t warmup = 5, samples = 20, batch = 64;
  std::string json, weights, outputs, data;
  mgn::Backend backend = mgn::Backend::Auto;
  mgn::Precision mode = mgn::Precision::Strict;
  uint64_t seed = 0;
  double lr = 1e-3;
  bool cold_cache = false;  // compile with an empty shader/pipeline cache (a temporary MGN_CACHE_DIR)

  bool has(const std::string& phase) const {
    return std::find(phases.begin(), phases.end(), phase) != phases.end();
  }
};

int64_t parse_int(const std::string& key, const std::string& v) {
  char* end = nullptr;
  long long r = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || !end || *end) throw mgn::Error("bench: --" + key + " takes an integer, got '" + v + "'");
  return r;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> r;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) r.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return r;
}

BenchArgs parse_bench_args(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]).rfind("--", 0) == 0)
    throw mgn::Error("bench: name a workload first (fashion-cnn or fashion-mlp), e.g. mgn bench fashion-cnn");
  BenchArgs a;
  a.workload = argv[2];
  if (a.workload != "fashion-cnn" && a.workload != "fashion-mlp")
    throw mgn::Error("bench: unknown workload '" + a.workload + "' (expected fashion-cnn or fashion-mlp)");
  a.data = mgn::fashion_mnist_dir();
  for (int i = 3; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0) throw mgn::Error("bench: unexpected argument '" + flag + "'");
    std::string key = flag.substr(2);
    if (i + 1 >= argc) throw mgn::Error("bench: flag --" + key + " needs a value");
    std::string v = argv[++i];
    if (key == "phases") {
      a.phases = split_commas(v);
      for (const std::string& p : a.phases)
        if (std::find(std::begin(kPhases), std::end(kPhases), p) == std::end(kPhases))
          throw mgn::Error("bench: unknown phase '" + p + "' (expected compile, inference, flb, step)");
    } else if (key == "warmup") {
      a.warmup = parse_int(key, v);
    } else if (key == "samples") {
      a.samples = parse_int(key, v);
    } else if (key == "batch") {
      a.batch = parse_int(key, v);
    } else if (key == "seed") {
      a.seed = uint64_t(parse_int(key, v));
    } else if (key == "lr") {
      char* end = nullptr;
      a.lr = std::strtod(v.c_str(), &end);
      if (v.empty() || !end || *end) throw mgn::Error("bench: --lr takes a number, got '" + v + "'");
    } else if (key == "json") {
      a.json = v;
    } else if (key == "weights") {
      a.weights = v;
    } else if (key == "outputs") {
      a.outputs = v;
    } else if (key == "data") {
      a.data = v;
    } else if (key == "cache") {
      if (v != "cold" && v != "default")
        throw mgn::Error("bench: --cache is cold or default, got '" + v + "'");
      a.cold_cache = v == "cold";
    } else if (key == "backend") {
      a.backend = mgn::backend_from_name(v);
    } else if (key == "mode") {
      if (v == "strict")
        a.mode = mgn::Precision::Strict;
      else if (v == "accelerated")
        a.mode = mgn::Precision::Accelerated;
      else
        throw mgn::Error("bench: --mode is strict or accelerated, got '" + v + "'");
    } else {
      throw mgn::Error("bench: unknown flag --" + key);
    }
  }
  if (a.warmup < 0 || a.samples < 1 || a.batch < 1)
    throw mgn::Error("bench: needs --warmup >= 0, --samples >= 1 and --batch >= 1");
  return a;
}

// Linear interpolation between order statistics (numpy.percentile's default), so both sides agree.
double percentile(const std::vector<double>& sorted, double q) {
  double pos = q * double(sorted.size() - 1);
  size_t lo = size_t(std::floor(pos)), hi = size_t(std::ceil(pos));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

std::string json_string(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      r += buf;
    } else {
      r += c;
    }
  }
  return r + "\"";
}

std::string json_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.5f", v);
  return buf;
}

struct Context {
  const BenchArgs& args;
  std::string backend, device;
  int64_t params = 0;
  std::FILE* json = nullptr;

  // One JSON object per phase, the schema bench/pytorch/fashion_cnn.py writes too.
  void emit(const std::string& phase, const std::vector<double>& ms, int64_t warmup,
            const std::string& extra = "") const {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    std::string line = "{\"side\": \"mgn\", \"impl\": \"mgn\", \"workload\": " + json_string(args.workload) +
                       ", \"phase\": " + json_string(phase) +
                       ", \"mode\": " + json_string(mgn::precision_name(args.mode)) +
                       ", \"backend\": " + json_string(backend) + ", \"device\": " + json_string(device) +
                       ", \"batch\": " + std::to_string(args.batch) +
                       ", \"cache\": " + json_string(args.cold_cache ? "cold" : "default") +
                       ", \"params\": " + std::to_string(params) + ", \"warmup\": " + std::to_string(warmup) +
                       ", \"samples\": " + std::to_string(ms.size());
    double p25 = percentile(sorted, 0.25), p75 = percentile(sorted, 0.75);
    line += ", \"median_ms\": " + json_number(percentile(sorted, 0.5)) + ", \"p25_ms\": " + json_number(p25) +
            ", \"p75_ms\": " + json_number(p75) + ", \"iqr_ms\": " + json_number(p75 - p25) +
            ", \"min_ms\": " + json_number(sorted.front()) + ", \"max_ms\": " + json_number(sorted.back());
    line += ", \"samples_ms\": [";  // in the order they were taken
    for (size_t i = 0; i < ms.size(); ++i) line += (i ? ", " : "") + json_number(ms[i]);
    line += "]" + extra + "}\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
    if (json) {
      std::fputs(line.c_str(), json);
      std::fflush(json);
    }
  }
};

// Session::run and Session::step return after the device finished (the submission's fence is waited on),
// so the wall time of one call is one synchronized sample, submission overhead included.
std::vector<double> time_calls(int64_t warmup, int64_t samples, const std::function<void()>& fn) {
  for (int64_t i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  for (int64_t i = 0; i < samples; ++i) {
    auto t0 = Clock::now();
    fn();
    ms.push_back(ms_since(t0));
  }
  return ms;
}

void require_finite(float v, const std::string& what) {
  if (!std::isfinite(v)) throw mgn::Error("bench: " + what + " is not finite (" + std::to_string(v) + ")");
}

void mark_precision(mgn::Graph& g, mgn::Precision p) {
  for (int id = 0; id < g.ir().size(); ++id) g.ir().node_mut(id).precision = p;
  g.set_precision(p);  // for the nodes backward() appends
}

}  // namespace

int bench_command(int argc, char** argv) {
  using namespace mgn;
  BenchArgs args = parse_bench_args(argc, argv);
  models::FashionArch arch =
      args.workload == "fashion-cnn" ? models::FashionArch::Cnn : models::FashionArch::Mlp;
  models::FashionMnistConfig infer_cfg{
      .arch = arch, .batch = args.batch, .mode = Mode::Infer, .seed = args.seed};
  models::FashionMnistConfig train_cfg = infer_cfg;
  train_cfg.mode = Mode::Train;
  const bool gate = !args.outputs.empty();
  // The compile phase covers every session of the workload (inference, F+L+B and training).
  const bool all = args.has("compile") || gate;
  const bool need_flb = args.has("flb") || all, need_step = args.has("step") || all;
  std::filesystem::path cold_dir;
  if (args.cold_cache) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mgn-bench-cache-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("bench: cannot create a temporary cache folder from " + tmpl);
    cold_dir = tmpl;
    setenv("MGN_CACHE_DIR", tmpl.c_str(), 1);
  }
  struct RemoveDir {
    const std::filesystem::path& dir;
    ~RemoveDir() {
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    }
  } remove_cold_dir{cold_dir};

  // Compile: graph build + autodiff + optimizer + planning + kernels and pipelines, per session (uploads of
  // the initial parameters included: they are part of compile()).
  std::map<std::string, double> compile_ms;
  auto t0 = Clock::now();
  Graph gi = models::fashion_mnist(infer_cfg);
  if (args.mode != Precision::Strict) mark_precision(gi, args.mode);
  Session infer = compile(gi, {.mode = Mode::Infer, .backend = args.backend});
  compile_ms["inference"] = ms_since(t0);

  Graph gf;
  std::vector<Session> flb_holder;
  std::vector<std::string> param_names = infer.state_names();
  if (need_flb) {
    t0 = Clock::now();
    gf = models::fashion_mnist(train_cfg);
    if (args.mode != Precision::Strict) mark_precision(gf, args.mode);
    std::optional<int> loss_id = gf.ir().find_output("loss");
    if (!loss_id) throw Error("bench: the training graph of " + args.workload + " has no output 'loss'");
    Gradients grads = backward(gf, Tensor(&gf.ir(), *loss_id));
    for (const std::string& name : param_names) {
      auto it = grads.params.find(name);
      if (it == grads.params.end()) throw Error("bench: parameter '" + name + "' gets no gradient");
      gf.output("grad." + name, it->second);
    }
    flb_holder.push_back(compile(gf, {.mode = Mode::Infer, .backend = args.backend}));
    compile_ms["flb"] = ms_since(t0);
  }
  Graph gt;
  std::vector<Session> train_holder;
  if (need_step) {
    t0 = Clock::now();
    gt = models::fashion_mnist(train_cfg);
    if (args.mode != Precision::Strict) mark_precision(gt, args.mode);
    train_holder.push_back(
        compile(gt, {.mode = Mode::Train, .optimizer = AdamW{.lr = args.lr}, .backend = args.backend}));
    compile_ms["step"] = ms_since(t0);
  }

  // Weights: one file both sides read, so PyTorch computes the same function.
  if (!args.weights.empty()) {
    if (std::filesystem::exists(args.weights)) {
      infer.load_checkpoint(args.weights);
      std::fprintf(stderr, "bench: weights from %s\n", args.weights.c_str());
    } else {
      infer.save_checkpoint(args.weights);
      std::fprintf(stderr, "bench: wrote the initial weights (seed %llu) to %s\n",
                   (unsigned long long)args.seed, args.weights.c_str());
    }
  }
  Context ctx{args, infer.backend(), infer.device_type()};
  for (const std::string& name : param_names) {
    std::vector<float> v = infer.read(name);
    ctx.params += int64_t(v.size());
    for (Session& s : flb_holder) s.write_parameter(name, v);
    for (Session& s : train_holder) s.write_parameter(name, v);
  }

  // Inputs: the first `batch` training images of Fashion-MNIST, which the PyTorch script reads too.
  Dataset data = load_fashion_mnist(args.data, Split::Train, args.batch);
  if (data.count < args.batch)
    throw Error("bench: " + args.data + " holds " + std::to_string(data.count) +
                " training images, batch is " + std::to_string(args.batch));
  infer.set_input("x", data.features);
  for (Session& s : flb_holder) {
    s.set_input("x", data.features);
    s.set_input("labels", data.labels);
  }
  for (Session& s : train_holder) {
    s.set_input("x", data.features);
    s.set_input("labels", data.labels);
  }
  std::fprintf(stderr, "bench %s: batch %lld, %lld parameters, backend %s (%s), mode %s\n",
               args.workload.c_str(), (long long)args.batch, (long long)ctx.params, ctx.backend.c_str(),
               ctx.device.c_str(), precision_name(args.mode));

  // The gate's outputs come first: the training session must take its one step from the given weights.
  if (gate) {
    Session& flb = flb_holder.front();
    Session& train = train_holder.front();
    std::vector<StoredTensor> out;
    const Shape xshape = {args.batch, 1, 28, 28};
    out.push_back(StoredTensor::from_f32("input.x", xshape, data.features));
    out.push_back(StoredTensor::from_i32("input.labels", {args.batch}, data.labels));
    infer.run();
    out.push_back(StoredTensor::from_f32("logits", infer.shape_of("logits"), infer.read("logits")));
    flb.run();
    out.push_back(StoredTensor::from_f32("loss", {}, flb.read("loss")));
    for (const std::string& name : param_names)
      out.push_back(StoredTensor::from_f32("grad." + name, flb.shape_of(name), flb.read("grad." + name)));
    train.step();
    out.push_back(StoredTensor::from_f32("step.loss", {}, train.read("loss")));
    for (const std::string& name : param_names)
      out.push_back(StoredTensor::from_f32("step." + name, train.shape_of(name), train.read(name)));
    write_safetensors(args.outputs, out,
                      {{"side", "mgn"},
                       {"workload", args.workload},
                       {"batch", std::to_string(args.batch)},
                       {"mode", precision_name(args.mode)},
                       {"backend", ctx.backend},
                       {"lr", std::to_string(args.lr)}});
    std::fprintf(stderr, "bench: gate outputs (logits, loss, gradients, parameters after one step) in %s\n",
                 args.outputs.c_str());
  }

  std::FILE* json = nullptr;
  if (!args.json.empty()) {
    json = std::fopen(args.json.c_str(), "w");
    if (!json) throw Error("bench: cannot write '" + args.json + "'");
  }
  ctx.json = json;
  try {
    for (const std::string& phase : args.phases) {
      if (phase == "compile") {
        double total = 0;
        std::string parts = ", \"parts_ms\": {";
        bool first = true;
        for (const char* p : {"inference", "flb", "step"}) {
          auto it = compile_ms.find(p);
          if (it == compile_ms.end()) continue;
          total += it->second;
          parts += std::string(first ? "" : ", ") + json_string(p) + ": " + json_number(it->second);
          first = false;
        }
        ctx.emit("compile", {total}, 0, parts + "}");
      } else if (phase == "inference") {
        std::vector<double> ms = time_calls(args.warmup, args.samples, [&] { infer.run(); });
        require_finite(infer.read("logits")[0], "a logit after the inference phase");
        ctx.emit(phase, ms, args.warmup);
      } else if (phase == "flb") {
        Session& flb = flb_holder.front();
        std::vector<double> ms = time_calls(args.warmup, args.samples, [&] { flb.run(); });
        require_finite(flb.read_scalar("loss"), "the loss after the F+L+B phase");
        ctx.emit(phase, ms, args.warmup);
      } else if (phase == "step") {
        Session& train = train_holder.front();
        std::vector<double> ms = time_calls(args.warmup, args.samples, [&] { train.step(); });
        require_finite(train.read_scalar("loss"), "the loss after the step phase");
        ctx.emit(phase, ms, args.warmup);
      }
    }
  } catch (...) {
    if (json) std::fclose(json);
    throw;
  }
  if (json) std::fclose(json);
  return 0;
}
