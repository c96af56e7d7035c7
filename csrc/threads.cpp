// Fork-join thread pool: see threads.h for why it exists.
#include "threads.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace sl {
namespace {

using Clock = std::chrono::steady_clock;
// A waiting thread spins on the CPU this long, then spins with sched_yield until kYieldFor (a
// decode step's Python side between two native calls is well under that), then sleeps (a
// worker; the caller waiting for its workers never sleeps: they are running its region).
// Measured with int8_a8 SmolLM2-135M decode on 2 cores: one process 185-212 tok/s for spins of
// 0-30 us (OpenMP: 92 passive, 175-185 active); two such processes sharing the cores 88-110
// tok/s each with a 20 ms yield phase, 63 with 2 ms (wake-ups), 18 with 200 us of plain spin.
constexpr auto kSpinFor = std::chrono::microseconds(5);
constexpr auto kYieldFor = std::chrono::milliseconds(20);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() (true) or until `limit` has passed (false); after kSpinFor, every 64th
// spin is a sched_yield.
template <class Done>
bool spin_until(Done&& done, Clock::duration limit) {
  const auto start = Clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i % 64 == 63) {  // reading the clock every time would slow the spin down
      const auto waited = Clock::now() - start;
      if (waited >= limit) return false;
      if (waited >= kSpinFor) sched_yield();
    }
    cpu_relax();
  }
}

int available_cores() {  // read once: num_threads() is asked on every linear() call
  static const int n = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

thread_local bool t_in_region = false;

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int id = 1; id < n; ++id) workers_.emplace_back([this, id] { work(id); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(sleep_m_);
      stop_ = true;
      epoch_.fetch_add(1);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int size() const { return n_; }

  // False (nothing run) if another thread's region is running.
  bool run(Task task, void* ctx) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    task_ = task;
    ctx_ = ctx;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    epoch_.fetch_add(1);  // seq_cst, paired with the sleepers_ check below and in wait()
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(sleep_m_);
      wake_.notify_all();
    }
    t_in_region = true;
    task(ctx, 0, n_);
    t_in_region = false;
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; },
               Clock::duration::max());
    return true;
  }

 private:
  void work(int id) {
    t_in_region = true;  // a region started from inside a region runs serially
    uint64_t seen = 0;
    for (;;) {
      const auto changed = [&] { return epoch_.load() != seen; };
      if (!spin_until(changed, kYieldFor)) {
        std::unique_lock<std::mutex> lock(sleep_m_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, changed);
        sleepers_.fetch_sub(1);
      }
      seen = epoch_.load();
      if (stop_) return;
      task_(ctx_, id, n_);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  std::mutex busy_;              // held by the thread whose region is running
  Task task_ = nullptr;          // the running region (written before epoch_ is bumped)
  void* ctx_ = nullptr;
  std::atomic<uint64_t> epoch_{0};  // bumped to start a region (or to stop)
  std::atomic<int> pending_{0};     // workers still running the current region
  std::atomic<int> sleepers_{0};
  std::mutex sleep_m_;
  std::condition_variable wake_;
  bool stop_ = false;  // set under sleep_m_ with an epoch bump
};

// The pool is replaced on set_num_threads and abandoned in a forked child (its threads do not
// exist there); a region in flight keeps its pool alive through its shared_ptr.
std::mutex g_pool_m;
std::shared_ptr<Pool>* g_pool = new std::shared_ptr<Pool>();
std::atomic<int> g_threads{0};  // 0: not set -> available_cores()

std::shared_ptr<Pool> pool() {
  std::lock_guard<std::mutex> lock(g_pool_m);
  if (!*g_pool) *g_pool = std::make_shared<Pool>(num_threads());
  return *g_pool;
}

const bool g_atfork = [] {
  pthread_atfork([] { g_pool_m.lock(); }, [] { g_pool_m.unlock(); },
                 [] {
                   new (&g_pool_m) std::mutex();
                   g_pool = new std::shared_ptr<Pool>();  // the parent's pool is leaked
                 });
  return true;
}();

}  // namespace

int num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : available_cores();
}

void set_num_threads(int n) {
  std::shared_ptr<Pool> old;  // joined outside the lock
  {
    std::lock_guard<std::mutex> lock(g_pool_m);
    g_threads = n > 0 ? n : available_cores();
    if (*g_pool && (*g_pool)->size() != g_threads) old = std::move(*g_pool);
  }
}

void parallel_run(bool parallel, Task task, void* ctx) {
  if (parallel && !t_in_region && num_threads() > 1 && pool()->run(task, ctx)) return;
  task(ctx, 0, 1);
}

}  // namespace sl
