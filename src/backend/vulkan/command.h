// The recorded command stream (a fixed dispatch list grouped at barriers, recorded once, resubmitted every
// step) and synchronous host<->device transfers through persistent staging buffers.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/memory.h"
#include "backend/vulkan/pipeline.h"

namespace mgn::vk {

struct DispatchTiming {
  std::string label;
  double ms = 0;  // GPU time from the dispatch's start to its end; dispatches of one group may overlap
};

// Build with dispatch()/copy()/barrier(), then submit() as often as needed. Commands between two barriers
// form a group the GPU may run concurrently, so a barrier must separate a writer from its readers.
// Push constants and bindings are fixed at record time; per-step values live in buffers.
class CommandStream {
 public:
  // timestamps: write a query around every dispatch; ignored (timings() throws) where unsupported.
  // faults (testing, may be null): the session's injected failures of submissions and waits; it must outlive
  // the stream.
  explicit CommandStream(Context& ctx, bool timestamps = false, FaultPoints* faults = nullptr);
  ~CommandStream();
  CommandStream(const CommandStream&) = delete;
  CommandStream& operator=(const CommandStream&) = delete;

  void dispatch(const Pipeline& pipeline, const std::vector<Buffer>& bindings, std::array<uint32_t, 3> groups,
                const void* push = nullptr, uint32_t push_bytes = 0, std::string label = {});
  template <class PushConstants>
  void dispatch(const Pipeline& pipeline, const std::vector<Buffer>& bindings, std::array<uint32_t, 3> groups,
                const PushConstants& push, std::string label = {}) {
    dispatch(pipeline, bindings, groups, &push, uint32_t(sizeof(PushConstants)), std::move(label));
  }
  // bytes = 0 copies min(src.size, dst.size).
  void copy(const Buffer& src, const Buffer& dst, VkDeviceSize bytes = 0);
  void barrier();  // everything before is complete and visible to everything after
  // Ends the current submission: what follows is recorded into the next command buffer, submitted by its
  // own vkQueueSubmit after the previous one (same queue, so a barrier at the start of each later buffer
  // orders it after everything before). Lets a caller that shares the queue (a renderer) submit its own
  // work between the pieces of a step. A split at the start or right after another split does nothing.
  void split();
  // Called on the host after submission i (0-based) of a step is queued and before submission i + 1 is;
  // never after the last. Set before or after record().
  void set_between_submissions(std::function<void(int)> hook) { between_ = std::move(hook); }

  // Allocates descriptor sets and records the command buffer; implied by the first submit().
  void record();
  void submit();        // submit_async() + wait()
  void submit_async();  // waits for the previous submission first: one in flight at a time
  void wait();

  size_t dispatch_count() const { return n_dispatches_; }
  size_t barrier_count() const { return n_barriers_; }
  size_t submission_count() const { return n_splits_ + 1; }  // vkQueueSubmit calls per step
  bool recorded() const { return !cmds_.empty(); }
  // False where the device lacks timestamp queries (Feature::Timestamps) or they were not requested.
  bool timestamps_enabled() const { return timestamps_; }
  // Per dispatch, of the last completed submission. Throws mgn::Error if timestamps are not enabled.
  std::vector<DispatchTiming> timings() const;
  double total_ms() const;  // whole stream, same conditions as timings()

 private:
  struct Command {
    enum class Kind : uint8_t { Dispatch, Copy, Barrier, Split };
    explicit Command(Kind k) : kind(k) {}
    Kind kind;
    const Pipeline* pipeline = nullptr;
    std::vector<Buffer> bindings;
    std::array<uint32_t, 3> groups{};
    std::vector<uint8_t> push;
    std::string label;
    Buffer src, dst;
    VkDeviceSize bytes = 0;
    uint32_t query = 0;  // first of two timestamps
  };
  void require_not_recorded(const char* what) const;
  std::vector<uint64_t> read_queries() const;

  Context& ctx_;
  FaultPoints* faults_ = nullptr;
  bool timestamps_requested_ = false;
  bool timestamps_ = false;
  std::vector<Command> commands_;
  size_t n_dispatches_ = 0, n_barriers_ = 0, n_splits_ = 0;
  std::function<void(int)> between_;
  uint32_t n_queries_ = 0;

  VkCommandPool pool_ = VK_NULL_HANDLE;
  std::vector<VkCommandBuffer> cmds_;  // one per submission
  VkDescriptorPool descriptor_pool_ = VK_NULL_HANDLE;
  VkQueryPool query_pool_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
  bool in_flight_ = false;
  bool completed_once_ = false;
};

// Synchronous uploads/downloads for setup and tests (parameters, checkpoints). Direct memcpy on unified
// memory; elsewhere chunked through one staging buffer per direction, allocated on first use as large as
// the copy needs (at least 1 MiB, a power of two, at most `staging_bytes`) and grown when a larger copy
// comes.
class Transfer {
 public:
  Transfer(Context& ctx, Allocator& allocator, VkDeviceSize staging_bytes = VkDeviceSize(64) << 20);
  ~Transfer();
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // The GPU must not be using `dst`/`src` meanwhile (submit streams with submit(), or wait() first).
  void upload(const Buffer& dst, const void* src, VkDeviceSize bytes, VkDeviceSize dst_offset = 0);
  void download(const Buffer& src, void* dst, VkDeviceSize bytes, VkDeviceSize src_offset = 0);
  void fill_zero(const Buffer& dst);

 private:
  // Records `body` between full barriers into a one-time command buffer, submits it and waits.
  void run(const std::function<void(VkCommandBuffer)>& body);
  // `b` (upload_ or readback_) holding at least min(bytes, chunk_) bytes.
  const Buffer& staging(Buffer& b, MemoryKind kind, VkDeviceSize bytes);
  Context& ctx_;
  Allocator& allocator_;
  VkDeviceSize chunk_ = 0;
  Buffer upload_, readback_;
  VkCommandPool pool_ = VK_NULL_HANDLE;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  VkFence fence_ = VK_NULL_HANDLE;
};

}  // namespace mgn::vk
