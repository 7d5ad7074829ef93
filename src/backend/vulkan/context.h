// Vulkan instance, device choice, feature table and device limits: the root object of the Vulkan backend.
// Everything else in src/backend/vulkan/ borrows a Context and must not outlive it.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "codegen/kernel.h"
#include "mgn/options.h"

namespace mgn::vk {

// Device capabilities the backend cares about. Order must match kFeatureTable (checked at compile time).
enum class Feature : uint8_t {
  Vulkan12,                  // core 1.2 API on the device
  ComputeQueue,              // a queue family with VK_QUEUE_COMPUTE_BIT
  StorageBuffer16BitAccess,  // f16 loads/stores in storage buffers
  ShaderFloat16,             // f16 arithmetic
  ShaderInt64,               // 64-bit integer arithmetic
  SubgroupArithmetic,        // subgroupAdd/Max... in compute shaders
  SubgroupSizeControl,       // pin the subgroup size a kernel was tuned for
  ScalarBlockLayout,         // C-like packing of storage-buffer structs
  Maintenance4,              // LocalSizeId, relaxed buffer size rules
  CooperativeMatrixKHR,      // VK_KHR_cooperative_matrix
  CooperativeMatrixNV,       // VK_NV_cooperative_matrix
  Timestamps,                // timestamp queries on the compute queue
  MemoryBudget,              // VK_EXT_memory_budget
  PipelineStatistics,        // VK_KHR_pipeline_executable_properties, enabled only when DeviceOptions ask
  kCount
};

struct FeatureInfo {
  Feature feature;
  const char* name;          // as Vulkan spells it
  bool required;             // missing → Context construction throws mgn::Error naming it
  const char* when_missing;  // what the backend does instead
};

// The one place that says what we need from a device and how we degrade.
inline constexpr std::array<FeatureInfo, static_cast<size_t>(Feature::kCount)> kFeatureTable = {{
    {Feature::Vulkan12, "Vulkan 1.2", true, "cannot run: the backend uses 1.2 core features"},
    {Feature::ComputeQueue, "compute queue", true, "cannot run"},
    {Feature::StorageBuffer16BitAccess, "storageBuffer16BitAccess", false,
     "f16 tensors are stored as f32; Accelerated precision behaves like Strict"},
    {Feature::ShaderFloat16, "shaderFloat16", false, "f16 values are converted to f32 for arithmetic"},
    {Feature::ShaderInt64, "shaderInt64", false, "index math stays 32-bit; tensors above 2^31 elements fail"},
    {Feature::SubgroupArithmetic, "subgroup arithmetic (compute)", false,
     "reductions use shared memory trees only"},
    {Feature::SubgroupSizeControl, "subgroupSizeControl", false,
     "kernels run with the driver's default subgroup size"},
    {Feature::ScalarBlockLayout, "scalarBlockLayout", false, "kernels use std430 layout only"},
    {Feature::Maintenance4, "maintenance4", false, "workgroup sizes are literal constants in the GLSL"},
    {Feature::CooperativeMatrixKHR, "VK_KHR_cooperative_matrix", false,
     "matmuls use SIMT tiles (glslang 12 cannot emit KHR coopmat anyway)"},
    {Feature::CooperativeMatrixNV, "VK_NV_cooperative_matrix", false, "matmuls use SIMT tiles"},
    {Feature::Timestamps, "timestamp queries", false, "per-dispatch timings are reported as unavailable"},
    {Feature::MemoryBudget, "VK_EXT_memory_budget", false,
     "out-of-memory messages report heap sizes instead of the live budget"},
    {Feature::PipelineStatistics, "VK_KHR_pipeline_executable_properties", false,
     "DeviceOptions::pipeline_statistics cannot print the driver's per-pipeline statistics"},
}};

constexpr bool feature_table_in_order() {
  for (size_t i = 0; i < kFeatureTable.size(); ++i)
    if (static_cast<size_t>(kFeatureTable[i].feature) != i) return false;
  return true;
}
static_assert(feature_table_in_order(), "kFeatureTable rows must follow the Feature enum order");

const FeatureInfo& feature_info(Feature f);

// One memory heap as the device reports it now. budget/usage come from VK_EXT_memory_budget (process-wide
// usage, including other sessions and the driver's own allocations); without it both are 0.
struct HeapBudget {
  uint64_t size = 0;
  uint64_t budget = 0;
  uint64_t usage = 0;
  bool device_local = false;
};

// Limits the code generator and memory planner must respect.
struct DeviceLimits {
  uint32_t subgroup_size = 0;  // default; min/max differ only with subgroup size control
  uint32_t min_subgroup_size = 0;
  uint32_t max_subgroup_size = 0;
  uint32_t max_shared_memory = 0;  // maxComputeSharedMemorySize, bytes per workgroup
  std::array<uint32_t, 3> max_workgroup_count{};
  std::array<uint32_t, 3> max_workgroup_size{};
  uint32_t max_workgroup_invocations = 0;
  uint32_t max_push_constants_size = 0;
  uint32_t max_storage_buffers_per_stage = 0;
  uint64_t max_storage_buffer_range = 0;  // the largest range one binding can see
  uint64_t max_memory_allocation_size = 0;
  uint64_t max_buffer_size = 0;  // maintenance4; equals max_memory_allocation_size without it
  uint64_t min_storage_buffer_offset_alignment = 0;
  uint64_t non_coherent_atom_size = 0;
  float timestamp_period_ns = 0;  // nanoseconds per timestamp tick
  uint32_t timestamp_valid_bits = 0;
  bool unified_memory = false;  // integrated GPU or CPU: device memory is host-visible, no staging needed
};

struct DeviceInfo {
  uint32_t index = 0;  // in vkEnumeratePhysicalDevices order, as DeviceOptions::device counts
  std::string name;
  VkPhysicalDeviceType type = VK_PHYSICAL_DEVICE_TYPE_OTHER;
  uint32_t api_version = 0;
  uint32_t vendor_id = 0;
  uint32_t device_id = 0;
  std::string driver;  // driverName + driverInfo
  std::array<uint8_t, VK_UUID_SIZE> pipeline_cache_uuid{};
};

const char* device_type_name(VkPhysicalDeviceType t);

// The verdict of the f16 cooperative-matrix GEMM's self-test on a device (vk::coopmat_verdict).
struct CoopMatVerdict {
  bool verified = false;
  codegen::CoopMatShape mma;
  std::string note;  // what passed, or why the path is off
};

// Testing only (FaultInjection, options.h): counts one session's calls of each kind and gives the VkResult
// the chosen call must fail with instead of calling the driver (VK_SUCCESS: make the call). Off (every count
// 0), a call costs one compare; on, one relaxed atomic add. Thread-safe.
class FaultPoints {
 public:
  explicit FaultPoints(const FaultInjection& plan = {}) : plan_(plan) {}
  VkResult submission() { return hit(submissions_, plan_.device_lost_at_submission, VK_ERROR_DEVICE_LOST); }
  VkResult wait() { return hit(waits_, plan_.device_lost_at_wait, VK_ERROR_DEVICE_LOST); }
  VkResult allocation() {
    return hit(allocations_, plan_.out_of_memory_at_allocation, VK_ERROR_OUT_OF_DEVICE_MEMORY);
  }

 private:
  static VkResult hit(std::atomic<uint64_t>& n, uint64_t at, VkResult fail) {
    if (at == 0) return VK_SUCCESS;
    return n.fetch_add(1, std::memory_order_relaxed) + 1 == at ? fail : VK_SUCCESS;
  }
  FaultInjection plan_;
  std::atomic<uint64_t> submissions_{0}, waits_{0}, allocations_{0};
};

class Context {
 public:
  // Opens the device DeviceOptions::device names (see there); validation and pipeline diagnostics as asked.
  explicit Context(const DeviceOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  VkInstance instance() const { return instance_; }
  VkPhysicalDevice physical_device() const { return physical_; }
  VkDevice device() const { return device_; }
  VkQueue queue() const { return queue_; }
  uint32_t queue_family() const { return queue_family_; }

  const DeviceInfo& info() const { return info_; }
  const DeviceLimits& limits() const { return limits_; }
  const DeviceOptions& options() const { return options_; }
  // What the code generator may specialize on (limits, features); the self-test verdict is not in it: a
  // session that needs it asks coopmat_verdict (gemm_selftest.h) and fills it in.
  const codegen::DeviceCaps& caps() const { return caps_; }
  // Once-per-device results by key: `compute` runs for the first caller of a key (others wait), and its
  // result stays with the device for the Context's lifetime.
  CoopMatVerdict memo_verdict(const std::string& key, const std::function<CoopMatVerdict()>& compute);
  const VkPhysicalDeviceMemoryProperties& memory_properties() const { return memory_properties_; }
  // Every physical device the loader reported, selected or not.
  const std::vector<DeviceInfo>& devices() const { return devices_; }

  bool has(Feature f) const { return present_[static_cast<size_t>(f)]; }
  // One line per row of kFeatureTable: present or what we do without it.
  std::string feature_report() const;

  // Every heap's size and, where VK_EXT_memory_budget is enabled, its current budget and usage.
  std::vector<HeapBudget> heap_budgets() const;

  // Queues are externally synchronized in Vulkan; every submission in the backend goes through here.
  // `injected` (FaultPoints) other than VK_SUCCESS is taken as the driver's answer and nothing is submitted.
  // Refused at once (DeviceLost) on a lost device.
  void submit(const VkSubmitInfo& info, VkFence fence, VkResult injected = VK_SUCCESS);
  // Waits for `fence` without a timeout; `injected` as for submit().
  void wait(VkFence fence, const char* what, VkResult injected = VK_SUCCESS);
  // Like vk::check, and where a lost device is noticed: VK_ERROR_DEVICE_LOST from any call marks the Context
  // lost and throws DeviceLost naming the call. Objects of the backend check their calls through here.
  void check(VkResult r, const char* what);

  // Device loss. Once lost, a Context stays lost: every session on it fails fast (require_device), its
  // pipeline cache is no longer saved, and the process's registry (runtime/engine_vulkan.cpp) opens a new
  // Context for the next session; this one is destroyed when the last session holding it goes away.
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  std::string lost_during() const;
  // Throws DeviceLost ("<what> refused: ...") on a lost device; one atomic load otherwise.
  void require_device(const char* what) const {
    if (lost()) throw_refused(what);
  }
  // Waits for the queue to finish whatever was submitted (the result ignored): a lost device's objects may
  // still be in use by work the loss interrupted or (injected) did not stop, and must not be destroyed then.
  void drain();

  bool validation_enabled() const { return validation_; }
  // Warnings and errors from the validation layer (and loader) since creation or the last clear.
  size_t validation_message_count() const;
  std::vector<std::string> validation_messages() const;
  void clear_validation_messages();

 private:
  static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                         VkDebugUtilsMessageTypeFlagsEXT types,
                                                         const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                         void* user);
  [[noreturn]] void throw_refused(const char* what) const;
  std::string lost_message(const std::string& during) const;
  void create_instance(bool validation);
  void choose_device(const std::string& selector);
  void create_device();
  void destroy();

  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  VkPhysicalDevice physical_ = VK_NULL_HANDLE;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  uint32_t queue_family_ = 0;
  bool validation_ = false;
  bool coop_matrix_khr_driver_only_ = false;

  DeviceOptions options_;
  DeviceInfo info_;
  DeviceLimits limits_;
  codegen::DeviceCaps caps_;
  std::mutex verdict_mutex_;
  std::map<std::string, CoopMatVerdict> verdicts_;
  VkPhysicalDeviceMemoryProperties memory_properties_{};
  std::vector<DeviceInfo> devices_;
  std::vector<VkPhysicalDevice> physical_devices_;
  std::array<bool, static_cast<size_t>(Feature::kCount)> present_{};

  std::mutex queue_mutex_;
  std::atomic<bool> lost_{false};
  mutable std::mutex lost_mutex_;
  std::string lost_during_;  // the call that reported the loss first
  mutable std::mutex messages_mutex_;
  std::vector<std::string> messages_;
};

// A Vulkan info struct, zeroed, with sType (and pNext) set. `T x{TYPE}` would trip
// -Wmissing-field-initializers.
template <class T>
T make(VkStructureType type, void* next = nullptr) {
  T s{};
  s.sType = type;
  s.pNext = next;
  return s;
}

// Throws mgn::Error naming the call and the VkResult; for Vulkan failures a user can hit (OOM, lost device).
void check(VkResult r, const char* what);

}  // namespace mgn::vk
