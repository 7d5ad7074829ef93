// The f16 cooperative-matrix GEMM's device self-test: the generated kernel against a CPU reference, once per
// device and tile option, kept with the Context; nothing lowers to that kernel until it passed
// (DeviceCaps::coopmat_f16_verified).
#include "backend/vulkan/gemm_selftest.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/vulkan/command.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"
#include "backend/vulkan/session_cache.h"
#include "codegen/matmul.h"
#include "codegen/shader_compiler.h"
#include "mgn/types.h"
#include "support/atomic_file.h"

namespace mgn::vk {
namespace {

// Round to the nearest f16 value (ties to even), kept as f32: the reference then sees exactly what the
// kernel's f32 -> f16 conversion produces, whatever rounding the device uses for ties.
float round_f16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  const float a = std::fabs(x);
  if (a >= 65520.0f) return std::copysign(INFINITY, x);
  int e = 0;
  std::frexp(a, &e);                    // a = f * 2^e, f in [0.5, 1)
  const int q = std::max(e - 11, -24);  // f16: 11 significant bits, subnormal spacing 2^-24
  const float step = std::ldexp(1.0f, q);
  return std::copysign(std::nearbyint(a / step) * step, x);
}

// The device's f16 x f16 -> f32 subgroup multiply, preferring 16x16x16, then 16x8x16, then 16x8x8.
bool pick_shape(const Context& ctx, codegen::CoopMatShape* out, std::string* why) {
  auto fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(ctx.instance(), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!fn) {
    *why = "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV is missing";
    return false;
  }
  uint32_t n = 0;
  check(fn(ctx.physical_device(), &n, nullptr), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
  std::vector<VkCooperativeMatrixPropertiesNV> props(n);
  for (auto& p : props)
    p = make<VkCooperativeMatrixPropertiesNV>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV);
  check(fn(ctx.physical_device(), &n, props.data()), "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
  const codegen::CoopMatShape preferred[] = {{16, 16, 16}, {16, 8, 16}, {16, 8, 8}};
  for (const auto& want : preferred)
    for (const auto& p : props)
      if (p.AType == VK_COMPONENT_TYPE_FLOAT16_NV && p.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
          p.CType == VK_COMPONENT_TYPE_FLOAT32_NV && p.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
          p.scope == VK_SCOPE_SUBGROUP_NV && p.MSize == want.m && p.NSize == want.n && p.KSize == want.k) {
        *out = want;
        return true;
      }
  *why = "no f16 x f16 -> f32 subgroup shape among the device's " + std::to_string(n) +
         " cooperative-matrix properties (want 16x16x16, 16x8x16 or 16x8x8)";
  return false;
}

struct Case {
  uint64_t m, n, k;
  bool ta, tb;
  uint64_t batch;  // a batched, b broadcast over the batch when > 1
  codegen::GemmTile tile;
};

// Runs one product on the device; returns the relative L2 error against the double-precision reference
// on the f16-rounded inputs.
double run_case(Context& ctx, Allocator& alloc, Transfer& transfer, PipelineCache& pipelines,
                codegen::ShaderCompiler& compiler, const codegen::DeviceCaps& caps,
                const codegen::CoopMatShape& mma, const Case& c, std::string* kernel_name) {
  codegen::GemmShape s;
  s.m = c.m, s.n = c.n, s.k = c.k;
  s.transpose_a = c.ta, s.transpose_b = c.tb;
  if (c.batch > 1) {
    s.batch = {c.batch};
    s.a_stride = {1};
    s.b_stride = {0};
  }
  codegen::GemmOptions o;
  o.variant = codegen::GemmVariant::CoopMatF16;
  o.coopmat_tile = c.tile;
  o.mma = mma;
  codegen::Lowering low = codegen::lower_gemm(s, caps, o);
  for (const auto& k : low.kernels) *kernel_name += (kernel_name->empty() ? "" : " + ") + k.name;

  std::vector<float> a(c.batch * c.m * c.k), b(c.k * c.n);
  uint64_t state = 0x9e3779b97f4a7c15ull ^ (c.m * 131 + c.n * 17 + c.k);
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(double(state >> 40) / double(1ull << 24)) * 2.0f - 1.0f;
  };
  for (float& v : a) v = round_f16(next());
  for (float& v : b) v = round_f16(next());
  std::vector<double> want(c.batch * c.m * c.n);
  for (uint64_t q = 0; q < c.batch; ++q)
    for (uint64_t i = 0; i < c.m; ++i)
      for (uint64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (uint64_t l = 0; l < c.k; ++l) {
          const double av = a[q * c.m * c.k + (c.ta ? l * c.m + i : i * c.k + l)];
          const double bv = b[c.tb ? j * c.k + l : l * c.n + j];
          sum += av * bv;
        }
        want[(q * c.m + i) * c.n + j] = sum;
      }
  const std::vector<float> got =
      run_gemm_lowering(ctx, alloc, transfer, pipelines, compiler, low, a, b, want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = double(got[i]) - want[i];
    num += e * e;
    den += want[i] * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

CoopMatVerdict run_all(Context& ctx, const GemmTile& tile, codegen::ShaderCompiler& compiler) {
  CoopMatVerdict st;
  if (!ctx.has(Feature::CooperativeMatrixNV)) {
    st.note = "the device lacks VK_NV_cooperative_matrix";
    return st;
  }
  if (ctx.limits().subgroup_size != 32) {
    st.note = "subgroup size " + std::to_string(ctx.limits().subgroup_size) + ", the kernel needs 32";
    return st;
  }
  if (!ctx.has(Feature::ShaderFloat16)) {
    st.note = "the device lacks shaderFloat16 (f16 shared-memory tiles)";
    return st;
  }
  codegen::CoopMatShape mma;
  if (!pick_shape(ctx, &mma, &st.note)) return st;
  st.mma = mma;

  const codegen::DeviceCaps& caps = ctx.caps();

  // The tile a session would use (KernelOptions::f16_tile, or auto) on a block-aligned product, the large
  // default tile, and an edge-staged, transposed, batched product.
  GemmTile big;
  big.bm = big.bn = 128;
  const Case cases[] = {
      {256, 256, 256, false, false, 1, tile},
      {256, 256, 96, false, false, 1, big},
      {136, 200, 70, true, true, 2, tile},
  };
  Allocator alloc(ctx);
  Transfer transfer(ctx, alloc, 1 << 20);
  PipelineCache pipelines(ctx, "");
  std::string passed;
  for (const Case& c : cases) {
    std::string name;
    const double err = run_case(ctx, alloc, transfer, pipelines, compiler, caps, mma, c, &name);
    char line[256];
    std::snprintf(line, sizeof line, "%llux%llux%llu%s%s%s rel L2 %.2e", (unsigned long long)c.m,
                  (unsigned long long)c.n, (unsigned long long)c.k, c.ta ? " tA" : "", c.tb ? " tB" : "",
                  c.batch > 1 ? " batched" : "", err);
    // Inputs are f16-exact, so only f32 accumulation order separates the kernel from the reference.
    if (!(err <= 1e-3)) {
      st.note = std::string("wrong results: ") + line + " via " + name;
      return st;
    }
    passed += (passed.empty() ? "" : "; ") + std::string(line);
  }
  st.verified = true;
  st.note = "passed (" + std::to_string(mma.m) + "x" + std::to_string(mma.n) + "x" + std::to_string(mma.k) +
            " multiplies): " + passed;
  return st;
}

}  // namespace

std::vector<float> run_gemm_lowering(Context& ctx, Allocator& alloc, Transfer& transfer,
                                     PipelineCache& pipelines, codegen::ShaderCompiler& compiler,
                                     const codegen::Lowering& low, const std::vector<float>& a,
                                     const std::vector<float>& b, size_t n_out) {
  std::vector<Buffer> owned;
  auto release = [&]() {
    for (Buffer& x : owned) alloc.free(x);
    owned.clear();
  };
  std::vector<float> out(n_out);
  try {
    owned.push_back(alloc.allocate(std::max<size_t>(a.size(), 1) * 4, MemoryKind::Device, "gemm a"));
    owned.push_back(alloc.allocate(std::max<size_t>(b.size(), 1) * 4, MemoryKind::Device, "gemm b"));
    owned.push_back(alloc.allocate(std::max<size_t>(n_out, 1) * 4, MemoryKind::Device, "gemm out"));
    for (uint64_t w : low.scratch_words)
      owned.push_back(alloc.allocate(std::max<uint64_t>(w, 1) * 4, MemoryKind::Device, "gemm scratch"));
    if (low.counter_words > 0) {
      owned.push_back(alloc.allocate(low.counter_words * 4, MemoryKind::Device, "gemm counters"));
      transfer.fill_zero(owned.back());
    }
    if (!a.empty()) transfer.upload(owned[0], a.data(), a.size() * 4);
    if (!b.empty()) transfer.upload(owned[1], b.data(), b.size() * 4);
    if (low.output_zero_filled) transfer.fill_zero(owned[2]);
    {
      CommandStream stream(ctx);
      for (size_t i = 0; i < low.kernels.size(); ++i) {
        const codegen::Kernel& k = low.kernels[i];
        codegen::ShaderOptions so;
        so.name = k.name;
        so.scalar_block_layout = k.scalar_block_layout;
        PipelineDesc d;
        d.spirv = compiler.compile(k.glsl, so).words;
        d.num_buffers = uint32_t(k.bindings.size());
        d.name = k.name;
        d.required_subgroup_size = k.required_subgroup_size;
        std::vector<Buffer> bind;
        for (const codegen::Binding& bd : k.bindings)
          bind.push_back(bd.kind == codegen::BindingKind::Input      ? owned.at(bd.index == 0 ? 0 : 1)
                         : bd.kind == codegen::BindingKind::Output   ? owned[2]
                         : bd.kind == codegen::BindingKind::Counters ? owned.back()
                                                                     : owned.at(3 + size_t(bd.index)));
        if (i > 0) stream.barrier();
        stream.dispatch(pipelines.get(d), bind, k.groups, nullptr, 0, k.name);
      }
      stream.submit();
    }
    transfer.download(owned[2], out.data(), n_out * 4);
  } catch (...) {
    release();
    throw;
  }
  release();
  return out;
}

std::string coopmat_verdict_path(const std::string& cache_dir, const std::string& key_hex) {
  return (std::filesystem::path(cache_dir) / "selftest" / (key_hex + ".txt")).string();
}

// The file: "mgn coopmat verdict 1", the key, "<verified 0|1> <m> <n> <k>", then the note (one line).
constexpr const char* kVerdictMagic = "mgn coopmat verdict 1";

std::optional<CoopMatVerdict> load_coopmat_verdict(const std::string& cache_dir, const std::string& key_hex) {
  if (cache_dir.empty()) return std::nullopt;
  std::ifstream f(coopmat_verdict_path(cache_dir, key_hex));
  std::string magic, key, shape, note;
  if (!f || !std::getline(f, magic) || magic != kVerdictMagic || !std::getline(f, key) || key != key_hex ||
      !std::getline(f, shape) || !std::getline(f, note))
    return std::nullopt;
  CoopMatVerdict v;
  int verified = -1;
  char extra = 0;
  if (std::sscanf(shape.c_str(), "%d %u %u %u %c", &verified, &v.mma.m, &v.mma.n, &v.mma.k, &extra) != 4 ||
      (verified != 0 && verified != 1))
    return std::nullopt;
  v.verified = verified == 1;
  v.note = note;
  return v;
}

void store_coopmat_verdict(const std::string& cache_dir, const std::string& key_hex, const CoopMatVerdict& v) {
  if (cache_dir.empty()) return;
  std::string note = v.note;
  std::replace(note.begin(), note.end(), '\n', ' ');
  const std::string text = std::string(kVerdictMagic) + "\n" + key_hex + "\n" + (v.verified ? "1 " : "0 ") +
                           std::to_string(v.mma.m) + " " + std::to_string(v.mma.n) + " " + std::to_string(v.mma.k) +
                           "\n" + note + "\n";
  const std::string path = coopmat_verdict_path(cache_dir, key_hex);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return;
  (void)files::try_write_atomic(path, [&](int fd) { return files::write_all(fd, text.data(), text.size()); });
}

CoopMatVerdict coopmat_verdict(Context& ctx, const GemmTile& tile, codegen::ShaderCompiler& compiler) {
  const std::string what = "f16 GEMM " + gemm_tile_str(tile, true);
  return ctx.memo_verdict(what, [&] {
    // Only a device with the extension runs the test, and only its verdict is worth keeping.
    const bool has_ext = ctx.has(Feature::CooperativeMatrixNV);
    const std::string key = device_build_key(ctx.info(), "coopmat self-test: " + what).hex();
    if (has_ext)
      if (std::optional<CoopMatVerdict> kept = load_coopmat_verdict(compiler.cache_dir(), key)) {
        if (!kept->verified)
          std::fprintf(stderr, "mgn: f16 cooperative-matrix GEMM disabled on %s: %s (kept verdict: %s)\n",
                       ctx.info().name.c_str(), kept->note.c_str(), coopmat_verdict_path(compiler.cache_dir(), key).c_str());
        return *kept;
      }
    CoopMatVerdict v;
    bool ran = false;
    try {
      v = run_all(ctx, tile, compiler);
      ran = true;
    } catch (const std::exception& e) {
      v = {};
      v.note = std::string("the self-test failed to run: ") + e.what();
      if (v.note.size() > 2000) v.note = v.note.substr(0, 2000) + " [...]";
    }
    if (ran && has_ext) store_coopmat_verdict(compiler.cache_dir(), key, v);
    if (!v.verified && ctx.has(Feature::CooperativeMatrixNV))
      std::fprintf(stderr, "mgn: f16 cooperative-matrix GEMM disabled on %s: %s\n", ctx.info().name.c_str(),
                   v.note.c_str());
    return v;
  });
}

}  // namespace mgn::vk
