// Instance and device creation: validation layer, device selection, the feature table probed and enabled.
#include "backend/vulkan/context.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "mgn/types.h"

namespace mgn::vk {
namespace {

constexpr const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

// VK_KHR_cooperative_matrix arrived in header 1.3.255; Debian ships 1.3.239. A build with older headers
// leaves it off: its validation layer rejects the unknown feature struct, and glslang of that era cannot emit
// KHR cooperative-matrix SPIR-V anyway, so nothing could use it.
#ifdef VK_KHR_cooperative_matrix
using CoopMatrixFeaturesKHR = VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
constexpr VkStructureType kCoopMatrixFeaturesKHRType =
    VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR;
constexpr bool kHeadersKnowCoopMatrixKHR = true;
#else
struct CoopMatrixFeaturesKHR {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};
constexpr VkStructureType kCoopMatrixFeaturesKHRType = static_cast<VkStructureType>(1000506000);
constexpr bool kHeadersKnowCoopMatrixKHR = false;
#endif
constexpr const char* kCoopMatrixKHRExtension = "VK_KHR_cooperative_matrix";

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

std::string version_str(uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

std::string device_list(const std::vector<DeviceInfo>& devices) {
  std::ostringstream s;
  for (const auto& d : devices)
    s << "\n  " << d.index << ": " << d.name << " (" << device_type_name(d.type) << ", Vulkan "
      << version_str(d.api_version) << ")";
  return s.str();
}

bool has_extension(const std::vector<VkExtensionProperties>& exts, const char* name) {
  return std::any_of(exts.begin(), exts.end(),
                     [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
}

}  // namespace

const FeatureInfo& feature_info(Feature f) {
  return kFeatureTable[static_cast<size_t>(f)];
}

const char* device_type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "CPU";
    default:
      return "other";
  }
}

void check(VkResult r, const char* what) {
  if (r == VK_SUCCESS) return;
  const char* name = "unknown VkResult";
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
      name = "VK_ERROR_OUT_OF_HOST_MEMORY";
      break;
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
      name = "VK_ERROR_OUT_OF_DEVICE_MEMORY";
      break;
    case VK_ERROR_INITIALIZATION_FAILED:
      name = "VK_ERROR_INITIALIZATION_FAILED";
      break;
    case VK_ERROR_DEVICE_LOST:
      name = "VK_ERROR_DEVICE_LOST";
      break;
    case VK_ERROR_LAYER_NOT_PRESENT:
      name = "VK_ERROR_LAYER_NOT_PRESENT";
      break;
    case VK_ERROR_EXTENSION_NOT_PRESENT:
      name = "VK_ERROR_EXTENSION_NOT_PRESENT";
      break;
    case VK_ERROR_FEATURE_NOT_PRESENT:
      name = "VK_ERROR_FEATURE_NOT_PRESENT";
      break;
    case VK_ERROR_INCOMPATIBLE_DRIVER:
      name = "VK_ERROR_INCOMPATIBLE_DRIVER";
      break;
    case VK_ERROR_TOO_MANY_OBJECTS:
      name = "VK_ERROR_TOO_MANY_OBJECTS";
      break;
    case VK_ERROR_FRAGMENTED_POOL:
      name = "VK_ERROR_FRAGMENTED_POOL";
      break;
    case VK_ERROR_OUT_OF_POOL_MEMORY:
      name = "VK_ERROR_OUT_OF_POOL_MEMORY";
      break;
    case VK_TIMEOUT:
      name = "VK_TIMEOUT";
      break;
    default:
      break;
  }
  throw Error(std::string("Vulkan call failed: ") + what + " returned " + name + " (" + std::to_string(r) +
              ")");
}

VKAPI_ATTR VkBool32 VKAPI_CALL Context::on_debug_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                                         VkDebugUtilsMessageTypeFlagsEXT types,
                                                         const VkDebugUtilsMessengerCallbackDataEXT* data,
                                                         void* user) {
  auto* self = static_cast<Context*>(user);
  const bool error = severity & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  std::string text = std::string(error ? "[vulkan error] " : "[vulkan warning] ") +
                     (data && data->pMessage ? data->pMessage : "(no message)");
  // Printed as well as stored: a validation error usually explains a wrong result that follows it.
  std::fprintf(stderr, "%s\n", text.c_str());
  std::lock_guard lock(self->messages_mutex_);
  self->messages_.push_back(std::move(text));
  return VK_FALSE;  // never abort the call: the test decides what a message means
}

Context::Context(const DeviceOptions& options) : options_(options) {
  try {
    create_instance(options_.validation);
    choose_device(options_.device);
    create_device();
    caps_.subgroup_size = limits_.subgroup_size;
    caps_.max_shared_bytes = limits_.max_shared_memory;
    caps_.max_workgroup_invocations = limits_.max_workgroup_invocations;
    caps_.max_workgroup_count = limits_.max_workgroup_count;
    caps_.max_storage_buffer_range = limits_.max_storage_buffer_range;
    caps_.cooperative_matrix_nv = has(Feature::CooperativeMatrixNV);
    caps_.max_storage_buffers = limits_.max_storage_buffers_per_stage;
  } catch (...) {
    destroy();  // the destructor does not run when a constructor throws
    throw;
  }
}

Context::~Context() {
  destroy();
}

void Context::destroy() {
  if (device_) {
    vkDeviceWaitIdle(device_);
    vkDestroyDevice(device_, nullptr);
    device_ = VK_NULL_HANDLE;
  }
  if (messenger_) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance_, messenger_, nullptr);
    messenger_ = VK_NULL_HANDLE;
  }
  if (instance_) {
    vkDestroyInstance(instance_, nullptr);
    instance_ = VK_NULL_HANDLE;
  }
}

void Context::create_instance(bool validation) {
  uint32_t loader_version = VK_API_VERSION_1_0;
  vkEnumerateInstanceVersion(&loader_version);
  if (loader_version < VK_API_VERSION_1_2)
    throw Error("the Vulkan loader is version " + version_str(loader_version) +
                "; meganeura needs 1.2 or newer");

  uint32_t n = 0;
  vkEnumerateInstanceLayerProperties(&n, nullptr);
  std::vector<VkLayerProperties> layers(n);
  vkEnumerateInstanceLayerProperties(&n, layers.data());
  vkEnumerateInstanceExtensionProperties(nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateInstanceExtensionProperties(nullptr, &n, exts.data());

  std::vector<const char*> enabled_layers, enabled_exts;
  if (validation) {
    const bool found = std::any_of(layers.begin(), layers.end(), [](const VkLayerProperties& l) {
      return std::strcmp(l.layerName, kValidationLayer) == 0;
    });
    if (!found)
      throw Error(std::string("validation was requested (DeviceOptions::validation, MGN_VALIDATION=1) but ") +
                  kValidationLayer +
                  " is not installed (Debian: apt install vulkan-validationlayers)");
    enabled_layers.push_back(kValidationLayer);
    if (!has_extension(exts, VK_EXT_DEBUG_UTILS_EXTENSION_NAME))
      throw Error("validation was requested but the loader lacks " VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    enabled_exts.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    if (options_.sync_validation) {  // the layer offers VK_EXT_validation_features itself
      uint32_t m = 0;
      vkEnumerateInstanceExtensionProperties(kValidationLayer, &m, nullptr);
      std::vector<VkExtensionProperties> layer_exts(m);
      vkEnumerateInstanceExtensionProperties(kValidationLayer, &m, layer_exts.data());
      if (!has_extension(layer_exts, VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME))
        throw Error("synchronization validation was requested but the validation layer lacks "
                    VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
      enabled_exts.push_back(VK_EXT_VALIDATION_FEATURES_EXTENSION_NAME);
    }
  }
  VkInstanceCreateFlags flags = 0;
  // MoltenVK (the later Metal path) only shows up with portability enumeration.
  if (has_extension(exts, VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME)) {
    enabled_exts.push_back(VK_KHR_PORTABILITY_ENUMERATION_EXTENSION_NAME);
    flags |= VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR;
  }

  auto app = make<VkApplicationInfo>(VK_STRUCTURE_TYPE_APPLICATION_INFO);
  app.pApplicationName = "meganeura";
  app.pEngineName = "meganeura";
  app.apiVersion = VK_API_VERSION_1_3;  // the highest we use; 1.2 devices still work through this instance

  auto messenger_info =
      make<VkDebugUtilsMessengerCreateInfoEXT>(VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT);
  messenger_info.messageSeverity =
      VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  messenger_info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  messenger_info.pfnUserCallback = &Context::on_debug_message;
  messenger_info.pUserData = this;

  auto ci = make<VkInstanceCreateInfo>(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  ci.flags = flags;
  ci.pApplicationInfo = &app;
  ci.enabledLayerCount = static_cast<uint32_t>(enabled_layers.size());
  ci.ppEnabledLayerNames = enabled_layers.data();
  ci.enabledExtensionCount = static_cast<uint32_t>(enabled_exts.size());
  ci.ppEnabledExtensionNames = enabled_exts.data();
  if (validation) ci.pNext = &messenger_info;  // also catches messages from vkCreateInstance itself
  // Synchronization validation is a feature of the same layer, enabled through VkValidationFeaturesEXT in the
  // instance's chain (not the messenger's: vkCreateDebugUtilsMessengerEXT takes no pNext).
  const VkValidationFeatureEnableEXT sync_feature = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT;
  auto features = make<VkValidationFeaturesEXT>(VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT);
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = &sync_feature;
  if (validation && options_.sync_validation) {
    features.pNext = &messenger_info;
    ci.pNext = &features;
  }
  check(vkCreateInstance(&ci, nullptr, &instance_), "vkCreateInstance");
  validation_ = validation;

  if (validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance_, "vkCreateDebugUtilsMessengerEXT"));
    if (!create) throw Error("vkCreateDebugUtilsMessengerEXT is missing although the extension is enabled");
    check(create(instance_, &messenger_info, nullptr, &messenger_), "vkCreateDebugUtilsMessengerEXT");
  }
}

void Context::choose_device(const std::string& selector) {
  uint32_t n = 0;
  check(vkEnumeratePhysicalDevices(instance_, &n, nullptr), "vkEnumeratePhysicalDevices");
  physical_devices_.resize(n);
  check(vkEnumeratePhysicalDevices(instance_, &n, physical_devices_.data()), "vkEnumeratePhysicalDevices");
  if (n == 0)
    throw Error(
        "no Vulkan device found (on a machine without a GPU install mesa-vulkan-drivers for lavapipe)");

  for (uint32_t i = 0; i < n; ++i) {
    VkPhysicalDeviceProperties p;
    vkGetPhysicalDeviceProperties(physical_devices_[i], &p);
    DeviceInfo d;
    d.index = i;
    d.name = p.deviceName;
    d.type = p.deviceType;
    d.api_version = p.apiVersion;
    d.vendor_id = p.vendorID;
    d.device_id = p.deviceID;
    std::copy(std::begin(p.pipelineCacheUUID), std::end(p.pipelineCacheUUID), d.pipeline_cache_uuid.begin());
    if (p.apiVersion >= VK_API_VERSION_1_2) {
      auto driver =
          make<VkPhysicalDeviceDriverProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES);
      auto p2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &driver);
      vkGetPhysicalDeviceProperties2(physical_devices_[i], &p2);
      d.driver = std::string(driver.driverName) + " " + driver.driverInfo;
    }
    devices_.push_back(std::move(d));
  }

  // Candidates in preference order; a selector filters them, it does not reorder them.
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return type_rank(devices_[a].type) < type_rank(devices_[b].type);
  });

  std::optional<uint32_t> chosen;
  if (selector.empty()) {
    for (uint32_t i : order)
      if (devices_[i].api_version >= VK_API_VERSION_1_2) {
        chosen = i;
        break;
      }
    if (!chosen) chosen = order[0];  // fails below with the 1.2 message, naming the device
  } else if (std::all_of(selector.begin(), selector.end(),
                         [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    const unsigned long idx = std::strtoul(selector.c_str(), nullptr, 10);
    if (idx >= n)
      throw Error("MGN_DEVICE/device index " + selector +
                  " is out of range; devices:" + device_list(devices_));
    chosen = static_cast<uint32_t>(idx);
  } else {
    const std::string want = lower(selector);
    for (uint32_t i : order)
      if (lower(devices_[i].name).find(want) != std::string::npos) {
        chosen = i;
        break;
      }
    if (!chosen)
      throw Error("no Vulkan device name contains '" + selector +
                  "' (MGN_DEVICE/device option); devices:" + device_list(devices_));
  }
  physical_ = physical_devices_[*chosen];
  info_ = devices_[*chosen];
}

void Context::create_device() {
  auto mark = [&](Feature f, bool v) { present_[static_cast<size_t>(f)] = v; };
  const bool is13 = info_.api_version >= VK_API_VERSION_1_3;
  mark(Feature::Vulkan12, info_.api_version >= VK_API_VERSION_1_2);

  uint32_t n = 0;
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n, nullptr);
  std::vector<VkExtensionProperties> exts(n);
  vkEnumerateDeviceExtensionProperties(physical_, nullptr, &n, exts.data());

  // Queue: any compute family; prefer one that can write timestamps.
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n, nullptr);
  std::vector<VkQueueFamilyProperties> families(n);
  vkGetPhysicalDeviceQueueFamilyProperties(physical_, &n, families.data());
  std::optional<uint32_t> family;
  for (uint32_t i = 0; i < n; ++i) {
    if (!(families[i].queueFlags & VK_QUEUE_COMPUTE_BIT)) continue;
    if (!family || (families[*family].timestampValidBits == 0 && families[i].timestampValidBits > 0))
      family = i;
  }
  mark(Feature::ComputeQueue, family.has_value());

  // Feature query chain. 1.3 structs may only be chained on 1.3 devices.
  auto f11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  auto f12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto f13 = make<VkPhysicalDeviceVulkan13Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
  auto coop_nv = make<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  CoopMatrixFeaturesKHR coop_khr{kCoopMatrixFeaturesKHRType, nullptr, VK_FALSE, VK_FALSE};
  auto f2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  const bool has_coop_nv_ext = has_extension(exts, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  coop_matrix_khr_driver_only_ = has_extension(exts, kCoopMatrixKHRExtension) && !kHeadersKnowCoopMatrixKHR;
  const bool has_coop_khr_ext = has_extension(exts, kCoopMatrixKHRExtension) && kHeadersKnowCoopMatrixKHR;
  const bool has_budget_ext = has_extension(exts, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  // Driver statistics per pipeline (registers, shared memory, ...): a diagnostic, so only on request.
  const bool has_stats_ext = has_extension(exts, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) &&
                             (options_.pipeline_statistics || !options_.pipeline_ir_dir.empty());
  auto stats_f = make<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  if (has(Feature::Vulkan12)) {
    void** tail = &f2.pNext;
    auto chain = [&tail](auto& s) {
      *tail = &s;
      tail = &s.pNext;
    };
    chain(f11);
    chain(f12);
    if (is13) chain(f13);
    if (has_coop_nv_ext) chain(coop_nv);
    if (has_coop_khr_ext) chain(coop_khr);
    if (has_stats_ext) chain(stats_f);
    vkGetPhysicalDeviceFeatures2(physical_, &f2);
  }

  // Properties chain.
  auto subgroup =
      make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto p13 =
      make<VkPhysicalDeviceVulkan13Properties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_PROPERTIES);
  auto p2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &subgroup);
  if (is13) subgroup.pNext = &p13;
  vkGetPhysicalDeviceProperties2(physical_, &p2);
  const VkPhysicalDeviceLimits& L = p2.properties.limits;

  mark(Feature::StorageBuffer16BitAccess, f11.storageBuffer16BitAccess);
  mark(Feature::ShaderFloat16, f12.shaderFloat16);
  mark(Feature::ShaderInt64, f2.features.shaderInt64);
  mark(Feature::SubgroupArithmetic, (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                                        (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT));
  mark(Feature::SubgroupSizeControl, is13 && f13.subgroupSizeControl && f13.computeFullSubgroups &&
                                         (p13.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT));
  mark(Feature::ScalarBlockLayout, f12.scalarBlockLayout);
  mark(Feature::Maintenance4, is13 && f13.maintenance4);
  mark(Feature::CooperativeMatrixKHR, has_coop_khr_ext && coop_khr.cooperativeMatrix);
  mark(Feature::CooperativeMatrixNV, has_coop_nv_ext && coop_nv.cooperativeMatrix);
  mark(Feature::Timestamps, family && families[*family].timestampValidBits > 0 && L.timestampPeriod > 0);
  mark(Feature::MemoryBudget, has_budget_ext);
  mark(Feature::PipelineStatistics, has_stats_ext && stats_f.pipelineExecutableInfo);

  for (const auto& row : kFeatureTable)
    if (row.required && !has(row.feature))
      throw Error("Vulkan device '" + info_.name + "' (Vulkan " + version_str(info_.api_version) +
                  ") lacks required feature '" + row.name + "': " + row.when_missing +
                  "; pick another device with MGN_DEVICE. Devices:" + device_list(devices_));

  // Limits.
  vkGetPhysicalDeviceMemoryProperties(physical_, &memory_properties_);
  auto m3 = make<VkPhysicalDeviceMaintenance3Properties>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
  auto p2b = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &m3);
  vkGetPhysicalDeviceProperties2(physical_, &p2b);
  limits_.subgroup_size = subgroup.subgroupSize;
  limits_.min_subgroup_size = has(Feature::SubgroupSizeControl) ? p13.minSubgroupSize : subgroup.subgroupSize;
  limits_.max_subgroup_size = has(Feature::SubgroupSizeControl) ? p13.maxSubgroupSize : subgroup.subgroupSize;
  limits_.max_shared_memory = L.maxComputeSharedMemorySize;
  for (int i = 0; i < 3; ++i) {
    limits_.max_workgroup_count[i] = L.maxComputeWorkGroupCount[i];
    limits_.max_workgroup_size[i] = L.maxComputeWorkGroupSize[i];
  }
  limits_.max_workgroup_invocations = L.maxComputeWorkGroupInvocations;
  limits_.max_push_constants_size = L.maxPushConstantsSize;
  limits_.max_storage_buffers_per_stage = L.maxPerStageDescriptorStorageBuffers;
  limits_.max_storage_buffer_range = L.maxStorageBufferRange;
  limits_.max_memory_allocation_size = m3.maxMemoryAllocationSize;
  limits_.max_buffer_size = is13 && p13.maxBufferSize ? p13.maxBufferSize : m3.maxMemoryAllocationSize;
  limits_.min_storage_buffer_offset_alignment = L.minStorageBufferOffsetAlignment;
  limits_.non_coherent_atom_size = L.nonCoherentAtomSize;
  limits_.timestamp_period_ns = L.timestampPeriod;
  limits_.timestamp_valid_bits = family ? families[*family].timestampValidBits : 0;
  bool host_visible_device_local = false;
  const VkMemoryPropertyFlags unified_flags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT |
                                              VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                              VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  for (uint32_t i = 0; i < memory_properties_.memoryTypeCount; ++i)
    if ((memory_properties_.memoryTypes[i].propertyFlags & unified_flags) == unified_flags)
      host_visible_device_local = true;
  // Discrete GPUs with resizable BAR also have such a type, but host reads through it cross PCIe uncached:
  // staging stays the faster path there.
  limits_.unified_memory =
      host_visible_device_local &&
      (info_.type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU || info_.type == VK_PHYSICAL_DEVICE_TYPE_CPU);

  // Enable exactly what the table found; everything else stays off so a kernel that needs more fails loudly.
  auto e11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  auto e12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto e13 = make<VkPhysicalDeviceVulkan13Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES);
  auto e_nv = make<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  CoopMatrixFeaturesKHR e_khr{kCoopMatrixFeaturesKHRType, nullptr, VK_FALSE, VK_FALSE};
  auto e2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  void** tail = &e2.pNext;
  auto chain = [&tail](auto& s) {
    *tail = &s;
    tail = &s.pNext;
  };
  chain(e11);
  chain(e12);
  e2.features.shaderInt64 = has(Feature::ShaderInt64);
  e2.features.shaderInt16 = f2.features.shaderInt16;  // f16 storage code paths pack through 16-bit ints
  e11.storageBuffer16BitAccess = has(Feature::StorageBuffer16BitAccess);
  e12.shaderFloat16 = has(Feature::ShaderFloat16);
  e12.scalarBlockLayout = has(Feature::ScalarBlockLayout);
  // Cooperative-matrix shaders declare the Vulkan memory model (GL_KHR_memory_scope_semantics).
  e12.vulkanMemoryModel = f12.vulkanMemoryModel;
  e12.vulkanMemoryModelDeviceScope = f12.vulkanMemoryModelDeviceScope;
  std::vector<const char*> enabled_exts;
  if (is13) {
    chain(e13);
    e13.subgroupSizeControl = has(Feature::SubgroupSizeControl);
    e13.computeFullSubgroups = has(Feature::SubgroupSizeControl);
    e13.maintenance4 = has(Feature::Maintenance4);
  }
  if (has(Feature::CooperativeMatrixNV)) {
    chain(e_nv);
    e_nv.cooperativeMatrix = VK_TRUE;
    enabled_exts.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  }
  if (has(Feature::CooperativeMatrixKHR)) {
    chain(e_khr);
    e_khr.cooperativeMatrix = VK_TRUE;
    enabled_exts.push_back(kCoopMatrixKHRExtension);
  }
  if (has(Feature::MemoryBudget)) enabled_exts.push_back(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  auto e_stats = make<VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR);
  if (has(Feature::PipelineStatistics)) {
    chain(e_stats);
    e_stats.pipelineExecutableInfo = VK_TRUE;
    enabled_exts.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }

  const float priority = 1.0f;
  auto qci = make<VkDeviceQueueCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO);
  qci.queueFamilyIndex = *family;
  qci.queueCount = 1;
  qci.pQueuePriorities = &priority;
  auto dci = make<VkDeviceCreateInfo>(VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &e2);
  dci.queueCreateInfoCount = 1;
  dci.pQueueCreateInfos = &qci;
  dci.enabledExtensionCount = static_cast<uint32_t>(enabled_exts.size());
  dci.ppEnabledExtensionNames = enabled_exts.data();
  check(vkCreateDevice(physical_, &dci, nullptr, &device_), "vkCreateDevice");
  queue_family_ = *family;
  vkGetDeviceQueue(device_, queue_family_, 0, &queue_);
}

std::string Context::feature_report() const {
  std::ostringstream s;
  s << "device " << info_.index << ": " << info_.name << " (" << device_type_name(info_.type) << ", Vulkan "
    << version_str(info_.api_version) << ", " << info_.driver << ")\n";
  for (const auto& row : kFeatureTable) {
    s << "  " << (has(row.feature) ? "[x] " : "[ ] ") << row.name << (row.required ? " (required)" : "");
    if (!has(row.feature)) s << ": " << row.when_missing;
    if (row.feature == Feature::CooperativeMatrixKHR && coop_matrix_khr_driver_only_)
      s << " [the driver has it; this build's Vulkan headers predate it]";
    s << "\n";
  }
  s << "  subgroup " << limits_.subgroup_size << " (" << limits_.min_subgroup_size << ".."
    << limits_.max_subgroup_size << "), shared memory " << limits_.max_shared_memory << " B, storage range "
    << limits_.max_storage_buffer_range << " B, max allocation " << limits_.max_memory_allocation_size
    << " B, " << (limits_.unified_memory ? "unified memory" : "discrete memory (staging)") << "\n";
  return s.str();
}

std::vector<HeapBudget> Context::heap_budgets() const {
  auto budget = make<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
  auto mp2 = make<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
  const bool ext = has(Feature::MemoryBudget);
  if (ext) {
    mp2.pNext = &budget;
    vkGetPhysicalDeviceMemoryProperties2(physical_, &mp2);
  }
  std::vector<HeapBudget> r;
  for (uint32_t h = 0; h < memory_properties_.memoryHeapCount; ++h) {
    HeapBudget b;
    b.size = memory_properties_.memoryHeaps[h].size;
    b.device_local = (memory_properties_.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0;
    if (ext) {
      b.budget = budget.heapBudget[h];
      b.usage = budget.heapUsage[h];
    }
    r.push_back(b);
  }
  return r;
}

void Context::submit(const VkSubmitInfo& info, VkFence fence, VkResult injected) {
  require_device("vkQueueSubmit");
  VkResult r = injected;
  if (r == VK_SUCCESS) {
    std::lock_guard lock(queue_mutex_);
    r = vkQueueSubmit(queue_, 1, &info, fence);
  }
  check(r, "vkQueueSubmit");
}

void Context::wait(VkFence fence, const char* what, VkResult injected) {
  const VkResult r =
      injected != VK_SUCCESS ? injected : vkWaitForFences(device_, 1, &fence, VK_TRUE, UINT64_MAX);
  check(r, what);
}

void Context::check(VkResult r, const char* what) {
  if (r != VK_ERROR_DEVICE_LOST) return vk::check(r, what);
  {
    std::lock_guard lock(lost_mutex_);
    if (!lost_.load(std::memory_order_relaxed)) {
      lost_during_ = what;
      lost_.store(true, std::memory_order_release);
    }
  }
  throw DeviceLost(lost_message(what));
}

std::string Context::lost_message(const std::string& during) const {
  return "vulkan device '" + info_.name + "' lost (VK_ERROR_DEVICE_LOST) during " + during +
         "; this session cannot run again: compile a new session (it opens the device anew)";
}

std::string Context::lost_during() const {
  std::lock_guard lock(lost_mutex_);
  return lost_during_;
}

void Context::throw_refused(const char* what) const {
  throw DeviceLost(std::string(what) + " refused: " + lost_message(lost_during() + " earlier"));
}

void Context::drain() {
  std::lock_guard lock(queue_mutex_);
  (void)vkQueueWaitIdle(queue_);
}

size_t Context::validation_message_count() const {
  std::lock_guard lock(messages_mutex_);
  return messages_.size();
}

std::vector<std::string> Context::validation_messages() const {
  std::lock_guard lock(messages_mutex_);
  return messages_;
}

void Context::clear_validation_messages() {
  std::lock_guard lock(messages_mutex_);
  messages_.clear();
}

CoopMatVerdict Context::memo_verdict(const std::string& key, const std::function<CoopMatVerdict()>& compute) {
  std::lock_guard lock(verdict_mutex_);
  auto it = verdicts_.find(key);
  if (it == verdicts_.end()) it = verdicts_.emplace(key, compute()).first;
  return it->second;
}

}  // namespace mgn::vk
