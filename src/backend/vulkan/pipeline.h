// Compute pipelines from SPIR-V: N storage buffers at set 0 bindings 0..N-1, plus push constants.
// Deduplicated by SPIR-V content, created in parallel, backed by a VkPipelineCache persisted on disk.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/vulkan/context.h"

namespace mgn::vk {

struct PipelineDesc {
  std::vector<uint32_t> spirv;          // validated SPIR-V (codegen::ShaderCompiler output)
  uint32_t num_buffers = 0;             // storage buffers at set 0, bindings 0..num_buffers-1
  uint32_t push_constant_bytes = 0;     // multiple of 4, at offset 0
  uint32_t required_subgroup_size = 0;  // 0: the driver's choice; else needs Feature::SubgroupSizeControl
  std::string name;                     // for errors and timings
};

struct Pipeline {
  VkPipeline pipeline = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  uint32_t num_buffers = 0;
  uint32_t push_constant_bytes = 0;
  uint64_t spirv_hash = 0;
  std::string name;
};

// Thread-safe. Returned references stay valid until the cache is destroyed (before its Context).
class PipelineCache {
 public:
  // An empty cache_dir keeps the VkPipelineCache in memory only.
  explicit PipelineCache(Context& ctx, std::string cache_dir);
  ~PipelineCache();  // saves the VkPipelineCache
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  // Creates on this thread, or returns the pipeline already made from identical SPIR-V and layout (waiting
  // while another thread creates it). *created (if given): this call created it; *create_ms: how long
  // vkCreateShaderModule + vkCreateComputePipelines took here, *create_cpu_ms: the CPU time this thread
  // spent in them (both 0 when not created). Safe from many threads:
  // the VkPipelineCache is internally synchronized (the spec's vkCreatePipelineCache; it is not created
  // with VK_PIPELINE_CACHE_CREATE_EXTERNALLY_SYNCHRONIZED_BIT).
  const Pipeline& get(const PipelineDesc& desc, bool* created = nullptr, double* create_ms = nullptr,
                      double* create_cpu_ms = nullptr);
  // Creates the missing ones on `threads` workers (support::parallel_for; 0: hardware concurrency); same
  // order as `descs`. Drivers compile at this point (lavapipe: ~2 ms of CPU per pipeline, warm or cold, its
  // cache keeps nothing; NVIDIA: docs/perf-notes.md 2026-12-07).
  std::vector<const Pipeline*> get_all(const std::vector<PipelineDesc>& descs, unsigned threads = 0);

  void save() const;  // atomically writes the VkPipelineCache; best effort
  const std::string& cache_file() const { return cache_file_; }
  bool loaded_from_disk() const { return loaded_from_disk_; }

  struct Stats {
    uint64_t created = 0;  // vkCreateComputePipelines calls
    uint64_t reused = 0;   // requests answered by an existing pipeline
    double create_ms = 0;  // vkCreateShaderModule + vkCreateComputePipelines, summed over threads
    double create_cpu_ms = 0;  // the CPU time of the creating threads in those calls
  };
  Stats stats() const;

 private:
  struct Entry {
    PipelineDesc desc;
    Pipeline pipeline;
    std::promise<void> promise;      // fulfilled by the one thread that claimed the entry
    std::shared_future<void> ready;  // set once vkCreateComputePipelines returned (or threw)
  };
  // Finds the entry for `desc` or inserts one; *claimed says this caller must build() it.
  Entry* find_or_claim(const PipelineDesc& desc, bool* claimed);
  // Never throws (a failure goes to e.ready); the creation's wall and thread-CPU milliseconds.
  std::pair<double, double> build(Entry& e);
  void print_statistics(const Pipeline& p) const;                               // MGN_PIPELINE_STATS=1
  void write_representations(const Pipeline& p, const std::string& dir) const;  // MGN_PIPELINE_IR=DIR
  VkDescriptorSetLayout set_layout(uint32_t num_buffers);
  VkPipelineLayout pipeline_layout(uint32_t num_buffers, uint32_t push_bytes);
  void check_desc(const PipelineDesc& d) const;

  Context& ctx_;
  std::string cache_file_;
  bool loaded_from_disk_ = false;
  VkPipelineCache cache_ = VK_NULL_HANDLE;

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, std::vector<std::unique_ptr<Entry>>> entries_;  // by content hash
  std::map<uint32_t, VkDescriptorSetLayout> set_layouts_;
  std::map<std::pair<uint32_t, uint32_t>, VkPipelineLayout> pipeline_layouts_;
  Stats stats_;
};

}  // namespace mgn::vk
