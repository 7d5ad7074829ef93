// Microbenchmarks of `mgn bench`: causal grouped-query attention at SmolLM2's shapes (forward, forward +
// backward) and conv2d at ResNet-50's shapes (forward, gradient of the input, gradient of the weight). Each
// case is its own session per phase; the inputs and outputs of every case go to one safetensors file that
// bench/pytorch/attention.py and conv.py read, so both sides compute on the same values.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "cli.h"
#include "mgn/autodiff.h"
#include "mgn/safetensors.h"

namespace mgn::bench {

namespace {

struct Input {
  std::string name;
  Shape shape;
  float lo, hi;
};

// One case: named inputs (random, deterministic) and per phase a graph of those inputs with named outputs.
struct MicroCase {
  std::string name;
  Json shape;  // the parameters the PyTorch side needs besides the tensors' shapes
  std::vector<Input> inputs;
  std::map<std::string, double> flop;  // per phase
  // The graph of one phase; it uses only graph inputs named as in `inputs`.
  std::function<Graph(const std::string& phase)> graph;
};

// ---- attention: q [B, Hq, S, D], k/v [B, Hkv, S, D], causal

struct AttentionShape {
  int64_t b, hq, hkv, s, d;
};

MicroCase attention_case(const AttentionShape& sh) {
  MicroCase c;
  c.name = "h" + std::to_string(sh.hq) + "-" + std::to_string(sh.hkv) + "_d" + std::to_string(sh.d) + "_s" +
           std::to_string(sh.s) + (sh.b != 1 ? "_b" + std::to_string(sh.b) : "");
  c.shape = {{"batch", sh.b}, {"heads", sh.hq},   {"kv_heads", sh.hkv},
             {"seq", sh.s},   {"head_dim", sh.d}, {"causal", true}};
  const Shape qs = {sh.b, sh.hq, sh.s, sh.d}, kvs = {sh.b, sh.hkv, sh.s, sh.d};
  c.inputs = {{"q", qs, -1, 1}, {"k", kvs, -1, 1}, {"v", kvs, -1, 1}, {"do", qs, -1, 1}};
  // Two matmuls of S x S x D per head, half of the score matrix under the causal mask; the backward pass has
  // five such products (the convention of FlashAttention's benchmarks), so forward + backward is 3.5x.
  const double fwd = 4.0 * double(sh.b * sh.hq) * double(sh.s) * double(sh.s) * double(sh.d) * 0.5;
  c.flop = {{"forward", fwd}, {"fwdbwd", 3.5 * fwd}};
  c.graph = [=](const std::string& phase) {
    Graph g;
    Tensor q = g.input("q", qs), k = g.input("k", kvs), v = g.input("v", kvs);
    Tensor o = attention(q, k, v, {.causal = true});
    g.output("out", o);
    if (phase == "fwdbwd") {
      // The gradient for a given upstream gradient `do`: d/dq of sum(o * do) is the vector-Jacobian product.
      Tensor dout = g.input("do", qs);
      Gradients gr = backward(g, sum(o * dout), {.inputs = {q, k, v}});
      g.output("grad.q", gr.inputs[0]);
      g.output("grad.k", gr.inputs[1]);
      g.output("grad.v", gr.inputs[2]);
    }
    return g;
  };
  return c;
}

// ---- conv2d: x [N, Cin, H, W], w [Cout, Cin, k, k], stride s, padding p, no bias

struct ConvShape {
  int64_t n, cin, cout, hw, k, stride, pad;
};

MicroCase conv_case(const ConvShape& sh) {
  MicroCase c;
  c.name = "k" + std::to_string(sh.k) + (sh.stride != 1 ? "s" + std::to_string(sh.stride) : "") + "_c" +
           std::to_string(sh.cin) + "-" + std::to_string(sh.cout) + "_" + std::to_string(sh.hw) +
           (sh.n != 4 ? "_n" + std::to_string(sh.n) : "");
  const int64_t ho = (sh.hw + 2 * sh.pad - sh.k) / sh.stride + 1;
  c.shape = {{"batch", sh.n},  {"in_channels", sh.cin}, {"out_channels", sh.cout}, {"size", sh.hw},
             {"kernel", sh.k}, {"stride", sh.stride},   {"padding", sh.pad},       {"out_size", ho}};
  const Shape xs = {sh.n, sh.cin, sh.hw, sh.hw}, ws = {sh.cout, sh.cin, sh.k, sh.k},
              ys = {sh.n, sh.cout, ho, ho};
  const float bound = 1.0f / std::sqrt(float(sh.cin * sh.k * sh.k));  // weights of a He-like scale
  c.inputs = {{"x", xs, -1, 1}, {"w", ws, -bound, bound}, {"dy", ys, -1, 1}};
  const double flop = 2.0 * double(sh.n * sh.cout) * double(ho * ho) * double(sh.cin * sh.k * sh.k);
  c.flop = {{"forward", flop}, {"grad_input", flop}, {"grad_weight", flop}};
  c.graph = [=](const std::string& phase) {
    Graph g;
    Tensor x = g.input("x", xs), w = g.input("w", ws);
    const Conv2dOptions geo{.stride = {sh.stride, sh.stride}, .padding = {sh.pad, sh.pad}};
    if (phase == "forward") {
      g.output("out", conv2d(x, w, geo));
    } else {
      // The gradient op alone (mgn::conv2d_grad_input / conv2d_grad_weight, as autodiff's conv2d rule emits
      // it), so the phase is the one kernel PyTorch's convolution_backward is compared with; the forward conv
      // is not needed, so the plan does not run it.
      Tensor dy = g.input("dy", ys);
      if (phase == "grad_input")
        g.output("grad.x", conv2d_grad_input(dy, w, xs, geo));
      else
        g.output("grad.w", conv2d_grad_weight(x, dy, ws, geo));
    }
    return g;
  };
  return c;
}

struct MicroSpec {
  std::vector<std::string> phases;
  std::vector<MicroCase> cases;
};

MicroSpec micro_spec(Args& a) {
  MicroSpec m;
  if (a.workload == "attention") {
    m.phases = {"forward", "fwdbwd"};
    // SmolLM2-135M: 9 query heads / 3 KV heads of dimension 64; tiny: small enough for lavapipe.
    const int64_t b = a.batch ? a.batch : 1;
    std::vector<AttentionShape> shapes =
        a.tiny ? std::vector<AttentionShape>{{b, 4, 2, 8, 16}, {b, 4, 2, 24, 16}}
               : std::vector<AttentionShape>{{b, 9, 3, 128, 64}, {b, 9, 3, 1024, 64}};
    if (a.seq) shapes = {{b, a.tiny ? 4 : 9, a.tiny ? 2 : 3, a.seq, a.tiny ? 16 : 64}};
    for (const AttentionShape& s : shapes) m.cases.push_back(attention_case(s));
  } else {
    if (a.seq) throw tool::UsageError("conv takes no --seq (attention and the Llama workloads do)");
    m.phases = {"forward", "grad_input", "grad_weight"};
    // ResNet-50 at batch 4: the stem, layer1's 3x3 and its 1x1 reduction, layer2's 3x3, layer4's 3x3.
    const int64_t n = a.batch ? a.batch : (a.tiny ? 2 : 4);
    std::vector<ConvShape> shapes =
        a.tiny ? std::vector<ConvShape>{{n, 3, 8, 16, 7, 2, 3}, {n, 8, 8, 8, 3, 1, 1}, {n, 16, 8, 8, 1, 1, 0}}
               : std::vector<ConvShape>{{n, 3, 64, 224, 7, 2, 3},
                                        {n, 64, 64, 56, 3, 1, 1},
                                        {n, 256, 64, 56, 1, 1, 0},
                                        {n, 128, 128, 28, 3, 1, 1},
                                        {n, 512, 512, 7, 3, 1, 1}};
    for (const ConvShape& s : shapes) m.cases.push_back(conv_case(s));
  }
  if (!a.weights.empty() || !a.config.empty() || !a.data.empty())
    throw tool::UsageError(a.workload + " takes no --weights, --config or --data (the model workloads do)");
  a.check_phases(m.phases, m.phases);
  if (!a.cases.empty()) {
    std::vector<MicroCase> picked;
    for (const std::string& want : split_commas(a.cases)) {
      bool found = false;
      for (const MicroCase& c : m.cases)
        if (c.name == want) {
          picked.push_back(c);
          found = true;
        }
      if (!found) {
        std::string names;
        for (const MicroCase& c : m.cases) names += (names.empty() ? "" : ", ") + c.name;
        throw tool::UsageError(a.workload + " has no case '" + want + "' (cases: " + names + ")");
      }
    }
    m.cases = picked;
  }
  return m;
}

double l2_norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * double(x);
  return std::sqrt(s);
}

}  // namespace

bool is_micro_workload(const std::string& w) {
  return w == "attention" || w == "conv";
}

int run_micro_bench(Args& a) {
  MicroSpec spec = micro_spec(a);
  ColdCache cold(a.cold_cache);
  JsonLines lines(a.json);
  std::vector<StoredTensor> out;
  Json cases_meta = Json::object();
  for (const MicroCase& c : spec.cases) {
    std::map<std::string, std::vector<float>> values;
    for (const Input& in : c.inputs) {
      values[in.name] =
          uniform(size_t(numel(in.shape)), name_seed(c.name + "." + in.name, a.seed), in.lo, in.hi);
      out.push_back(StoredTensor::from_f32(c.name + ".input." + in.name, in.shape, values[in.name]));
    }
    cases_meta[c.name] = c.shape;
    cases_meta[c.name]["flop"] = c.flop;
    for (const std::string& phase : spec.phases) {
      if (!a.has(phase)) continue;
      auto t0 = Clock::now();
      Graph g = c.graph(phase);
      Session s = compile(g, compile_options(a, Mode::Infer, cold));
      const double compile_ms = ms_since(t0);
      for (const std::string& name : s.input_names()) s.set_input(name, values.at(name));
      const Samples ms = time_calls(a.warmup, a.samples, [&] { s.run(); });
      Json r = {{"side", "mgn"},
                {"impl", "mgn"},
                {"workload", a.workload},
                {"case", c.name},
                {"phase", phase},
                {"mode", precision_name(a.mode())},
                {"backend", s.backend()},
                {"device", s.device_type()},
                {"shape", c.shape},
                {"flop", c.flop.at(phase)},
                {"compile_ms", compile_ms},
                {"kernels", Json::array()}};
      // Which kernels the session dispatches (e.g. that a gradient-only graph does not run the forward conv).
      for (const auto& [kernel, glsl] : s.kernel_sources()) r["kernels"].push_back(kernel);
      r.update(summary(ms));
      r["tflops"] = c.flop.at(phase) / (r["median_ms"].get<double>() * 1e-3) / 1e12;
      for (const std::string& name : s.output_names()) {
        std::vector<float> v = s.read(name);
        if (!std::isfinite(l2_norm(v)))
          throw Error(a.workload + " " + c.name + " " + phase + ": output '" + name + "' is not finite");
        out.push_back(StoredTensor::from_f32(c.name + "." + phase + "." + name, s.shape_of(name), v));
      }
      lines.emit(r);
    }
  }
  if (!a.outputs.empty()) {
    std::string phases;
    for (const std::string& p : a.phases) phases += (phases.empty() ? "" : ",") + p;
    write_safetensors(a.outputs, out,
                      {{"side", "mgn"},
                       {"kind", "micro"},
                       {"workload", a.workload},
                       {"mode", precision_name(a.mode())},
                       {"seed", std::to_string(a.seed)},
                       {"phases", phases},
                       {"cases", cases_meta.dump()}});
    std::fprintf(stderr, "bench %s: inputs and outputs of %zu cases in %s\n", a.workload.c_str(),
                 spec.cases.size(), a.outputs.c_str());
  }
  return 0;
}

}  // namespace mgn::bench
