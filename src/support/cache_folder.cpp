// Bounded cache folders (cache_folder.h).
#include "support/cache_folder.h"

#include "support/atomic_file.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

namespace mgn::files {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct FileEntry {
  fs::path path;
  uint64_t bytes = 0;
  fs::file_time_type mtime;
};

std::vector<FileEntry> list(const std::string& dir, const std::string& suffix, bool with_temp) {
  std::vector<FileEntry> r;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    const std::string name = it->path().filename().string();
    const bool temp = name.find(".tmp.") != std::string::npos;
    if (temp ? !with_temp : !ends_with(name, suffix)) continue;
    FileEntry f;
    f.path = it->path();
    f.bytes = it->file_size(e2);
    if (e2) continue;
    f.mtime = it->last_write_time(e2);
    if (e2) continue;
    r.push_back(std::move(f));
  }
  return r;
}

}  // namespace

FolderUsage folder_usage(const std::string& dir, const std::string& suffix) {
  FolderUsage u;
  for (const FileEntry& f : list(dir, suffix, false)) {
    ++u.files;
    u.bytes += f.bytes;
  }
  return u;
}

uint64_t evict_lru(const std::string& dir, const std::string& suffix, uint64_t max_bytes, const std::string& keep) {
  std::vector<FileEntry> files = list(dir, suffix, false);
  uint64_t total = 0;
  for (const FileEntry& f : files) total += f.bytes;
  if (total <= max_bytes) return 0;
  std::sort(files.begin(), files.end(), [](const FileEntry& a, const FileEntry& b) { return a.mtime < b.mtime; });
  uint64_t removed = 0;
  std::error_code ec;
  for (const FileEntry& f : files) {
    if (total <= max_bytes) break;
    if (!keep.empty() && fs::equivalent(f.path, keep, ec)) continue;
    if (fs::remove(f.path, ec)) {
      total -= f.bytes;
      ++removed;
    }
  }
  return removed;
}

void touch(const std::string& path) {
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
}

FolderUsage clear_folder(const std::string& dir, const std::string& suffix) {
  FolderUsage u;
  std::error_code ec;
  for (const FileEntry& f : list(dir, suffix, false))
    if (fs::remove(f.path, ec)) {
      ++u.files;
      u.bytes += f.bytes;
    }
  // Temp files left by killed writers (a live writer's temp file is renamed or removed by the writer itself).
  for (const FileEntry& f : list(dir, suffix, true)) {
    const std::string name = f.path.filename().string();
    if (name.find(".tmp.") == std::string::npos) continue;
    const std::string base = (f.path.parent_path() / name.substr(0, name.find(".tmp."))).string();
    for (const std::string& stale : stale_temp_files(base))
      if (stale == f.path.string() && fs::remove(f.path, ec)) u.bytes += f.bytes;
  }
  return u;
}

}  // namespace mgn::files
