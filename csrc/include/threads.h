// The runtime's own fork-join thread pool (threads.cpp).
//
// Why not OpenMP: a decode step is ~125 parallel regions, each a few to a few hundred
// microseconds long. Workers that sleep between regions (OMP_WAIT_POLICY=passive) pay a futex
// wake-up per region, ~40 us in a VM: half of an int8 step on SmolLM2-135M. Workers that spin
// without yielding (libgomp's active spin) are a disaster when the cores are shared: they burn
// their time slice waiting for a thread that is not running (two 2-thread processes on 2 cores
// each slow to a crawl). These workers spin briefly, then spin with sched_yield (a
// waiting thread hands its core to whoever is runnable), then sleep; the regions of a step run
// back to back, so the pool is as fast as active spinning and as polite as sleeping.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sl {

// Threads a region started on this thread runs on: the innermost ThreadScope's count, else the
// process default (inside a region: that region's count).
int num_threads();
int default_num_threads();    // the process default
void set_num_threads(int n);  // the process default; n <= 0 -> all cores this process may run on

// A per-call thread count (an engine's own): while it lives, regions started by this thread
// run on at most n threads (n <= 0: the process default). Another thread's scope is not
// affected, so two engines with different counts can run at once from two threads. widest()
// is the most threads that ran one of its regions (measured: the workers that took part).
class ThreadScope {
 public:
  explicit ThreadScope(int n);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;
  int widest() const;

 private:
  int saved_threads_, saved_widest_;
};

using Task = void (*)(void* ctx, int id, int n);
void parallel_run(bool parallel, Task task, void* ctx);

// Runs fn(id, n) on n = num_threads() threads, the caller being id 0, and returns when all
// have finished (the pool grows to the largest count asked for; the workers past n sit out). Runs fn(0, 1) on the caller alone when !parallel, when called from inside a
// region, or while another thread's region is running. fn must not throw.
template <class F>
void parallel(bool parallel, F&& fn) {
  using Fn = std::remove_reference_t<F>;
  parallel_run(parallel, [](void* c, int id, int n) { (*static_cast<Fn*>(c))(id, n); },
               const_cast<void*>(static_cast<const void*>(&fn)));
}

// [0, n) split into one contiguous range per thread: fn(lo, hi).
template <class F>
void parallel_for(int64_t n, bool parallel_if, F&& fn) {
  parallel(parallel_if && n > 1, [&](int id, int nt) {
    const int64_t per = (n + nt - 1) / nt;
    const int64_t lo = std::min(n, per * id), hi = std::min(n, lo + per);
    if (lo < hi) fn(lo, hi);
  });
}

}  // namespace sl
