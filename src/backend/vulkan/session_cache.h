// The compiled-session cache: what compiling a graph produces before any device object exists (the fusion
// choice, every dispatch's lowering with its GLSL, and the validated SPIR-V of every kernel), stored under a
// canonical hash of everything that produces it: the graph, the codegen and planning options, the device's
// caps and identity (vendor, device, driver, pipeline-cache UUID) and the shader compiler's version. A warm
// compile hashes the graph, loads the entry and goes straight to planning and pipeline creation (from the
// persisted VkPipelineCache): no GLSL emission, no shaderc, no validation.
//
// Entries live in <cache_dir>/sessions/<key>.mgs, are written atomically (support/atomic_file.h) and carry a
// checksum of their payload: a truncated or corrupt entry is reported as such, removed and rebuilt, never
// trusted. The folder is bounded (least recently used entries go first; a hit marks its entry used).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "codegen/kernel.h"
#include "ir/graph.h"
#include "plan/plan.h"

namespace mgn::vk {

// One dispatch's lowering as the executor first produced it (kernel names without the node suffix).
struct CachedDispatch {
  std::vector<int> nodes;
  // A pointwise fusion is lowered after planning, for the nodes the plan gave memory; the entry says for which,
  // and is used only when the plan agrees. Empty for every other dispatch.
  std::vector<bool> stored;
  codegen::Lowering lowering;
  std::vector<uint32_t> spirv;  // per kernel: index into CompiledSession::spirv
};

struct CompiledSession {
  std::vector<std::vector<int>> fusions;  // codegen::find_fusions's answer
  std::vector<CachedDispatch> dispatches;
  std::vector<std::vector<uint32_t>> spirv;  // unique validated SPIR-V modules
};

struct SessionKey {
  uint64_t a = 0, b = 0;
  std::string hex() const;  // 32 hex digits: the entry's file name
};

// The canonical hash of a compile's inputs. Node names, attributes, shapes, dtypes, precisions, outputs,
// assigns and constant values all count; parameter initializers do not (they are uploaded, never compiled).
SessionKey session_key(const ir::Graph& g, const codegen::DeviceCaps& caps, const codegen::CodegenOptions& codegen,
                       const plan::PlanOptions& plan, const DeviceInfo& device);

// The key of a result that depends only on this build's generators and shader compiler and on the device and
// its driver (the session key's device part), plus `what`: the cooperative-matrix self-test's persisted verdict.
SessionKey device_build_key(const DeviceInfo& device, const std::string& what);

// The key of a result that depends only on the device and its driver (vendor, device, API version, name, driver
// name and info, pipeline-cache UUID), plus `what`: the measured kernel choices (gemm_tune.h), which stay valid
// kernels whatever this build's generators are.
SessionKey device_key(const DeviceInfo& device, const std::string& what);

enum class CacheResult : uint8_t {
  Off,      // no cache directory
  Miss,     // no entry
  Hit,      // loaded and verified
  Corrupt,  // an entry existed but failed verification (removed; rebuilt by this compile)
};
const char* cache_result_name(CacheResult r);

// Subfolder and file suffix of the entries.
std::string session_cache_folder(const std::string& cache_dir);
inline constexpr const char* kSessionSuffix = ".mgs";

CacheResult load_session(const std::string& cache_dir, const SessionKey& key, CompiledSession* out);
// Best effort (a read-only or full disk only costs the next compile its warm path); then evicts the least
// recently used entries beyond max_bytes.
void store_session(const std::string& cache_dir, const SessionKey& key, const CompiledSession& entry,
                   uint64_t max_bytes);

}  // namespace mgn::vk
