// Atomic file replacement shared by every writer of a file a user or a later process reads (checkpoints, the
// kernel and pipeline caches): write `<path>.tmp.<pid>.<n>`, fsync it, rename it over `path`, fsync the folder.
// A process killed at any point leaves the complete old or the complete new file; its temp file is removed by
// the next write to the same path (stale_temp_files names what counts as stale).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace mgn::files {

// Writes through `write`, which gets an open file descriptor and returns false (errno set) on failure.
// Throws mgn::Error naming `path` and the system error when any step fails; the temp file is removed then.
void write_atomic(const std::string& path, const std::function<bool(int fd)>& write);
// The same, returning the error text instead of throwing ("" on success): for best-effort caches.
std::string try_write_atomic(const std::string& path, const std::function<bool(int fd)>& write);
// Writes all of [data, data + n) to fd, retrying short writes and EINTR.
bool write_all(int fd, const void* data, size_t n);

// Temp files `<path>.tmp.<pid>[.<n>]` beside `path` whose process no longer exists (a save killed midway).
// A temp file of a live process (a save in progress, perhaps in another process) is not stale.
std::vector<std::string> stale_temp_files(const std::string& path);

}  // namespace mgn::files
