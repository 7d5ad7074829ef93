// `mgn cache`: what a cache directory holds (compiled sessions, SPIR-V per kernel, VkPipelineCache files),
// and clearing it. The layout is the Vulkan backend's (session_cache.h, shader_compiler.h, pipeline.h).
#include "mgn/session.h"

#include <filesystem>

#include "support/cache_folder.h"

namespace mgn {
namespace {

namespace fs = std::filesystem;

// The VkPipelineCache files: "pipelines-<uuid>.bin" at the top of the directory.
files::FolderUsage pipeline_files(const std::string& dir, bool remove) {
  files::FolderUsage u;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e2;
    if (!it->is_regular_file(e2) || name.rfind("pipelines-", 0) != 0 || name.find(".tmp.") != std::string::npos)
      continue;
    const uint64_t bytes = it->file_size(e2);
    if (e2) continue;
    if (remove && !fs::remove(it->path(), e2)) continue;
    ++u.files;
    u.bytes += bytes;
  }
  return u;
}

CacheUsage usage(const std::string& dir, bool remove) {
  if (dir.empty()) throw Error("cache: no cache directory (set MGN_CACHE_DIR or give --dir)");
  const std::string sessions = (fs::path(dir) / "sessions").string(), spirv = (fs::path(dir) / "spirv").string();
  CacheUsage u;
  const files::FolderUsage s = remove ? files::clear_folder(sessions, ".mgs") : files::folder_usage(sessions, ".mgs");
  const files::FolderUsage k = remove ? files::clear_folder(spirv, ".spv") : files::folder_usage(spirv, ".spv");
  const files::FolderUsage p = pipeline_files(dir, remove);
  u.session_entries = s.files;
  u.session_bytes = s.bytes;
  u.spirv_files = k.files;
  u.spirv_bytes = k.bytes;
  u.pipeline_files = p.files;
  u.pipeline_bytes = p.bytes;
  return u;
}

}  // namespace

CacheUsage cache_usage(const std::string& cache_dir) { return usage(cache_dir, false); }
CacheUsage clear_cache(const std::string& cache_dir) { return usage(cache_dir, true); }

}  // namespace mgn
