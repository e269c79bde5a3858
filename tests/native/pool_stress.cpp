// Stress test of the kernels' thread pool (csrc/include/marlkit/common.h), built and run by
// tests/native/test_pool.py, under ThreadSanitizer where the compiler has it. Exits 0 and prints
// "ok" when every check holds; otherwise prints what failed and exits 1. An optional argument
// divides the number of jobs (ThreadSanitizer runs them about 10x slower).
//
// What it checks, for 2 and 3 threads, over many short jobs of random sizes (most of them much
// shorter than a pooled thread takes to wake on a VM, so workers often arrive after the caller
// took every task, or in the middle of a later job):
//   * every task of every job runs exactly once, and the job returns only after all of them;
//   * an exception thrown by some tasks is rethrown by parallel_for once the others have run;
//   * a parallel_for inside a task runs inline, and one from a second thread while the pool is
//     busy runs inline too (both still cover every index once);
//   * the pool keeps working after the thread setting changes.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "marlkit/common.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    if (failures < 20) {
      std::printf("FAILED: %s\n", what.c_str());
    }
    ++failures;
  }
}

// Runs jobs of random sizes on this thread; each index of each job counted once.
void run_jobs(int jobs, std::uint32_t seed, const char* who) {
  std::mt19937 rng(seed);
  std::vector<std::atomic<int>> hits(512);
  for (int j = 0; j < jobs; ++j) {
    const std::int64_t total = 1 + static_cast<std::int64_t>(rng() % 512);
    const std::int64_t chunk = static_cast<std::int64_t>(rng() % 9);  // 0: the default chunks
    const int spin = static_cast<int>(rng() % 200);                   // work per index
    for (std::int64_t i = 0; i < total; ++i) {
      hits[static_cast<std::size_t>(i)].store(0, std::memory_order_relaxed);
    }
    std::atomic<std::int64_t> sink{0};
    marlkit::parallel_for_chunks(total, 1, chunk, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        std::int64_t x = i;
        for (int s = 0; s < spin; ++s) {
          x = x * 6364136223846793005LL + 1442695040888963407LL;
        }
        sink.fetch_add(x & 1, std::memory_order_relaxed);
        hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
      }
    });
    for (std::int64_t i = 0; i < total; ++i) {
      const int n = hits[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
      check(n == 1, std::string(who) + ": job " + std::to_string(j) + " index " +
                        std::to_string(i) + " of " + std::to_string(total) + " ran " +
                        std::to_string(n) + " times");
    }
  }
}

void exceptions(int jobs) {
  for (int j = 0; j < jobs; ++j) {
    const std::int64_t total = 2 + j % 97;
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(total));
    bool thrown = false;
    try {
      marlkit::parallel_for_chunks(total, 1, 1, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) {
          hits[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
          if (i % 7 == 3) {
            throw std::runtime_error("task " + std::to_string(i));
          }
        }
      });
    } catch (const std::runtime_error& e) {
      thrown = std::string(e.what()).rfind("task ", 0) == 0;
    }
    check(thrown || total <= 3, "job " + std::to_string(j) + ": the task's exception came back");
    for (std::int64_t i = 0; i < total; ++i) {
      check(hits[static_cast<std::size_t>(i)].load() == 1,
            "exceptions: index " + std::to_string(i) + " did not run exactly once");
    }
  }
}

void nested(int jobs) {
  for (int j = 0; j < jobs; ++j) {
    std::atomic<std::int64_t> count{0};
    marlkit::parallel_for(16, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        marlkit::parallel_for(8, 1, [&](std::int64_t b, std::int64_t e) { count += e - b; });
      }
    });
    check(count.load() == 16 * 8, "nested: " + std::to_string(count.load()) + " of 128");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int divide = argc > 1 ? std::atoi(argv[1]) : 1;
  if (divide < 1) {
    std::printf("the argument divides the jobs: a positive integer, got %s\n", argv[1]);
    return 2;
  }
  for (int threads : {2, 3}) {
    marlkit::set_num_threads(threads);
    const std::string name = std::to_string(threads) + " threads";
    run_jobs(20000 / divide, 7u + static_cast<std::uint32_t>(threads), name.c_str());
    exceptions(2000 / divide);
    nested(500 / divide);
    // Two callers at once: one holds the pool, the other runs inline.
    std::thread other([&] { run_jobs(3000 / divide, 99u, "second caller"); });
    run_jobs(3000 / divide, 5u, "first caller");
    other.join();
  }
  marlkit::set_num_threads(1);
  run_jobs(200, 3u, "1 thread");
  if (failures) {
    std::printf("%d checks failed\n", failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
