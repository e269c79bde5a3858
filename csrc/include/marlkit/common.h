// Shared helpers for the header-only kernels: argument checks and a small thread pool helper.
// No Python includes here: kernels take raw pointers and sizes; bindings.cpp does the array work.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace marlkit {

// Number of worker threads the kernels use; 0 means "all hardware threads".
inline int& num_threads_setting() {
  static int value = 0;
  return value;
}

inline int resolved_num_threads() {
  int n = num_threads_setting();
  if (n <= 0) {
    n = static_cast<int>(std::thread::hardware_concurrency());
  }
  return std::max(1, n);
}

inline void set_num_threads(int n) {
  if (n < 0) {
    throw std::invalid_argument("num_threads must be >= 0 (0 means all cores), got " +
                                std::to_string(n));
  }
  num_threads_setting() = n;
}

// Run fn(begin, end) over [0, total) split in contiguous chunks across threads.
// Work below `min_per_thread` items per thread runs on the calling thread only.
template <typename Fn>
void parallel_for(std::int64_t total, std::int64_t min_per_thread, Fn&& fn) {
  if (total <= 0) {
    return;
  }
  std::int64_t threads = std::min<std::int64_t>(resolved_num_threads(),
                                                std::max<std::int64_t>(1, total / std::max<std::int64_t>(1, min_per_thread)));
  if (threads <= 1) {
    fn(std::int64_t{0}, total);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads - 1));
  const std::int64_t chunk = (total + threads - 1) / threads;
  for (std::int64_t t = 1; t < threads; ++t) {
    const std::int64_t begin = t * chunk;
    const std::int64_t end = std::min(total, begin + chunk);
    if (begin >= end) {
      break;
    }
    pool.emplace_back([&fn, begin, end] { fn(begin, end); });
  }
  fn(std::int64_t{0}, std::min(total, chunk));
  for (auto& th : pool) {
    th.join();
  }
}

}  // namespace marlkit
