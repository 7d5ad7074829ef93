// The matmul / norm / conv / attention kernel generators on the Vulkan device (lavapipe under ctest, with the
// validation layer on): single-op graphs with random inputs, each GPU result compared with the CPU reference
// executor (f32) by relative L2 error. Shapes are small and deliberately not multiples of any tile.
#include <gtest/gtest.h>

#ifdef MGN_HAVE_VULKAN
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/executor.h"
#include "backend/vulkan/command.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "codegen/kernel.h"
#include "codegen/matmul.h"
#include "codegen/shader_compiler.h"
#include "ir/graph.h"
#include "mgn/graph.h"
#include "support/test_util.h"

namespace mgn {
namespace {

using codegen::BindingKind;
using codegen::Lowering;
using Lower = std::function<Lowering(const codegen::LowerContext&)>;

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class VulkanKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctx_ = std::make_unique<vk::Context>(test::device_options());
    alloc_ = std::make_unique<vk::Allocator>(*ctx_);
    transfer_ = std::make_unique<vk::Transfer>(*ctx_, *alloc_, 1 << 20);
    compiler_ = std::make_unique<codegen::ShaderCompiler>("");
    pipelines_ = std::make_unique<vk::PipelineCache>(*ctx_, "");
    const vk::DeviceLimits& L = ctx_->limits();
    caps_.subgroup_size = L.subgroup_size;
    caps_.max_shared_bytes = L.max_shared_memory;
    caps_.max_workgroup_invocations = L.max_workgroup_invocations;
    caps_.max_workgroup_count = L.max_workgroup_count;
    caps_.max_storage_buffer_range = L.max_storage_buffer_range;
  }
  static void TearDownTestSuite() {
    pipelines_.reset();
    compiler_.reset();
    transfer_.reset();
    alloc_.reset();
    ctx_.reset();
  }
  void TearDown() override {
    EXPECT_EQ(ctx_->validation_message_count(), 0u);
    for (const auto& m : ctx_->validation_messages()) ADD_FAILURE() << m;
    ctx_->clear_validation_messages();
  }

  // Runs one lowered node on the device. This is a test-local dispatcher over the runtime API: inputs of
  // the node must be graph inputs (single-op graphs).
  static std::vector<float> run_gpu(const ir::Graph& g, int node_id, const Lowering& low,
                                    const std::map<int, std::vector<float>>& values) {
    const ir::Node& node = g.node(node_id);
    std::vector<vk::Buffer> ins, scratch;
    for (int in : node.inputs) {
      const std::vector<float>& v = values.at(in);
      vk::Buffer b = alloc_->allocate(std::max<size_t>(v.size(), 1) * 4, vk::MemoryKind::Device, "in");
      transfer_->upload(b, v.data(), v.size() * 4);
      ins.push_back(b);
    }
    const size_t n_out = size_t(numel(node.shape));
    vk::Buffer out = alloc_->allocate(std::max<size_t>(n_out, 1) * 4, vk::MemoryKind::Device, "out");
    if (low.output_zero_filled) transfer_->fill_zero(out);
    for (uint64_t w : low.scratch_words)
      scratch.push_back(alloc_->allocate(std::max<uint64_t>(w, 1) * 4, vk::MemoryKind::Device, "scratch"));
    if (low.counter_words > 0) {  // zero before the first run (the kernels leave them zero)
      scratch.push_back(alloc_->allocate(low.counter_words * 4, vk::MemoryKind::Device, "counters"));
      transfer_->fill_zero(scratch.back());
    }
    {
      vk::CommandStream stream(*ctx_);
      for (size_t i = 0; i < low.kernels.size(); ++i) {
        const codegen::Kernel& k = low.kernels[i];
        codegen::ShaderOptions so;
        so.name = k.name;
        so.scalar_block_layout = k.scalar_block_layout;
        vk::PipelineDesc d;
        d.spirv = compiler_->compile(k.glsl, so).words;
        d.num_buffers = uint32_t(k.bindings.size());
        d.name = k.name;
        d.required_subgroup_size = k.required_subgroup_size;
        std::vector<vk::Buffer> bind;
        for (const codegen::Binding& b : k.bindings)
          bind.push_back(b.kind == BindingKind::Input      ? ins.at(size_t(b.index))
                         : b.kind == BindingKind::Output   ? out
                         : b.kind == BindingKind::Counters ? scratch.back()
                                                           : scratch.at(size_t(b.index)));
        if (i > 0) stream.barrier();
        stream.dispatch(pipelines_->get(d), bind, k.groups, nullptr, 0, k.name);
      }
      stream.submit();
    }
    std::vector<float> result(n_out);
    transfer_->download(out, result.data(), n_out * 4);
    for (auto& b : ins) alloc_->free(b);
    for (auto& b : scratch) alloc_->free(b);
    alloc_->free(out);
    return result;
  }

  // Random inputs for every graph input, the node run on CPU (f32 executor) and GPU, compared by rel-L2.
  // Returns the lowering so callers can check which kernel variant ran.
  static Lowering check(mgn::Graph& g, int node_id, const Lower& lower, double tol = 1e-5,
                        uint32_t seed = 1) {
    ir::Graph& ir = g.ir();
    ir.add_output("y", node_id);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::map<int, std::vector<float>> values;
    cpu::Executor cpu(ir);
    for (int id : ir.inputs()) {
      std::vector<float> v(size_t(numel(ir.node(id).shape)));
      for (float& x : v) x = dist(rng);
      cpu.set_input(ir.node(id).name, v);
      values[id] = v;
    }
    cpu.run();
    const std::vector<double>& want = cpu.output("y").v;
    const codegen::CodegenOptions options;
    codegen::LowerContext lc{ir, ir.node(node_id), caps_, options};
    Lowering low = lower(lc);
    std::vector<float> got = run_gpu(ir, node_id, low, values);
    EXPECT_EQ(got.size(), want.size());
    double err = rel_l2(got, want);
    std::string names;
    for (const auto& k : low.kernels) names += k.name + " ";
    EXPECT_LE(err, tol) << ir.describe(node_id) << " via " << names;
    return low;
  }

  static codegen::DeviceCaps caps_;
  static std::unique_ptr<vk::Context> ctx_;
  static std::unique_ptr<vk::Allocator> alloc_;
  static std::unique_ptr<vk::Transfer> transfer_;
  static std::unique_ptr<codegen::ShaderCompiler> compiler_;
  static std::unique_ptr<vk::PipelineCache> pipelines_;
};
codegen::DeviceCaps VulkanKernels::caps_;
std::unique_ptr<vk::Context> VulkanKernels::ctx_;
std::unique_ptr<vk::Allocator> VulkanKernels::alloc_;
std::unique_ptr<vk::Transfer> VulkanKernels::transfer_;
std::unique_ptr<codegen::ShaderCompiler> VulkanKernels::compiler_;
std::unique_ptr<vk::PipelineCache> VulkanKernels::pipelines_;

bool uses(const Lowering& l, const std::string& prefix) {
  for (const auto& k : l.kernels)
    if (k.name.rfind(prefix, 0) == 0) return true;
  return false;
}

// ---------------------------------------------------------------------------------------------- reductions

// Few outputs over many elements (a loss's mean over every element) split each output's elements into row chunks
// of at least 8,192: a partial kernel, then the chunks summed in order. 48,251 elements: 5 chunks, the last one
// short; 3 rows of 41,000: 5 chunks each; max over 18,000: 2; 2 rows of 5,000 stay one workgroup per row.
TEST_F(VulkanKernels, ReductionsOfFewOutputsSplitTheirRows) {
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    std::string op, kernel;  // the pass-1 kernel's name prefix ("" = one kernel)
  };
  for (const Case& c : {Case{{7, 61, 113}, {}, "sum", "reduce_sum_[7,61,113] axes[0,1,2]_part5"},
                        Case{{3, 41000}, {1}, "mean", "reduce_mean_[3,41000] axes[1]_part5"},
                        Case{{9, 2000}, {}, "max", "reduce_max_[9,2000] axes[0,1]_part2"},
                        Case{{2, 5000}, {1}, "sum", ""}}) {
    Graph g;
    Tensor x = g.input("x", c.shape);
    Tensor y = c.op == "sum" ? sum(x, c.axes) : c.op == "mean" ? mean(x, c.axes) : max(x, c.axes);
    const Lowering l = check(g, y.id(), codegen::lower_reduction, 1e-5);
    if (c.kernel.empty()) {
      EXPECT_EQ(l.kernels.size(), 1u) << l.kernels[0].name;
    } else {
      ASSERT_EQ(l.kernels.size(), 2u) << c.kernel;
      EXPECT_EQ(l.kernels[0].name, c.kernel);
    }
  }
}

// ---------------------------------------------------------------------------------------------- matmul

TEST_F(VulkanKernels, MatmulTiledAllTransposes) {
  // 67 x 45 x 70: no dimension is a multiple of the 64/32/16 tiles; K spans several K slices.
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      mgn::Graph g;
      Tensor a = g.input("a", ta ? Shape{45, 67} : Shape{67, 45});
      Tensor b = g.input("b", tb ? Shape{70, 45} : Shape{45, 70});
      Tensor y = matmul(a, b, ta, tb);
      Lowering l = check(g, y.id(), codegen::lower_matmul);
      EXPECT_TRUE(uses(l, "matmul_tiled")) << ta << tb;
    }
}

TEST_F(VulkanKernels, MatmulLargeTileAllTransposes) {
  // 32 x (129 x 37) x (37 x 385): 256 blocks of 128 x 128 select the 8x8-per-thread kernel; M, N and K
  // all leave partial tiles and K a partial slice.
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      mgn::Graph g;
      Tensor a = g.input("a", ta ? Shape{32, 37, 129} : Shape{32, 129, 37});
      Tensor b = g.input("b", tb ? Shape{385, 37} : Shape{37, 385});
      Tensor y = matmul(a, b, ta, tb);
      Lowering l = check(g, y.id(), codegen::lower_matmul);
      EXPECT_TRUE(uses(l, "matmul_tiled_128x128")) << ta << tb;
    }
}

TEST_F(VulkanKernels, MatmulBroadcastBatch) {
  // a [2,1,3,13,20] against b [4,20,11]: a broadcasts over axis 1, b over the leading axes.
  mgn::Graph g;
  Tensor a = g.input("a", {2, 1, 3, 13, 20});
  Tensor b = g.input("b", {4, 1, 20, 11});
  Tensor y = matmul(a, b);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3, 13, 11}));
  EXPECT_TRUE(uses(check(g, y.id(), codegen::lower_matmul), "matmul_tiled"));
}

TEST_F(VulkanKernels, MatmulSmallVariants) {
  // M = 1 with b contiguous along N (thread per output) and along K (workgroup K reduction); N = 3.
  struct Case { Shape a, b; bool ta, tb; const char* kernel; };
  const Case cases[] = {
      {{3, 1, 37}, {37, 50}, false, false, "matmul_small_thread"},
      {{3, 1, 37}, {50, 37}, false, true, "matmul_small_ksplit"},
      {{2, 37, 29}, {2, 37, 3}, true, false, "matmul_small_thread"},
      {{29, 300}, {300, 3}, false, false, "matmul_small_ksplit"},
  };
  for (const Case& c : cases) {
    mgn::Graph g;
    Tensor y = matmul(g.input("a", c.a), g.input("b", c.b), c.ta, c.tb);
    EXPECT_TRUE(uses(check(g, y.id(), codegen::lower_matmul), c.kernel)) << c.kernel;
  }
}

TEST_F(VulkanKernels, GemmEntryForBenchmarks) {
  // The shape-only entry point: forcing the tiled kernel on a GEMV shape must still be correct.
  mgn::Graph g;
  Tensor y = matmul(g.input("a", {2, 5, 33}), g.input("b", {33, 6}));
  codegen::GemmShape s;
  s.m = 5, s.n = 6, s.k = 33;
  s.batch = {2};
  s.a_stride = {1};
  s.b_stride = {0};
  for (auto v : {codegen::GemmVariant::Tiled, codegen::GemmVariant::Small}) {
    mgn::Graph g2;
    Tensor y2 = matmul(g2.input("a", {2, 5, 33}), g2.input("b", {33, 6}));
    Lowering l = check(g2, y2.id(), [&](const codegen::LowerContext&) { return codegen::lower_gemm(s, caps_, v); });
    EXPECT_EQ(l.kernels.size(), 1u);
  }
  (void)y;
}

// Deep, narrow implicit-GEMM convolutions split K over several workgroups of 64x64-fitted tiles (instead of
// 32x32 tiles of 64 threads) and sum the splits in a second kernel; results against the CPU reference. Shapes
// small enough for lavapipe whose 64x64 grid is still under the count: conv2d (1 tile, K 576: 2 splits of at
// least 8 slices) and the input gradient of a 1x1 stride-2 projection (4 stride phases, 3 of them reached by
// no tap, K 1024: 4 splits).
TEST_F(VulkanKernels, DeepNarrowConvolutionsSplitK) {
  auto names = [](const Lowering& l) {
    std::string s;
    for (const auto& k : l.kernels) s += k.name + " ";
    return s;
  };
  {
    mgn::Graph g;
    Tensor y = conv2d(g.input("x", {1, 64, 6, 6}), g.input("w", {32, 64, 3, 3}), {.padding = {1, 1}});
    Lowering l = check(g, y.id(), codegen::lower_node);
    EXPECT_EQ(names(l), "conv2d_igemm_split2_64x32x32 conv2d_split_sum_s2 ");
    EXPECT_EQ(l.scratch_words, std::vector<uint64_t>{2 * 32 * 36});
  }
  {
    mgn::Graph g;
    Tensor dx = conv2d_grad_input(g.input("dy", {1, 1024, 4, 4}), g.input("w", {1024, 32, 1, 1}),
                                  {1, 32, 8, 8}, {.stride = {2, 2}});
    Lowering l = check(g, dx.id(), codegen::lower_node);
    EXPECT_EQ(names(l), "conv2d_grad_input_igemm_split4_32x32x32 conv2d_grad_input_split_sum_s4 ");
  }
  {  // conv_splits = 1: never split (the 32x32 tile of the ladder)
    mgn::Graph g;
    Tensor y = conv2d(g.input("x", {1, 64, 6, 6}), g.input("w", {32, 64, 3, 3}), {.padding = {1, 1}});
    codegen::CodegenOptions o;
    o.kernels.conv_splits = 1;
    Lowering l = check(g, y.id(), [&](const codegen::LowerContext& c) {
      return codegen::lower_node({c.graph, c.node, c.caps, o});
    });
    EXPECT_EQ(names(l), "conv2d_igemm_32x32x32 ");
  }
}

// The split rule at ResNet-50's batch-4 shapes on a large GPU's limits (lowering only, nothing runs): the 3x3
// convs of the 7x7 and 14x14 stages split, the stem and the 56x56 stage (enough tiles) do not.
TEST_F(VulkanKernels, ConvSplitRuleAtResNetShapes) {
  codegen::DeviceCaps big;
  big.max_shared_bytes = 48 * 1024;
  big.max_workgroup_invocations = 1024;
  const codegen::CodegenOptions options;
  auto first_kernel = [&](std::vector<int64_t> x, std::vector<int64_t> w, int64_t stride, int64_t pad) {
    mgn::Graph g;
    Tensor y = conv2d(g.input("x", Shape(x)), g.input("w", Shape(w)),
                      {.stride = {stride, stride}, .padding = {pad, pad}});
    const ir::Graph& ir = g.ir();
    return codegen::lower_node({ir, ir.node(y.id()), big, options}).kernels.at(0).name;
  };
  EXPECT_EQ(first_kernel({4, 512, 7, 7}, {512, 512, 3, 3}, 1, 1), "conv2d_igemm_split8_64x64x32");
  EXPECT_EQ(first_kernel({4, 256, 14, 14}, {256, 256, 3, 3}, 1, 1), "conv2d_igemm_split5_64x64x32");
  EXPECT_EQ(first_kernel({4, 2048, 7, 7}, {512, 2048, 1, 1}, 1, 0), "conv2d_igemm_split8_64x64x32");
  EXPECT_EQ(first_kernel({4, 3, 224, 224}, {64, 3, 7, 7}, 2, 3).find("split"), std::string::npos);
  EXPECT_EQ(first_kernel({4, 64, 56, 56}, {64, 64, 3, 3}, 1, 1).find("split"), std::string::npos);
}

// The input gradient of a 3x3 stride-2 conv: its four stride phases are reached by 2x2, 2x1, 1x2 and 1x1
// taps, and each phase's GEMM runs its own K (k decomposed by the phase's counts); a stride-1 conv keeps the
// constant one. Results of both: the oracle cases conv2d_grad_input_wide_3x3_s2 and _wide_3x3
// (vulkan_ops_test).
TEST_F(VulkanKernels, ConvGradInputRunsEachStridePhasesOwnTaps) {
  const codegen::CodegenOptions options;
  auto glsl = [&](int64_t stride, int64_t hw) {
    mgn::Graph g;
    Tensor dx = conv2d_grad_input(g.input("dy", {2, 16, hw, hw}), g.input("w", {16, 8, 3, 3}), {2, 8, 9, 9},
                                  {.stride = {stride, stride}, .padding = {1, 1}});
    const ir::Graph& ir = g.ir();
    return codegen::lower_node({ir, ir.node(dx.id()), caps_, options}).kernels.at(0).glsl;
  };
  EXPECT_NE(glsl(2, 5).find("uint og = k / taps_n"), std::string::npos);
  EXPECT_EQ(glsl(1, 9).find("uint og = k / taps_n"), std::string::npos);
}

}  // namespace
}  // namespace mgn
#endif  // MGN_HAVE_VULKAN
