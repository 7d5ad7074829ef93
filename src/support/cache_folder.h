// A bounded folder of cache files (the compiled-session cache): total size, least-recently-used eviction by
// modification time (a hit touches its file), and clearing. Best effort: a file another process removes
// meanwhile is skipped, never an error.
#pragma once

#include <cstdint>
#include <string>

namespace mgn::files {

struct FolderUsage {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

// Regular files directly in `dir` whose name ends in `suffix` ("" for all); zero when `dir` does not exist.
FolderUsage folder_usage(const std::string& dir, const std::string& suffix = "");
// Removes the least recently used files (oldest modification time first) ending in `suffix` until the rest
// take at most `max_bytes`; `keep` (a path) is never removed. Returns how many files were removed.
uint64_t evict_lru(const std::string& dir, const std::string& suffix, uint64_t max_bytes, const std::string& keep = "");
// Sets the file's modification time to now (marks it recently used).
void touch(const std::string& path);
// Removes the regular files of `dir` ending in `suffix`, and their stale temp files; returns what was removed.
FolderUsage clear_folder(const std::string& dir, const std::string& suffix = "");

}  // namespace mgn::files
