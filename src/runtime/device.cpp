// list_devices / describe_device (include/mgn/device.h): the shared device of a DeviceOptions, as the
// Vulkan engine opens it, described.
#include "mgn/device.h"

#include "mgn/types.h"

#ifdef MGN_HAVE_VULKAN
#include "backend/vulkan/context.h"
#include "backend/vulkan/gemm_selftest.h"
#include "codegen/shader_compiler.h"
#include "runtime/engine.h"
#endif

namespace mgn {

#ifdef MGN_HAVE_VULKAN
namespace {

DeviceDescription describe(const vk::DeviceInfo& d) {
  DeviceDescription r;
  r.index = d.index;
  r.name = d.name;
  r.type = vk::device_type_name(d.type);
  r.api_version = std::to_string(VK_API_VERSION_MAJOR(d.api_version)) + "." +
                  std::to_string(VK_API_VERSION_MINOR(d.api_version)) + "." +
                  std::to_string(VK_API_VERSION_PATCH(d.api_version));
  r.driver = d.driver;
  return r;
}

}  // namespace

std::vector<DeviceDescription> list_devices() {
  std::vector<DeviceDescription> r;
  for (const vk::DeviceInfo& d : detail::shared_context({})->devices()) r.push_back(describe(d));
  return r;
}

DeviceDescription describe_device(const DeviceOptions& device, const KernelOptions& kernels) {
  const std::shared_ptr<vk::Context> shared = detail::shared_context(device);
  vk::Context& ctx = *shared;
  DeviceDescription r = describe(ctx.info());
  r.features = ctx.feature_report();
  r.subgroup_size = ctx.limits().subgroup_size;
  r.max_shared_bytes = ctx.limits().max_shared_memory;
  codegen::ShaderCompiler compiler("");
  const vk::CoopMatVerdict v = vk::coopmat_verdict(ctx, kernels.f16_tile, compiler);
  r.f16_gemm = v.note;
  r.f16_gemm_verified = v.verified;
  return r;
}
#else
std::vector<DeviceDescription> list_devices() { return {}; }

DeviceDescription describe_device(const DeviceOptions&, const KernelOptions&) {
  throw Error("describe_device: this build has no Vulkan backend");
}
#endif

}  // namespace mgn
