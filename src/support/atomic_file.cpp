// Atomic file replacement (atomic_file.h): temp file, fsync, rename, fsync of the folder; stale temp files of
// killed writers are removed before each write.
#include "support/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "mgn/types.h"

namespace mgn::files {

namespace {

namespace fs = std::filesystem;

// The pid in "<name>.tmp.<pid>" or "<name>.tmp.<pid>.<n>", or -1 when `file` is no temp file of `name`.
long temp_pid(const std::string& file, const std::string& name) {
  const std::string prefix = name + ".tmp.";
  if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) return -1;
  long pid = 0;
  size_t i = prefix.size();
  for (; i < file.size() && file[i] >= '0' && file[i] <= '9'; ++i) {
    pid = pid * 10 + (file[i] - '0');
    if (pid > (1l << 30)) return -1;
  }
  if (i == prefix.size() || pid <= 0) return -1;
  if (i < file.size()) {  // ".<n>": a counter, digits only
    if (file[i] != '.' || i + 1 == file.size()) return -1;
    for (size_t k = i + 1; k < file.size(); ++k)
      if (file[k] < '0' || file[k] > '9') return -1;
  }
  return pid;
}

bool process_gone(long pid) { return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH; }

// Makes the rename durable: without it a power loss after rename() may bring back the old directory entry.
bool fsync_folder(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // some file systems cannot sync a folder; nothing to do then
  ::close(fd);
  return ok;
}

}  // namespace

bool write_all(int fd, const void* data, size_t n) {
  const char* c = static_cast<const char*>(data);
  while (n) {
    ssize_t w = ::write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= size_t(w);
  }
  return true;
}

std::vector<std::string> stale_temp_files(const std::string& path) {
  std::vector<std::string> out;
  const fs::path p(path);
  const std::string name = p.filename().string();
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const long pid = temp_pid(it->path().filename().string(), name);
    if (pid > 0 && pid != long(::getpid()) && process_gone(pid)) out.push_back(it->path().string());
  }
  return out;
}

std::string try_write_atomic(const std::string& path, const std::function<bool(int fd)>& write) {
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  for (const std::string& stale : stale_temp_files(path)) fs::remove(stale, ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create '" + tmp + "': " + std::strerror(errno);
  bool ok = write(fd) && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) ok = false, err = errno;
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) ok = false, err = errno;
  if (!ok) {
    ::unlink(tmp.c_str());
    return "cannot write '" + path + "': " + std::strerror(err);
  }
  if (!fsync_folder(fs::path(path).parent_path()))
    return "wrote '" + path + "' but cannot sync its folder: " + std::strerror(errno);
  return "";
}

void write_atomic(const std::string& path, const std::function<bool(int fd)>& write) {
  const std::string err = try_write_atomic(path, write);
  if (!err.empty()) throw Error(err);
}

}  // namespace mgn::files
