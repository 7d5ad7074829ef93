// Block sub-allocation (best fit over coalesced free ranges) and memory-type choice per kind and device.
#include "backend/vulkan/memory.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdio>
#include <sstream>

#include "mgn/types.h"

namespace mgn::vk {
namespace {

VkDeviceSize align_up(VkDeviceSize v, VkDeviceSize a) {
  return (v + a - 1) / a * a;
}

std::string mib(VkDeviceSize bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

}  // namespace

const char* memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::Device:
      return "device";
    case MemoryKind::Upload:
      return "upload staging";
    case MemoryKind::Readback:
      return "readback staging";
    case MemoryKind::kCount:
      break;
  }
  return "?";
}

Allocator::Allocator(Context& ctx, const AllocatorOptions& options, FaultPoints* faults)
    : ctx_(ctx), options_(options), faults_(faults) {
  const DeviceLimits& L = ctx.limits();
  // 16 at least so vec4 loads at a view's start stay aligned whatever the device minimum is.
  alignment_ = std::max<VkDeviceSize>({16, L.min_storage_buffer_offset_alignment, L.non_coherent_atom_size});
  assert(std::has_single_bit(alignment_));
  max_allocation_ = std::min({L.max_storage_buffer_range, L.max_memory_allocation_size, L.max_buffer_size});
  max_allocation_ = max_allocation_ / alignment_ * alignment_;
}

Allocator::~Allocator() {
  for (auto& b : blocks_)
    if (b) destroy_block(*b);
}

void Allocator::destroy_block(Block& b) {
  VkDevice dev = ctx_.device();
  if (b.mapped) vkUnmapMemory(dev, b.memory);
  if (b.buffer) vkDestroyBuffer(dev, b.buffer, nullptr);
  if (b.memory) vkFreeMemory(dev, b.memory, nullptr);
  b = Block{};
}

uint32_t Allocator::pick_memory_type(uint32_t type_bits, MemoryKind kind) const {
  using F = VkMemoryPropertyFlags;
  constexpr F kLocal = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, kHost = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT,
              kCoherent = VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, kCached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  // Host-visible kinds require coherent memory (every implementation has some) so no flush is ever needed.
  F required = 0, preferred = 0, avoided = 0;
  switch (kind) {
    case MemoryKind::Device:
      if (unified()) {
        required = kLocal | kHost | kCoherent;
        preferred = kCached;  // host reads outputs directly from it
      } else {
        required = kLocal;
        avoided = kHost;  // keep the small BAR heap for what needs it
      }
      break;
    case MemoryKind::Upload:
      required = kHost | kCoherent;
      if (!unified()) avoided = kLocal | kCached;  // plain write-combined system memory
      break;
    case MemoryKind::Readback:
      required = kHost | kCoherent;
      preferred = kCached;
      if (!unified()) avoided = kLocal;
      break;
    case MemoryKind::kCount:
      break;
  }
  const auto& mp = ctx_.memory_properties();
  int best = -1, best_score = 0;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    const F flags = mp.memoryTypes[i].propertyFlags;
    if (!(type_bits & (1u << i)) || (flags & required) != required) continue;
    const int score = 2 * std::popcount(flags & preferred) - std::popcount(flags & avoided);
    if (best < 0 || score > best_score) best = int(i), best_score = score;
  }
  if (best < 0)
    throw Error(std::string("device '") + ctx_.info().name + "' has no memory type for " +
                memory_kind_name(kind) + " buffers");
  return uint32_t(best);
}

void Allocator::out_of_memory(VkDeviceSize asked, MemoryKind kind, const std::string& what,
                              const std::string& reason) const {
  // Caller holds mutex_.
  std::ostringstream e;
  e << "out of GPU memory: asked for " << asked << " bytes (" << mib(asked) << ") of "
    << memory_kind_name(kind) << " memory" << (what.empty() ? "" : " for '" + what + "'") << " on '"
    << ctx_.info().name << "': " << reason;
  VkDeviceSize free_total = 0, largest = 0, reserved = 0;
  size_t n_blocks = 0;
  for (const auto& b : blocks_) {
    if (!b || b->kind != kind) continue;
    ++n_blocks;
    reserved += b->size;
    for (const auto& [off, size] : b->free) free_total += size, largest = std::max(largest, size);
  }
  e << ". Free: " << free_total << " bytes (" << mib(free_total) << ") in " << n_blocks
    << " blocks, largest free range " << mib(largest) << ", reserved " << mib(reserved);
  if (kind == MemoryKind::Device && options_.device_limit)
    e << ", limit " << mib(options_.device_limit) << " (AllocatorOptions::device_limit)";

  const auto& mp = ctx_.memory_properties();
  auto budget = make<VkPhysicalDeviceMemoryBudgetPropertiesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT);
  auto mp2 = make<VkPhysicalDeviceMemoryProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2);
  const bool has_budget = ctx_.has(Feature::MemoryBudget);
  if (has_budget) {
    mp2.pNext = &budget;
    vkGetPhysicalDeviceMemoryProperties2(ctx_.physical_device(), &mp2);
  }
  for (uint32_t h = 0; h < mp.memoryHeapCount; ++h) {
    e << "; heap " << h
      << (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT ? " (device-local)" : "") << ": size "
      << mib(mp.memoryHeaps[h].size);
    if (has_budget)
      e << ", budget " << mib(budget.heapBudget[h]) << ", in use " << mib(budget.heapUsage[h]) << ", free "
        << mib(budget.heapBudget[h] > budget.heapUsage[h] ? budget.heapBudget[h] - budget.heapUsage[h] : 0);
  }
  throw Error(e.str());
}

uint32_t Allocator::create_block(VkDeviceSize size, MemoryKind kind, const std::string& what,
                                 VkDeviceSize asked) {
  VkDevice dev = ctx_.device();
  auto b = std::make_unique<Block>();
  b->size = size;
  b->kind = kind;

  auto bci = make<VkBufferCreateInfo>(VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO);
  bci.size = size;
  bci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
              VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  ctx_.check(vkCreateBuffer(dev, &bci, nullptr, &b->buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev, b->buffer, &req);
  try {
    b->memory_type = pick_memory_type(req.memoryTypeBits, kind);
  } catch (...) {
    destroy_block(*b);
    throw;
  }

  auto mai = make<VkMemoryAllocateInfo>(VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO);
  mai.allocationSize = req.size;
  mai.memoryTypeIndex = b->memory_type;
  VkResult r = faults_ ? faults_->allocation() : VK_SUCCESS;  // testing: the driver's answer, injected
  if (r == VK_SUCCESS) r = vkAllocateMemory(dev, &mai, nullptr, &b->memory);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) {
    destroy_block(*b);
    out_of_memory(asked, kind, what,
                  "vkAllocateMemory of a " + mib(size) + " block failed (" +
                      (r == VK_ERROR_OUT_OF_DEVICE_MEMORY ? "VK_ERROR_OUT_OF_DEVICE_MEMORY"
                                                          : "VK_ERROR_OUT_OF_HOST_MEMORY") +
                      ")");
  }
  if (r != VK_SUCCESS) destroy_block(*b);
  ctx_.check(r, "vkAllocateMemory");
  ctx_.check(vkBindBufferMemory(dev, b->buffer, b->memory, 0), "vkBindBufferMemory");
  const bool host_visible = ctx_.memory_properties().memoryTypes[b->memory_type].propertyFlags &
                            VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  // On a discrete GPU with resizable BAR device memory may be host-visible too; it still goes through
  // staging.
  if (host_visible && (kind != MemoryKind::Device || unified())) {
    void* p = nullptr;
    ctx_.check(vkMapMemory(dev, b->memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory");  // persistently mapped
    b->mapped = static_cast<std::byte*>(p);
  }
  b->free.emplace(0, size);

  for (uint32_t i = 0; i < blocks_.size(); ++i)
    if (!blocks_[i]) {
      blocks_[i] = std::move(b);
      return i;
    }
  blocks_.push_back(std::move(b));
  return uint32_t(blocks_.size() - 1);
}

Buffer Allocator::allocate(VkDeviceSize size, MemoryKind kind, const std::string& what) {
  if (size > max_allocation_) {
    std::ostringstream e;
    e << "cannot allocate " << size << " bytes (" << mib(size) << ") of " << memory_kind_name(kind)
      << " memory" << (what.empty() ? "" : " for '" + what + "'") << ": the limit for one buffer on '"
      << ctx_.info().name << "' is " << max_allocation_ << " bytes (" << mib(max_allocation_)
      << "; maxStorageBufferRange " << ctx_.limits().max_storage_buffer_range << ", maxMemoryAllocationSize "
      << ctx_.limits().max_memory_allocation_size << "); split the tensor";
    throw Error(e.str());
  }
  // Zero-byte tensors still get a distinct, bindable range (descriptor ranges cannot be empty).
  const VkDeviceSize rounded = align_up(std::max<VkDeviceSize>(size, 1), alignment_);

  std::lock_guard lock(mutex_);
  // Best fit over every block of this kind: fewer, fuller blocks.
  int best_block = -1;
  VkDeviceSize best_offset = 0, best_waste = ~VkDeviceSize(0);
  for (uint32_t i = 0; i < blocks_.size(); ++i) {
    const Block* b = blocks_[i].get();
    if (!b || b->kind != kind) continue;
    for (const auto& [off, sz] : b->free)
      if (sz >= rounded && sz - rounded < best_waste) {
        best_block = int(i), best_offset = off, best_waste = sz - rounded;
        if (best_waste == 0) break;
      }
  }
  if (best_block < 0) {
    const VkDeviceSize limit_block =
        std::min(ctx_.limits().max_memory_allocation_size, ctx_.limits().max_buffer_size);
    VkDeviceSize block_size = kind == MemoryKind::Device ? options_.device_block_size : rounded;
    block_size = align_up(std::max(std::min(block_size, limit_block), rounded), alignment_);
    if (block_size > limit_block) block_size = rounded;
    if (kind == MemoryKind::Device && options_.device_limit) {
      VkDeviceSize reserved = 0;
      for (const auto& b : blocks_)
        if (b && b->kind == kind) reserved += b->size;
      const VkDeviceSize room = options_.device_limit > reserved ? options_.device_limit - reserved : 0;
      if (rounded > room) out_of_memory(size, kind, what, "the device_limit leaves " + mib(room));
      block_size = std::min(block_size, room / alignment_ * alignment_);
    }
    best_block = int(create_block(block_size, kind, what, size));
    best_offset = 0;
  }

  Block& b = *blocks_[best_block];
  auto it = b.free.find(best_offset);
  assert(it != b.free.end() && it->second >= rounded);
  const VkDeviceSize range_size = it->second;
  b.free.erase(it);
  if (range_size > rounded) b.free.emplace(best_offset + rounded, range_size - rounded);
  b.used += rounded;

  Buffer out;
  out.buffer = b.buffer;
  out.offset = best_offset;
  out.size = size;
  out.mapped = b.mapped ? b.mapped + best_offset : nullptr;
  out.kind = kind;
  out.block = uint32_t(best_block);
  return out;
}

void Allocator::free(Buffer& buffer) {
  if (!buffer) return;
  const VkDeviceSize rounded = align_up(std::max<VkDeviceSize>(buffer.size, 1), alignment_);
  std::lock_guard lock(mutex_);
  assert(buffer.block < blocks_.size() && blocks_[buffer.block] &&
         blocks_[buffer.block]->buffer == buffer.buffer);
  Block& b = *blocks_[buffer.block];
  VkDeviceSize off = buffer.offset, size = rounded;
  // Coalesce with the neighbours so large tensors can reuse the space.
  auto next = b.free.lower_bound(off);
  if (next != b.free.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= off && "double free");
    if (prev->first + prev->second == off) {
      off = prev->first;
      size += prev->second;
      b.free.erase(prev);
    }
  }
  if (next != b.free.end() && off + size == next->first) {
    size += next->second;
    b.free.erase(next);
  }
  b.free.emplace(off, size);
  b.used -= rounded;
  buffer = Buffer{};
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  MemoryStats s;
  for (const auto& b : blocks_) {
    if (!b) continue;
    const size_t k = size_t(b->kind);
    s.reserved[k] += b->size;
    s.used[k] += b->used;
    s.blocks[k] += 1;
  }
  return s;
}

void Allocator::trim() {
  std::lock_guard lock(mutex_);
  for (auto& b : blocks_)
    if (b && b->used == 0) {
      destroy_block(*b);
      b.reset();
    }
}

}  // namespace mgn::vk
