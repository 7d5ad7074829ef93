// `mgn bench-gemm`: times Session::run() of a one-matmul inference graph per shape. Each run submits the
// recorded stream and waits for the GPU, so the wall time of a run includes submission overhead (a few
// microseconds), not uploads. The kernel is whatever the lowering picks under the kernel options (MGN_GEMM_*
// or the flags); --f16 marks the matmul Accelerated, which runs the f16 cooperative-matrix kernel where the
// device has it and its self-test passes (else the f32 kernel, said in the JSON). Each shape's result is
// checked on sampled entries against a double-precision dot product of the same inputs.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"  // the warm-up and timing rule of mgn bench
#include "cli.h"
#include "mgn/device.h"

namespace mgn::tool {

namespace {

struct GemmArgs {
  std::vector<std::string> shapes;
  bool f16 = false, no_check = false;
  int64_t warmup = 5, samples = 20;
  double warmup_ms = bench::Warmup{}.min_ms;
  std::string tag, variant, tile, f16_tile;
  std::string layout = "nn";  // A then B: n stored as the product reads it, t stored transposed
  CompileFlags compile;
};

int bench_gemm(const GemmArgs& a, const Context& c) {
  std::vector<std::array<int64_t, 4>> shapes;  // batch, M, N, K
  for (const std::string& s : a.shapes) {
    std::vector<int64_t> d = parse_dims(s, "shape");
    if (d.size() == 3) d.insert(d.begin(), 1);
    if (d.size() != 4) throw UsageError("shapes are MxNxK or BATCHxMxNxK, got '" + s + "'");
    shapes.push_back({d[0], d[1], d[2], d[3]});
  }
  if (shapes.empty()) shapes.push_back({1, 1024, 1024, 1024});
  const bool ta_t = a.layout[0] == 't', tb_t = a.layout[1] == 't';
  CompileOptions opt = compile_options(c, a.compile, Mode::Infer);
  if (!a.variant.empty()) opt.kernels.gemm = parse_gemm_kernel(a.variant, "--variant");
  if (!a.tile.empty()) opt.kernels.gemm_tile = parse_gemm_tile(a.tile, false, "--tile");
  if (!a.f16_tile.empty()) opt.kernels.f16_tile = parse_gemm_tile(a.f16_tile, true, "--f16-tile");

  // --f16, or MGN_PRECISION=accelerated (the default precision of the matmul, which sets none of its own).
  const bool accelerated = a.f16 || opt.default_precision == Precision::Accelerated;
  std::string coopmat = "n/a";
  if (accelerated) {
    // The sessions below open the same device (equal DeviceOptions share one), so the self-test this runs is
    // the verdict they use.
    try {
      coopmat = describe_device(opt.device, opt.kernels).f16_gemm;
    } catch (const std::exception& e) {
      coopmat = std::string("no Vulkan device: ") + e.what();
    }
  }
  for (const auto& shape : shapes) {
    const int64_t nb = shape[0], m = shape[1], n = shape[2], k = shape[3];
    Graph g;
    // Stored A is [K, M] when transposed, B [N, K] (a linear layer's weight); a batch > 1 leads both.
    auto dims = [nb](int64_t r, int64_t c) { return nb > 1 ? Shape{nb, r, c} : Shape{r, c}; };
    Tensor ta = g.input("a", ta_t ? dims(k, m) : dims(m, k));
    Tensor tb = g.input("b", tb_t ? dims(n, k) : dims(k, n));
    Tensor tc = matmul(ta, tb, ta_t, tb_t);
    if (a.f16) tc.set_precision(Precision::Accelerated);
    g.output("c", tc);
    auto t0 = std::chrono::steady_clock::now();
    Session s = compile(g, opt);
    double compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::vector<float> av(size_t(nb * m * k)), bv(size_t(nb * k * n));
    for (size_t i = 0; i < av.size(); ++i) av[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    for (size_t i = 0; i < bv.size(); ++i) bv[i] = float((i * 40503u) % 1000) / 1000.0f - 0.5f;
    s.set_input("a", av);
    s.set_input("b", bv);
    const bench::Samples timed =
        bench::time_calls({.calls = a.warmup, .min_ms = a.warmup_ms}, a.samples, [&] { s.run(); });
    std::vector<double> ms = timed.ms;
    std::sort(ms.begin(), ms.end());
    const double med = bench::percentile(ms, 0.5);
    // Error of sampled entries relative to sum_k |a||b| (robust where an entry cancels to ~0).
    double check_err = -1;
    if (!a.no_check) {
      std::vector<float> cv = s.read("c");
      check_err = 0;
      const int64_t outs = nb * m * n, count = std::min<int64_t>(outs, 512);
      for (int64_t q = 0; q < count; ++q) {
        const int64_t idx = count == outs ? q : int64_t((uint64_t(q) * 2654435761ull + 12345) % uint64_t(outs));
        const int64_t bi = idx / (m * n), i = idx / n % m, j = idx % n;
        const float* ab = av.data() + bi * m * k;
        const float* bb = bv.data() + bi * k * n;
        double ref = 0, mag = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double x = double(ab[ta_t ? l * m + i : i * k + l]) * double(bb[tb_t ? j * k + l : l * n + j]);
          ref += x;
          mag += x < 0 ? -x : x;
        }
        const double d = double(cv[size_t(idx)]) - ref;
        check_err = std::max(check_err, (d < 0 ? -d : d) / std::max(mag, 1e-30));
      }
    }
    std::string kernels;
    for (const auto& [name, src] : s.kernel_sources()) kernels += (kernels.empty() ? "" : " ") + name;
    const bench::Json line = {{"side", "mgn"},
                              {"backend", s.backend()},
                              {"batch", nb},
                              {"m", m},
                              {"n", n},
                              {"k", k},
                              {"layout", a.layout},
                              {"precision", accelerated ? "f16" : "strict"},
                              {"variant", gemm_kernel_name(opt.kernels.gemm)},
                              {"tile", gemm_tile_str(opt.kernels.gemm_tile, false)},
                              {"f16_tile", gemm_tile_str(opt.kernels.f16_tile, true)},
                              {"tag", a.tag},
                              {"kernels", kernels},
                              {"compile_ms", compile_ms},
                              {"warmup", timed.warmup_calls},
                              {"warmup_ms", timed.warmup_ms},
                              {"median_ms", med},
                              {"min_ms", ms.front()},
                              {"tflops", 2.0 * double(nb) * double(m) * double(n) * double(k) / (med * 1e-3) / 1e12},
                              {"check_err", check_err},
                              {"coopmat", coopmat}};
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

// A validator that parses a tile with options.h's text form; CLI11 puts the flag's name before the message.
CLI::Validator tile_text(bool coopmat) {
  return CLI::Validator(
      [coopmat](std::string& s) -> std::string {
        try {
          parse_gemm_tile(s, coopmat, "tile");
        } catch (const Error& e) {
          const std::string m = e.what();
          return m.rfind("tile: ", 0) == 0 ? m.substr(6) : m;
        }
        return "";
      },
      "TILE");
}

}  // namespace

Run declare_bench_gemm(CLI::App& app) {
  auto a = std::make_shared<GemmArgs>();
  app.add_option("SHAPES", a->shapes, "MxNxK or BATCHxMxNxK, one session each (default 1024x1024x1024)")
      ->check(shape_text("shape"))
      ->type_name("MxNxK")
      ->default_str("");
  app.add_flag("--f16", a->f16,
               "mark the matmul Accelerated (the f16 cooperative-matrix kernel where the self-test passed)");
  app.add_flag("--no-check", a->no_check, "skip the sampled check against a double-precision reference");
  app.add_option("--warmup", a->warmup, "untimed calls before the timed ones, at least")->check(at_least(0));
  app.add_option("--warmup-ms", a->warmup_ms, "wall time of the untimed calls, at least")
      ->check(number_at_least(0));
  app.add_option("--samples", a->samples, "timed calls per shape")->check(at_least(1));
  app.add_option("--layout", a->layout,
                 "how A and B are stored: n as read (A [M,K], B [K,N]), t transposed (A [K,M], B [N,K]: a "
                 "linear layer's weight)")
      ->check(CLI::IsMember({"nn", "nt", "tn", "tt"}));
  app.add_option("--tag", a->tag, "copied into every JSON line (e.g. the variant's name in a sweep)");
  app.add_option("--variant", a->variant, "the f32 GEMM kernel family; overrides MGN_GEMM_VARIANT")
      ->check(CLI::IsMember({"auto", "simt", "small"}));
  app.add_option("--tile", a->tile,
                 "the f32 SIMT tile, BMxBNxBK[,tTMxTN][,lLXxLY][,gG][,sS]; overrides MGN_GEMM_TILE")
      ->check(tile_text(false));
  app.add_option("--f16-tile", a->f16_tile,
                 "the f16 tile, BMxBNxBK[,wWMxWN][,gG][,sS]; overrides MGN_GEMM_F16_TILE")
      ->check(tile_text(true));
  add_compile_flags(app, a->compile, kBackendFlag | kDeviceFlag);
  app.footer(
      "Times matmul sessions (wall clock per synchronized run, after warm-up) and prints one JSON line per\n"
      "shape: kernel names, the kernel options (variant, tile, f16_tile), TFLOP/s and the sampled error.");
  return [a](const Context& c) { return bench_gemm(*a, c); };
}

}  // namespace mgn::tool
