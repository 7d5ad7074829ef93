// Command recording: descriptor sets written once, global barriers between groups, timestamp queries,
// and the staging path for synchronous transfers.
#include "backend/vulkan/command.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <exception>

#include "mgn/types.h"
#include "support/numerics_trace.h"

namespace mgn::vk {
namespace {

constexpr VkPipelineStageFlags kWorkStages =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

void memory_barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stages, VkAccessFlags src_access,
                    VkPipelineStageFlags dst_stages, VkAccessFlags dst_access) {
  auto b = make<VkMemoryBarrier>(VK_STRUCTURE_TYPE_MEMORY_BARRIER);
  b.srcAccessMask = src_access;
  b.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cmd, src_stages, dst_stages, 0, 1, &b, 0, nullptr, 0, nullptr);
}

// Writes of an earlier submission are not implicitly visible to a later one on the same queue.
void begin_barrier(VkCommandBuffer cmd) {
  memory_barrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_WRITE_BIT, kWorkStages,
                 VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
}

void group_barrier(VkCommandBuffer cmd) {
  memory_barrier(cmd, kWorkStages, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, kWorkStages,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT);
}

// The fence wait alone does not make device writes visible to the host.
void end_barrier(VkCommandBuffer cmd) {
  memory_barrier(cmd, kWorkStages, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                 VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
}

VkFence make_fence(VkDevice dev) {
  auto fci = make<VkFenceCreateInfo>(VK_STRUCTURE_TYPE_FENCE_CREATE_INFO);
  VkFence f;
  check(vkCreateFence(dev, &fci, nullptr, &f), "vkCreateFence");
  return f;
}

VkCommandPool make_pool(const Context& ctx) {
  auto ci = make<VkCommandPoolCreateInfo>(VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO);
  ci.queueFamilyIndex = ctx.queue_family();
  VkCommandPool pool;
  check(vkCreateCommandPool(ctx.device(), &ci, nullptr, &pool), "vkCreateCommandPool");
  return pool;
}

VkCommandBuffer make_command_buffer(VkDevice dev, VkCommandPool pool) {
  auto ai = make<VkCommandBufferAllocateInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO);
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cmd;
  check(vkAllocateCommandBuffers(dev, &ai, &cmd), "vkAllocateCommandBuffers");
  return cmd;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// CommandStream

CommandStream::CommandStream(Context& ctx, bool timestamps, FaultPoints* faults)
    : ctx_(ctx),
      faults_(faults),
      timestamps_requested_(timestamps),
      timestamps_(timestamps && ctx.has(Feature::Timestamps)) {}

CommandStream::~CommandStream() {
  VkDevice dev = ctx_.device();
  if (in_flight_) vkWaitForFences(dev, 1, &fence_, VK_TRUE, UINT64_MAX);  // returns at once on a lost device
  // After a loss, submissions of a split step before the one that failed may still be queued (no fence).
  if (ctx_.lost()) ctx_.drain();
  if (fence_) vkDestroyFence(dev, fence_, nullptr);
  if (query_pool_) vkDestroyQueryPool(dev, query_pool_, nullptr);
  if (descriptor_pool_) vkDestroyDescriptorPool(dev, descriptor_pool_, nullptr);
  if (pool_) vkDestroyCommandPool(dev, pool_, nullptr);  // frees cmds_
}

void CommandStream::require_not_recorded(const char* what) const {
  if (recorded()) throw Error(std::string("CommandStream::") + what + " after the stream was recorded");
}

void CommandStream::dispatch(const Pipeline& pipeline, const std::vector<Buffer>& bindings,
                             std::array<uint32_t, 3> groups, const void* push, uint32_t push_bytes,
                             std::string label) {
  require_not_recorded("dispatch");
  if (label.empty()) label = pipeline.name;
  auto who = [&] { return "dispatch '" + label + "'"; };  // errors only: recording thousands stays cheap
  if (bindings.size() != pipeline.num_buffers)
    throw Error(who() + " binds " + std::to_string(bindings.size()) + " buffers; pipeline '" + pipeline.name +
                "' declares " + std::to_string(pipeline.num_buffers));
  if (push_bytes != pipeline.push_constant_bytes)
    throw Error(who() + " passes " + std::to_string(push_bytes) + " bytes of push constants; pipeline '" +
                pipeline.name + "' declares " + std::to_string(pipeline.push_constant_bytes));
  const auto& max_count = ctx_.limits().max_workgroup_count;
  for (int i = 0; i < 3; ++i)
    if (groups[i] > max_count[i])
      throw Error(who() + " has " + std::to_string(groups[i]) + " workgroups on axis " + std::to_string(i) +
                  "; the device allows " + std::to_string(max_count[i]));
  for (const Buffer& b : bindings) {
    if (!b) throw Error(who() + " binds an empty Buffer");
    assert(b.offset % ctx_.limits().min_storage_buffer_offset_alignment == 0);
    assert(b.size <= ctx_.limits().max_storage_buffer_range);
  }
  Command c(Command::Kind::Dispatch);
  c.pipeline = &pipeline;
  c.bindings = bindings;
  c.groups = groups;
  c.push.assign(static_cast<const uint8_t*>(push), static_cast<const uint8_t*>(push) + push_bytes);
  c.label = std::move(label);
  commands_.push_back(std::move(c));
  ++n_dispatches_;
}

void CommandStream::copy(const Buffer& src, const Buffer& dst, VkDeviceSize bytes) {
  require_not_recorded("copy");
  if (bytes == 0) bytes = std::min(src.size, dst.size);
  if (!src || !dst || bytes > src.size || bytes > dst.size)
    throw Error("CommandStream::copy of " + std::to_string(bytes) + " bytes from a " +
                std::to_string(src.size) + "-byte buffer to a " + std::to_string(dst.size) + "-byte buffer");
  Command c(Command::Kind::Copy);
  c.src = src;
  c.dst = dst;
  c.bytes = bytes;
  commands_.push_back(std::move(c));
}

void CommandStream::barrier() {
  require_not_recorded("barrier");
  // Two barriers in a row, or one at the start, order nothing.
  if (commands_.empty() || commands_.back().kind == Command::Kind::Barrier ||
      commands_.back().kind == Command::Kind::Split)  // a later submission's buffer starts with one
    return;
  commands_.emplace_back(Command::Kind::Barrier);
  ++n_barriers_;
}

void CommandStream::split() {
  require_not_recorded("split");
  if (commands_.empty() || commands_.back().kind == Command::Kind::Split) return;
  if (commands_.back().kind == Command::Kind::Barrier) {  // the next buffer starts with one anyway
    commands_.pop_back();
    --n_barriers_;
  }
  commands_.emplace_back(Command::Kind::Split);
  ++n_splits_;
}

void CommandStream::record() {
  if (recorded()) return;
  VkDevice dev = ctx_.device();
  pool_ = make_pool(ctx_);
  fence_ = make_fence(dev);

  // One descriptor set per dispatch, written now and never touched again.
  uint32_t total_bindings = 0;
  std::vector<VkDescriptorSetLayout> layouts;
  for (const auto& c : commands_)
    if (c.kind == Command::Kind::Dispatch) {
      total_bindings += uint32_t(c.bindings.size());
      layouts.push_back(c.pipeline->set_layout);
    }
  std::vector<VkDescriptorSet> sets(layouts.size());
  if (!layouts.empty()) {
    VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, std::max(total_bindings, 1u)};
    auto pci = make<VkDescriptorPoolCreateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO);
    pci.maxSets = uint32_t(layouts.size());
    pci.poolSizeCount = 1;
    pci.pPoolSizes = &size;
    ctx_.check(vkCreateDescriptorPool(dev, &pci, nullptr, &descriptor_pool_), "vkCreateDescriptorPool");
    auto ai = make<VkDescriptorSetAllocateInfo>(VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO);
    ai.descriptorPool = descriptor_pool_;
    ai.descriptorSetCount = uint32_t(layouts.size());
    ai.pSetLayouts = layouts.data();
    ctx_.check(vkAllocateDescriptorSets(dev, &ai, sets.data()), "vkAllocateDescriptorSets");

    std::vector<VkDescriptorBufferInfo> infos;
    infos.reserve(total_bindings);  // no reallocation: writes point into it
    // One write per set: its bindings 0..n-1 are alike (one storage buffer each, compute stage), so a write
    // of descriptorCount n starting at binding 0 fills them in order (the spec's consecutive binding
    // updates); the same descriptors as one write per binding, in a quarter of the structures.
    std::vector<VkWriteDescriptorSet> writes;
    writes.reserve(layouts.size());
    size_t set = 0;
    for (const auto& c : commands_) {
      if (c.kind != Command::Kind::Dispatch) continue;
      const size_t first = infos.size();
      for (const Buffer& b : c.bindings)
        // Zero-byte tensors bind their (non-empty) aligned slot: a descriptor range cannot be 0.
        infos.push_back({b.buffer, b.offset, std::max<VkDeviceSize>(b.size, 4)});
      if (!c.bindings.empty()) {
        auto w = make<VkWriteDescriptorSet>(VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET);
        w.dstSet = sets[set];
        w.dstBinding = 0;
        w.descriptorCount = uint32_t(c.bindings.size());
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &infos[first];
        writes.push_back(w);
      }
      ++set;
    }
    vkUpdateDescriptorSets(dev, uint32_t(writes.size()), writes.data(), 0, nullptr);
  }

  if (timestamps_) {
    n_queries_ = uint32_t(2 * n_dispatches_ + 2);  // two per dispatch, then the whole stream
    auto qci = make<VkQueryPoolCreateInfo>(VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO);
    qci.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qci.queryCount = n_queries_;
    ctx_.check(vkCreateQueryPool(dev, &qci, nullptr, &query_pool_), "vkCreateQueryPool");
  }

  // Each submission's buffer: the first starts with the host-write barrier (and resets the queries), a
  // later one with a group barrier (ordering it after the previous submission's work); the last ends with
  // the device-to-host barrier.
  auto begin = [&](bool first) {
    VkCommandBuffer cmd = make_command_buffer(dev, pool_);
    auto bi = make<VkCommandBufferBeginInfo>(
        VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);  // no ONE_TIME: resubmitted
    ctx_.check(vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    if (first) {
      if (timestamps_) {
        vkCmdResetQueryPool(cmd, query_pool_, 0, n_queries_);
        vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, query_pool_, n_queries_ - 2);
      }
      begin_barrier(cmd);
    } else {
      group_barrier(cmd);
    }
    cmds_.push_back(cmd);
    return cmd;
  };
  VkCommandBuffer cmd = begin(true);
  size_t set = 0;
  uint32_t query = 0;
  const Pipeline* bound = nullptr;
  for (auto& c : commands_) {
    switch (c.kind) {
      case Command::Kind::Dispatch:
        if (c.pipeline != bound) {
          vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c.pipeline->pipeline);
          bound = c.pipeline;
        }
        vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, c.pipeline->layout, 0, 1, &sets[set++],
                                0, nullptr);
        if (!c.push.empty())
          vkCmdPushConstants(cmd, c.pipeline->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, uint32_t(c.push.size()),
                             c.push.data());
        if (timestamps_) {
          c.query = query;
          vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, query_pool_, query++);
        }
        vkCmdDispatch(cmd, c.groups[0], c.groups[1], c.groups[2]);
        if (timestamps_) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_, query++);
        break;
      case Command::Kind::Copy: {
        VkBufferCopy region{c.src.offset, c.dst.offset, c.bytes};
        vkCmdCopyBuffer(cmd, c.src.buffer, c.dst.buffer, 1, &region);
        break;
      }
      case Command::Kind::Barrier:
        group_barrier(cmd);
        break;
      case Command::Kind::Split:
        ctx_.check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
        cmd = begin(false);
        bound = nullptr;  // pipeline bindings do not carry over between command buffers
        break;
    }
  }
  end_barrier(cmd);
  if (timestamps_)
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, query_pool_, n_queries_ - 1);
  ctx_.check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
}

void CommandStream::submit_async() {
  if (!recorded()) record();
  if (in_flight_) wait();
  ctx_.check(vkResetFences(ctx_.device(), 1, &fence_), "vkResetFences");
  std::exception_ptr hook_error;  // the rest of the step is still submitted (its buffers must not dangle)
  for (size_t i = 0; i < cmds_.size(); ++i) {
    auto si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmds_[i];
    const bool last = i + 1 == cmds_.size();
    // The last signals: queue order covers the rest.
    ctx_.submit(si, last ? fence_ : VK_NULL_HANDLE, faults_ ? faults_->submission() : VK_SUCCESS);
    if (last) {
      in_flight_ = true;
    } else if (between_ && !hook_error) {
      try {
        between_(int(i));
      } catch (...) {
        hook_error = std::current_exception();
      }
    }
  }
  if (hook_error) std::rethrow_exception(hook_error);
}

void CommandStream::wait() {
  if (!in_flight_) return;
  ctx_.wait(fence_, "vkWaitForFences (the end of a step)", faults_ ? faults_->wait() : VK_SUCCESS);
  in_flight_ = false;
  completed_once_ = true;
}

void CommandStream::submit() {
  submit_async();
  wait();
}

std::vector<uint64_t> CommandStream::read_queries() const {
  if (!timestamps_)
    throw Error(std::string("timings are unavailable: ") +
                (timestamps_requested_ ? std::string("device '") + ctx_.info().name +
                                             "' lacks timestamp queries on its compute queue"
                                       : "the CommandStream was created without timestamps"));
  if (!completed_once_ || in_flight_) throw Error("timings are unavailable until a submission has completed");
  std::vector<uint64_t> ticks(n_queries_);
  ctx_.check(vkGetQueryPoolResults(ctx_.device(), query_pool_, 0, n_queries_, ticks.size() * sizeof(uint64_t),
                                   ticks.data(), sizeof(uint64_t),
                                   VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
             "vkGetQueryPoolResults");
  const uint32_t bits = ctx_.limits().timestamp_valid_bits;
  if (bits < 64)
    for (auto& t : ticks) t &= (uint64_t(1) << bits) - 1;
  return ticks;
}

std::vector<DispatchTiming> CommandStream::timings() const {
  const std::vector<uint64_t> ticks = read_queries();
  const double ns_per_tick = ctx_.limits().timestamp_period_ns;
  std::vector<DispatchTiming> out;
  for (const auto& c : commands_)
    if (c.kind == Command::Kind::Dispatch) {
      // Unsigned wrap is possible only with < 64 valid bits; the subtraction below handles one wrap.
      const uint64_t mask = ctx_.limits().timestamp_valid_bits < 64
                                ? (uint64_t(1) << ctx_.limits().timestamp_valid_bits) - 1
                                : ~uint64_t(0);
      const uint64_t dt = (ticks[c.query + 1] - ticks[c.query]) & mask;
      out.push_back({c.label, double(dt) * ns_per_tick * 1e-6});
    }
  return out;
}

double CommandStream::total_ms() const {
  const std::vector<uint64_t> ticks = read_queries();
  const uint32_t bits = ctx_.limits().timestamp_valid_bits;
  const uint64_t mask = bits < 64 ? (uint64_t(1) << bits) - 1 : ~uint64_t(0);
  return double((ticks[n_queries_ - 1] - ticks[n_queries_ - 2]) & mask) * ctx_.limits().timestamp_period_ns *
         1e-6;
}

// ---------------------------------------------------------------------------------------------------------------
// Transfer

Transfer::Transfer(Context& ctx, Allocator& allocator, VkDeviceSize staging_bytes)
    : ctx_(ctx), allocator_(allocator) {
  chunk_ = std::min(staging_bytes, allocator.max_allocation());
  pool_ = make_pool(ctx);
  cmd_ = make_command_buffer(ctx.device(), pool_);
  fence_ = make_fence(ctx.device());
}

const Buffer& Transfer::staging(Buffer& b, MemoryKind kind, VkDeviceSize bytes) {
  const VkDeviceSize need = std::min(bytes, chunk_);
  if (b && b.size >= need) return b;
  constexpr VkDeviceSize kMinStaging = VkDeviceSize(1) << 20;
  const VkDeviceSize size = std::min(chunk_, std::bit_ceil(std::max(need, kMinStaging)));
  if (b) {
    allocator_.free(b);
    allocator_.trim();  // the smaller staging block, now empty
  }
  b = allocator_.allocate(size, kind, kind == MemoryKind::Upload ? "upload staging" : "readback staging");
  return b;
}

Transfer::~Transfer() {
  allocator_.free(upload_);
  allocator_.free(readback_);
  vkDestroyFence(ctx_.device(), fence_, nullptr);
  vkDestroyCommandPool(ctx_.device(), pool_, nullptr);
}

void Transfer::run(const std::function<void(VkCommandBuffer)>& body) {
  VkDevice dev = ctx_.device();
  ctx_.check(vkResetCommandPool(dev, pool_, 0), "vkResetCommandPool");
  auto bi = make<VkCommandBufferBeginInfo>(VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO);
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  ctx_.check(vkBeginCommandBuffer(cmd_, &bi), "vkBeginCommandBuffer");
  begin_barrier(cmd_);
  body(cmd_);
  end_barrier(cmd_);
  ctx_.check(vkEndCommandBuffer(cmd_), "vkEndCommandBuffer");
  auto si = make<VkSubmitInfo>(VK_STRUCTURE_TYPE_SUBMIT_INFO);
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd_;
  ctx_.submit(si, fence_);
  ctx_.wait(fence_, "vkWaitForFences (a transfer)");
  ctx_.check(vkResetFences(dev, 1, &fence_), "vkResetFences");
}

void Transfer::upload(const Buffer& dst, const void* src, VkDeviceSize bytes, VkDeviceSize dst_offset) {
  if (dst_offset + bytes > dst.size)
    throw Error("upload of " + std::to_string(bytes) + " bytes at offset " + std::to_string(dst_offset) +
                " overruns a " + std::to_string(dst.size) + "-byte buffer");
  if (dst.mapped) {
    std::memcpy(dst.mapped + dst_offset, src, bytes);  // coherent: visible to the next submission
    return;
  }
  const auto* p = static_cast<const std::byte*>(src);
  const Buffer& up = staging(upload_, MemoryKind::Upload, bytes);
  for (VkDeviceSize done = 0; done < bytes;) {
    const VkDeviceSize n = std::min(up.size, bytes - done);
    std::memcpy(up.mapped, p + done, n);
    run([&](VkCommandBuffer cmd) {
      VkBufferCopy region{up.offset, dst.offset + dst_offset + done, n};
      vkCmdCopyBuffer(cmd, up.buffer, dst.buffer, 1, &region);
    });
    done += n;
  }
}

void Transfer::download(const Buffer& src, void* dst, VkDeviceSize bytes, VkDeviceSize src_offset) {
  if (src_offset + bytes > src.size)
    throw Error("download of " + std::to_string(bytes) + " bytes at offset " + std::to_string(src_offset) +
                " overruns a " + std::to_string(src.size) + "-byte buffer");
  if (src.mapped) {
    std::memcpy(dst, src.mapped + src_offset, bytes);
    trace::record("vk.download", dst, bytes);
    return;
  }
  auto* p = static_cast<std::byte*>(dst);
  const Buffer& rb = staging(readback_, MemoryKind::Readback, bytes);
  for (VkDeviceSize done = 0; done < bytes;) {
    const VkDeviceSize n = std::min(rb.size, bytes - done);
    run([&](VkCommandBuffer cmd) {
      VkBufferCopy region{src.offset + src_offset + done, rb.offset, n};
      vkCmdCopyBuffer(cmd, src.buffer, rb.buffer, 1, &region);
    });
    std::memcpy(p + done, rb.mapped, n);
    done += n;
  }
  trace::record("vk.download", dst, bytes);
}

void Transfer::fill_zero(const Buffer& dst) {
  if (dst.mapped) {
    std::memset(dst.mapped, 0, dst.size);
    return;
  }
  // vkCmdFillBuffer wants a multiple of 4; the allocator's slot is at least 16-aligned, so rounding up is
  // ours.
  run([&](VkCommandBuffer cmd) {
    vkCmdFillBuffer(cmd, dst.buffer, dst.offset, std::max<VkDeviceSize>((dst.size + 3) / 4 * 4, 4), 0);
  });
}

}  // namespace mgn::vk
