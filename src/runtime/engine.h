// The backend seam of a Session: an Engine runs one compiled graph (inputs in, outputs and named state out).
// The CPU engine wraps cpu::Executor; the Vulkan engine wraps vk::GraphExecutor, which has the same shape.
// Both run the graph from its static plan.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "plan/plan.h"
#include "mgn/session.h"

#ifdef MGN_HAVE_VULKAN
namespace mgn::vk {
class Context;
}
#endif

namespace mgn::detail {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  // The kind of device the engine runs on: "host" (the CPU reference executor), or the Vulkan device type
  // ("discrete GPU", "integrated GPU", "virtual GPU", "CPU" for a software implementation such as lavapipe).
  virtual const char* device_type() const { return "host"; }
  // Values are row-major and already count-checked by the Session.
  virtual void set_input(const std::string& name, std::span<const float> values) = 0;
  virtual void set_input(const std::string& name, const std::vector<int32_t>& values) = 0;
  // One step: evaluates the outputs and every assign, then commits the assigns.
  virtual void run() = 0;
  virtual std::vector<float> read_output(const std::string& name) = 0;
  // Parameters and state (optimizer moments, the step counter, running statistics).
  virtual std::vector<float> read_state(const std::string& name) = 0;
  virtual void write_state(const std::string& name, std::span<const float> values) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  // (kernel name, GLSL source) of every dispatch, in order; empty for engines without generated kernels.
  virtual std::vector<std::pair<std::string, std::string>> kernel_sources() const { return {}; }
  virtual DeviceMemoryReport device_memory() const { return {}; }
  virtual std::vector<KernelProfile> kernel_profile() const { return {}; }
  // The engine's compile phases (the Session adds the graph passes and the total).
  virtual CompileReport compile_report() const { return {}; }
};

// Both take ownership of the graph (engines keep references into it) and read only the options.
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ir::Graph> graph, const CompileOptions& options);
#ifdef MGN_HAVE_VULKAN
std::unique_ptr<Engine> make_vulkan_engine(std::shared_ptr<const ir::Graph> graph, const CompileOptions& options);
#endif

#ifdef MGN_HAVE_VULKAN
// The process's device for `options`: sessions (and describe_device) with equal DeviceOptions share one. A
// lost one (VK_ERROR_DEVICE_LOST) is replaced by a new Context here; its sessions keep the old one alive.
std::shared_ptr<vk::Context> shared_context(const DeviceOptions& options);
#endif

// The static plan's memory options as CompileOptions::planning asks.
plan::PlanOptions plan_options(const PlanningOptions& planning);
// Lowers the plan's available bytes to `bytes` (naming `what` as the limit) when that is smaller.
void limit_to(plan::PlanOptions& po, uint64_t bytes, const std::string& what);

}  // namespace mgn::detail
