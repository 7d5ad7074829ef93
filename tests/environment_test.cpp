// The MGN_* variables: their one mapping onto typed options (mgn::environment_from), its documentation
// (docs/environment.md holds environment_markdown() verbatim), and every variable the code, the tests and the
// scripts use is in that one table. No test sets the process environment: the mapping takes a lookup.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "mgn/environment.h"

using namespace mgn;

namespace {

using Vars = std::map<std::string, std::string>;

Environment from(const Vars& vars) {
  std::vector<std::string> names;
  for (const auto& [k, v] : vars) names.push_back(k);
  return environment_from(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      names);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Environment, DefaultsWhenNothingIsSet) {
  const Environment e = from({});
  EXPECT_EQ(e.kernels, KernelOptions{});
  EXPECT_EQ(e.planning, PlanningOptions{});
  EXPECT_EQ(e.device, DeviceOptions{});
  EXPECT_EQ(e.default_precision, Precision::Strict);
  EXPECT_FALSE(e.profile);
  EXPECT_EQ(e.cache_dir, "");  // no HOME: no disk cache
  EXPECT_EQ(e.fashion_mnist_dir, "/usr/share/datasets/fashion-mnist");
  EXPECT_TRUE(e.unknown.empty());
  // The conventional cache folder, and the variable over it.
  EXPECT_EQ(from({{"HOME", "/h"}}).cache_dir, "/h/.cache/meganeura");
  EXPECT_EQ(from({{"HOME", "/h"}, {"XDG_CACHE_HOME", "/x"}}).cache_dir, "/x/meganeura");
  EXPECT_EQ(from({{"HOME", "/h"}, {"MGN_CACHE_DIR", "/c"}}).cache_dir, "/c");
  // An empty value is unset.
  EXPECT_EQ(from({{"MGN_ATTENTION", ""}}).kernels.attention, AttentionKernel::Auto);
}

TEST(Environment, EveryVariableReachesItsOption) {
  const Vars all = {
      {"MGN_DEVICE", "lavapipe"},
      {"MGN_VALIDATION", "1"},
      {"MGN_SYNC_VALIDATION", "1"},
      {"MGN_CACHE_DIR", "/c"},
      {"MGN_PROFILE", "on"},
      {"MGN_PIPELINE_STATS", "true"},
      {"MGN_PIPELINE_IR", "/ir"},
      {"MGN_FASHION_MNIST_DIR", "/f"},
      {"MGN_PRECISION", "accelerated"},
      {"MGN_FUSION", "0"},
      {"MGN_GEMM_EPILOGUE", "0"},
      {"MGN_GEMM_SIBLINGS", "0"},
      {"MGN_GEMM_SPLITK_FIXUP", "0"},
      {"MGN_GEMM_K_VEC4", "0"},
      {"MGN_SPIRV_OPT", "1"},
      {"MGN_PLAN_REUSE", "off"},
      {"MGN_ATTENTION", "tiled"},
      {"MGN_GEMM_VARIANT", "small"},
      {"MGN_GEMM_TILE", "64x64x16,s2"},
      {"MGN_GEMM_F16", "no"},
      {"MGN_GEMM_F16_SCALING", "0"},
      {"MGN_GEMM_F16_MIN_WORK", "4096"},
      {"MGN_GEMM_F16_MIN_DIM", "16"},
      {"MGN_GEMM_F16_TILE", "128x128x32,w64x32"},
      {"MGN_GEMM_F16_ABLATE", "mmaonly"},
      {"MGN_CONV_TILE", "64x32x16"},
      {"MGN_CONV_SPLITS", "3"},
  };
  // The test covers every variable the library maps (the tests-only ones have no option).
  std::set<std::string> mapped, covered;
  for (const EnvironmentVariable& v : environment_variables())
    if (std::string(v.section) != "tests") mapped.insert(v.name);
  for (const auto& [k, v] : all) covered.insert(k);
  EXPECT_EQ(mapped, covered);

  const Environment e = from(all);
  EXPECT_EQ(e.device.device, "lavapipe");
  EXPECT_TRUE(e.device.validation);
  EXPECT_TRUE(e.device.sync_validation);
  EXPECT_TRUE(e.device.pipeline_statistics);
  EXPECT_EQ(e.device.pipeline_ir_dir, "/ir");
  EXPECT_EQ(e.cache_dir, "/c");
  EXPECT_TRUE(e.profile);
  EXPECT_EQ(e.fashion_mnist_dir, "/f");
  EXPECT_EQ(e.default_precision, Precision::Accelerated);
  EXPECT_FALSE(e.kernels.fusion);
  EXPECT_FALSE(e.kernels.gemm_epilogue);
  EXPECT_FALSE(e.kernels.gemm_siblings);
  EXPECT_FALSE(e.kernels.gemm_splitk_fixup);
  EXPECT_EQ(e.kernels.gemm_k_vec4, GemmOperands::None);
  EXPECT_TRUE(e.kernels.spirv_optimize);
  EXPECT_FALSE(e.planning.reuse);
  EXPECT_FALSE(e.planning.in_place);
  EXPECT_EQ(e.kernels.attention, AttentionKernel::Tiled);
  EXPECT_EQ(e.kernels.gemm, GemmKernel::Small);
  EXPECT_EQ(e.kernels.gemm_tile.bm, 64u);
  EXPECT_EQ(e.kernels.gemm_tile.splits, 2u);
  EXPECT_FALSE(e.kernels.f16_gemm);
  EXPECT_FALSE(e.kernels.f16_operand_scaling);
  EXPECT_EQ(e.kernels.f16_min_work, 4096u);
  EXPECT_EQ(e.kernels.f16_min_dim, 16u);
  EXPECT_EQ(e.kernels.f16_tile.wm, 64u);
  EXPECT_EQ(e.kernels.f16_ablation, GemmAblation::MmaOnly);
  EXPECT_EQ(e.kernels.conv_tile, (ConvTile{64, 32, 16}));
  EXPECT_EQ(e.kernels.conv_splits, 3u);
  EXPECT_TRUE(e.unknown.empty());

  CompileOptions o;
  e.apply(o);
  EXPECT_EQ(o.kernels, e.kernels);
  EXPECT_EQ(o.planning, e.planning);
  EXPECT_EQ(o.device, e.device);
  EXPECT_EQ(o.default_precision, Precision::Accelerated);
  EXPECT_EQ(o.cache_dir, "/c");
  EXPECT_TRUE(o.profile);
}

TEST(Environment, MalformedValuesNameTheVariable) {
  const Vars bad = {
      {"MGN_VALIDATION", "maybe"},
      {"MGN_PROFILE", "2"},
      {"MGN_FUSION", "no thanks"},
      {"MGN_PRECISION", "fast"},
      {"MGN_ATTENTION", "fast"},
      {"MGN_GEMM_VARIANT", "classic"},
      {"MGN_GEMM_TILE", "12x"},
      {"MGN_GEMM_TILE", "128x128x8,w8x4"},
      {"MGN_GEMM_F16_TILE", "64x64x32,q1"},
      {"MGN_GEMM_F16_ABLATE", "all"},
      {"MGN_CONV_TILE", "48x32x16"},
      {"MGN_PLAN_REUSE", "sometimes"},
      {"MGN_GEMM_F16_MIN_WORK", "-1"},
      {"MGN_GEMM_F16_MIN_WORK", "1e6"},
      {"MGN_GEMM_F16_MIN_WORK", "99999999999999999999"},
      {"MGN_CONV_SPLITS", "65"},
      {"MGN_CONV_SPLITS", "two"},
  };
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(name + "=" + value);
    try {
      from({{name, value}});
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(Environment, UnknownNamesAreReported) {
  const Environment e = from({{"MGN_GEMM_TIEL", "64x64x16"}, {"MGN_DEVICE", "0"}, {"PATH", "/bin"}});
  EXPECT_EQ(e.unknown, std::vector<std::string>{"MGN_GEMM_TIEL"});
  EXPECT_EQ(e.device.device, "0");
}

TEST(Environment, DocsHoldTheTable) {
  const std::string doc = read_file(std::filesystem::path(MGN_SOURCE_DIR) / "docs/environment.md");
  const std::string begin = "<!-- env:begin -->\n", end = "<!-- env:end -->";
  const size_t a = doc.find(begin), b = doc.find(end);
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(doc.substr(a + begin.size(), b - a - begin.size()), environment_markdown())
      << "regenerate docs/environment.md's table with `mgn help environment --markdown`";
}

// Every MGN_* variable a C++ file reads (getenv) or a script sets (NAME=value, export NAME) is in the table,
// so nothing undocumented steers a run and no script sets a variable nothing reads.
TEST(Environment, EveryVariableInUseIsInTheTable) {
  std::set<std::string> known;
  for (const EnvironmentVariable& v : environment_variables()) known.insert(v.name);
  const std::regex read(R"(getenv\("(MGN_[A-Z0-9_]+)\"\))"), set(R"((?:^|[\s;'"])(MGN_[A-Z0-9_]+)=)");
  const std::filesystem::path root(MGN_SOURCE_DIR);
  int files = 0;
  for (const char* folder : {"src", "tools", "tests", "bench", "scripts", "fuzz", ".ci"}) {
    if (!std::filesystem::exists(root / folder)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / folder)) {
      const std::string ext = e.path().extension().string(), rel = e.path().lexically_relative(root).string();
      if (!e.is_regular_file() || rel.rfind("bench/results", 0) == 0 || rel.find("node_modules") != std::string::npos)
        continue;
      const bool cpp = ext == ".cpp" || ext == ".h", script = ext == ".sh" || ext == ".py" || e.path().filename() == "run";
      if (!cpp && !script) continue;
      ++files;
      const std::string text = read_file(e.path());
      const std::regex& re = cpp ? read : set;
      for (std::sregex_iterator it(text.begin(), text.end(), re), stop; it != stop; ++it)
        EXPECT_TRUE(known.count((*it)[1])) << rel << " uses " << (*it)[1] << ", which docs/environment.md lacks";
    }
  }
  EXPECT_GT(files, 50);
}

}  // namespace
