// Whole-model workloads of `mgn bench`: the Fashion-MNIST CNN/MLP and the Llama family (SmolLM2-135M, a tiny
// config for CI, any HF config.json). One runner times the phases (compile, inference, minimal, F+L+B, step),
// reports each session's planned and measured memory, and writes the tensors of one step from given weights
// and inputs for bench/compare.py to gate against PyTorch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cli.h"
#include "mgn/data.h"
#include "mgn/llama.h"
#include "mgn/models.h"
#include "mgn/safetensors.h"
#include "mgn/dinov3.h"
#include "mgn/dinovision.h"
#include "mgn/smolvla.h"
#include "mgn/unet.h"
#include "mgn/whisper.h"

namespace mgn::bench {

namespace {

// One graph input's host values.
struct Feed {
  std::string name;
  Shape shape;
  bool integer = false;
  std::vector<float> f32;
  std::vector<int32_t> i32;

  void apply(Session& s) const {
    if (integer)
      s.set_input(name, i32);
    else
      s.set_input(name, f32);
  }
  StoredTensor stored(const std::string& as) const {
    return integer ? StoredTensor::from_i32(as, shape, i32) : StoredTensor::from_f32(as, shape, f32);
  }
};

// What a model workload provides; run_model() does the rest.
struct ModelSpec {
  int64_t batch = 0;
  Json extra;  // fields added to every JSON line (e.g. the sequence length)
  // Infer: a graph with the output `output`; Train: one with the output "loss".
  std::function<Graph(Mode)> graph;
  std::string output = "logits";  // the inference output, gated under the name "logits"
  std::vector<Feed> infer_feeds, train_feeds;
  // The minimal phase (optional): its graph (output "logits"), what runs once after the weights are in
  // (e.g. filling a KV cache) and the timed call, which sets its own inputs.
  std::function<Graph()> minimal_graph;
  std::function<void(Session&)> minimal_prepare, minimal_call;
  // Adjusts the initial weights of the inference session before they are used or written (optional).
  std::function<void(Session&, const std::vector<std::string>&)> init_weights;
  std::map<std::string, std::string> weights_meta, gate_meta;
  // State that is no parameter (e.g. BatchNorm's running statistics): no gradient, gated after the step.
  std::function<bool(const std::string&)> is_state;
};

void require_finite(float v, const std::string& what) {
  if (!std::isfinite(v)) throw Error(what + " is not finite (" + std::to_string(v) + ")");
}

// The parameters of `s` under their (HF / torchvision) names, with metadata, so the PyTorch side can load
// them.
void write_weights(Session& s, const std::vector<std::string>& names, const std::string& path,
                   const std::map<std::string, std::string>& meta) {
  std::vector<StoredTensor> t;
  for (const std::string& n : names) t.push_back(StoredTensor::from_f32(n, s.shape_of(n), s.read(n)));
  write_safetensors(path, t, meta);
}

// One session's compile phases (CompileReport) as JSON, with the caller-timed graph build.
Json report_json(double graph_ms, const CompileReport& r) {
  return {{"graph_build_ms", graph_ms},   {"autodiff_ms", r.autodiff_ms},
          {"optimizer_ms", r.optimizer_ms}, {"verify_ms", r.verify_ms},
          {"device_ms", r.device_ms},       {"setup_ms", r.setup_ms},
          {"hash_ms", r.hash_ms},
          {"cache_ms", r.cache_ms},
          {"fusion_ms", r.fusion_ms},       {"emit_ms", r.emit_ms},
          {"plan_ms", r.plan_ms},           {"shaderc_ms", r.shaderc_ms},
          {"shaderc_cpu_ms", r.shaderc_cpu_ms}, {"validate_cpu_ms", r.validate_cpu_ms},
          {"pipeline_ms", r.pipeline_ms},   {"pipeline_cpu_ms", r.pipeline_cpu_ms},
          {"pipeline_thread_cpu_ms", r.pipeline_thread_cpu_ms},
          {"record_ms", r.record_ms},       {"alloc_ms", r.alloc_ms},
          {"commands_ms", r.commands_ms},
          {"store_ms", r.store_ms},         {"upload_ms", r.upload_ms},
          {"tune_ms", r.tune_ms},           {"tune_measured", r.tune_measured},
          {"tune_cached", r.tune_cached},   {"tune_timed", r.tune_timed},
          {"tune_file", r.tune_file},
          {"compile_ms", r.total_ms},       {"kernels", r.kernels},
          {"unique_kernels", r.unique_kernels}, {"emitted", r.emitted},
          {"compiled", r.compiled},         {"spirv_memory_hits", r.spirv_memory_hits},
          {"spirv_disk_hits", r.spirv_disk_hits}, {"spirv_from_session", r.spirv_from_session},
          {"pipelines_created", r.pipelines_created}, {"pipeline_threads", r.pipeline_threads},
          {"session_cache", r.session_cache}};
}

void print_report(const std::string& workload, const std::map<std::string, Json>& sessions) {
  static const char* kRows[] = {"graph_build_ms", "autodiff_ms", "optimizer_ms", "verify_ms", "device_ms",
                                "setup_ms", "hash_ms", "cache_ms", "fusion_ms", "emit_ms", "plan_ms", "shaderc_ms", "shaderc_cpu_ms",
                                "validate_cpu_ms", "pipeline_ms", "pipeline_cpu_ms", "pipeline_thread_cpu_ms",
                                "record_ms", "alloc_ms", "commands_ms", "store_ms", "tune_ms", "compile_ms",
                                "upload_ms"};
  static const char* kCounts[] = {"kernels", "unique_kernels", "emitted", "compiled", "spirv_memory_hits",
                                  "spirv_disk_hits", "spirv_from_session", "pipelines_created",
                                  "pipeline_threads", "tune_measured", "tune_cached", "tune_timed"};
  std::fprintf(stderr, "compile phases of %s (ms; graph build is outside compile, upload not counted)\n%-23s",
               workload.c_str(), "");
  for (auto& [name, j] : sessions) std::fprintf(stderr, " %11s", name.c_str());
  std::fprintf(stderr, "\n");
  for (const char* row : kRows) {
    std::fprintf(stderr, "%-23s", row);
    for (auto& [name, j] : sessions) std::fprintf(stderr, " %11.1f", j.at(row).get<double>());
    std::fprintf(stderr, "\n");
  }
  for (const char* row : kCounts) {
    std::fprintf(stderr, "%-23s", row);
    for (auto& [name, j] : sessions) std::fprintf(stderr, " %11llu", (unsigned long long)j.at(row).get<uint64_t>());
    std::fprintf(stderr, "\n");
  }
  for (const char* row : {"session_cache", "tune_file"}) {
    std::fprintf(stderr, "%-23s", row);
    for (auto& [name, j] : sessions) std::fprintf(stderr, " %11s", j.at(row).get<std::string>().c_str());
    std::fprintf(stderr, "\n");
  }
}

int run_model(const Args& a, const ModelSpec& m) {
  const bool gate = !a.outputs.empty();
  // The compile phase covers every session of the workload; the gate needs every session too.
  const bool all = a.has("compile") || gate;
  const bool need_min = m.minimal_graph && (a.has("minimal") || all);
  const bool need_flb = a.has("flb") || all, need_step = a.has("step") || all;
  ColdCache cold(a.cold_cache);

  // Compile: graph build + autodiff + optimizer + planning + kernels and pipelines, per session.
  std::map<std::string, double> compile_ms, graph_ms;
  std::map<std::string, Json> phases;  // per session: the compile phases
  auto t0 = Clock::now();
  Graph gi = m.graph(Mode::Infer);
  graph_ms["inference"] = ms_since(t0);
  Session infer = compile(gi, compile_options(a, Mode::Infer, cold));
  compile_ms["inference"] = ms_since(t0);
  phases["inference"] = report_json(graph_ms["inference"], infer.compile_report());
  const std::vector<std::string> params = infer.state_names();
  std::vector<std::string> trainable;
  for (const std::string& n : params)
    if (!m.is_state || !m.is_state(n)) trainable.push_back(n);

  std::optional<Graph> gm, gf, gt;
  std::optional<Session> minimal, flb, train;
  if (need_min) {
    t0 = Clock::now();
    gm.emplace(m.minimal_graph());
    graph_ms["minimal"] = ms_since(t0);
    minimal.emplace(compile(*gm, compile_options(a, Mode::Infer, cold)));
    compile_ms["minimal"] = ms_since(t0);
    phases["minimal"] = report_json(graph_ms["minimal"], minimal->compile_report());
  }
  if (need_flb) {
    t0 = Clock::now();
    gf.emplace(m.graph(Mode::Train));
    const auto ta = Clock::now();
    add_gradient_outputs(*gf, trainable, "bench " + a.workload);
    const double autodiff = ms_since(ta);
    graph_ms["flb"] = ms_since(t0) - autodiff;
    flb.emplace(compile(*gf, compile_options(a, Mode::Infer, cold)));
    compile_ms["flb"] = ms_since(t0);
    phases["flb"] = report_json(graph_ms["flb"], flb->compile_report());
    phases["flb"]["autodiff_ms"] = autodiff;  // the F+L+B graph's backward pass is built before compile()
  }
  if (need_step) {
    t0 = Clock::now();
    gt.emplace(m.graph(Mode::Train));
    graph_ms["step"] = ms_since(t0);
    train.emplace(compile(*gt, [&] {
      CompileOptions o = compile_options(a, Mode::Train, cold);
      o.optimizer = AdamW{.lr = a.lr};
      return o;
    }()));
    compile_ms["step"] = ms_since(t0);
    phases["step"] = report_json(graph_ms["step"], train->compile_report());
  }
  if (a.verbose) print_report(a.workload, phases);

  // Only compile times asked (e.g. a cold-cache run): no weights to make, copy or write, nothing to feed.
  const bool runs =
      gate || !a.weights.empty() ||
      std::any_of(a.phases.begin(), a.phases.end(), [](const std::string& p) { return p != "compile"; });
  int64_t n_params = 0;
  for (const std::string& name : params) n_params += numel(infer.shape_of(name));

  if (runs) {
    // Weights: one file both sides read, so PyTorch computes the same function.
    if (!a.weights.empty() && std::filesystem::exists(a.weights)) {
      infer.load_checkpoint(a.weights);
      std::fprintf(stderr, "bench: weights from %s\n", a.weights.c_str());
    } else {
      if (m.init_weights) m.init_weights(infer, params);
      if (!a.weights.empty()) {
        write_weights(infer, params, a.weights, m.weights_meta);
        std::fprintf(stderr, "bench: wrote the initial weights (seed %llu) to %s\n",
                     (unsigned long long)a.seed, a.weights.c_str());
      }
    }
    for (const std::string& name : params) {
      std::vector<float> v = infer.read(name);
      for (std::optional<Session>* s : {&minimal, &flb, &train})
        if (*s) (*s)->write_parameter(name, v);
    }
    for (const Feed& f : m.infer_feeds) f.apply(infer);
    for (std::optional<Session>* s : {&flb, &train})
      if (*s)
        for (const Feed& f : m.train_feeds) f.apply(**s);
    if (minimal && m.minimal_prepare) m.minimal_prepare(*minimal);
  }

  Json common = {{"side", "mgn"},
                 {"impl", "mgn"},
                 {"workload", a.workload},
                 {"phase", ""},
                 {"mode", precision_name(a.mode())},
                 {"backend", infer.backend()},
                 {"device", infer.device_type()},
                 {"batch", m.batch}};
  for (auto& [k, v] : m.extra.items()) common[k] = v;
  common["cache"] = a.cold_cache ? "cold" : "default";
  common["tune"] = tune_mode_name(a.base.tune);
  common["params"] = n_params;
  std::fprintf(stderr, "bench %s: batch %lld, %lld parameters, backend %s (%s), mode %s\n",
               a.workload.c_str(), (long long)m.batch, (long long)n_params, infer.backend(),
               infer.device_type(), precision_name(a.mode()));

  // The gate's outputs come first: the training session must take its one step from the given weights.
  if (gate) {
    std::vector<StoredTensor> out;
    for (const Feed& f : m.train_feeds) out.push_back(f.stored("input." + f.name));
    infer.run();
    out.push_back(StoredTensor::from_f32("logits", infer.shape_of(m.output), infer.read(m.output)));
    if (minimal) {
      m.minimal_call(*minimal);
      out.push_back(
          StoredTensor::from_f32("minimal.logits", minimal->shape_of("logits"), minimal->read("logits")));
    }
    flb->run();
    out.push_back(StoredTensor::from_f32("loss", {}, flb->read("loss")));
    for (const std::string& name : trainable)
      out.push_back(StoredTensor::from_f32("grad." + name, flb->shape_of(name), flb->read("grad." + name)));
    train->step();
    out.push_back(StoredTensor::from_f32("step.loss", {}, train->read("loss")));
    for (const std::string& name : params)
      out.push_back(StoredTensor::from_f32("step." + name, train->shape_of(name), train->read(name)));
    std::map<std::string, std::string> meta = {{"side", "mgn"},
                                               {"workload", a.workload},
                                               {"batch", std::to_string(m.batch)},
                                               {"mode", precision_name(a.mode())},
                                               {"backend", infer.backend()},
                                               {"lr", std::to_string(a.lr)}};
    for (auto& [k, v] : m.gate_meta) meta[k] = v;
    write_safetensors(a.outputs, out, meta);
    std::fprintf(stderr, "bench: gate outputs (logits, %sloss, gradients, parameters after one step) in %s\n",
                 minimal ? "minimal logits, " : "", a.outputs.c_str());
  }

  JsonLines lines(a.json);
  auto emit = [&](const std::string& phase, const Samples& ms, const Json& more) {
    Json r = common;
    r["phase"] = phase;
    r.update(summary(ms));
    r.update(more);
    lines.emit(r);
  };
  for (const std::string& phase : a.phases) {
    const std::string label = "bench " + a.workload + " " + phase;  // the progress line over the samples
    if (phase == "compile") {
      double total = 0;
      Json parts = Json::object(), per_session = Json::object(), sums = Json::object();
      for (const char* p : {"inference", "minimal", "flb", "step"}) {
        auto it = compile_ms.find(p);
        if (it == compile_ms.end()) continue;
        total += it->second;
        parts[p] = it->second;
        per_session[p] = phases.at(p);
        // Phase totals over the sessions (counts too); the cache verdicts stay per session.
        for (auto& [k, v] : phases.at(p).items())
          if (v.is_number()) sums[k] = sums.value(k, 0.0) + v.get<double>();
      }
      emit("compile", Samples{.ms = {total}}, {{"parts_ms", parts}, {"phases", per_session}, {"phase_totals", sums}});
    } else if (phase == "inference") {
      const Samples ms = time_calls(a.warmup, a.samples, [&] { infer.run(); }, label);
      require_finite(infer.read(m.output)[0], "the output after the inference phase");
      emit(phase, ms, memory_fields(infer, gi));
    } else if (phase == "minimal") {
      if (!minimal) throw Error(a.workload + " has no minimal phase");
      const Samples ms = time_calls(a.warmup, a.samples, [&] { m.minimal_call(*minimal); }, label);
      require_finite(minimal->read("logits")[0], "a logit after the minimal phase");
      emit(phase, ms, memory_fields(*minimal, *gm));
    } else if (phase == "flb") {
      const Samples ms = time_calls(a.warmup, a.samples, [&] { flb->run(); }, label);
      require_finite(flb->read_scalar("loss"), "the loss after the F+L+B phase");
      emit(phase, ms, memory_fields(*flb, *gf));
    } else if (phase == "step") {
      const Samples ms = time_calls(a.warmup, a.samples, [&] { train->step(); }, label);
      require_finite(train->read_scalar("loss"), "the loss after the step phase");
      emit(phase, ms, memory_fields(*train, *gt));
    }
  }
  return 0;
}

// ---- Fashion-MNIST

ModelSpec fashion_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.config.empty() || !a.cases.empty() || a.tiny)
    throw tool::UsageError(a.workload + " takes no --seq, --config, --cases or --tiny (other workloads do)");
  ModelSpec m;
  m.batch = a.batch ? a.batch : 64;
  const models::FashionArch arch =
      a.workload == "fashion-cnn" ? models::FashionArch::Cnn : models::FashionArch::Mlp;
  const int64_t batch = m.batch;
  const uint64_t seed = a.seed;
  m.graph = [=](Mode mode) {
    return models::fashion_mnist({.arch = arch, .batch = batch, .mode = mode, .seed = seed});
  };
  // Inputs: the first `batch` training images of Fashion-MNIST, which the PyTorch script reads too.
  const std::string dir = a.data.empty() ? a.fashion_mnist_dir : a.data;
  if (!std::filesystem::is_directory(dir))
    throw tool::UsageError("the Fashion-MNIST folder " + dir +
                           " does not exist (give --data DIR or MGN_FASHION_MNIST_DIR)");
  Dataset data = load_fashion_mnist(dir, Split::Train, batch);
  if (data.count < batch)
    throw Error(dir + " holds " + std::to_string(data.count) + " training images, batch is " +
                std::to_string(batch));
  Feed x{.name = "x", .shape = {batch, 1, 28, 28}, .f32 = data.features};
  Feed labels{.name = "labels", .shape = {batch}, .integer = true, .i32 = data.labels};
  m.infer_feeds = {x};
  m.train_feeds = {x, labels};
  return m;
}

// ---- Llama family

std::string config_json(const llama::Config& c) {
  Json j = {{"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.kv_heads()},
            {"head_dim", c.head_size()},
            {"intermediate_size", c.intermediate_size},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"max_position_embeddings", c.max_position_embeddings},
            {"initializer_range", c.initializer_range}};
  return j.dump();
}

// Token ids both sides compute from the same formula (bench/pytorch/llama_ref.py bench_ids): row b, position
// t of a [batch, seq + 1] table; the first seq columns are the prompt, the last one the minimal phase's
// token.
std::vector<int32_t> bench_ids(int64_t batch, int64_t cols, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> ids(size_t(batch * cols));
  for (int64_t i = 0; i < batch * cols; ++i) {
    uint64_t x = (uint64_t(i) * 2654435761ull + 12345ull + seed * 97ull) & 0xffffffffull;
    ids[size_t(i)] = int32_t((x >> 7) % uint64_t(vocab));
  }
  return ids;
}

ModelSpec llama_spec(Args& a) {
  a.check_phases({"compile", "inference", "minimal", "flb", "step"},
                 {"compile", "inference", "minimal", "flb", "step"});
  if (!a.cases.empty() || a.tiny)
    throw tool::UsageError(a.workload + " takes no --cases or --tiny (the microbenchmarks do)");
  llama::Config cfg;
  if (a.workload == "smollm2-135m") {
    cfg = llama::Config::smollm2_135m();
  } else if (a.workload == "llama-tiny") {
    cfg = llama::Config::tiny();
    cfg.initializer_range = 0.125;  // bench/pytorch/llama_ref.py's "tiny" (weights large enough to matter)
  } else {
    if (a.config.empty()) throw tool::UsageError("llama needs --config FILE.json (a Hugging Face config)");
    cfg = llama::Config::from_file(a.config);
  }
  if (a.workload != "llama" && !a.config.empty())
    throw tool::UsageError(a.workload + " takes no --config (the workload 'llama' does)");
  cfg.validate();
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 1, S = a.seq ? a.seq : 128, V = cfg.vocab_size;
  if (S + 1 > cfg.max_position_embeddings)
    throw tool::UsageError(a.workload + ": --seq " + std::to_string(S) +
                           " + 1 exceeds max_position_embeddings " +
                           std::to_string(cfg.max_position_embeddings));
  m.batch = B;
  m.extra = {{"seq", S}};
  const uint64_t seed = a.seed;
  m.graph = [=](Mode mode) {
    return mode == Mode::Infer ? llama::prefill_graph(cfg, {.batch = B, .seq = S, .seed = seed})
                               : llama::loss_graph(cfg, {.batch = B, .seq = S, .seed = seed});
  };
  const std::vector<int32_t> table = bench_ids(B, S + 1, V, seed);
  std::vector<int32_t> ids, next;
  for (int64_t b = 0; b < B; ++b) {
    ids.insert(ids.end(), table.begin() + b * (S + 1), table.begin() + b * (S + 1) + S);
    next.push_back(table[size_t(b * (S + 1) + S)]);
  }
  Feed fids{.name = "ids", .shape = {B, S}, .integer = true, .i32 = ids};
  Feed labels{.name = "labels", .shape = {B, S}, .integer = true, .i32 = llama::next_token_labels(ids, B, S)};
  m.infer_feeds = {fids};
  m.train_feeds = {fids, labels};

  // Minimal: one token at position S for every row, with the KV cache of the S prompt tokens (filled by the
  // decode graph itself, token by token; the cache has room for S + 1 positions).
  m.minimal_graph = [=] { return llama::decode_graph(cfg, {.batch = B, .seq = S + 1, .seed = seed}); };
  m.minimal_prepare = [=](Session& s) {
    std::vector<int32_t> col(static_cast<size_t>(B));
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t b = 0; b < B; ++b) col[size_t(b)] = ids[size_t(b * S + t)];
      s.set_input("ids", col);
      s.set_input("pos", std::vector<int32_t>{int32_t(t)});
      s.run();
    }
  };
  m.minimal_call = [=](Session& s) {
    s.set_input("ids", next);
    s.set_input("pos", std::vector<int32_t>{int32_t(S)});
    s.run();
  };
  // HF's init makes every norm weight 1, where a side that dropped one would still agree: 1 + U(-0.1, 0.1).
  m.init_weights = [=](Session& s, const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      if (n.size() < 11 || n.compare(n.size() - 11, 11, "norm.weight") != 0) continue;
      std::vector<float> v = uniform(size_t(numel(s.shape_of(n))), name_seed(n, seed), -0.1f, 0.1f);
      for (float& x : v) x += 1.0f;
      s.write_parameter(n, v);
    }
  };
  const std::string cj = config_json(cfg);
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"seq", std::to_string(S)}, {"config", cj}};
  return m;
}

// ---- ResNet (torchvision layout, real BatchNorm)

// Inputs both sides read from the gate file (input.x, input.labels): uniform images in [-1, 1) and labels
// from bench_ids' formula.
ModelSpec resnet_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.config.empty() || !a.cases.empty() || a.tiny)
    throw tool::UsageError(a.workload + " takes no --seq, --config, --cases or --tiny (other workloads do)");
  models::ResNetConfig cfg;
  if (a.workload == "resnet-tiny") {
    cfg.depth = 18;
    cfg.width = 8;
    cfg.image_size = 64;  // layer4 at 2x2: BatchNorm over 8 values per channel, not 2 (ill-conditioned)
    cfg.num_classes = 10;
    cfg.batch = 2;
  }
  if (a.batch) cfg.batch = a.batch;
  cfg.seed = a.seed;
  ModelSpec m;
  m.batch = cfg.batch;
  m.extra = {{"image", cfg.image_size}};
  m.graph = [=](Mode mode) {
    models::ResNetConfig c = cfg;
    c.mode = mode;
    return models::resnet(c);
  };
  const int64_t B = cfg.batch, S = cfg.image_size;
  Feed x{.name = "x",
         .shape = {B, 3, S, S},
         .f32 = uniform(size_t(B * 3 * S * S), a.seed * 131 + 7, -1.0f, 1.0f)};
  Feed labels{
      .name = "labels", .shape = {B}, .integer = true, .i32 = bench_ids(B, 1, cfg.num_classes, a.seed)};
  m.infer_feeds = {x};
  m.train_feeds = {x, labels};
  m.is_state = [](const std::string& n) {
    auto ends = [&](const char* s) {
      std::string t(s);
      return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
    };
    return ends(".running_mean") || ends(".running_var");
  };
  // torchvision's init gives every BN weight 1, bias 0, running mean 0, var 1, where a side that dropped one
  // would still agree: weight 1 + U(-0.1, 0.1), bias, mean U(-0.1, 0.1), var 1 + U(0, 0.5).
  m.init_weights = [seed = a.seed](Session& s, const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      if (n.find("bn") == std::string::npos && n.find("downsample.1") == std::string::npos) continue;
      const size_t k = size_t(numel(s.shape_of(n)));
      std::vector<float> v;
      auto ends = [&](const std::string& t) {
        return n.size() >= t.size() && n.compare(n.size() - t.size(), t.size(), t) == 0;
      };
      if (ends(".weight")) {
        v = uniform(k, name_seed(n, seed), 0.9f, 1.1f);
      } else if (ends(".bias") || ends(".running_mean")) {
        v = uniform(k, name_seed(n, seed), -0.1f, 0.1f);
      } else if (ends(".running_var")) {
        v = uniform(k, name_seed(n, seed), 1.0f, 1.5f);
      } else {
        continue;
      }
      s.write_parameter(n, v);
    }
  };
  const std::string cj = Json{
      {"depth", cfg.depth},
      {"width", cfg.width},
      {"image_size", cfg.image_size},
      {"num_classes", cfg.num_classes},
      {"bn_momentum", cfg.bn_momentum},
      {"bn_eps", cfg.bn_eps}}.dump();
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"image", std::to_string(S)}, {"config", cj}};
  return m;
}

// ---- Whisper encoder

// The paper's Whisper workload: the encoder, objective mean(last_hidden_state²), the paper's sine init;
// whisper-encoder-test is a reduced config (2 layers, d_model 64, 300 frames) for CI's harness run. Input: mel
// frames uniform in [-1, 1) (the range of Whisper's normalized log-mel), both sides read it from the gate file.
ModelSpec whisper_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.cases.empty() || a.tiny)
    throw tool::UsageError(a.workload + " takes no --seq, --cases or --tiny (other workloads do)");
  whisper::Config cfg = whisper::Config::tiny();
  if (a.workload == "whisper-encoder-test")
    cfg = {.d_model = 64, .encoder_layers = 2, .encoder_attention_heads = 4, .encoder_ffn_dim = 96,
           .max_source_positions = 150};
  if (!a.config.empty()) cfg = whisper::Config::from_file(a.config);
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 1, F = cfg.frames();
  m.batch = B;
  m.extra = {{"frames", F}};
  m.output = "last_hidden_state";
  m.graph = [=](Mode mode) {
    return whisper::encoder_graph(cfg, {.batch = B, .init = whisper::Init::PaperSine}, mode);
  };
  Feed mel{.name = "mel", .shape = {B, cfg.num_mel_bins, F},
           .f32 = uniform(size_t(B * cfg.num_mel_bins * F), a.seed * 131 + 11, -1.0f, 1.0f)};
  m.infer_feeds = {mel};
  m.train_feeds = {mel};
  m.is_state = [](const std::string& n) { return n == "embed_positions.weight"; };
  const std::string cj = Json{{"d_model", cfg.d_model},
                              {"encoder_layers", cfg.encoder_layers},
                              {"encoder_attention_heads", cfg.encoder_attention_heads},
                              {"encoder_ffn_dim", cfg.encoder_ffn_dim},
                              {"num_mel_bins", cfg.num_mel_bins},
                              {"max_source_positions", cfg.max_source_positions}}.dump();
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"frames", std::to_string(F)}, {"config", cj}};
  return m;
}

// ---- DINOv3 ViT and the DinoVision decoder

dinov3::Config dinov3_test_config() {
  dinov3::Config c;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.intermediate_size = 96;
  c.image_size = 64;
  return c;
}

std::string dinov3_config_json(const dinov3::Config& c) {
  return Json{{"hidden_size", c.hidden_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"intermediate_size", c.intermediate_size},
              {"patch_size", c.patch_size},
              {"num_channels", c.num_channels},
              {"image_size", c.image_size},
              {"num_register_tokens", c.num_register_tokens},
              {"rope_theta", c.rope_theta},
              {"layer_norm_eps", c.layer_norm_eps},
              {"layerscale_value", c.layerscale_value},
              {"query_bias", c.query_bias},
              {"key_bias", c.key_bias},
              {"value_bias", c.value_bias},
              {"proj_bias", c.proj_bias},
              {"mlp_bias", c.mlp_bias},
              {"hidden_act", "gelu"},
              {"use_gated_mlp", false}}.dump();
}

// The paper's DINOv3 workload: ViT-S/16 at 224² (5 + 196 tokens), objective mean(last_hidden_state²), the
// paper's sine init; dinov3-test is a reduced config (2 layers, hidden 64, 64² images) for CI's harness run.
// Input: pixels uniform in [-2, 2) (the range of ImageNet-normalized images), both sides read it from the gate file.
ModelSpec dinov3_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.cases.empty() || a.tiny)
    throw tool::UsageError(a.workload + " takes no --seq, --cases or --tiny (other workloads do)");
  dinov3::Config cfg = a.workload == "dinov3-test" ? dinov3_test_config() : dinov3::Config::vits16();
  if (!a.config.empty()) cfg = dinov3::Config::from_file(a.config);
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 1, S = cfg.image_size;
  m.batch = B;
  m.extra = {{"image", S}};
  m.output = "last_hidden_state";
  m.graph = [=](Mode mode) {
    return dinov3::vit_graph(cfg, {.batch = B, .height = S, .width = S, .init = dinov3::Init::PaperSine}, mode);
  };
  Feed px{.name = "pixel_values", .shape = {B, cfg.num_channels, S, S},
          .f32 = uniform(size_t(B * cfg.num_channels * S * S), a.seed * 131 + 13, -2.0f, 2.0f)};
  m.infer_feeds = {px};
  m.train_feeds = {px};
  m.is_state = [](const std::string& n) { return n == "embeddings.mask_token"; };
  const std::string cj = dinov3_config_json(cfg);
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"image", std::to_string(S)}, {"config", cj}};
  return m;
}

// DinoVision's decoder training step (the paper's shape: batch 8, features [384, 14, 14] -> RGB 224²; MSE against
// the target); dinovision-test: hidden 64, 4 x 4 features, widths 16,16,8,8,8. Features uniform in [-2, 2),
// targets uniform in [0, 1); both sides read them from the gate file. PyTorch's Conv2d default init.
ModelSpec dinovision_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.cases.empty() || a.tiny || !a.config.empty())
    throw tool::UsageError(a.workload + " takes no --seq, --cases, --tiny or --config (other workloads do)");
  dinovision::DecoderConfig cfg;
  if (a.workload == "dinovision-test") cfg = {.in_channels = 64, .grid = 4, .widths = {16, 16, 8, 8, 8}, .groups = 4};
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 8, S = cfg.image_size();
  m.batch = B;
  m.extra = {{"image", S}};
  m.output = "image";
  const uint64_t seed = a.seed;
  m.graph = [=](Mode mode) { return dinovision::decoder_graph(cfg, B, mode, seed); };
  Feed f{.name = "features", .shape = {B, cfg.in_channels, cfg.grid, cfg.grid},
         .f32 = uniform(size_t(B * cfg.in_channels * cfg.grid * cfg.grid), a.seed * 131 + 17, -2.0f, 2.0f)};
  Feed t{.name = "target", .shape = {B, 3, S, S}, .f32 = uniform(size_t(B * 3 * S * S), a.seed * 131 + 19, 0.0f, 1.0f)};
  m.infer_feeds = {f};
  m.train_feeds = {f, t};
  // GroupNorm's init is weight 1, bias 0, where a side that dropped one would still agree: 1 + U(-0.1, 0.1), U(-0.1, 0.1).
  m.init_weights = [=](Session& s, const std::vector<std::string>& names) {
    for (const std::string& n : names) {
      if (n.find(".norm.") == std::string::npos) continue;
      std::vector<float> v = uniform(size_t(numel(s.shape_of(n))), name_seed(n, seed), -0.1f, 0.1f);
      if (n.ends_with(".weight"))
        for (float& x : v) x += 1.0f;
      s.write_parameter(n, v);
    }
  };
  const std::string cj = Json{{"in_channels", cfg.in_channels}, {"grid", cfg.grid}, {"widths", cfg.widths},
                              {"groups", cfg.groups}, {"eps", cfg.eps}}.dump();
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"image", std::to_string(S)}, {"config", cj}};
  return m;
}

// ---- SmolVLA action expert

// The paper's SmolVLA workload: the action expert at batch 1 on the spec's benchmark inputs (noisy_actions
// sin(0.01 i), timestep sin(0.005 i), every VLM K/V input cos(0.01 i), target zeros), loss mean((v - target)²),
// the paper's sine init. The minimal phase is the spec's latency shape: 1 action token, still 16 VLM tokens.
// smolvla-expert-test is the reduced config (4 layers, hidden 48) for CI's harness run; smolvla-expert-lerobot
// is the paper's config with lerobot's attention (self layers over the VLM prefix too, RoPE; Attention::Lerobot).
ModelSpec smolvla_spec(Args& a) {
  a.check_phases({"compile", "inference", "minimal", "flb", "step"},
                 {"compile", "inference", "minimal", "flb", "step"});
  if (a.seq || !a.cases.empty() || a.tiny || !a.config.empty())
    throw tool::UsageError(a.workload + " takes no --seq, --cases, --tiny or --config (other workloads do)");
  smolvla::Config cfg = a.workload == "smolvla-expert-test" ? smolvla::Config::reduced() : smolvla::Config::paper();
  if (a.workload == "smolvla-expert-lerobot") cfg.attention = smolvla::Attention::Lerobot;
  const bool lerobot = cfg.attention == smolvla::Attention::Lerobot;
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 1;
  m.batch = B;
  m.extra = {{"chunk", cfg.chunk}, {"vlm_tokens", cfg.vlm_tokens}};
  m.output = "velocity";
  m.graph = [=](Mode mode) { return smolvla::expert_graph(cfg, {.batch = B}, mode); };
  // Feeds of a graph with `chunk` action tokens: the pattern over the whole tensor (batch rows included).
  auto feeds = [=](int64_t chunk, bool train) {
    std::vector<Feed> f;
    const Mode mode = train ? Mode::Train : Mode::Infer;
    for (auto& [name, shape] : smolvla::input_shapes(cfg, {.batch = B, .chunk = chunk}, mode)) {
      Feed x{.name = name, .shape = shape, .f32 = std::vector<float>(size_t(numel(shape)))};
      for (size_t i = 0; i < x.f32.size(); ++i)
        x.f32[i] = name == "noisy_actions" ? float(std::sin(0.01 * double(i)))
                   : name == "timestep"    ? float(std::sin(0.005 * double(i)))
                   : name == "target"      ? 0.0f
                                           : float(std::cos(0.01 * double(i)));
      f.push_back(std::move(x));
    }
    return f;
  };
  m.infer_feeds = feeds(cfg.chunk, false);
  m.train_feeds = feeds(cfg.chunk, true);
  m.minimal_graph = [=] {
    Graph g = smolvla::expert_graph(cfg, {.batch = B, .chunk = 1});
    g.output("logits", *g.find_output("velocity"));
    return g;
  };
  const std::vector<Feed> one = feeds(1, false);
  m.minimal_prepare = [=](Session& s) {
    for (const Feed& f : one) f.apply(s);
  };
  m.minimal_call = [](Session& s) { s.run(); };
  const std::string cj = Json{{"hidden", cfg.hidden},
                              {"layers", cfg.layers},
                              {"heads", cfg.heads},
                              {"kv_heads", cfg.kv_heads},
                              {"head_dim", cfg.head_dim},
                              {"intermediate", cfg.intermediate},
                              {"action_dim", cfg.action_dim},
                              {"chunk", cfg.chunk},
                              {"time_dim", cfg.time_dim},
                              {"vlm_kv_dim", cfg.vlm_kv_dim},
                              {"vlm_tokens", cfg.vlm_tokens},
                              {"rms_norm_eps", cfg.rms_norm_eps},
                              {"rope_theta", cfg.rope_theta},
                              {"attention", lerobot ? "lerobot" : "paper"}}.dump();
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"chunk", std::to_string(cfg.chunk)}, {"config", cj}};
  return m;
}

// ---- the conditioned U-Net

// The paper's U-Net workload (workload-specs.md §2): SDUNetConfig::small(), batch 1, the spec's inputs
// (noisy_latent = sin(0.01 i), timestep_embedding = sin(0.005 i), text_context = 0.1·cos(0.003 i) [77, 768]
// for every row, noise_target = cos(0.007 i)), loss mean((noise_pred - noise_target)²), the paper's sine init.
// sd-unet-test: the spec's tiny() cut to 2 levels with an 8-token context, for CI's harness run.
ModelSpec unet_spec(Args& a) {
  a.check_phases({"compile", "inference", "flb", "step"}, {"compile", "inference", "flb", "step"});
  if (a.seq || !a.cases.empty() || a.tiny || !a.config.empty())
    throw tool::UsageError(a.workload + " takes no --seq, --cases, --tiny or --config (other workloads do)");
  unet::Config cfg = unet::Config::small();
  if (a.workload == "sd-unet-test") {
    cfg = unet::Config::tiny();
    cfg.levels = 2;
    cfg.context_len = 8;
  }
  ModelSpec m;
  const int64_t B = a.batch ? a.batch : 1;
  const unet::GraphOptions go{.batch = B, .init = unet::Init::PaperSine};
  m.batch = B;
  m.extra = {{"latent", cfg.latent}, {"context_len", cfg.context_len}};
  m.output = "noise_pred";
  m.graph = [=](Mode mode) { return unet::graph(cfg, go, mode); };
  auto seq = [](int64_t n, auto f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(f(double(i)));
    return v;
  };
  const Shape lat = unet::input_shape(cfg, go, "noisy_latent"), ctx = unet::input_shape(cfg, go, "text_context");
  const Shape temb = unet::input_shape(cfg, go, "timestep_embedding");
  std::vector<float> one_ctx = seq(cfg.context_len * cfg.context_dim, [](double i) { return 0.1 * std::cos(0.003 * i); });
  std::vector<float> all_ctx;
  for (int64_t b = 0; b < B; ++b) all_ctx.insert(all_ctx.end(), one_ctx.begin(), one_ctx.end());
  Feed x{.name = "noisy_latent", .shape = lat, .f32 = seq(numel(lat), [](double i) { return std::sin(0.01 * i); })};
  Feed t{.name = "timestep_embedding", .shape = temb,
         .f32 = seq(numel(temb), [](double i) { return std::sin(0.005 * i); })};
  Feed c{.name = "text_context", .shape = ctx, .f32 = all_ctx};
  Feed y{.name = "noise_target", .shape = lat, .f32 = seq(numel(lat), [](double i) { return std::cos(0.007 * i); })};
  m.infer_feeds = {x, t, c};
  m.train_feeds = {x, t, c, y};
  const std::string cj = Json{{"in_channels", cfg.in_channels},       {"base_channels", cfg.base_channels},
                              {"levels", cfg.levels},                 {"groups", cfg.groups},
                              {"eps", cfg.eps},                       {"time_input_dim", cfg.time_input_dim},
                              {"time_embed_dim", cfg.time_embed_dim}, {"context_dim", cfg.context_dim},
                              {"context_len", cfg.context_len},       {"head_dim", cfg.head_dim},
                              {"latent", cfg.latent}}.dump();
  m.weights_meta = {{"format", "pt"}, {"workload", a.workload}, {"config", cj}};
  m.gate_meta = {{"latent", std::to_string(cfg.latent)}, {"config", cj}};
  return m;
}

}  // namespace

bool is_model_workload(const std::string& w) {
  return w == "fashion-cnn" || w == "fashion-mlp" || w == "smollm2-135m" || w == "llama-tiny" ||
         w == "llama" || w == "resnet50" || w == "resnet-tiny" || w == "whisper-tiny-encoder" ||
         w == "whisper-encoder-test" || w == "dinov3-vits16" || w == "dinov3-test" || w == "dinovision" ||
         w == "dinovision-test" || w == "smolvla-expert" || w == "smolvla-expert-test" ||
         w == "smolvla-expert-lerobot" || w == "sd-unet-small" || w == "sd-unet-test";
}

int run_model_bench(Args& a) {
  ModelSpec m = a.workload.rfind("fashion-", 0) == 0 ? fashion_spec(a)
                : a.workload.rfind("resnet", 0) == 0 ? resnet_spec(a)
                : a.workload.rfind("whisper", 0) == 0 ? whisper_spec(a)
                : a.workload.rfind("dinov3", 0) == 0 ? dinov3_spec(a)
                : a.workload.rfind("dinovision", 0) == 0 ? dinovision_spec(a)
                : a.workload.rfind("smolvla", 0) == 0 ? smolvla_spec(a)
                : a.workload.rfind("sd-unet", 0) == 0 ? unet_spec(a)
                                                     : llama_spec(a);
  return run_model(a, m);
}

}  // namespace mgn::bench
