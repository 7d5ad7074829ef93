// `mgn llama-check`: the Llama-family correctness gates on one backend against a reference directory written
// by bench/pytorch/llama_ref.py (transformers' LlamaForCausalLM, strict f32), and the phases the paper times
// (compile, prefill, one decode token, F+L+B), next to PyTorch eager when DIR/torch_times.json is there.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cli.h"
#include "mgn/graph.h"
#include "mgn/llama.h"
#include "mgn/safetensors.h"
#include "mgn/session.h"

namespace mgn::tool {

namespace {

using mgn::bench::Clock;
using mgn::bench::Json;
using mgn::bench::ms_since;

struct Args {
  std::string dir, json;
  int64_t seq = 0;     // timing length of prefill and F+L+B; 0: the reference's
  int64_t tokens = 0;  // greedy tokens compared; 0: all the reference has
  int64_t warmup = 5, samples = 20;
  bool no_time = false;
  double tol_logits = 1e-3, tol_loss = 1e-4, tol_grad = 1e-3;  // the gates of issue 6
  CompileFlags compile;
};

struct Diff {
  double rel_l2 = 0, max_abs = 0;
};

// ||got - want|| / ||want|| in double (||got - want|| when want is zero) and the largest element difference.
Diff compare(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  if (got.size() != want.size())
    throw mgn::Error(what + " has " + std::to_string(got.size()) + " values, the reference " +
                     std::to_string(want.size()));
  double num = 0, den = 0, mx = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * double(want[i]);
    mx = std::max(mx, std::fabs(d));
  }
  return {den > 0 ? std::sqrt(num / den) : std::sqrt(num), mx};
}

// The greedy choice (lowest id on ties, as torch.argmax) and its lead over the runner-up.
struct Pick {
  int32_t id = 0;
  double margin = 0;
};
Pick pick(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = i;
  double second = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (i != best) second = std::max(second, double(v[i]));
  return {int32_t(best), double(v[best]) - second};
}

// Session::run returns after the device finished, so the wall time of one call is one synchronized sample
// (the protocol of mgn bench, bench_common.h).
Json time_calls(int64_t warmup, int64_t samples, const std::function<void()>& fn) {
  return mgn::bench::summary(mgn::bench::time_calls({.calls = warmup}, samples, fn));
}

struct Gate {
  std::string name;
  double value, limit;
  bool pass;
  std::string detail;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Index of the first token where a and b differ (their common length when none does).
size_t first_mismatch(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

std::string tokens_text(const std::vector<int32_t>& t) {
  std::string s;
  for (size_t i = 0; i < t.size(); ++i) s += (i ? " " : "") + std::to_string(t[i]);
  return s;
}

std::optional<Json> read_torch_times(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  try {
    return Json::parse(f);
  } catch (const Json::exception& e) {
    throw mgn::Error(path + " is not valid JSON: " + e.what());
  }
}

// The F+L+B graph: the loss graph with every parameter's gradient as an output "grad.<name>" (shared with
// mgn bench's Llama workloads).
mgn::Graph flb_graph(const mgn::llama::Config& cfg, int64_t batch, int64_t seq) {
  return mgn::bench::llama_flb_graph(cfg, batch, seq);
}

int llama_check(const Args& a, const Context& c) {
  const llama::Config cfg = llama::Config::from_file(a.dir + "/config.json");
  auto t0 = Clock::now();
  const std::map<std::string, std::vector<float>> weights = llama::read_weights(cfg, a.dir);
  const double read_ms = ms_since(t0);
  const std::string ref_path = a.dir + "/inputs.safetensors";
  const SafetensorsFile ref = SafetensorsFile::read(ref_path);
  auto meta = [&](const std::string& k) {
    auto it = ref.metadata().find(k);
    return it == ref.metadata().end() ? std::string("?") : it->second;
  };

  const StoredTensor& ids_t = ref.get("ref.ids");
  if (ids_t.shape.size() != 2) throw Error("" + ref_path + ": ref.ids must be [batch, seq]");
  const int64_t B = ids_t.shape[0], S = ids_t.shape[1], V = cfg.vocab_size;
  const std::vector<int32_t> ids = ids_t.to_i32(), prompt = ref.get("ref.prompt").to_i32();
  std::vector<int32_t> want_greedy = ref.get("ref.greedy").to_i32();
  auto check_tokens = [&](const std::vector<int32_t>& v, const char* what) {
    for (int32_t t : v)
      if (t < 0 || t >= V)
        throw Error("" + ref_path + ": " + what + " holds token " + std::to_string(t) +
                    ", outside the vocabulary of " + std::to_string(V));
  };
  check_tokens(ids, "ref.ids");
  check_tokens(prompt, "ref.prompt");
  check_tokens(want_greedy, "ref.greedy");
  if (a.tokens > int64_t(want_greedy.size()))
    throw UsageError("--tokens " + std::to_string(a.tokens) + ": the reference has only " +
                     std::to_string(want_greedy.size()) + " greedy tokens");
  const int64_t N = a.tokens ? a.tokens : int64_t(want_greedy.size()), P = int64_t(prompt.size());
  want_greedy.resize(size_t(N));
  const int64_t T = a.seq ? a.seq : S;  // timing length
  int64_t n_params = 0;
  for (auto& [name, shape] : llama::parameter_shapes(cfg)) n_params += numel(shape);

  const CompileOptions copt = compile_options(c, a.compile, Mode::Infer);
  std::map<std::string, double> compile_ms;
  std::vector<Gate> gates;
  Json out;
  out["dir"] = a.dir;
  out["config"] = {{"vocab_size", V},
                   {"hidden_size", cfg.hidden_size},
                   {"num_hidden_layers", cfg.num_hidden_layers},
                   {"num_attention_heads", cfg.num_attention_heads},
                   {"num_key_value_heads", cfg.kv_heads()},
                   {"head_dim", cfg.head_size()},
                   {"intermediate_size", cfg.intermediate_size},
                   {"tie_word_embeddings", cfg.tie_word_embeddings},
                   {"parameters", n_params}};
  out["reference"] = {{"impl", meta("impl")},
                      {"config", meta("config")},
                      {"device", meta("device")},
                      {"torch", meta("torch")},
                      {"transformers", meta("transformers")},
                      {"seed", meta("seed")}};
  out["shapes"] = {{"batch", B}, {"seq", S}, {"prompt", P}, {"tokens", N}, {"timing_seq", T}};

  // ---- prefill logits
  t0 = Clock::now();
  Graph gp = llama::prefill_graph(cfg, {.batch = B, .seq = S});
  Session pre = compile(gp, copt);
  compile_ms["prefill"] = ms_since(t0);
  std::printf("llama-check %s: %lld layers, hidden %lld, heads %lld/%lld, vocab %lld, %.1fM parameters\n",
              a.dir.c_str(), (long long)cfg.num_hidden_layers, (long long)cfg.hidden_size,
              (long long)cfg.num_attention_heads, (long long)cfg.kv_heads(), (long long)V,
              double(n_params) / 1e6);
  std::printf(
      "reference: %s (torch %s, transformers %s) on %s; backend %s (%s); batch %lld, seq %lld, prompt %lld, "
      "%lld greedy tokens\n",
      meta("impl").c_str(), meta("torch").c_str(), meta("transformers").c_str(), meta("device").c_str(),
      pre.backend(), pre.device_type(), (long long)B, (long long)S, (long long)P, (long long)N);
  std::fflush(stdout);
  out["backend"] = pre.backend();
  out["device_type"] = pre.device_type();
  t0 = Clock::now();
  llama::load_weights(pre, weights);
  const double upload_ms = ms_since(t0);
  pre.set_input("ids", ids);
  pre.run();
  {
    const StoredTensor& rl = ref.get("ref.logits");
    if (rl.shape != Shape{B, S, V}) throw Error("" + ref_path + ": ref.logits is not [batch, seq, vocab]");
    std::vector<float> got = pre.read("logits"), want = rl.to_f32();
    Diff d = compare(got, want, "logits");
    int64_t agree = 0;
    for (int64_t r = 0; r < B * S; ++r)
      agree += pick(&got[size_t(r * V)], V).id == pick(&want[size_t(r * V)], V).id;
    gates.push_back({"prefill logits rel-L2", d.rel_l2, a.tol_logits, d.rel_l2 < a.tol_logits,
                     "max abs " + fmt("%.2e", d.max_abs) + ", argmax equal at " + std::to_string(agree) +
                         "/" + std::to_string(B * S) + " positions"});
    out["logits"] = {
        {"rel_l2", d.rel_l2}, {"max_abs", d.max_abs}, {"argmax_equal", agree}, {"positions", B * S}};
  }

  // ---- F+L+B: loss and every gradient
  t0 = Clock::now();
  Graph gl = flb_graph(cfg, B, S);
  Session flb = compile(gl, copt);
  compile_ms["flb"] = ms_since(t0);
  llama::load_weights(flb, weights);
  const std::vector<int32_t> labels = llama::next_token_labels(ids, B, S);
  flb.set_input("ids", ids);
  flb.set_input("labels", labels);
  flb.run();
  {
    double loss = flb.read_scalar("loss"), want = ref.get("ref.loss").to_f64().at(0);
    double rel = std::fabs(loss - want) / std::fabs(want);
    gates.push_back({"loss rel. error", rel, a.tol_loss, rel < a.tol_loss,
                     fmt("%.7f", loss) + " vs " + fmt("%.7f", want)});
    out["loss"] = {{"mgn", loss}, {"reference", want}, {"rel", rel}};
    Json per = Json::object();
    double worst = 0;
    std::string worst_name;
    int64_t over = 0, n = 0;
    for (auto& [name, shape] : llama::parameter_shapes(cfg)) {
      const StoredTensor& rg = ref.get("grad." + name);
      if (rg.shape != shape) throw Error("" + ref_path + ": grad." + name + " has the wrong shape");
      Diff d = compare(flb.read("grad." + name), rg.to_f32(), "grad." + name);
      per[name] = {{"rel_l2", d.rel_l2}, {"max_abs", d.max_abs}};
      over += !(d.rel_l2 < a.tol_grad);
      ++n;
      if (!(d.rel_l2 <= worst)) {
        worst = d.rel_l2;
        worst_name = name;
      }
    }
    gates.push_back({"gradients, worst rel-L2", worst, a.tol_grad, over == 0,
                     std::to_string(n) + " tensors, " + std::to_string(over) + " over; worst " + worst_name});
    out["gradients"] = per;
  }

  // ---- greedy decoding: KV cache (llama::generate) vs prefill only vs the reference
  if (P + N - 1 > cfg.max_position_embeddings) throw Error("prompt + tokens exceed max_position_embeddings");
  t0 = Clock::now();
  Graph gd = llama::decode_graph(cfg, {.batch = 1, .seq = P + N});
  Session dec = compile(gd, copt);
  compile_ms["decode"] = ms_since(t0);
  llama::load_weights(dec, weights);
  const std::vector<int32_t> kv = llama::generate(dec, cfg, prompt, {.max_new_tokens = N});

  // Prefill only: one graph of length P + N - 1; causal attention makes the logits at row t depend on tokens
  // 0..t alone, so the rows after the current one may hold anything (zeros) and no length needs a new graph.
  const int64_t L = P + N - 1;
  std::optional<Graph> gg;
  std::optional<Session> greedy_session;
  Session* gs = &pre;
  int64_t gs_len = S;
  if (B != 1 || L > S) {
    t0 = Clock::now();
    gg.emplace(llama::prefill_graph(cfg, {.batch = 1, .seq = L}));
    greedy_session.emplace(compile(*gg, copt));
    compile_ms["prefill_greedy"] = ms_since(t0);
    llama::load_weights(*greedy_session, weights);
    gs = &*greedy_session;
    gs_len = L;
  }
  std::vector<int32_t> seq_ids(size_t(gs_len), 0), prefill_only;
  std::copy(prompt.begin(), prompt.end(), seq_ids.begin());
  double min_margin = INFINITY;
  for (int64_t t = 0; t < N; ++t) {
    gs->set_input("ids", seq_ids);
    gs->run();
    std::vector<float> lg = gs->read("logits");
    Pick p = pick(&lg[size_t((P - 1 + t) * V)], V);
    min_margin = std::min(min_margin, p.margin);
    prefill_only.push_back(p.id);
    if (P + t < gs_len) seq_ids[size_t(P + t)] = p.id;
  }
  auto greedy_gate = [&](const char* name, const std::vector<int32_t>& x, const std::vector<int32_t>& y) {
    size_t m = first_mismatch(x, y);
    bool pass = m == size_t(N) && x.size() == y.size();
    gates.push_back(
        {name, double(m), double(N), pass,
         pass ? "all " + std::to_string(N) + " equal" : "first difference at token " + std::to_string(m)});
  };
  greedy_gate("greedy: KV cache == reference", kv, want_greedy);
  greedy_gate("greedy: prefill only == reference", prefill_only, want_greedy);
  greedy_gate("greedy: KV cache == prefill only", kv, prefill_only);
  out["greedy"] = {{"reference", want_greedy},
                   {"kv_cache", kv},
                   {"prefill_only", prefill_only},
                   {"min_margin", min_margin}};

  // ---- timings
  Json phases = Json::object();
  std::optional<Graph> gpt, gft;
  std::optional<Session> tpre_s, tflb_s;
  if (!a.no_time) {
    Session* tpre = &pre;
    Session* tflb = &flb;
    std::vector<int32_t> tids = ids, tlabels = labels;
    if (T != S || B != 1) {  // separate sessions at the timing length, batch 1, the reference ids cycled
      tids.resize(size_t(T));
      for (int64_t i = 0; i < T; ++i) tids[size_t(i)] = ids[size_t(i % (B * S))];
      tlabels = llama::next_token_labels(tids, 1, T);
      gpt.emplace(llama::prefill_graph(cfg, {.batch = 1, .seq = T}));
      tpre_s.emplace(compile(*gpt, copt));
      gft.emplace(flb_graph(cfg, 1, T));
      tflb_s.emplace(compile(*gft, copt));
      llama::load_weights(*tpre_s, weights);
      llama::load_weights(*tflb_s, weights);
      tpre = &*tpre_s;
      tflb = &*tflb_s;
    }
    tpre->set_input("ids", tids);
    phases["prefill"] = time_calls(a.warmup, a.samples, [&] { tpre->run(); });
    // One new token at position P (the cache holds the prompt and what generate wrote after it).
    const std::vector<int32_t> one = {kv.empty() ? prompt.back() : kv.front()}, pos = {int32_t(P)};
    phases["decode"] = time_calls(a.warmup, a.samples, [&] {
      dec.set_input("ids", one);
      dec.set_input("pos", pos);
      dec.run();
    });
    tflb->set_input("ids", tids);
    tflb->set_input("labels", tlabels);
    phases["flb"] = time_calls(a.warmup, a.samples, [&] { tflb->run(); });
  }
  out["compile_ms"] = compile_ms;
  out["read_weights_ms"] = read_ms;
  out["upload_weights_ms"] = upload_ms;
  out["phases"] = phases;
  std::optional<Json> torch = read_torch_times(a.dir + "/torch_times.json");
  if (torch) out["torch"] = *torch;

  bool all = true;
  Json gj = Json::array();
  std::printf("\n%-36s %12s %10s  %-4s  %s\n", "gate", "value", "limit", "", "detail");
  for (const Gate& g : gates) {
    all = all && g.pass;
    bool count = g.name.rfind("greedy", 0) == 0;
    std::printf("%-36s %12s %10s  %-4s  %s\n", g.name.c_str(),
                (count ? fmt("%.0f", g.value) : fmt("%.3e", g.value)).c_str(),
                (count ? fmt("= %.0f", g.limit) : fmt("< %.0e", g.limit)).c_str(), g.pass ? "pass" : "FAIL",
                g.detail.c_str());
    gj.push_back(
        {{"name", g.name}, {"value", g.value}, {"limit", g.limit}, {"pass", g.pass}, {"detail", g.detail}});
  }
  std::printf("greedy tokens (reference): %s\n", tokens_text(want_greedy).c_str());
  if (!all) {
    std::printf("greedy tokens (KV cache):  %s\n", tokens_text(kv).c_str());
    std::printf("greedy tokens (prefill):   %s\n", tokens_text(prefill_only).c_str());
  }
  std::printf("smallest lead of the greedy token over the runner-up: %.3e\n", min_margin);
  out["gates"] = gj;
  out["pass"] = all;

  std::printf("\n%-22s %12s %10s %14s %8s\n", "phase", "mgn ms", "IQR", "torch eager ms", "ratio");
  for (auto& [phase, ms] : compile_ms)
    std::printf("%-22s %12.1f %10s %14s %8s\n", ("compile " + phase).c_str(), ms, "", "", "");
  const bool torch_same_seq = torch && torch->value("seq", int64_t(-1)) == T;
  for (auto& [phase, st] : phases.items()) {
    double m = st["median_ms"].get<double>();
    std::string tm = "", ratio = "";
    if (torch_same_seq && (*torch)["phases"].contains(phase)) {
      double tq = (*torch)["phases"][phase]["median_ms"].get<double>();
      tm = fmt("%.3f", tq);
      ratio = fmt("%.2fx", m / tq);
    }
    std::string label = phase == "prefill"  ? "prefill (" + std::to_string(T) + " tokens)"
                        : phase == "decode" ? "decode (1 token)"
                                            : "F+L+B (" + std::to_string(T) + " tokens)";
    std::printf("%-22s %12.3f %10.3f %14s %8s\n", label.c_str(), m, st["iqr_ms"].get<double>(), tm.c_str(),
                ratio.c_str());
  }
  if (torch && !torch_same_seq) std::printf("(torch_times.json was timed at another --seq: no comparison)\n");
  if (torch_same_seq)
    std::printf("torch eager: %s on %s (torch %s, transformers %s), from torch_times.json\n",
                torch->value("impl", "?").c_str(), torch->value("device", "?").c_str(),
                torch->value("torch", "?").c_str(), torch->value("transformers", "?").c_str());
  if (!phases.empty())
    std::printf(
        "medians of %lld runs after %lld warm-ups; decode: one token at position %lld, cache %lld; ratio > "
        "1: "
        "mgn slower\n",
        (long long)a.samples, (long long)a.warmup, (long long)P, (long long)(P + N));
  std::printf("\nllama-check: %s\n", all ? "every gate passes" : "GATE FAILED");

  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) throw Error("cannot write " + a.json);
    f << out.dump(1) << "\n";
  }
  return all ? 0 : 1;
}

}  // namespace

Run declare_llama_check(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("DIR", a->dir, "a directory written by bench/pytorch/llama_ref.py")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--seq", a->seq, "timing length of prefill and F+L+B (default: the reference's)")
      ->check(at_least(2));
  app.add_option("--tokens", a->tokens, "greedy tokens compared (default: all the reference has)")
      ->check(at_least(1));
  app.add_option("--json", a->json, "write the gates, errors and timings there")->type_name("FILE");
  app.add_option("--warmup", a->warmup, "untimed calls before each timed phase")->check(at_least(0));
  app.add_option("--samples", a->samples, "timed calls per phase")->check(at_least(1));
  app.add_flag("--no-time", a->no_time, "the gates only");
  app.add_option("--tol-logits", a->tol_logits, "gate: prefill logits, relative L2")
      ->check(positive_number());
  app.add_option("--tol-loss", a->tol_loss, "gate: loss, relative error")->check(positive_number());
  app.add_option("--tol-grad", a->tol_grad, "gate: every gradient, relative L2")->check(positive_number());
  add_compile_flags(app, a->compile);
  app.footer(
      "Checks the prefill logits, the loss, every gradient and greedy KV-cache decoding against the "
      "reference\n"
      "(transformers' LlamaForCausalLM, strict f32) and times prefill, one decode token and F+L+B, next to\n"
      "PyTorch eager when DIR/torch_times.json is there. Exit status 1 when a gate fails.");
  return [a](const Context& c) { return llama_check(*a, c); };
}

}  // namespace mgn::tool
