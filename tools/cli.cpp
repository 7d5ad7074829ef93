// Pieces every command of the `mgn` command line shares: validators with readable messages and the
// compile flags (backend, device, precision) laid over the environment.
#include "cli.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "progress.h"

namespace mgn::tool {

namespace {

bool parse_integer(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || !end || *end) return false;
  out = v;
  return true;
}

bool parse_number(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (!end || *end || !std::isfinite(v)) return false;
  out = v;
  return true;
}

std::string number_text(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

CLI::Validator at_least(int64_t min) {
  const std::string want = "an integer >= " + std::to_string(min);
  return CLI::Validator(
      [want, min](std::string& s) -> std::string {
        int64_t v = 0;
        if (!parse_integer(s, v) || v < min) return "expected " + want + ", got '" + s + "'";
        return "";
      },
      ">= " + std::to_string(min));
}

CLI::Validator number_at_least(double min) {
  const std::string want = "a number >= " + number_text(min);
  return CLI::Validator(
      [want, min](std::string& s) -> std::string {
        double v = 0;
        if (!parse_number(s, v) || v < min) return "expected " + want + ", got '" + s + "'";
        return "";
      },
      ">= " + number_text(min));
}

CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (!parse_number(s, v) || !(v > 0)) return "expected a number > 0, got '" + s + "'";
        return "";
      },
      "> 0");
}

std::vector<int64_t> parse_dims(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  size_t p = 0;
  while (p <= text.size()) {
    size_t q = text.find('x', p);
    if (q == std::string::npos) q = text.size();
    const std::string part = text.substr(p, q - p);
    int64_t v = 0;
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos ||
        !parse_integer(part, v) || v < 1)
      throw UsageError(what + ": '" + text + "' is not a shape like 1x3x224x224 (every dimension >= 1)");
    out.push_back(v);
    p = q + 1;
  }
  return out;
}

CLI::Validator shape_text(const std::string& what) {
  return CLI::Validator(
      [what](std::string& s) -> std::string {
        try {
          parse_dims(s, what);
        } catch (const UsageError& e) {
          return e.what();
        }
        return "";
      },
      "");
}

void add_compile_flags(CLI::App& app, CompileFlags& f, unsigned which, const std::string& precision_names) {
  if (which & kBackendFlag)
    app.add_option("--backend", f.backend,
                   "where sessions run; auto: Vulkan when a device works, else the CPU")
        ->check(CLI::IsMember({"auto", "cpu", "vulkan"}));
  if (which & kDeviceFlag)
    app.add_option("--device", f.device,
                   "the Vulkan device: an index or part of its name (`mgn devices`); overrides MGN_DEVICE")
        ->type_name("INDEX|NAME");
  if (which & kPrecisionFlag)
    app.add_option(
           precision_names, f.precision,
           "precision of nodes that leave theirs unset; accelerated lets matmuls round their inputs to "
           "f16 where the device's self-test passed; overrides MGN_PRECISION (default strict)")
        ->check(CLI::IsMember({"strict", "accelerated"}));
  if (which & kTuneFlag)
    app.add_flag("--tune", f.tune,
                 "time the candidate kernels of each f32 GEMM shape on the device while compiling and use the "
                 "fastest; choices are kept per device and driver in the cache folder, so only new shapes are "
                 "measured (docs/tuning.md)");
}

Precision precision_from_name(const std::string& name) {
  if (name == "strict") return Precision::Strict;
  if (name == "accelerated") return Precision::Accelerated;
  throw UsageError("precision is strict or accelerated, got '" + name + "'");
}

void add_model_dir(CLI::App& app, std::string& dir) {
  app.add_option("MODEL_DIR", dir, "a Hugging Face Llama-family directory (config.json, weights, tokenizer.json)")
      ->required()
      ->check(CLI::ExistingDirectory);
}

CompileOptions compile_options(const Context& c, const CompileFlags& f, Mode mode) {
  CompileOptions o;
  c.env.apply(o);
  o.mode = mode;
  o.backend = backend_from_name(f.backend);
  if (!f.device.empty()) o.device.device = f.device;
  if (!f.precision.empty()) o.default_precision = precision_from_name(f.precision);
  if (f.tune) o.tune = TuneMode::Measure;
  o.on_progress = compile_progress(mode == Mode::Train ? "the training session" : "the inference session");
  return o;
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f) throw Error("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("cannot write '" + path + "': " + ec.message());
}

}  // namespace mgn::tool
