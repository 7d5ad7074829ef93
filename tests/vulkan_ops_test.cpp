// PyTorch oracle tests for the Vulkan graph executor: every case file written by tests/oracle/gen_oracle.py
// (the same files tests/oracle_test.cpp runs on the CPU executor) is rebuilt with the builder API, lowered
// and run on the device (lavapipe under ctest, validation layer on) with poisoned intermediates, and its
// output compared with PyTorch's by relative L2 error with the case's own tolerance. Every op archetype has a
// Vulkan lowering, so every case runs; one the lowering cannot handle fails (it is not skipped). One Context
// is shared by the whole suite. The implicit-GEMM conv kernels also run a few cases under pinned tiles
// (VulkanConvTiles).
#include <gtest/gtest.h>

#ifdef MGN_HAVE_VULKAN
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/graph_executor.h"
#include "ir/graph.h"
#include "oracle/registry.h"
#include "support/test_util.h"

using namespace mgn;

namespace {

// The oracle files' folder: the build's, or MGN_ORACLE_DIR (the files copied to another machine).
std::string oracle_dir() {
  const char* dir = std::getenv("MGN_ORACLE_DIR");
  return dir && *dir ? dir : MGN_ORACLE_DIR;
}

// Every oracle case; the suite fails (CasesExist) if the generated data is missing.
std::vector<std::string> all_cases() {
  try {
    return oracle::case_files(oracle_dir());
  } catch (const Error&) {
    return {};
  }
}

std::string case_label(const testing::TestParamInfo<std::string>& info) {
  std::string s = std::filesystem::path(info.param).stem().string();
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// Kernel names of the executor's stream, for failure messages.
std::string kernel_names(const vk::GraphExecutor& ex) {
  std::string s;
  for (const auto& [name, glsl] : ex.kernel_sources()) s += " " + name;
  return s;
}

// Builds the case on the device, runs it twice and compares the output with PyTorch's.
// `kernels_out`: the names of the kernels that ran, for the caller's own checks.
void check_case(const std::string& path, vk::Context& ctx, const KernelOptions& kernels = {},
                std::string* kernels_out = nullptr) {
  oracle::Case c = oracle::load_case(path);
  const ir::Graph& ir = c.graph->ir();
  vk::GraphExecutorOptions opt;
  opt.cache_dir = "";  // memory only: every run compiles from scratch
  opt.poison = true;
  opt.codegen.kernels = kernels;
  std::unique_ptr<vk::GraphExecutor> ex;
  try {
    ex = std::make_unique<vk::GraphExecutor>(ir, ctx, opt);
  } catch (const std::exception& e) {
    FAIL() << c.name << " (" << c.key << "): Vulkan lowering/build failed: " << e.what();
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = "in." + std::to_string(i);
    DType t = c.inputs[i].dtype();
    if (t == DType::I32 || t == DType::Bool)
      ex->set_input(name, c.input_values[i].to_i32());
    else
      ex->set_input(name, c.input_values[i].to_f32());
  }
  ex->run();
  // Twice: the recorded stream is resubmitted, and poisoning must not leak stale values between runs.
  ex->run();
  if (kernels_out) *kernels_out = kernel_names(*ex);
  std::vector<float> got = ex->read_output("out");
  std::vector<double> want = c.expected.to_f64();
  ASSERT_EQ(got.size(), want.size()) << c.name;
  DType out_t = c.out.dtype();
  if (out_t == DType::I32 || out_t == DType::Bool) {
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(double(got[i]), want[i]) << c.name << " element " << i << " via" << kernel_names(*ex);
  } else {
    std::vector<double> g(got.begin(), got.end());
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_TRUE(std::isfinite(g[i]))
          << c.name << ": non-finite output at element " << i << " via" << kernel_names(*ex);
    double err = test::rel_l2(g, want);
    EXPECT_LE(err, c.tol) << c.name << ": relative L2 error " << err << " via" << kernel_names(*ex);
  }
}

}  // namespace

TEST(VulkanOps, CasesExist) {
  auto files = all_cases();
  ASSERT_GT(files.size(), 100u) << "oracle data missing in " << MGN_ORACLE_DIR;
}

// One Context per suite, validation messages turned into failures.
class VulkanDevice : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctx_ = std::make_unique<vk::Context>(test::device_options());
  }
  static void TearDownTestSuite() { ctx_.reset(); }
  void TearDown() override {
    EXPECT_EQ(ctx_->validation_message_count(), 0u);
    for (const auto& m : ctx_->validation_messages()) ADD_FAILURE() << m;
    ctx_->clear_validation_messages();
  }
  static std::unique_ptr<vk::Context> ctx_;
};
std::unique_ptr<vk::Context> VulkanDevice::ctx_;

class VulkanOpsForward : public VulkanDevice, public testing::WithParamInterface<std::string> {};

TEST_P(VulkanOpsForward, VulkanMatchesPyTorch) {
  check_case(GetParam(), *ctx_);
}

INSTANTIATE_TEST_SUITE_P(Cases, VulkanOpsForward, testing::ValuesIn(all_cases()), case_label);

// The implicit-GEMM conv kernels under tiles their heuristic would only pick for shapes too large for
// lavapipe (MGN_CONV_TILE pins the tile): every slot layout of the loads (rows per thread above 1, several
// threads per row, a K slice shorter than the thread count), stride phases, groups and K splits.
struct TileCase {
  std::string tile, name;
};
void PrintTo(const TileCase& c, std::ostream* os) {
  *os << c.name << " under MGN_CONV_TILE=" << c.tile;
}

std::vector<TileCase> tile_cases() {
  std::vector<TileCase> v;
  for (const char* tile : {"128x128x16", "128x16x8", "64x64x32", "32x128x8"})
    for (const char* name :
         {"conv2d_wide_dilated_s2", "conv2d_grad_input_wide_dilated_s2", "conv2d_grad_weight_wide_dilated_s2",
          "conv2d_grouped_wide", "conv2d_grad_input_grouped_wide", "conv2d_grad_weight_grouped_wide"})
      v.push_back({tile, name});
  return v;
}

class VulkanConvTiles : public VulkanDevice, public testing::WithParamInterface<TileCase> {};

std::string oracle_file(const std::string& name) {
  return oracle_dir() + "/" + name + ".safetensors";
}

TEST_P(VulkanConvTiles, VulkanMatchesPyTorch) {
  const std::string path = oracle_file(GetParam().name);
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  check_case(path, *ctx_, {.conv_tile = parse_conv_tile(GetParam().tile)});
}

INSTANTIATE_TEST_SUITE_P(Pinned, VulkanConvTiles, testing::ValuesIn(tile_cases()),
                         [](const testing::TestParamInfo<TileCase>& info) {
                           return info.param.name + "_" + info.param.tile;
                         });

// K split over several workgroups (KernelOptions::conv_splits; auto splits only shapes too large for
// lavapipe): conv2d and conv2d_grad_input with their partial outputs summed by a second kernel, under the
// automatic tile and a pinned one, including stride phases no tap reaches (the 1x1 stride-2 projection, the
// dilated case).
struct SplitCase {
  std::string name, tile;
  uint32_t splits;
};
void PrintTo(const SplitCase& c, std::ostream* os) {
  *os << c.name << " split " << c.splits << " ways, tile " << c.tile;
}

std::vector<SplitCase> split_cases() {
  std::vector<SplitCase> v;
  for (const char* op : {"conv2d", "conv2d_grad_input"})
    for (const char* shape : {"wide_3x3", "bottleneck_proj_s2", "wide_dilated_s2", "grouped_wide"})
      v.push_back({std::string(op) + "_" + shape, "auto", 3});
  v.push_back({"conv2d_wide_3x3_s2", "64x64x32", 2});
  v.push_back({"conv2d_grad_input_wide_3x3_s2", "32x128x8", 5});
  v.push_back({"conv2d_grad_weight_wide_3x3", "auto", 3});  // its own split rule: conv_splits leaves it alone
  return v;
}

class VulkanConvSplits : public VulkanDevice, public testing::WithParamInterface<SplitCase> {};

TEST_P(VulkanConvSplits, VulkanMatchesPyTorch) {
  const std::string path = oracle_file(GetParam().name);
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  KernelOptions k;
  if (GetParam().tile != "auto") k.conv_tile = parse_conv_tile(GetParam().tile);
  k.conv_splits = GetParam().splits;
  std::string kernels;
  check_case(path, *ctx_, k, &kernels);
  // The GEMM that ran is split (and summed) exactly when asked; conv_splits leaves grad_weight alone.
  const std::string& name = GetParam().name;
  const bool want_split = GetParam().splits > 1 && name.find("grad_weight") == std::string::npos;
  EXPECT_EQ(kernels.find("igemm_split") != std::string::npos, want_split) << kernels;
  EXPECT_EQ(kernels.find("_split_sum_s") != std::string::npos, want_split) << kernels;
}

INSTANTIATE_TEST_SUITE_P(Forced, VulkanConvSplits, testing::ValuesIn(split_cases()),
                         [](const testing::TestParamInfo<SplitCase>& info) {
                           std::string t = info.param.tile;
                           for (char& ch : t)
                             if (ch == 'x') ch = '_';
                           return info.param.name + "_s" + std::to_string(info.param.splits) + "_" + t;
                         });

#endif  // MGN_HAVE_VULKAN
