// The Vulkan devices this process can see, and what meganeura makes of the one a DeviceOptions selects:
// its features and limits as the code generator uses them, and the verdict of the f16 cooperative-matrix
// GEMM's self-test on it.
//
//   for (const mgn::DeviceDescription& d : mgn::list_devices()) std::puts(d.name.c_str());
//   std::puts(mgn::describe_device({}).f16_gemm.c_str());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mgn/options.h"

namespace mgn {

struct DeviceDescription {
  uint32_t index = 0;  // as DeviceOptions::device counts
  std::string name;
  std::string type;         // "discrete GPU", "integrated GPU", "virtual GPU", "CPU" or "other"
  std::string api_version;  // "1.3.255"
  std::string driver;       // driver name and version
  // Filled by describe_device only:
  std::string features;  // one line per feature meganeura cares about: present, or what it does without it
  uint32_t subgroup_size = 0;
  uint32_t max_shared_bytes = 0;
  // The f16 cooperative-matrix GEMM self-test: what passed, or why the path is off on this device.
  std::string f16_gemm;
  bool f16_gemm_verified = false;
};

// Every device the Vulkan loader reports, in its order; throws mgn::Error when there is no Vulkan loader or
// no device (the message says why). Empty in a build without the Vulkan backend.
std::vector<DeviceDescription> list_devices();

// The device `device` selects (as sessions would open it), with the self-test verdict for
// `kernels.f16_tile` (run now if no session has run it yet). Throws mgn::Error without a usable device.
DeviceDescription describe_device(const DeviceOptions& device, const KernelOptions& kernels = {});

}  // namespace mgn
