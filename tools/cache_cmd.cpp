// `mgn cache info|clear`: what the cache directory holds (compiled sessions, SPIR-V per kernel, pipeline
// caches) and removing it. The directory is --dir, else MGN_CACHE_DIR's (default ~/.cache/meganeura).
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "mgn/session.h"

namespace mgn::tool {

namespace {

struct CacheArgs {
  std::string action, dir;
};

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

int run_cache(const CacheArgs& a, const Context& c) {
  const std::string dir = a.dir.empty() ? c.env.cache_dir : a.dir;
  if (dir.empty()) throw UsageError("cache: no cache directory (MGN_CACHE_DIR is empty; give --dir)");
  const bool clear = a.action == "clear";
  const CacheUsage u = clear ? clear_cache(dir) : cache_usage(dir);
  std::printf("%s %s\n", clear ? "cleared" : "cache", dir.c_str());
  std::printf("  compiled sessions  %6llu  %s\n", (unsigned long long)u.session_entries, mib(u.session_bytes).c_str());
  std::printf("  SPIR-V kernels     %6llu  %s\n", (unsigned long long)u.spirv_files, mib(u.spirv_bytes).c_str());
  std::printf("  pipeline caches    %6llu  %s\n", (unsigned long long)u.pipeline_files, mib(u.pipeline_bytes).c_str());
  std::printf("  total                      %s\n", mib(u.session_bytes + u.spirv_bytes + u.pipeline_bytes).c_str());
  return 0;
}

}  // namespace

Run declare_cache(CLI::App& app) {
  auto a = std::make_shared<CacheArgs>();
  app.add_option("ACTION", a->action, "info: what the cache holds; clear: remove it")
      ->required()
      ->check(CLI::IsMember({"info", "clear"}));
  app.add_option("--dir", a->dir, "the cache directory (default: MGN_CACHE_DIR's)")->type_name("DIR");
  app.footer(
      "The cache directory holds compiled sessions (sessions/, bounded, least recently used removed first),\n"
      "SPIR-V per kernel (spirv/) and one VkPipelineCache file per driver build (pipelines-*.bin).");
  return [a](const Context& c) { return run_cache(*a, c); };
}

}  // namespace mgn::tool
