// Pipeline creation, deduplication and the on-disk VkPipelineCache.
#include "backend/vulkan/pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <utility>

#include "codegen/shader_compiler.h"
#include "mgn/types.h"
#include "support/atomic_file.h"
#include "support/parallel.h"

namespace mgn::vk {
namespace {

uint64_t desc_hash(const PipelineDesc& d) {
  uint64_t h = codegen::fnv1a64(d.spirv.data(), d.spirv.size() * sizeof(uint32_t));
  const uint32_t layout[3] = {d.num_buffers, d.push_constant_bytes, d.required_subgroup_size};
  return codegen::fnv1a64(layout, sizeof layout, h);
}

bool same_pipeline(const PipelineDesc& a, const PipelineDesc& b) {
  return a.num_buffers == b.num_buffers && a.push_constant_bytes == b.push_constant_bytes &&
         a.required_subgroup_size == b.required_subgroup_size && a.spirv == b.spirv;
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += digits[p[i] >> 4], s += digits[p[i] & 15];
  return s;
}

// The header Vulkan puts in front of cache data (VkPipelineCacheHeaderVersionOne).
bool header_matches(const std::vector<char>& data, const DeviceInfo& info) {
  if (data.size() < 32) return false;
  uint32_t words[4];
  std::memcpy(words, data.data(), 16);
  return words[0] >= 32 && words[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && words[2] == info.vendor_id &&
         words[3] == info.device_id &&
         std::memcmp(data.data() + 16, info.pipeline_cache_uuid.data(), 16) == 0;
}

// CPU time of the calling thread (user + system), in milliseconds.
double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

}  // namespace

PipelineCache::PipelineCache(Context& ctx, std::string cache_dir) : ctx_(ctx) {
  std::vector<char> initial;
  if (!cache_dir.empty()) {
    const auto& i = ctx.info();
    // One file per driver build: the UUID changes with the driver, and a stale file would only be ignored.
    cache_file_ =
        (std::filesystem::path(cache_dir) /
         ("pipelines-" + hex_bytes(i.pipeline_cache_uuid.data(), i.pipeline_cache_uuid.size()) + ".bin"))
            .string();
    std::ifstream in(cache_file_, std::ios::binary);
    if (in) initial.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!header_matches(initial, i)) initial.clear();
    loaded_from_disk_ = !initial.empty();
  }
  auto ci = make<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
  ci.initialDataSize = initial.size();
  ci.pInitialData = initial.empty() ? nullptr : initial.data();
  check(vkCreatePipelineCache(ctx.device(), &ci, nullptr, &cache_), "vkCreatePipelineCache");
}

PipelineCache::~PipelineCache() {
  VkDevice dev = ctx_.device();
  save();  // not on a lost device (save() checks)
  for (auto& [hash, list] : entries_)
    for (auto& e : list)
      if (e->pipeline.pipeline) vkDestroyPipeline(dev, e->pipeline.pipeline, nullptr);
  for (auto& [key, layout] : pipeline_layouts_) vkDestroyPipelineLayout(dev, layout, nullptr);
  for (auto& [n, layout] : set_layouts_) vkDestroyDescriptorSetLayout(dev, layout, nullptr);
  vkDestroyPipelineCache(dev, cache_, nullptr);
}

void PipelineCache::save() const {
  // A lost device's cache data is not trusted: the file keeps what the last healthy save wrote.
  if (cache_file_.empty() || ctx_.lost()) return;
  size_t size = 0;
  if (vkGetPipelineCacheData(ctx_.device(), cache_, &size, nullptr) != VK_SUCCESS || size == 0) return;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(ctx_.device(), cache_, &size, data.data()) != VK_SUCCESS) return;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cache_file_).parent_path(), ec);
  // Best effort (a read-only cache folder costs a recompile next time); atomic: readers see the old or new file.
  (void)files::try_write_atomic(cache_file_, [&](int fd) { return files::write_all(fd, data.data(), size); });
}

PipelineCache::Stats PipelineCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void PipelineCache::check_desc(const PipelineDesc& d) const {
  const DeviceLimits& L = ctx_.limits();
  const std::string who = "pipeline '" + d.name + "'";
  if (d.spirv.empty() || d.spirv[0] != 0x07230203u)
    throw Error(who + ": the SPIR-V is empty or lacks its magic number");
  if (d.num_buffers > L.max_storage_buffers_per_stage)
    throw Error(who + " binds " + std::to_string(d.num_buffers) + " storage buffers; the device allows " +
                std::to_string(L.max_storage_buffers_per_stage) + " per stage");
  if (d.push_constant_bytes % 4 || d.push_constant_bytes > L.max_push_constants_size)
    throw Error(who + " has " + std::to_string(d.push_constant_bytes) +
                " bytes of push constants; need a multiple of 4 and at most " +
                std::to_string(L.max_push_constants_size));
  if (d.required_subgroup_size) {
    if (!ctx_.has(Feature::SubgroupSizeControl))
      throw Error(who + " requires subgroup size " + std::to_string(d.required_subgroup_size) +
                  " but the device lacks subgroupSizeControl");
    if (!std::has_single_bit(d.required_subgroup_size) || d.required_subgroup_size < L.min_subgroup_size ||
        d.required_subgroup_size > L.max_subgroup_size)
      throw Error(who + " requires subgroup size " + std::to_string(d.required_subgroup_size) +
                  "; the device supports " + std::to_string(L.min_subgroup_size) + ".." +
                  std::to_string(L.max_subgroup_size));
  }
}

VkDescriptorSetLayout PipelineCache::set_layout(uint32_t num_buffers) {
  // Caller holds mutex_.
  if (auto it = set_layouts_.find(num_buffers); it != set_layouts_.end()) return it->second;
  std::vector<VkDescriptorSetLayoutBinding> bindings(num_buffers);
  for (uint32_t i = 0; i < num_buffers; ++i)
    bindings[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  auto ci = make<VkDescriptorSetLayoutCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO);
  ci.bindingCount = num_buffers;
  ci.pBindings = bindings.data();
  VkDescriptorSetLayout layout;
  ctx_.check(vkCreateDescriptorSetLayout(ctx_.device(), &ci, nullptr, &layout),
             "vkCreateDescriptorSetLayout");
  return set_layouts_[num_buffers] = layout;
}

VkPipelineLayout PipelineCache::pipeline_layout(uint32_t num_buffers, uint32_t push_bytes) {
  // Caller holds mutex_.
  const auto key = std::make_pair(num_buffers, push_bytes);
  if (auto it = pipeline_layouts_.find(key); it != pipeline_layouts_.end()) return it->second;
  VkDescriptorSetLayout sl = set_layout(num_buffers);
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  auto ci = make<VkPipelineLayoutCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO);
  ci.setLayoutCount = 1;
  ci.pSetLayouts = &sl;
  ci.pushConstantRangeCount = push_bytes ? 1 : 0;
  ci.pPushConstantRanges = push_bytes ? &range : nullptr;
  VkPipelineLayout layout;
  ctx_.check(vkCreatePipelineLayout(ctx_.device(), &ci, nullptr, &layout), "vkCreatePipelineLayout");
  return pipeline_layouts_[key] = layout;
}

PipelineCache::Entry* PipelineCache::find_or_claim(const PipelineDesc& desc, bool* claimed) {
  check_desc(desc);
  const uint64_t h = desc_hash(desc);
  std::lock_guard lock(mutex_);
  auto& list = entries_[h];
  for (auto& e : list)
    if (same_pipeline(e->desc, desc)) {
      ++stats_.reused;
      *claimed = false;
      return e.get();
    }
  auto e = std::make_unique<Entry>();
  e->desc = desc;
  e->ready = e->promise.get_future().share();
  e->pipeline.num_buffers = desc.num_buffers;
  e->pipeline.push_constant_bytes = desc.push_constant_bytes;
  e->pipeline.spirv_hash = codegen::fnv1a64(desc.spirv.data(), desc.spirv.size() * sizeof(uint32_t));
  e->pipeline.name = desc.name;
  e->pipeline.layout = pipeline_layout(desc.num_buffers, desc.push_constant_bytes);
  e->pipeline.set_layout = set_layout(desc.num_buffers);
  ++stats_.created;
  *claimed = true;
  list.push_back(std::move(e));
  return list.back().get();
}

std::pair<double, double> PipelineCache::build(Entry& e) {
  VkDevice dev = ctx_.device();
  VkShaderModule module = VK_NULL_HANDLE;
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_ms();
  auto elapsed = [&] {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = thread_cpu_ms() - cpu0;
    std::lock_guard lock(mutex_);
    stats_.create_ms += ms;
    stats_.create_cpu_ms += cpu;
    return std::make_pair(ms, cpu);
  };
  try {
    auto mci = make<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    mci.codeSize = e.desc.spirv.size() * sizeof(uint32_t);
    mci.pCode = e.desc.spirv.data();
    ctx_.check(vkCreateShaderModule(dev, &mci, nullptr, &module), "vkCreateShaderModule");

    auto subgroup = make<VkPipelineShaderStageRequiredSubgroupSizeCreateInfo>(
        VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO);
    subgroup.requiredSubgroupSize = e.desc.required_subgroup_size;
    auto ci = make<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    ci.stage = make<VkPipelineShaderStageCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO);
    ci.stage.pNext = e.desc.required_subgroup_size ? &subgroup : nullptr;
    ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    ci.stage.module = module;
    ci.stage.pName = "main";
    ci.layout = e.pipeline.layout;
    const std::string& ir_dir = ctx_.options().pipeline_ir_dir;
    const bool want_ir = ctx_.has(Feature::PipelineStatistics) && !ir_dir.empty();
    if (ctx_.has(Feature::PipelineStatistics)) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    if (want_ir) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
    // The VkPipelineCache is internally synchronized, so workers share it.
    const VkResult r = vkCreateComputePipelines(dev, cache_, 1, &ci, nullptr, &e.pipeline.pipeline);
    if (r != VK_SUCCESS) e.pipeline.pipeline = VK_NULL_HANDLE;
    ctx_.check(r, ("vkCreateComputePipelines for '" + e.desc.name + "'").c_str());
    vkDestroyShaderModule(dev, module, nullptr);
    const auto ms = elapsed();
    if (ctx_.has(Feature::PipelineStatistics)) print_statistics(e.pipeline);
    if (want_ir) write_representations(e.pipeline, ir_dir);
    e.promise.set_value();
    return ms;
  } catch (...) {
    if (module) vkDestroyShaderModule(dev, module, nullptr);
    e.promise.set_exception(std::current_exception());
    return elapsed();
  }
}

// The executables of a pipeline as the driver lists them (VK_KHR_pipeline_executable_properties); empty
// when it lists none or the entry point is missing.
// Vulkan's two-call idiom: call(&n, nullptr) for the count, then call(&n, data) into elements that start
// as `blank` (their sType). Empty when either call fails.
template <class T, class Call>
static std::vector<T> two_call(const T& blank, Call call) {
  uint32_t n = 0;
  if (call(&n, nullptr) != VK_SUCCESS || n == 0) return {};
  std::vector<T> out(n, blank);
  const VkResult r = call(&n, out.data());
  if (r != VK_SUCCESS && r != VK_INCOMPLETE) return {};  // VK_INCOMPLETE: n says how many were written
  out.resize(n);
  return out;
}

static std::vector<VkPipelineExecutablePropertiesKHR> pipeline_executables(VkDevice dev,
                                                                           VkPipeline pipeline) {
  auto props_fn = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(dev, "vkGetPipelineExecutablePropertiesKHR"));
  if (!props_fn) return {};
  auto info = make<VkPipelineInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR);
  info.pipeline = pipeline;
  return two_call(make<VkPipelineExecutablePropertiesKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR),
                  [&](uint32_t* n, VkPipelineExecutablePropertiesKHR* d) { return props_fn(dev, &info, n, d); });
}

static VkPipelineExecutableInfoKHR executable_info(VkPipeline pipeline, uint32_t index) {
  auto ei = make<VkPipelineExecutableInfoKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR);
  ei.pipeline = pipeline;
  ei.executableIndex = index;
  return ei;
}

// MGN_PIPELINE_STATS=1: one stderr line per pipeline with what the driver reports about its executable
// ("mgn pipeline stats: <name>: <executable>: <statistic>=<value>, ...").
void PipelineCache::print_statistics(const Pipeline& p) const {
  VkDevice dev = ctx_.device();
  auto stats_fn = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(dev, "vkGetPipelineExecutableStatisticsKHR"));
  if (!stats_fn) return;
  const std::vector<VkPipelineExecutablePropertiesKHR> execs = pipeline_executables(dev, p.pipeline);
  const uint32_t n = uint32_t(execs.size());
  std::string line;
  for (uint32_t i = 0; i < n; ++i) {
    const VkPipelineExecutableInfoKHR ei = executable_info(p.pipeline, i);
    const std::vector<VkPipelineExecutableStatisticKHR> st =
        two_call(make<VkPipelineExecutableStatisticKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR),
                 [&](uint32_t* m, VkPipelineExecutableStatisticKHR* d) { return stats_fn(dev, &ei, m, d); });
    if (st.empty()) continue;
    line += std::string(" ") + execs[i].name + " (subgroup " + std::to_string(execs[i].subgroupSize) + "):";
    for (const auto& s : st) {
      line += std::string(" ") + s.name + "=";
      switch (s.format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
          line += s.value.b32 ? "true" : "false";
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
          line += std::to_string(s.value.i64);
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
          line += std::to_string(s.value.u64);
          break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
          line += std::to_string(s.value.f64);
          break;
        default:
          line += "?";
      }
      line += ";";
    }
  }
  std::fprintf(stderr, "mgn pipeline stats: %s:%s\n", p.name.c_str(), line.c_str());
}

// MGN_PIPELINE_IR=DIR: every internal representation the driver keeps of the pipeline's executables (for
// instance its intermediate code or machine code), one file each: DIR/<pipeline>.<executable>.<name>.txt
// (text) or .bin. One stderr line per pipeline says what was written, or that the driver offered none.
void PipelineCache::write_representations(const Pipeline& p, const std::string& dir) const {
  VkDevice dev = ctx_.device();
  auto ir_fn = reinterpret_cast<PFN_vkGetPipelineExecutableInternalRepresentationsKHR>(
      vkGetDeviceProcAddr(dev, "vkGetPipelineExecutableInternalRepresentationsKHR"));
  if (!ir_fn) return;
  const uint32_t n = uint32_t(pipeline_executables(dev, p.pipeline).size());
  // File names keep [A-Za-z0-9_.-] of the pipeline and representation names.
  auto clean = [](std::string t) {
    for (char& c : t)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '_';
    return t;
  };
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string written;
  for (uint32_t i = 0; i < n; ++i) {
    const VkPipelineExecutableInfoKHR ei = executable_info(p.pipeline, i);
    // The names and sizes first (pData null), then the data into buffers of those sizes.
    std::vector<VkPipelineExecutableInternalRepresentationKHR> reps =
        two_call(make<VkPipelineExecutableInternalRepresentationKHR>(
                     VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR),
                 [&](uint32_t* m, VkPipelineExecutableInternalRepresentationKHR* d) { return ir_fn(dev, &ei, m, d); });
    uint32_t m = uint32_t(reps.size());
    if (m == 0) continue;
    std::vector<std::vector<char>> data(m);
    for (uint32_t r = 0; r < m; ++r) {
      data[r].resize(reps[r].dataSize);
      reps[r].pData = data[r].data();
    }
    if (ir_fn(dev, &ei, &m, reps.data()) != VK_SUCCESS) continue;
    for (uint32_t r = 0; r < m; ++r) {
      size_t size = reps[r].dataSize;
      if (reps[r].isText && size && data[r][size - 1] == '\0') --size;  // text ends in a NUL
      const std::string path = dir + "/" + clean(p.name) + "." + std::to_string(i) + "." +
                               clean(reps[r].name) + (reps[r].isText ? ".txt" : ".bin");
      std::FILE* f = std::fopen(path.c_str(), "wb");
      if (!f) continue;
      std::fwrite(data[r].data(), 1, size, f);
      std::fclose(f);
      written += std::string(" ") + reps[r].name + " (" + std::to_string(size) + " bytes)";
    }
  }
  std::fprintf(stderr, "mgn pipeline ir: %s:%s\n", p.name.c_str(),
               written.empty() ? " the driver offers no internal representation" : written.c_str());
}

const Pipeline& PipelineCache::get(const PipelineDesc& desc, bool* created, double* create_ms,
                                   double* create_cpu_ms) {
  bool claimed = false;
  Entry* e = find_or_claim(desc, &claimed);
  const std::pair<double, double> ms = claimed ? build(*e) : std::make_pair(0.0, 0.0);
  if (created) *created = claimed;
  if (create_ms) *create_ms = ms.first;
  if (create_cpu_ms) *create_cpu_ms = ms.second;
  e->ready.get();  // waits if another thread builds it; rethrows its failure
  return e->pipeline;
}

std::vector<const Pipeline*> PipelineCache::get_all(const std::vector<PipelineDesc>& descs,
                                                    unsigned threads) {
  std::vector<Entry*> entries(descs.size());
  std::vector<Entry*> to_build;
  for (size_t i = 0; i < descs.size(); ++i) {
    bool claimed = false;
    entries[i] = find_or_claim(descs[i], &claimed);
    if (claimed) to_build.push_back(entries[i]);
  }
  support::parallel_for(to_build.size(), threads, [&](size_t i) { build(*to_build[i]); });  // never throws

  std::vector<const Pipeline*> out(descs.size());
  for (size_t i = 0; i < descs.size(); ++i) {
    entries[i]->ready.get();  // rethrows a failed creation (the first in `descs` order)
    out[i] = &entries[i]->pipeline;
  }
  return out;
}

}  // namespace mgn::vk
