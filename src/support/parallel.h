// A bounded parallel loop for compile-time work (GLSL emission, shaderc, pipeline creation): at most
// `threads` workers (0: the hardware's concurrency; never more than n), the calling thread being worker 0.
// Worker w runs index w first, then takes the next untaken index, so every worker runs at least one item
// whatever the scheduling; the first exception is rethrown on the calling thread once every worker has
// stopped (workers take no new index after a failure).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mgn::support {

inline unsigned worker_count(unsigned threads, size_t items) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return unsigned(std::min<size_t>(threads, std::max<size_t>(items, 1)));
}

template <typename F>
void parallel_for(size_t n, unsigned threads, F&& body) {
  const unsigned workers = worker_count(threads, n);
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<size_t> next{workers};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&](size_t first) {
    for (size_t i = first; !failed.load() && i < n; i = next.fetch_add(1)) {
      try {
        body(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work, size_t(w));
  work(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace mgn::support
