// Shared test helpers.
#include "support/test_util.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>
#include <random>
#include <stdexcept>

namespace mgn::test {

#if defined(__SANITIZE_ADDRESS__)
#define MGN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MGN_TEST_ASAN 1
#endif
#endif

#ifdef MGN_TEST_ASAN
namespace {
// Sanitizer builds (scripts/sanitize.sh): the Vulkan loader unloads the validation layer and the driver when a
// test destroys its instance, and LeakSanitizer then cannot name the library that leaked (the frames are
// "<unknown module>"), so its suppressions (scripts/sanitizer/lsan.supp, third-party only) cannot match.
// Keeping the two libraries mapped for the process keeps their frames symbolized.
const bool kept_mapped = [] {
  for (const char* lib : {"libVkLayer_khronos_validation.so", "libvulkan_lvp.so"})
    (void)::dlopen(lib, RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE);
  return true;
}();
}  // namespace
#endif

plan::PlanOptions separate_memory_plan() {
  plan::PlanOptions o;
  o.reuse = o.in_place = o.in_place_assign = o.sink = false;
  return o;
}

DeviceOptions device_options() {
  const char* v = std::getenv("MGN_VALIDATION");
  DeviceOptions o;
  o.validation = !(v && std::string(v) == "0");
  // Synchronization validation on top, when asked (scripts/sanitize.sh runs the Vulkan tests so).
  const char* sync = std::getenv("MGN_SYNC_VALIDATION");
  o.sync_validation = o.validation && sync && std::string(sync) == "1";
  return o;
}

double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::runtime_error("rel_l2: size mismatch");
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::runtime_error("max_abs_diff: size mismatch");
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

std::vector<double> random_normal(size_t n, uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

std::vector<double> random_uniform(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng);
  return v;
}

}  // namespace mgn::test

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace mgn::test {

std::string make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() /
               ("mgn-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::string generated_dir(const std::string& tag, const std::string& script,
                          const std::vector<std::string>& also_hashed) {
  namespace fs = std::filesystem;
  const std::string path = std::string(MGN_SOURCE_DIR) + "/" + script;
  std::string text = read_bytes(path);
  if (text.empty()) throw Error("cannot read " + path);
  for (const std::string& f : also_hashed) text += read_bytes(std::string(MGN_SOURCE_DIR) + "/" + f);
  const std::string key = std::to_string(std::hash<std::string>{}(text + MGN_TORCH_PYTHON));
  const fs::path cached = fs::temp_directory_path() / ("mgn-" + tag + "-" + key);
  if (fs::exists(cached / "done")) return cached.string();
  const std::string d = make_temp_dir(tag);
  const std::string cmd = std::string(MGN_TORCH_PYTHON) + " " + path + " " + d + " > " + d + "/gen.log 2>&1";
  if (std::system(cmd.c_str()) != 0) throw Error(script + " failed:\n" + read_bytes(d + "/gen.log"));
  std::ofstream(d + "/done") << "ok\n";
  std::error_code ec;
  fs::rename(d, cached, ec);  // fails harmlessly when another process got there first
  if (fs::exists(cached / "done")) {
    if (ec) fs::remove_all(d, ec);
    return cached.string();
  }
  return d;
}

std::map<std::string, StoredTensor> run_torch(const std::string& script,
                                              const std::vector<StoredTensor>& inputs) {
  std::string dir = make_temp_dir("torch");
  std::string in = dir + "/in.safetensors", out = dir + "/out.safetensors", log = dir + "/log.txt";
  write_safetensors(in, inputs);
  std::string cmd = std::string(MGN_TORCH_PYTHON) + " " + MGN_SOURCE_DIR + "/" + script + " " + in + " " +
                    out + " > " + log + " 2>&1";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    throw Error("run_torch: '" + cmd + "' failed (status " + std::to_string(rc) + "):\n" + ss.str());
  }
  SafetensorsFile file = SafetensorsFile::read(out);
  std::map<std::string, StoredTensor> result;
  for (const std::string& n : file.names()) result.emplace(n, file.get(n));
  std::filesystem::remove_all(dir);
  return result;
}

std::vector<float> attention_input(std::mt19937& rng, size_t n, float scale, bool inf_rows, int64_t cols) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = dist(rng) * scale;
  if (inf_rows)
    for (size_t e = 0; e < x.size(); ++e) {
      int64_t row = int64_t(e) / cols;
      if (row % 3 == 1 || rng() % 4 == 0) x[e] = -std::numeric_limits<float>::infinity();
    }
  return x;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mgn::test
