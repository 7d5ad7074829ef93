// The backend seam of a Session: an Engine runs one compiled graph (inputs in, outputs and named state out).
// The CPU engine wraps cpu::Executor; a GPU engine wraps vk::GraphExecutor, which has the same shape.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "mgn/session.h"

namespace mgn::detail {

// What CompileOptions passes to an engine besides the graph.
struct EngineOptions {
  int submissions = 1;
  std::function<void(int)> between_submissions;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  // The kind of device the engine runs on: "host" (the CPU reference executor), or the Vulkan device type
  // ("discrete GPU", "integrated GPU", "virtual GPU", "CPU" for a software implementation such as lavapipe).
  virtual const char* device_type() const { return "host"; }
  // Values are row-major and already count-checked by the Session.
  virtual void set_input(const std::string& name, const std::vector<float>& values) = 0;
  virtual void set_input(const std::string& name, const std::vector<int32_t>& values) = 0;
  // One step: evaluates the outputs and every assign, then commits the assigns.
  virtual void run() = 0;
  virtual std::vector<float> read_output(const std::string& name) = 0;
  // Parameters and state (optimizer moments, the step counter, running statistics).
  virtual std::vector<float> read_state(const std::string& name) = 0;
  virtual void write_state(const std::string& name, const std::vector<float>& values) = 0;
  virtual std::vector<std::string> state_names() const = 0;
  // (kernel name, GLSL source) of every dispatch, in order; empty for engines without generated kernels.
  virtual std::vector<std::pair<std::string, std::string>> kernel_sources() const { return {}; }
  virtual DeviceMemoryReport device_memory() const { return {}; }
};

// Takes ownership of the graph (engines keep references into it).
std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ir::Graph> graph);

#ifdef MGN_HAVE_VULKAN
// The built-in Vulkan engine (src/api/engine_vulkan.cpp); it is the default factory below.
std::unique_ptr<Engine> make_vulkan_engine(std::shared_ptr<const ir::Graph> graph, const EngineOptions& options);
#endif

// A GPU backend plugs in here (e.g. from a static initializer in its own engine file, referenced by the
// tool); without one, Backend::Vulkan is a clear error and Backend::Auto picks the CPU.
using EngineFactory =
    std::function<std::unique_ptr<Engine>(std::shared_ptr<const ir::Graph>, const EngineOptions&)>;
void register_vulkan_engine(EngineFactory factory);
const EngineFactory* vulkan_engine_factory();  // nullptr when none is registered

}  // namespace mgn::detail
