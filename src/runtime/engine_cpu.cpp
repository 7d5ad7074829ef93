// The CPU engine: the reference executor behind the Session interface, rounding like a real f32 backend,
// running from the static plan (one arena, tensors at their planned offsets, as the Vulkan engine does), so a
// session's memory on the CPU is the planned figure too.
#include <unistd.h>

#include <string>

#include "backend/cpu/executor.h"
#include "runtime/engine.h"

namespace mgn::detail {

plan::PlanOptions plan_options(const PlanningOptions& planning) {
  plan::PlanOptions po;
  po.reuse = planning.reuse;
  po.in_place = po.in_place_assign = planning.in_place;
  if (planning.memory_limit_bytes) {
    po.available_bytes = planning.memory_limit_bytes;
    po.available_what = "PlanningOptions::memory_limit_bytes";
  }
  return po;
}

void limit_to(plan::PlanOptions& po, uint64_t bytes, const std::string& what) {
  if (bytes >= po.available_bytes) return;
  po.available_bytes = bytes;
  po.available_what = what;
}

namespace {

// The host's physical memory: a CPU plan larger than it could only end in the kernel's OOM killer.
uint64_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : UINT64_MAX;
}

plan::PlanOptions cpu_plan_options(const PlanningOptions& planning) {
  plan::PlanOptions po = plan_options(planning);
  limit_to(po, host_memory_bytes(), "the host's physical memory");
  return po;
}

}  // namespace

namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<const ir::Graph> g, const CompileOptions& options)
      : graph_(std::move(g)), exec_(*graph_, {.plan = cpu_plan_options(options.planning)}) {}

  const char* name() const override { return "cpu"; }
  void set_input(const std::string& name, std::span<const float> values) override {
    exec_.set_input(name, std::vector<float>(values.begin(), values.end()));
  }
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
  void write_state(const std::string& name, std::span<const float> values) override {
    exec_.set_state(name, std::vector<double>(values.begin(), values.end()));
  }
  std::vector<std::string> state_names() const override { return exec_.state_names(); }
  DeviceMemoryReport device_memory() const override {
    DeviceMemoryReport r;
    r.arena_bytes = exec_.plan().arena_bytes;
    return r;
  }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  cpu::Executor exec_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<const ir::Graph> graph, const CompileOptions& options) {
  return std::make_unique<CpuEngine>(std::move(graph), options);
}

}  // namespace mgn::detail
