// GLSL compute source → validated SPIR-V, in process (shaderc + SPIRV-Tools), with an on-disk cache
// keyed by the full compile input so a warm start skips glslang entirely.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mgn::codegen {

struct ShaderOptions {
  std::string name = "kernel";  // shown in errors and used as the file name glslang reports
  std::vector<std::pair<std::string, std::string>> defines;
  bool optimize = true;              // spirv-opt performance passes (shaderc's -O)
  bool debug_info = false;           // keep OpName/OpLine, for RenderDoc-style tools
  bool scalar_block_layout = false;  // set when the kernel uses GL_EXT_scalar_block_layout
};

struct SpirV {
  std::vector<uint32_t> words;
  uint64_t hash = 0;  // of the words; pipelines are deduplicated by it
};

// 64-bit FNV-1a; stable across runs and machines, which std::hash is not.
uint64_t fnv1a64(const void* data, size_t bytes, uint64_t seed = 0xcbf29ce484222325ull);

// The source with its comments removed and the node-numbered identifiers the generators write (x<id>, v<id>,
// in_x<id>, out_v<id>, idx_x<id>) renumbered in order of first appearance: two sources with the same
// canonical text are the same program up to a consistent renaming, so (without debug info, where names never
// reach the module) they compile to the same SPIR-V and share one cache entry, e.g. the same pointwise
// fusion in each of a model's layers.
std::string canonical_glsl(const std::string& glsl);

// "   1 | #version 450\n   2 | ..." so a compiler message's line number can be read off directly.
std::string number_lines(const std::string& source);

// Thread-safe: kernels of one session are compiled from several threads at once.
class ShaderCompiler {
 public:
  // An empty cache_dir disables the disk cache (the in-memory one stays).
  explicit ShaderCompiler(std::string cache_dir);

  // Throws mgn::Error with the numbered source and the compiler/validator message on failure.
  SpirV compile(const std::string& glsl, const ShaderOptions& options = {});

  struct Stats {
    uint64_t compiled = 0;     // ran glslang
    uint64_t memory_hits = 0;  // same input seen by this compiler
    uint64_t disk_hits = 0;    // loaded from the cache directory
    double compile_ms = 0;     // glslang + spirv-opt, summed over threads
    double validate_ms = 0;    // spirv-val, summed over threads
  };
  Stats stats() const;
  const std::string& cache_dir() const { return cache_dir_; }

  // Identifies shaderc/glslang/SPIRV-Tools and our cache format; part of every cache key.
  static std::string compiler_version();
  // Builds glslang's built-in symbol tables for the kernels' GLSL version and stage (the first compile of a process
  // pays for them: ~85-140 ms), by compiling an empty kernel; thread-safe, nothing cached or counted.
  static void warm_up();

 private:
  std::string cache_dir_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, SpirV> memory_;  // full key text → result
  Stats stats_;
};

}  // namespace mgn::codegen
