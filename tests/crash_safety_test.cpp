// Crash safety (issue 30): a process writing checkpoints (and two processes writing the same cache entry) is
// killed with SIGKILL at random points, over and over; after every kill the file on disk must be the complete
// old or the complete new one (byte for byte), and the next save must leave no temp file behind. The cache
// entries go through files::try_write_atomic, the writer the kernel and pipeline caches use.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "mgn/checkpoint.h"
#include "support/atomic_file.h"
#include "support/test_util.h"

namespace fs = std::filesystem;
using namespace mgn;

namespace {

std::vector<uint8_t> file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

int temp_files(const fs::path& dir) {
  int n = 0;
  for (auto& f : fs::directory_iterator(dir)) n += f.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

// Shared with the children: how many writes they started and finished (a kill between the two is "inside").
struct Counters {
  std::atomic<uint64_t> started{0}, finished{0};
};

Counters* shared_counters() {
  void* p = ::mmap(nullptr, sizeof(Counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) Counters();
}

// Writes version A, B, A, ... of a file forever (the child's body); `write(v)` writes version v.
template <class Write>
pid_t writer(Counters* c, Write write) {
  pid_t pid = ::fork();
  if (pid == 0) {
    for (uint64_t i = 0;; ++i) {
      c->started.fetch_add(1);
      write(int(i % 2));
      c->finished.fetch_add(1);
    }
  }
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int st = 0;
  ::waitpid(pid, &st, 0);
}

}  // namespace

TEST(CrashSafety, CheckpointSavesSurviveSigkill) {
  fs::path dir = test::make_temp_dir("crash_ckpt");
  const std::string path = (dir / "c.safetensors").string();
  // Two versions, 1 MiB each, so a write takes long enough to be cut in the middle.
  std::vector<float> a(1 << 18), b(1 << 18);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i), b[i] = -float(i);
  std::vector<std::vector<uint8_t>> versions;
  for (int v = 0; v < 2; ++v) {
    write_checkpoint(path, {StoredTensor::from_f32("w", {int64_t(a.size())}, v ? b : a)}, v);
    versions.push_back(file_bytes(path));
  }
  Counters* c = shared_counters();
  std::mt19937 rng(30);
  const int kIterations = 200;
  int inside = 0, torn = 0;
  for (int it = 0; it < kIterations; ++it) {
    const uint64_t s0 = c->started.load(), f0 = c->finished.load();
    pid_t pid = writer(c, [&](int v) {
      write_checkpoint(path, {StoredTensor::from_f32("w", {int64_t(a.size())}, v ? b : a)}, v);
    });
    ::usleep(useconds_t(std::uniform_int_distribution<int>(1000, 40000)(rng)));
    kill_and_reap(pid);
    inside += (c->started.load() - s0) != (c->finished.load() - f0);
    const std::vector<uint8_t> now = file_bytes(path);
    torn += now != versions[0] && now != versions[1];
  }
  std::printf("checkpoint: %d SIGKILLs, %d inside a save, %d torn files, %d temp files left by the kills\n",
              kIterations, inside, torn, temp_files(dir));
  EXPECT_EQ(torn, 0);
  EXPECT_GT(inside, kIterations / 4);  // the kills do land inside saves (the test can fail)
  // The next save removes every temp file the killed saves left.
  write_checkpoint(path, {StoredTensor::from_f32("w", {2}, {1, 2})}, 9);
  EXPECT_EQ(temp_files(dir), 0);
  EXPECT_EQ(SafetensorsFile::read(path).get("w").to_f32(), (std::vector<float>{1, 2}));
  fs::remove_all(dir);
}

TEST(CrashSafety, TwoProcessesWritingOneCacheEntry) {
  fs::path dir = test::make_temp_dir("crash_cache");
  const std::string path = (dir / "entry.spv").string();
  std::vector<std::vector<uint8_t>> versions(2, std::vector<uint8_t>(1 << 20));
  for (size_t i = 0; i < versions[0].size(); ++i) versions[0][i] = uint8_t(i * 7), versions[1][i] = uint8_t(~(i * 13));
  auto write = [&](int v) {
    std::string err = files::try_write_atomic(
        path, [&](int fd) { return files::write_all(fd, versions[size_t(v)].data(), versions[size_t(v)].size()); });
    if (!err.empty()) std::fprintf(stderr, "%s\n", err.c_str());
  };
  write(0);
  Counters* c = shared_counters();
  std::mt19937 rng(31);
  const int kIterations = 100;
  int torn = 0;
  for (int it = 0; it < kIterations; ++it) {
    pid_t p1 = writer(c, write), p2 = writer(c, write);
    ::usleep(useconds_t(std::uniform_int_distribution<int>(1000, 30000)(rng)));
    kill_and_reap(p1);
    ::usleep(useconds_t(std::uniform_int_distribution<int>(0, 5000)(rng)));
    kill_and_reap(p2);
    const std::vector<uint8_t> now = file_bytes(path);
    torn += now != versions[0] && now != versions[1];
  }
  std::printf("cache entry: %d rounds of two concurrent writers killed, %llu writes started, %llu finished, "
              "%d torn files\n",
              kIterations, (unsigned long long)c->started.load(), (unsigned long long)c->finished.load(), torn);
  EXPECT_EQ(torn, 0);
  EXPECT_GT(c->finished.load(), 0u);
  write(1);
  EXPECT_EQ(temp_files(dir), 0);
  EXPECT_EQ(file_bytes(path), versions[1]);
  fs::remove_all(dir);
}
