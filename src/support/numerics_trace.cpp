// The numerics trace's writer (see numerics_trace.h): one file per process, named by its pid, starting with
// the process's command line (temporary paths folded to /tmp/X, so two runs of a test get the same key).
#include "support/numerics_trace.h"

#ifdef MGN_NUMERICS_TRACE_DIR
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>

namespace mgn::trace {
namespace {

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string s;
  for (char c : raw) s += c == '\0' ? ' ' : c;
  // Temporary directories differ from run to run; executables differ by build folder.
  s = std::regex_replace(s, std::regex("/tmp/[^/ ]+"), "/tmp/X");
  s = std::regex_replace(s, std::regex("[^ ]*/([^/ ]+)"), "$1");
  return s;
}

uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

void record(const char* what, const void* data, size_t bytes) {
  static std::mutex m;
  static std::FILE* f = nullptr;
  std::lock_guard<std::mutex> lock(m);
  if (!f) {
    std::string path = std::string(MGN_NUMERICS_TRACE_DIR) + "/" + std::to_string(getpid()) + ".trace";
    f = std::fopen(path.c_str(), "w");
    if (!f) return;
    std::fprintf(f, "key %s\n", command_line().c_str());
  }
  std::fprintf(f, "%s %zu %016llx\n", what, bytes, static_cast<unsigned long long>(fnv1a(data, bytes)));
  std::fflush(f);
}

}  // namespace mgn::trace
#endif
