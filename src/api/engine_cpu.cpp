// The CPU engine: the reference executor behind the Session interface, rounding like a real f32 backend,
// running from the static plan (one arena, tensors at their planned offsets, as the Vulkan engine does),
// so a session's memory on the CPU is the planned figure too. MGN_PLAN=0 runs it unplanned.
#include <cstdlib>
#include <string>

#include "api/engine.h"
#include "backend/cpu/executor.h"

namespace mgn::detail {

namespace {

cpu::ExecutorOptions options() {
  cpu::ExecutorOptions o;
  const char* env = std::getenv("MGN_PLAN");
  if (!(env && std::string(env) == "0")) o.plan = plan::PlanOptions{};
  return o;
}

class CpuEngine final : public Engine {
 public:
  explicit CpuEngine(std::shared_ptr<const ir::Graph> g) : graph_(std::move(g)), exec_(*graph_, options()) {}

  const char* name() const override { return "cpu"; }
  void set_input(const std::string& name, const std::vector<float>& values) override { exec_.set_input(name, values); }
  void set_input(const std::string& name, const std::vector<int32_t>& values) override {
    exec_.set_input(name, values);
  }
  void run() override { exec_.run(); }
  std::vector<float> read_output(const std::string& name) override {
    const cpu::Buffer& b = exec_.output(name);
    return std::vector<float>(b.v.begin(), b.v.end());
  }
  std::vector<float> read_state(const std::string& name) override {
    const std::vector<double>& v = exec_.state(name);
    return std::vector<float>(v.begin(), v.end());
  }
  void write_state(const std::string& name, const std::vector<float>& values) override {
    exec_.set_state(name, std::vector<double>(values.begin(), values.end()));
  }
  std::vector<std::string> state_names() const override { return exec_.state_names(); }
  DeviceMemoryReport device_memory() const override {
    DeviceMemoryReport r;
    if (const plan::Plan* p = exec_.plan()) r.arena_bytes = p->arena_bytes;
    return r;
  }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  cpu::Executor exec_;
};

EngineFactory& vulkan_slot() {
#ifdef MGN_HAVE_VULKAN
  static EngineFactory f = make_vulkan_engine;
#else
  static EngineFactory f;
#endif
  return f;
}

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ir::Graph> graph) {
  return std::make_unique<CpuEngine>(std::move(graph));
}

void register_vulkan_engine(EngineFactory factory) { vulkan_slot() = std::move(factory); }

const EngineFactory* vulkan_engine_factory() { return vulkan_slot() ? &vulkan_slot() : nullptr; }

}  // namespace mgn::detail
