// The Vulkan engine: vk::GraphExecutor behind the Session interface. One process-wide Context (device
// choice: MGN_DEVICE, else discrete > integrated > CPU) is shared by every session.
#ifdef MGN_HAVE_VULKAN
#include <mutex>

#include "api/engine.h"
#include "backend/vulkan/graph_executor.h"

namespace mgn::detail {

namespace {

// Deliberately never destroyed: tearing the device down from a static destructor runs after the NVIDIA
// driver's own exit handlers and crashes at process exit (seen on the H200); sessions own everything else.
vk::Context& shared_context() {
  static std::mutex m;
  static vk::Context* ctx = nullptr;
  std::lock_guard<std::mutex> lock(m);
  if (!ctx) ctx = new vk::Context();
  return *ctx;
}

// Fails the step if the validation layer (when on) reported anything: a silent layer is part of the contract.
void check_validation(vk::Context& ctx, const char* where) {
  if (!ctx.validation_enabled() || ctx.validation_message_count() == 0) return;
  std::string all;
  for (const std::string& m : ctx.validation_messages()) all += "\n  " + m;
  ctx.clear_validation_messages();
  throw Error(std::string("vulkan engine: validation layer reported during ") + where + ":" + all);
}

class VulkanEngine final : public Engine {
 public:
  explicit VulkanEngine(std::shared_ptr<const ir::Graph> g)
      : graph_(std::move(g)), ctx_(shared_context()), exec_(*graph_, ctx_) {
    check_validation(ctx_, "compile");
    name_ = "vulkan (" + ctx_.info().name + ")";
  }
  const char* name() const override { return name_.c_str(); }
  void set_input(const std::string& name, const std::vector<float>& values) override { exec_.set_input(name, values); }
  void set_input(const std::string& name, const std::vector<int32_t>& values) override {
    exec_.set_input(name, values);
  }
  void run() override {
    exec_.run();
    check_validation(ctx_, "run");
  }
  std::vector<float> read_output(const std::string& name) override { return exec_.read_output(name); }
  std::vector<float> read_state(const std::string& name) override { return exec_.read_state(name); }
  void write_state(const std::string& name, const std::vector<float>& values) override {
    exec_.write_state(name, values);
  }
  std::vector<std::string> state_names() const override { return exec_.state_names(); }

 private:
  std::shared_ptr<const ir::Graph> graph_;
  vk::Context& ctx_;
  vk::GraphExecutor exec_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Engine> make_vulkan_engine(std::shared_ptr<const ir::Graph> graph) {
  return std::make_unique<VulkanEngine>(std::move(graph));
}

}  // namespace mgn::detail
#endif
