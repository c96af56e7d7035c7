// Token tiling shared by every GEMV kernel (scalar and AVX2): rows outer, tokens inner.
//
// A kernel provides row(Nt<NT>, r, t0): one weight row r against tokens [t0, t0 + NT), with NT
// separate accumulator sets in registers. for_rows_and_tiles walks each block of rows once per
// tile of at most MaxNT tokens, so the packed bytes come from DRAM once and stay in cache for
// the next tiles. A token's arithmetic is the same in every NT instantiation (its own accumulators, the
// same column order), which is what makes batched results bitwise equal to T == 1 results.
// MaxNT is per kernel: as many tokens as its accumulators fit in the 16 ymm registers.
#pragma once

#include <cstdint>
#include <type_traits>

namespace sl {

template <int N>
using Nt = std::integral_constant<int, N>;

// One out-of-line function per (kernel, NT), looping over a block of rows: inlined together, the
// instantiations made GCC spill general registers inside the NT == 1 loop (callgrind counts
// them), and a call per row costs tens of instructions of setup on short rows. GCC (with LTO)
// still calls the AVX-512 sparse int4 rows once per row here unless their lambda is marked
// always_inline, which they are (it pays at several tokens; bitmask W8A8's rows did not gain).
template <int NT, class Row>
[[gnu::noinline]] void call_tile(Row& row, int64_t ra, int64_t rz, int64_t t0) {
  for (int64_t r = ra; r < rz; ++r) row(Nt<NT>{}, r, t0);
}

template <int MaxNT, class Row>
inline void run_tile(int64_t n, Row& row, int64_t ra, int64_t rz, int64_t t0) {
  if constexpr (MaxNT > 1) {
    if (n < MaxNT) return run_tile<MaxNT - 1>(n, row, ra, rz, t0);
  }
  call_tile<MaxNT>(row, ra, rz, t0);
}

// Software prefetch of a weight stream, kPrefetchAhead bytes ahead, into L2: the kernels that
// stream weights faster than they compute on them (the float-row kernels, W8A8 and dense int4)
// call it once per step of their column loop with the address they read. With several tokens
// per tile such a kernel does enough arithmetic per cache line that its out-of-order window no
// longer covers the DRAM latency, and the hardware prefetcher alone does not keep up with
// several tokens per tile. 2 KB ahead was too short; 8 and 16 KB did the same. The AVX2 W4A16
// and sparse kernels are compute-bound and do not use it. At T == 1 it depends on the CPU
// (prefetch_single_stream(), runtime/cpu.cpp): AMD's AVX-512 cores (Zen 4 on) stream fp32/fp16/bf16
// rows and the 16-row-block W8A8 kernel faster without it; AMD's AVX2-only cores and Intel's
// (whose hardware prefetcher alone left bf16 rows well below the read bandwidth, out of a large
// L3) stream faster with it. The 16-row-block W8A8 kernel on Intel prefetches only for several
// tokens.
constexpr int64_t kPrefetchAhead = 8192;

inline void prefetch_ahead(const void* p) {
  __builtin_prefetch(static_cast<const char*>(p) + kPrefetchAhead, 0, 2);
}

// Rows in blocks of kRowBlock: a block (<= 8 rows x 1536 columns x 4 bytes = 48 KB) stays in
// L1/L2 while the token tiles walk it again.
constexpr int64_t kRowBlock = 8;

template <int MaxNT, class Row>
inline void for_rows_and_tiles(int64_t r0, int64_t r1, int64_t T, Row&& row) {
  for (int64_t ra = r0; ra < r1; ra += kRowBlock) {
    const int64_t rz = ra + kRowBlock < r1 ? ra + kRowBlock : r1;
    for (int64_t t0 = 0; t0 < T; t0 += MaxNT)
      run_tile<MaxNT>(T - t0 < MaxNT ? T - t0 : MaxNT, row, ra, rz, t0);
  }
}

// Calls f(std::integral_constant<int, R>{}, i0) over rows [0, m) in tiles of MaxR rows, the
// last one shorter (R is a compile-time constant: the attention kernels' register tiles).
template <int MaxR, class F>
inline void rows_in_tiles(int64_t m, F&& f) {
  int64_t i = 0;
  for (; i + MaxR <= m; i += MaxR) f(std::integral_constant<int, MaxR>{}, i);
  if constexpr (MaxR > 1)
    if (i < m) rows_in_tiles<MaxR - 1>(m - i, [&](auto r, int64_t k) { f(r, i + k); });
}

}  // namespace sl
