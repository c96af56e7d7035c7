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
// worker; the caller waiting for its workers never sleeps: they are running its region). A
// short plain spin is as fast as a long one for one process; for two processes sharing the
// cores, a long yield phase keeps both fast where plain spinning (or frequent sleeping and
// waking) slows both.
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

constexpr int kMaxThreads = (1 << 16) - 1;  // a region's width fits in epoch_'s low bits
constexpr uint64_t kRegion = uint64_t(1) << 16, kWidthMask = kRegion - 1;

thread_local bool t_in_region = false;
thread_local int t_threads = 0;  // the innermost ThreadScope's count; 0: the process default
thread_local int t_widest = 0;   // most threads that ran one region of the current scope

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int id = 1; id < n; ++id) workers_.emplace_back([this, id] { work(id); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(sleep_m_);
      stop_ = true;
      epoch_.fetch_add(kRegion);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int size() const { return n_; }

  // Runs task on the caller and workers 1..n-1 (n <= size()); returns how many threads ran it,
  // or 0 (nothing run) if another thread's region is running.
  int run(Task task, void* ctx, int n) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return 0;
    task_ = task;
    ctx_ = ctx;
    ran_.store(0, std::memory_order_relaxed);
    pending_.store(n - 1, std::memory_order_relaxed);
    // A new region number with its width in the low bits, so a worker reads both at once: one
    // that sits this region out never looks at task_, which the next region may be writing.
    // (seq_cst, paired with the sleepers_ check below and in wait())
    epoch_.store((epoch_.load(std::memory_order_relaxed) & ~kWidthMask) + kRegion + uint64_t(n));
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(sleep_m_);
      wake_.notify_all();
    }
    t_in_region = true;
    task(ctx, 0, n);
    t_in_region = false;
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; },
               Clock::duration::max());
    return 1 + ran_.load(std::memory_order_relaxed);
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
      const int n = int(seen & kWidthMask);
      if (id >= n) continue;  // a region on fewer threads than the pool has
      t_threads = n;          // num_threads() inside the task: the region's count
      task_(ctx_, id, n);
      ran_.fetch_add(1, std::memory_order_relaxed);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int n_;
  std::vector<std::thread> workers_;
  std::mutex busy_;              // held by the thread whose region is running
  Task task_ = nullptr;          // the running region (written before epoch_ is bumped)
  void* ctx_ = nullptr;
  std::atomic<int> ran_{0};         // workers that ran the current region
  // (region number) * kRegion + the region's width; a new number starts a region (or stops)
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> pending_{0};     // workers still running the current region
  std::atomic<int> sleepers_{0};
  std::mutex sleep_m_;
  std::condition_variable wake_;
  bool stop_ = false;  // set under sleep_m_ with an epoch bump
};

// The pool has the most threads any region asked for (at least the process default): it is
// replaced by a larger one when a region asks for more, dropped on set_num_threads, and
// abandoned in a forked child (its threads do not exist there); a region in flight keeps its
// pool alive through its shared_ptr.
std::mutex g_pool_m;
std::shared_ptr<Pool>* g_pool = new std::shared_ptr<Pool>();
std::atomic<int> g_threads{0};  // 0: not set -> available_cores()

std::shared_ptr<Pool> pool(int n) {
  std::shared_ptr<Pool> old;  // joined outside the lock (if no region still holds it)
  std::lock_guard<std::mutex> lock(g_pool_m);
  if (!*g_pool || (*g_pool)->size() < n) {
    old = std::move(*g_pool);
    *g_pool = std::make_shared<Pool>(std::max(n, default_num_threads()));
  }
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

int default_num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : available_cores();
}

int num_threads() { return t_threads > 0 ? t_threads : default_num_threads(); }

void set_num_threads(int n) {
  std::shared_ptr<Pool> old;  // joined outside the lock
  {
    std::lock_guard<std::mutex> lock(g_pool_m);
    g_threads = n > 0 ? n : available_cores();
    if (*g_pool && (*g_pool)->size() != g_threads) old = std::move(*g_pool);
  }
}

ThreadScope::ThreadScope(int n) : saved_threads_(t_threads), saved_widest_(t_widest) {
  t_threads = std::max(n, 0);
  t_widest = 0;
}

ThreadScope::~ThreadScope() {
  t_threads = saved_threads_;
  t_widest = std::max(saved_widest_, t_widest);
}

int ThreadScope::widest() const { return t_widest; }

void parallel_run(bool parallel, Task task, void* ctx) {
  const int n = std::min(num_threads(), kMaxThreads);
  int ran = 0;
  if (parallel && !t_in_region && n > 1) ran = pool(n)->run(task, ctx, n);
  if (ran == 0) {
    task(ctx, 0, 1);
    ran = 1;
  }
  t_widest = std::max(t_widest, ran);
}

}  // namespace sl
