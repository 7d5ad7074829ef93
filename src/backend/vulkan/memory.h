// Sub-allocator over a few large VkDeviceMemory blocks; a Buffer is a (VkBuffer, offset, size) view of one.
// Device memory is allocated at session build time, so a training step never fails for lack of it; the
// host-visible staging of uploads and readbacks (Transfer) on first use.
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"

namespace mgn::vk {

enum class MemoryKind : uint8_t {
  Device,    // kernels read and write it; host-mapped too on unified-memory devices
  Upload,    // host-visible staging the host writes and the GPU copies from
  Readback,  // host-visible (cached where possible) staging the GPU copies into
  kCount
};
const char* memory_kind_name(MemoryKind k);

struct Buffer {
  VkBuffer buffer = VK_NULL_HANDLE;  // the block's buffer; shared by every view in the block
  VkDeviceSize offset = 0;           // aligned to minStorageBufferOffsetAlignment (and at least 16)
  VkDeviceSize size = 0;             // as asked; the descriptor range
  std::byte* mapped = nullptr;       // host address of `offset`, or null for device-only memory
  MemoryKind kind = MemoryKind::Device;
  uint32_t block = 0;
  explicit operator bool() const { return buffer != VK_NULL_HANDLE; }
};

struct AllocatorOptions {
  VkDeviceSize device_block_size = VkDeviceSize(256) << 20;  // clamped to the device's allocation limits
  // Staging (Upload, Readback) blocks are sized to their one buffer: Transfer allocates its staging lazily,
  // as large as the biggest copy so far needs (at most its chunk), so that a session that moves little
  // pins little host-visible memory (pinning 2 x 64 MiB up front cost ~40 ms per session on an H100).
  // Cap on device-kind memory reserved, 0 for none: to share a GPU, or to test the out-of-memory path.
  VkDeviceSize device_limit = 0;
  // Treat a unified-memory device like a discrete GPU (device memory unmapped, staging copies): lets the
  // staging path be tested on lavapipe.
  bool force_staging = false;
};

struct MemoryStats {
  std::array<VkDeviceSize, size_t(MemoryKind::kCount)> reserved{};  // bytes in VkDeviceMemory blocks
  std::array<VkDeviceSize, size_t(MemoryKind::kCount)> used{};      // bytes handed out (after alignment)
  std::array<size_t, size_t(MemoryKind::kCount)> blocks{};
};

// Thread-safe. Must be destroyed before its Context; every Buffer dies with it.
class Allocator {
 public:
  // faults (testing, may be null): the session's injected allocation failures; it must outlive the allocator.
  explicit Allocator(Context& ctx, const AllocatorOptions& options = {}, FaultPoints* faults = nullptr);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // `what` names the tensor or purpose in the out-of-memory message. Throws mgn::Error when the size
  // exceeds what one kernel binding can address or the device has no room.
  Buffer allocate(VkDeviceSize size, MemoryKind kind, const std::string& what = {});
  void free(Buffer& buffer);  // resets `buffer`; freeing an empty Buffer is a no-op

  // Device memory is host-mapped: inputs and outputs need no staging copies.
  bool unified() const { return ctx_.limits().unified_memory && !options_.force_staging; }
  VkDeviceSize alignment() const { return alignment_; }
  // The largest single allocation: maxStorageBufferRange, capped by the allocation and buffer limits.
  VkDeviceSize max_allocation() const { return max_allocation_; }
  MemoryStats stats() const;
  void trim();  // releases blocks with nothing allocated in them

 private:
  struct Block {
    VkDeviceMemory memory = VK_NULL_HANDLE;
    VkBuffer buffer = VK_NULL_HANDLE;
    VkDeviceSize size = 0;
    VkDeviceSize used = 0;
    MemoryKind kind = MemoryKind::Device;
    uint32_t memory_type = 0;
    std::byte* mapped = nullptr;
    std::map<VkDeviceSize, VkDeviceSize> free;  // offset → size, coalesced
  };
  uint32_t create_block(VkDeviceSize size, MemoryKind kind, const std::string& what, VkDeviceSize asked);
  void destroy_block(Block& b);
  uint32_t pick_memory_type(uint32_t type_bits, MemoryKind kind) const;
  [[noreturn]] void out_of_memory(VkDeviceSize asked, MemoryKind kind, const std::string& what,
                                  const std::string& reason) const;

  Context& ctx_;
  AllocatorOptions options_;
  FaultPoints* faults_ = nullptr;
  VkDeviceSize alignment_ = 16;
  VkDeviceSize max_allocation_ = 0;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Block>> blocks_;  // null where trimmed, so Buffer::block stays valid
};

}  // namespace mgn::vk
