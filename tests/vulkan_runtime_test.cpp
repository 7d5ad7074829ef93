// Tests of the Vulkan runtime layer (context, memory, shader compile + cache, pipelines, command streams),
// run with the validation layer on; results are checked against plain CPU loops.
#include <gtest/gtest.h>

#ifdef MGN_HAVE_VULKAN  // built without the Vulkan backend (MGN_VULKAN=OFF), this file is empty
#include <stdlib.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/command.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "codegen/shader_compiler.h"
#include "mgn/types.h"
#include "support/test_util.h"

namespace mgn::vk {
namespace {

// A fresh directory per test process, so cache tests start cold and nothing touches ~/.cache.
std::string temp_dir(const char* tag) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / (std::string("mgn_") + tag + "_XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

// The disk cache of the compilers and pipeline caches that the tests below share (one per process).
const std::string& suite_cache_dir() {
  static const std::string dir = temp_dir("cache");
  return dir;
}

constexpr uint32_t kLocalSize = 256;

// c[i] = a[i] + b[i]
const char* kAddGlsl = R"(#version 450
// archetype: test pointwise add
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Push { uint n; } p;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) c[i] = a[i] + b[i];
}
)";

// y[i] = x[i] * scale + shift
const char* kAffineGlsl = R"(#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; float scale; float shift; } p;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) y[i] = x[i] * p.scale + p.shift;
}
)";

// y[i] = x[i] + x[n-1-i]: reads elements other workgroups write, so it needs the barrier before it.
const char* kMirrorGlsl = R"(#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint n; } p;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) y[i] = x[i] + x[p.n - 1u - i];
}
)";

// acc[i] += x[i]: makes each resubmission visible in the result.
const char* kAccumulateGlsl = R"(#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer Acc { float acc[]; };
layout(push_constant) uniform Push { uint n; } p;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < p.n) acc[i] += x[i];
}
)";

uint32_t groups_for(uint32_t n) {
  return (n + kLocalSize - 1) / kLocalSize;
}

class VulkanTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctx_ = std::make_unique<Context>(test::device_options());
  }
  static void TearDownTestSuite() { ctx_.reset(); }
  // Not cleared in SetUp: messages from creating the shared context must fail the first test.
  void TearDown() override {
    EXPECT_EQ(ctx_->validation_message_count(), 0u);
    for (const auto& m : ctx_->validation_messages()) ADD_FAILURE() << m;
    ctx_->clear_validation_messages();
  }
  Context& ctx() { return *ctx_; }

  static std::unique_ptr<Context> ctx_;
};
std::unique_ptr<Context> VulkanTest::ctx_;

PipelineDesc make_desc(codegen::ShaderCompiler& compiler, const char* glsl, uint32_t buffers,
                       uint32_t push_bytes, const char* name) {
  codegen::ShaderOptions so;
  so.name = name;
  PipelineDesc d;
  d.spirv = compiler.compile(glsl, so).words;
  d.num_buffers = buffers;
  d.push_constant_bytes = push_bytes;
  d.name = name;
  return d;
}

TEST_F(VulkanTest, FeatureTableAndLimits) {
  const std::string report = ctx().feature_report();
  for (const auto& row : kFeatureTable) {
    EXPECT_NE(report.find(row.name), std::string::npos) << row.name;
    if (row.required) {
      EXPECT_TRUE(ctx().has(row.feature)) << row.name;
    }
  }
  const DeviceLimits& L = ctx().limits();
  EXPECT_GT(L.subgroup_size, 0u);
  EXPECT_GE(L.max_shared_memory, 16384u);  // Vulkan's guaranteed minimum
  EXPECT_GE(L.max_workgroup_invocations, 128u);
  EXPECT_GE(L.max_storage_buffer_range, 1u << 27);
  EXPECT_GT(L.max_memory_allocation_size, 0u);
  std::printf("%s", report.c_str());
}

TEST_F(VulkanTest, ValidationMessagesAreCounted) {
  if (!ctx().validation_enabled()) GTEST_SKIP() << "MGN_VALIDATION=0";
  // A zero-sized buffer is invalid usage (VUID-VkBufferCreateInfo-size-00912): proves the counter is live,
  // so the zero counts every other test asserts mean something.
  auto bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = 0;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  ASSERT_EQ(ctx().validation_message_count(), 0u);
  VkBuffer b = VK_NULL_HANDLE;
  vkCreateBuffer(ctx().device(), &bci, nullptr, &b);
  if (b) vkDestroyBuffer(ctx().device(), b, nullptr);
  EXPECT_GE(ctx().validation_message_count(), 1u);
  ctx().clear_validation_messages();
}

void vector_add(Context& ctx, bool force_staging) {
  constexpr uint32_t n = 1000003;
  AllocatorOptions ao;
  ao.force_staging = force_staging;
  Allocator alloc(ctx, ao);
  Transfer transfer(ctx, alloc, 1 << 20);  // 1 MiB chunks: exercises the chunk loop on the staging path
  codegen::ShaderCompiler compiler{suite_cache_dir()};
  PipelineCache pipelines(ctx, compiler.cache_dir());
  const Pipeline& add = pipelines.get(make_desc(compiler, kAddGlsl, 3, 4, "add"));

  std::vector<float> a(n), b(n), c(n, -1.0f);
  for (uint32_t i = 0; i < n; ++i) a[i] = float(i) * 0.5f, b[i] = std::sin(float(i));
  Buffer ga = alloc.allocate(n * 4, MemoryKind::Device, "a");
  Buffer gb = alloc.allocate(n * 4, MemoryKind::Device, "b");
  Buffer gc = alloc.allocate(n * 4, MemoryKind::Device, "c");
  EXPECT_EQ(ga.mapped != nullptr, alloc.unified());  // staging exactly where memory is not unified
  EXPECT_EQ(alloc.unified(), ctx.limits().unified_memory && !force_staging);
  transfer.upload(ga, a.data(), n * 4);
  transfer.upload(gb, b.data(), n * 4);

  CommandStream stream(ctx);
  stream.dispatch(add, {ga, gb, gc}, {groups_for(n), 1, 1}, n);
  stream.submit();
  transfer.download(gc, c.data(), n * 4);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(c[i], a[i] + b[i]) << "at " << i;
  alloc.free(ga);
  alloc.free(gb);
  alloc.free(gc);
}

TEST_F(VulkanTest, VectorAddMatchesCpu) {
  vector_add(ctx(), false);
}
TEST_F(VulkanTest, VectorAddThroughStaging) {
  vector_add(ctx(), true);
}

// Transfer's staging on the staging path (force_staging): nothing host-visible until the first copy, then a
// buffer as large as the copy needs (1 MiB at least, a power of two, at most the chunk), grown (the smaller
// block released) when a larger copy comes; the bytes round-trip exactly through every size.
TEST_F(VulkanTest, TransferStagingIsAllocatedOnFirstUseAndGrows) {
  AllocatorOptions ao;
  ao.force_staging = true;
  Allocator alloc(ctx(), ao);
  Transfer transfer(ctx(), alloc, VkDeviceSize(4) << 20);  // chunks of 4 MiB
  auto reserved = [&](MemoryKind k) { return alloc.stats().reserved[size_t(k)]; };
  auto blocks = [&](MemoryKind k) { return alloc.stats().blocks[size_t(k)]; };
  EXPECT_EQ(reserved(MemoryKind::Upload), 0u);
  EXPECT_EQ(reserved(MemoryKind::Readback), 0u);

  auto round_trip = [&](size_t words) {
    std::vector<uint32_t> in(words), out(words, 0xdeadbeefu);
    for (size_t i = 0; i < words; ++i) in[i] = uint32_t(i * 2654435761u);
    Buffer g = alloc.allocate(words * 4, MemoryKind::Device, "round trip");
    transfer.upload(g, in.data(), words * 4);
    transfer.download(g, out.data(), words * 4);
    alloc.free(g);
    EXPECT_EQ(in, out) << words << " words";
  };
  round_trip(25);  // 100 bytes: 1 MiB of staging each way
  EXPECT_EQ(reserved(MemoryKind::Upload), VkDeviceSize(1) << 20);
  EXPECT_EQ(reserved(MemoryKind::Readback), VkDeviceSize(1) << 20);
  round_trip(600000);  // 2.4 MB: grows to 4 MiB (the next power of two), the 1 MiB blocks released
  EXPECT_EQ(reserved(MemoryKind::Upload), VkDeviceSize(4) << 20);
  EXPECT_EQ(blocks(MemoryKind::Upload), 1u);
  EXPECT_EQ(blocks(MemoryKind::Readback), 1u);
  round_trip(2500000);  // 10 MB: at most the 4 MiB chunk, three copies each way
  EXPECT_EQ(reserved(MemoryKind::Upload), VkDeviceSize(4) << 20);
  EXPECT_EQ(reserved(MemoryKind::Readback), VkDeviceSize(4) << 20);
  round_trip(7);  // a small copy keeps the larger buffer
  EXPECT_EQ(reserved(MemoryKind::Readback), VkDeviceSize(4) << 20);
}

// The dependent chain of the stream tests, its buffers and pipelines: y = affine(x) = 2x + 1 into y,
// z = mirror(y) into z (reads what other workgroups of the affine wrote), acc += z (each submission of the
// chain adds z once more). x is uploaded and acc zeroed; the tests record the three steps with their own
// barriers or splits in between.
struct AffineMirrorChain {
  static constexpr uint32_t n = 100003;
  struct AffinePush {
    uint32_t n;
    float scale, shift;
  };
  Allocator alloc;
  Transfer transfer;
  codegen::ShaderCompiler compiler{suite_cache_dir()};
  PipelineCache pipelines;
  std::vector<const Pipeline*> p;  // affine, mirror, accumulate
  std::vector<float> x;
  Buffer gx, gy, gz, gacc;

  explicit AffineMirrorChain(Context& ctx)
      : alloc(ctx), transfer(ctx, alloc), pipelines(ctx, compiler.cache_dir()), x(n) {
    p = pipelines.get_all({make_desc(compiler, kAffineGlsl, 2, 12, "affine"),
                           make_desc(compiler, kMirrorGlsl, 2, 4, "mirror"),
                           make_desc(compiler, kAccumulateGlsl, 2, 4, "accumulate")});
    for (uint32_t i = 0; i < n; ++i) x[i] = float(i % 977) - 300.0f;
    gx = alloc.allocate(n * 4, MemoryKind::Device, "x");
    gy = alloc.allocate(n * 4, MemoryKind::Device, "y");
    gz = alloc.allocate(n * 4, MemoryKind::Device, "z");
    gacc = alloc.allocate(n * 4, MemoryKind::Device, "acc");
    transfer.upload(gx, x.data(), n * 4);
    transfer.fill_zero(gacc);
  }
  void affine(CommandStream& s) const {
    s.dispatch(*p[0], {gx, gy}, {groups_for(n), 1, 1}, AffinePush{n, 2.0f, 1.0f});
  }
  void mirror(CommandStream& s) const { s.dispatch(*p[1], {gy, gz}, {groups_for(n), 1, 1}, n); }
  void accumulate(CommandStream& s) const { s.dispatch(*p[2], {gz, gacc}, {groups_for(n), 1, 1}, n); }
  // What one run of the chain adds to acc[i] (small integers: exact in f32).
  float z(uint32_t i) const { return (x[i] * 2.0f + 1.0f) + (x[n - 1 - i] * 2.0f + 1.0f); }
  std::vector<float> acc() {
    std::vector<float> v(n);
    transfer.download(gacc, v.data(), n * 4);
    return v;
  }
};

TEST_F(VulkanTest, ResubmittedStreamWithBarriers) {
  AffineMirrorChain chain(ctx());
  CommandStream stream(ctx());
  chain.affine(stream);
  stream.barrier();
  chain.mirror(stream);
  stream.barrier();
  chain.accumulate(stream);
  EXPECT_EQ(stream.barrier_count(), 2u);
  for (int i = 0; i < 3; ++i) stream.submit();
  EXPECT_THROW(stream.barrier(), Error);  // recorded streams are frozen

  const std::vector<float> acc = chain.acc();
  for (uint32_t i = 0; i < chain.n; ++i) {
    const float z = chain.z(i);
    ASSERT_EQ(acc[i], z + z + z) << "at " << i;
  }
}

// DeviceOptions::sync_validation is live: a reader recorded right after its writer with no barrier between
// them is a read-after-write hazard the layer reports; the same pair with the barrier is silent.
TEST_F(VulkanTest, SynchronizationValidationReportsAMissingBarrier) {
  if (!ctx().validation_enabled()) GTEST_SKIP() << "MGN_VALIDATION=0";
  DeviceOptions o = test::device_options();
  o.sync_validation = true;
  Context sync_ctx(o);
  for (bool with_barrier : {true, false}) {
    AffineMirrorChain chain(sync_ctx);
    CommandStream stream(sync_ctx);
    chain.affine(stream);
    if (with_barrier) stream.barrier();
    chain.mirror(stream);
    stream.submit();
    const size_t messages = sync_ctx.validation_message_count();
    bool hazard = false;
    for (const std::string& m : sync_ctx.validation_messages()) hazard = hazard || m.find("HAZARD") != std::string::npos;
    sync_ctx.clear_validation_messages();
    if (with_barrier)
      EXPECT_EQ(messages, 0u);
    else
      EXPECT_TRUE(hazard) << messages << " messages, none a hazard";
  }
}

TEST_F(VulkanTest, CompileErrorShowsNumberedSource) {
  codegen::ShaderCompiler compiler("");
  codegen::ShaderOptions so;
  so.name = "broken_kernel";
  const std::string bad =
      "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  float v = no_such_thing;\n}\n";
  try {
    compiler.compile(bad, so);
    FAIL() << "expected mgn::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("broken_kernel"), std::string::npos) << m;
    EXPECT_NE(m.find("no_such_thing"), std::string::npos) << m;
    EXPECT_NE(m.find(":4:"), std::string::npos) << m;  // glslang's line reference
    EXPECT_NE(m.find("   4 |   float v = no_such_thing;"), std::string::npos) << m;
  }
}

TEST_F(VulkanTest, SpirvDiskCacheHits) {
  const std::string dir = temp_dir("spv");
  codegen::SpirV first;
  {
    codegen::ShaderCompiler c(dir);
    first = c.compile(kAddGlsl);
    c.compile(kAddGlsl);
    EXPECT_EQ(c.stats().compiled, 1u);
    EXPECT_EQ(c.stats().memory_hits, 1u);
    EXPECT_EQ(c.stats().disk_hits, 0u);
  }
  codegen::ShaderCompiler c(dir);  // a new process would look like this
  const codegen::SpirV second = c.compile(kAddGlsl);
  EXPECT_EQ(c.stats().disk_hits, 1u);
  EXPECT_EQ(c.stats().compiled, 0u);
  EXPECT_EQ(second.words, first.words);
  EXPECT_EQ(second.hash, first.hash);
  codegen::ShaderOptions other;
  other.defines = {{"UNUSED_FLAG", "1"}};  // options are part of the key
  c.compile(kAddGlsl, other);
  EXPECT_EQ(c.stats().compiled, 1u);
}

TEST_F(VulkanTest, PipelinesDeduplicatedAndCachePersisted) {
  const std::string dir = temp_dir("pso");
  codegen::ShaderCompiler compiler(dir);
  const PipelineDesc add = make_desc(compiler, kAddGlsl, 3, 4, "add");
  const PipelineDesc mirror = make_desc(compiler, kMirrorGlsl, 2, 4, "mirror");
  const PipelineDesc acc = make_desc(compiler, kAccumulateGlsl, 2, 4, "accumulate");
  std::string file;
  {
    PipelineCache cache(ctx(), dir);
    EXPECT_FALSE(cache.loaded_from_disk());
    auto p = cache.get_all({add, mirror, add, acc, mirror}, 2);
    EXPECT_EQ(p[0], p[2]);
    EXPECT_EQ(p[1], p[4]);
    EXPECT_NE(p[0], p[1]);
    EXPECT_EQ(cache.stats().created, 3u);
    EXPECT_EQ(cache.stats().reused, 2u);
    EXPECT_EQ(&cache.get(acc), p[3]);
    file = cache.cache_file();
  }
  EXPECT_TRUE(std::filesystem::exists(file)) << file;
  PipelineCache again(ctx(), dir);
  EXPECT_TRUE(again.loaded_from_disk());
  again.get(add);

  PipelineDesc wrong = add;
  wrong.push_constant_bytes = 6;
  EXPECT_THROW(again.get(wrong), Error);
}

// The same dependent chain split into three submissions (with timestamps on, where supported): every
// piece sees the previous piece's writes, the hook runs between pieces, and a resubmission works.
TEST_F(VulkanTest, SplitStreamAcrossSubmissions) {
  AffineMirrorChain chain(ctx());
  CommandStream stream(ctx(), /*timestamps=*/true);
  std::vector<int> calls;
  stream.set_between_submissions([&calls](int i) { calls.push_back(i); });
  stream.split();  // at the start: nothing to split
  chain.affine(stream);
  stream.barrier();
  stream.split();  // drops the barrier: the next buffer starts with one
  stream.split();  // twice in a row: one split
  chain.mirror(stream);
  stream.split();
  stream.barrier();  // right after a split: nothing to order
  chain.accumulate(stream);
  EXPECT_EQ(stream.submission_count(), 3u);
  EXPECT_EQ(stream.barrier_count(), 0u);
  stream.submit();
  stream.submit();
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 0, 1}));
  if (ctx().has(Feature::Timestamps)) {
    EXPECT_EQ(stream.timings().size(), 3u);
  }
  std::vector<float> acc = chain.acc();
  for (uint32_t i = 0; i < chain.n; ++i) {
    const float z = chain.z(i);
    ASSERT_EQ(acc[i], z + z) << "at " << i;
  }
  // A hook that throws: the remaining pieces are still queued, the error reaches the caller, and the
  // stream stays usable.
  stream.set_between_submissions([](int) { throw Error("hook failed"); });
  EXPECT_THROW(stream.submit_async(), Error);
  stream.wait();
  acc = chain.acc();
  EXPECT_EQ(acc[0], chain.z(0) * 3);
}

TEST_F(VulkanTest, TimestampsWorkOrAreReportedMissing) {
  constexpr uint32_t n = 65536;
  Allocator alloc(ctx());
  codegen::ShaderCompiler compiler{suite_cache_dir()};
  PipelineCache pipelines(ctx(), compiler.cache_dir());
  const Pipeline& add = pipelines.get(make_desc(compiler, kAddGlsl, 3, 4, "add"));
  Buffer a = alloc.allocate(n * 4, MemoryKind::Device), b = alloc.allocate(n * 4, MemoryKind::Device),
         c = alloc.allocate(n * 4, MemoryKind::Device);
  Transfer t(ctx(), alloc);
  t.fill_zero(a);
  t.fill_zero(b);
  CommandStream stream(ctx(), /*timestamps=*/true);
  stream.dispatch(add, {a, b, c}, {groups_for(n), 1, 1}, n, "add#1");
  stream.barrier();
  stream.dispatch(add, {c, b, a}, {groups_for(n), 1, 1}, n, "add#2");
  stream.submit();
  if (ctx().has(Feature::Timestamps)) {
    ASSERT_TRUE(stream.timestamps_enabled());
    const auto timings = stream.timings();
    ASSERT_EQ(timings.size(), 2u);
    EXPECT_EQ(timings[1].label, "add#2");
    for (const auto& d : timings) EXPECT_GE(d.ms, 0.0);
    EXPECT_GT(stream.total_ms(), 0.0);
    EXPECT_GE(stream.total_ms() * 1.001, timings[1].ms);
    std::printf("add#1 %.3f ms, add#2 %.3f ms, stream %.3f ms\n", timings[0].ms, timings[1].ms,
                stream.total_ms());
  } else {
    EXPECT_FALSE(stream.timestamps_enabled());
    EXPECT_THROW(stream.timings(), Error);
  }
  CommandStream untimed(ctx());
  untimed.dispatch(add, {a, b, c}, {groups_for(n), 1, 1}, n);
  untimed.submit();
  EXPECT_THROW(untimed.timings(), Error);
}

TEST_F(VulkanTest, AllocationLimitsGiveClearErrors) {
  Allocator alloc(ctx());
  try {
    alloc.allocate(alloc.max_allocation() + 1, MemoryKind::Device, "huge_tensor");
    FAIL() << "expected mgn::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("huge_tensor"), std::string::npos) << m;
    EXPECT_NE(m.find("maxStorageBufferRange"), std::string::npos) << m;
  }

  AllocatorOptions capped;
  capped.device_limit = 1 << 20;
  Allocator small(ctx(), capped);
  Buffer a = small.allocate(512 << 10, MemoryKind::Device, "first");
  try {
    small.allocate(768 << 10, MemoryKind::Device, "second");
    FAIL() << "expected mgn::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("asked for 786432 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("'second'"), std::string::npos) << m;
    EXPECT_NE(m.find("Free: 524288 bytes"), std::string::npos) << m;
  }
  small.free(a);
  Buffer b = small.allocate(768 << 10, MemoryKind::Device, "second");  // fits once the first is gone
  EXPECT_EQ(b.offset, 0u);
}

TEST_F(VulkanTest, SubAllocatorAlignsCoalescesAndReuses) {
  AllocatorOptions o;
  o.device_block_size = 1 << 20;
  Allocator alloc(ctx(), o);
  std::vector<Buffer> bufs;
  for (int i = 0; i < 10; ++i) bufs.push_back(alloc.allocate(1000 + i * 37, MemoryKind::Device));
  for (const auto& b : bufs) {
    EXPECT_EQ(b.offset % ctx().limits().min_storage_buffer_offset_alignment, 0u);
    EXPECT_EQ(b.offset % 16, 0u);
    EXPECT_EQ(b.buffer, bufs[0].buffer);  // one block
  }
  for (size_t i = 0; i < bufs.size(); i += 2) alloc.free(bufs[i]);
  for (size_t i = 1; i < bufs.size(); i += 2) alloc.free(bufs[i]);
  EXPECT_EQ(alloc.stats().used[size_t(MemoryKind::Device)], 0u);
  Buffer whole = alloc.allocate(1 << 20, MemoryKind::Device);  // only fits if every range coalesced
  EXPECT_EQ(whole.offset, 0u);
  EXPECT_EQ(alloc.stats().blocks[size_t(MemoryKind::Device)], 1u);
  Buffer second = alloc.allocate(3 << 20, MemoryKind::Device);  // larger than a block: its own block
  EXPECT_EQ(alloc.stats().blocks[size_t(MemoryKind::Device)], 2u);
  alloc.free(whole);
  alloc.free(second);
  alloc.trim();
  EXPECT_EQ(alloc.stats().blocks[size_t(MemoryKind::Device)], 0u);
}

// Device selection builds contexts of its own (DeviceOptions::device; the MGN_DEVICE mapping onto it is
// tested in environment_test).
TEST(DeviceSelectionTest, BySubstringIndexAndName) {
  DeviceOptions o = test::device_options();
  std::string name;
  {
    Context def(o);
    name = def.info().name;
    EXPECT_EQ(def.validation_message_count(), 0u);
  }
  // Case-insensitive substring of the default device's name.
  std::string upper = name.substr(0, 4);
  for (auto& ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  o.device = upper;
  {
    Context by_substring(o);
    EXPECT_EQ(by_substring.info().name.substr(0, 4), name.substr(0, 4));
  }
  o.device = "0";
  {
    Context by_index(o);
    EXPECT_EQ(by_index.info().index, 0u);
  }
  o.device = name;
  Context by_name(o);
  EXPECT_EQ(by_name.info().name, name);
}

TEST(DeviceSelectionTest, BadSelectorListsDevices) {
  DeviceOptions o;
  o.validation = false;
  o.device = "no-such-gpu-xyz";
  try {
    Context c(o);
    FAIL() << "expected mgn::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no-such-gpu-xyz"), std::string::npos) << m;
    EXPECT_NE(m.find("0: "), std::string::npos) << m;  // the device list
  }
  o.device = "97";
  EXPECT_THROW(Context c(o), Error);
}

}  // namespace
}  // namespace mgn::vk
#endif  // MGN_HAVE_VULKAN
