// Shared helpers for the header-only kernels: the thread setting and a persistent thread pool.
// No Python includes here: kernels take raw pointers and sizes; bindings.cpp does the array work.
//
// The pool: worker threads are created once (on the first parallel call, again after the thread
// setting changes or after a fork) and sleep on a condition variable between calls, so a
// parallel_for costs a wake-up (a few microseconds) instead of a thread start (~80 us each).
// The calling thread always takes part in the work. Rules that keep it safe:
//   * a parallel_for inside a parallel_for task (nested) runs inline on the calling thread;
//   * while one thread uses the pool, a parallel_for from another thread runs inline (never
//     blocks on the other caller), so concurrent GIL-free calls cannot deadlock;
//   * an exception thrown by a task is caught on the thread that ran it; the first one is
//     rethrown on the calling thread once every task has finished (never std::terminate);
//   * in a child process after fork() the parent's pool (whose threads do not exist there) is
//     abandoned and a fresh one is started on demand.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define MARLKIT_HAS_PTHREAD_ATFORK 1
#endif

namespace marlkit {

// Number of worker threads the kernels use; 0 means "all hardware threads".
inline std::atomic<int>& num_threads_setting() {
  static std::atomic<int> value{0};
  return value;
}

inline int resolved_num_threads() {
  int n = num_threads_setting().load(std::memory_order_relaxed);
  if (n <= 0) {
    n = static_cast<int>(std::thread::hardware_concurrency());
  }
  return std::max(1, n);
}

// The most kernel threads a process may ask for: far beyond any machine's useful count, and
// well below what the OS refuses to start (a pool that cannot start its threads throws).
constexpr int kMaxNumThreads = 1024;

inline void set_num_threads(int n) {
  if (n < 0 || n > kMaxNumThreads) {
    throw std::invalid_argument("num_threads must be in [0, " + std::to_string(kMaxNumThreads) +
                                "] (0 means all cores), got " + std::to_string(n));
  }
  num_threads_setting().store(n, std::memory_order_relaxed);
}

// The least work, in the physics and LiDAR kernels' work units (one unit is roughly a pair test
// or an agent update, 0.2-0.5 ns on the benchmark machine), that a parallel job gives each
// thread; smaller jobs run on the calling thread. Each extra thread costs a wake-up (up to ~50
// us for an idle vCPU of a VM) and makes the caller read the part it wrote from another core's
// cache afterwards, so the default keeps jobs below ~50-150 us of work on one thread: on the
// 2-vCPU benchmark machine a second thread made a 1024 x 4 navigation step 0.82x as fast with
// 16,384 units, 1.00x with this default, and a 16,384 x 4 step 1.11x faster with either
// (benchmarks/threads.py).
constexpr std::int64_t kDefaultMinWorkPerThread = 262144;

inline std::atomic<std::int64_t>& min_work_per_thread_setting() {
  static std::atomic<std::int64_t> value{kDefaultMinWorkPerThread};
  return value;
}

inline std::int64_t min_work_per_thread() {
  return min_work_per_thread_setting().load(std::memory_order_relaxed);
}

inline void set_min_work_per_thread(std::int64_t units) {
  if (units < 1) {
    throw std::invalid_argument("min_work_per_thread must be >= 1 work unit, got " +
                                std::to_string(units));
  }
  min_work_per_thread_setting().store(units, std::memory_order_relaxed);
}

namespace pool_detail {

// True on a thread while it runs pool tasks (workers always, the caller during a run).
inline bool& in_parallel_region() {
  static thread_local bool flag = false;
  return flag;
}

class ThreadPool {
 public:
  using TaskFn = void (*)(void* context, std::int64_t task);

  explicit ThreadPool(int workers) : slots_(static_cast<std::size_t>(std::max(0, workers))) {
    threads_.reserve(slots_.size());
    try {
      for (std::size_t w = 0; w < slots_.size(); ++w) {
        threads_.emplace_back([this, w] { worker_loop(w); });
      }
    } catch (...) {  // the OS refused a thread: stop the ones started (no destructor runs)
      stop_and_join();
      throw;
    }
  }

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  ~ThreadPool() { stop_and_join(); }

  int workers() const { return static_cast<int>(slots_.size()); }

  // Largest task count of one job (the count and the next index share the job's 64-bit cursor).
  static constexpr std::int64_t kMaxTasks = (std::int64_t{1} << 16) - 1;

  // Run fn(context, t) for every t in [0, tasks) on the calling thread and up to tasks - 1
  // workers; returns when all tasks are done. Exceptions are caught per task; the first one is
  // rethrown here. The caller must hold the pool (see PoolState::run_mutex).
  //
  // Tasks are claimed one at a time from the job's cursor by whichever thread comes first, and
  // the caller waits only for tasks that were claimed, never for a worker to wake up: on a VM
  // an idle vCPU can take 50 us to wake, longer than many jobs. A worker that wakes after the
  // caller took every task finds nothing to claim and touches nothing of the job: a claim is one
  // compare-and-swap of the cursor, which holds the job's number, its task count and the next
  // index together, so it succeeds only while that job still has an unclaimed task, and the job
  // (fn_, context_) is read only after a claim.
  void run(std::int64_t tasks, TaskFn fn, void* context) {
    if (tasks > kMaxTasks) {
      throw std::invalid_argument("thread pool: a job of " + std::to_string(tasks) +
                                  " tasks is more than the pool's limit of " +
                                  std::to_string(kMaxTasks));
    }
    const int helpers =
        static_cast<int>(std::min<std::int64_t>(workers(), std::max<std::int64_t>(tasks - 1, 0)));
    fn_ = fn;
    context_ = context;
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const std::uint64_t job = ++generation_ & kJobMask;
    cursor_.store(job << kJobShift | static_cast<std::uint64_t>(tasks) << kCountShift,
                  std::memory_order_release);  // publishes the job
    for (int w = 0; w < helpers; ++w) {
      Slot& slot = slots_[static_cast<std::size_t>(w)];
      {
        std::lock_guard<std::mutex> lock(slot.mutex);
        slot.generation = generation_;
      }
      slot.cv.notify_one();
    }
    work();
    // Every task is claimed now; wait for those still running on a worker: spin briefly (they
    // are usually about to finish), then sleep.
    for (int spin = 0; spin < kSpin && done_.load(std::memory_order_acquire) < tasks; ++spin) {
      std::this_thread::yield();
    }
    if (done_.load(std::memory_order_acquire) < tasks) {
      std::unique_lock<std::mutex> lock(done_mutex_);
      done_cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire) >= tasks; });
    }
    fn_ = nullptr;
    context_ = nullptr;
    if (error_) {
      std::exception_ptr error = error_;
      error_ = nullptr;
      std::rethrow_exception(error);
    }
  }

 private:
  static constexpr int kSpin = 64;  // yields before the waiting caller sleeps
  // The cursor: (job number << 32) | (task count << 16) | next unclaimed index.
  static constexpr int kJobShift = 32;
  static constexpr int kCountShift = 16;
  static constexpr std::uint64_t kJobMask = (std::uint64_t{1} << 32) - 1;
  static constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kCountShift) - 1;

  struct Slot {
    std::mutex mutex;
    std::condition_variable cv;
    std::uint64_t generation = 0;
    bool stop = false;
  };

  // Tell every worker to stop, then join those that were started.
  void stop_and_join() {
    for (auto& slot : slots_) {
      std::lock_guard<std::mutex> lock(slot.mutex);
      slot.stop = true;
      slot.cv.notify_one();
    }
    for (auto& t : threads_) {
      t.join();
    }
  }

  // Claim and run tasks of the job in the cursor until none is left (caller and workers alike).
  void work() {
    std::uint64_t cursor = cursor_.load(std::memory_order_acquire);
    for (;;) {
      const auto t = static_cast<std::int64_t>(cursor & kIndexMask);
      const auto tasks = static_cast<std::int64_t>((cursor >> kCountShift) & kIndexMask);
      if (t >= tasks) {
        return;
      }
      if (!cursor_.compare_exchange_weak(cursor, cursor + 1, std::memory_order_acquire,
                                         std::memory_order_acquire)) {
        continue;  // cursor now holds the current value
      }
      try {
        fn_(context_, t);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) {
          error_ = std::current_exception();
        }
      }
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) {
        std::lock_guard<std::mutex> lock(done_mutex_);  // the caller may be about to sleep
        done_cv_.notify_one();
      }
      cursor = cursor_.load(std::memory_order_acquire);
    }
  }

  void worker_loop(std::size_t w) {
    in_parallel_region() = true;
    Slot& slot = slots_[w];
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(slot.mutex);
        slot.cv.wait(lock, [&] { return slot.stop || slot.generation != seen; });
        if (slot.stop) {
          return;
        }
        seen = slot.generation;
      }
      work();
    }
  }

  std::vector<Slot> slots_;
  std::vector<std::thread> threads_;
  // The current job. fn_ and context_ are written before the job's number is stored into the
  // cursor (release) and read only after claiming one of its tasks (acquire); the caller
  // rewrites them only once every claimed task is done.
  TaskFn fn_ = nullptr;
  void* context_ = nullptr;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> cursor_{0};
  std::atomic<std::int64_t> done_{0};
  std::mutex done_mutex_;
  std::condition_variable done_cv_;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// The process's pool and the lock that gives one caller at a time the use of it.
struct PoolState {
  std::mutex run_mutex;
  std::unique_ptr<ThreadPool> pool;
};

inline PoolState*& pool_state_ptr() {
  static PoolState* state = new PoolState();  // never deleted: workers may outlive statics
  return state;
}

#ifdef MARLKIT_HAS_PTHREAD_ATFORK
// In a forked child only the forking thread exists: abandon (leak) the parent's pool, whose
// threads are gone and whose mutexes may be held, and start from a fresh state.
inline void after_fork_in_child() {
  PoolState*& state = pool_state_ptr();
  state = new PoolState();
  in_parallel_region() = false;
}
#endif

inline PoolState& pool_state() {
#ifdef MARLKIT_HAS_PTHREAD_ATFORK
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, &after_fork_in_child);
    return true;
  }();
  (void)registered;
#endif
  return *pool_state_ptr();
}

// Run fn(t) for t in [0, tasks) on the calling thread and up to threads - 1 pool workers;
// inline when nested, when another thread holds the pool, or when one thread is asked for.
template <typename Fn>
void run_tasks(std::int64_t tasks, int threads, Fn& fn) {
  auto run_inline = [&] {
    for (std::int64_t t = 0; t < tasks; ++t) {
      fn(t);
    }
  };
  if (threads <= 1 || tasks <= 1 || in_parallel_region()) {
    run_inline();
    return;
  }
  PoolState& state = pool_state();
  std::unique_lock<std::mutex> lock(state.run_mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    run_inline();
    return;
  }
  // The pool follows the thread setting (a job may use fewer of its workers).
  const int workers = std::max(resolved_num_threads(), threads) - 1;
  if (!state.pool || state.pool->workers() != workers) {
    state.pool.reset();  // joins the old workers
    state.pool = std::make_unique<ThreadPool>(workers);
  }
  in_parallel_region() = true;
  struct Reset {
    ~Reset() { in_parallel_region() = false; }
  } reset;
  state.pool->run(
      tasks, [](void* context, std::int64_t t) { (*static_cast<Fn*>(context))(t); }, &fn);
}

}  // namespace pool_detail

// Chunks per thread of a parallel_for: a late thread leaves its share to the others.
constexpr std::int64_t kChunksPerThread = 4;

// Run fn(begin, end) over [0, total) in contiguous chunks of `chunk` items on the persistent
// pool, each chunk taken by whichever thread is free (the calling thread too): with small
// chunks a worker that wakes late takes only what is left instead of its share. `chunk` <= 0
// means kChunksPerThread chunks per thread. Work below `min_per_thread` items per thread runs
// on the calling thread only, in one call. An exception thrown by fn on any thread is rethrown
// here after every chunk has finished.
template <typename Fn>
void parallel_for_chunks(std::int64_t total, std::int64_t min_per_thread, std::int64_t chunk,
                         Fn&& fn) {
  if (total <= 0) {
    return;
  }
  const std::int64_t threads = std::min<std::int64_t>(
      resolved_num_threads(),
      std::max<std::int64_t>(1, total / std::max<std::int64_t>(1, min_per_thread)));
  if (threads <= 1) {
    fn(std::int64_t{0}, total);
    return;
  }
  if (chunk <= 0) {
    chunk = (total + threads * kChunksPerThread - 1) / (threads * kChunksPerThread);
  }
  // At most ThreadPool::kMaxTasks tasks (larger chunks for a larger total).
  chunk = std::max(chunk, (total + pool_detail::ThreadPool::kMaxTasks - 1) /
                              pool_detail::ThreadPool::kMaxTasks);
  const std::int64_t tasks = (total + chunk - 1) / chunk;
  auto task = [&](std::int64_t t) {
    const std::int64_t begin = t * chunk;
    fn(begin, std::min(total, begin + chunk));
  };
  pool_detail::run_tasks(tasks, static_cast<int>(threads), task);
}

// parallel_for_chunks with kChunksPerThread chunks per thread.
template <typename Fn>
void parallel_for(std::int64_t total, std::int64_t min_per_thread, Fn&& fn) {
  parallel_for_chunks(total, min_per_thread, 0, std::forward<Fn>(fn));
}

}  // namespace marlkit
