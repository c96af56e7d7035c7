// What the AVX-512 GEMV files (gemv_int8.cpp, gemv_int4.cpp, gemv_sparse.cpp) share: the
// int8-activation (VNNI) kernels' token tiles and group scaling, and the row walk of the
// kernels whose weights widen to fp32. Include only from kernels/avx512/ files: everything here
// has internal linkage, each including file its own copy (CMakeLists.txt).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "formats.h"
#include "kernels.h"
#include "kernels/avx512/simd.h"
#include "kernels/tiles.h"

namespace sl::avx512 {

namespace {

// Int8 activations (W8A8, W4A8), VNNI.
// vpdpbusd multiplies 64 unsigned by 64 signed bytes and adds each group of 4 products into 16
// int32 lanes: one instruction per 64 weights per token, against 8 for the AVX2 sign/maddubs
// chain, so batched decode, verification and prefill stop being compute-bound. The weights are
// the unsigned operand, offset by 128 (w ^ 0x80 == w + 128 as a byte, 0..255: -128 is 0),
// and the offset's share, 128 * sum(x), is subtracted once per token (Acts::xsum):
// the int32 dot product is exact, bitwise the value of the AVX2 and scalar kernels.

// Tokens per tile: each has one zmm accumulator, and a weight vector is loaded (or expanded)
// once per tile. 16-token tiles were slower than two 8-token passes over a row (which the
// second reads from L1) for the bitmask kernel; the dense 16-row-block kernel ran the same.
constexpr int kMaxNT = 8;

// The end of a group of the W4A8 kernels' int32 dots at columns [k, k + 64) (of two groups when
// G == 32: lanes 0-7 and 8-15 hold different ones): acc[t] += float(dot[t]) * the groups'
// scales, and dot[t] starts again.
template <int G, int NT>
inline void scale_group_dots(const float* sc, int64_t k, __m512i* dot, __m512* acc) {
  const __m512 s = G > 32 ? _mm512_set1_ps(sc[k / G])
                          : _mm512_castpd_ps(_mm512_insertf64x4(
                                _mm512_castps_pd(_mm512_set1_ps(sc[k / 32])),
                                _mm256_castps_pd(_mm256_set1_ps(sc[k / 32 + 1])), 1));
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[t]), s, acc[t]);
    dot[t] = _mm512_setzero_si512();
  }
}

constexpr int kMaxNT4 = 8;  // tokens per tile of the int4 W4A8 kernels (one accumulator each)
// ... of the int4 W4A16 ones: 4 accumulators per token, 4 weight vectors (+ 2 tables, dense)
constexpr int kMaxNTI4 = 5;

// Weights that widen to fp32 on fp32 activations: weight-only int8 (W8A16), dense, bitmask- and
// 2:4-sparse, and bitmask-sparse fp32.
// A row is walked 64 columns at a time: the step yields four 16-lane fp32 weight vectors
// (int8: one widening vpmovsxbd and one conversion per 16; bitmask: the 64-bit mask word's
// kept values expanded to their columns first, vpexpandb / vexpandps, dropped columns 0), and
// every token of the tile FMAs them into its own four accumulators. On AVX2 the same rows take
// 8 columns per instruction and the bitmask ones a table-driven expansion per mask byte.
//
// 4 accumulators per token + 4 weight vectors: 5 tokens fill 24 of the 32 zmm registers (a
// speculative verification of 4 drafted tokens + 1 is one tile).
constexpr int kMaxNTWiden = 5;

// y[t, r] = dot(W[r], x[t]) * scale[r] (integer values; fp32 ones: 1) for rows [r0, r1):
// row64(r) returns the row's stream, a callable filling w[4] with the fp32 weights of its next
// 64 columns.
template <class Row64>
inline void widen_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                       int64_t r1, Row64 row64) {
  const int64_t kp = w.kp;
  const bool scaled = !fmt_traits(w.fmt).is_float;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    auto next = row64(r);
    const float* x = a.x + t0 * kp;
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kp; k += 64) {
      __m512 wf[4];
      next(wf);
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < 4; ++i)
          acc[t][i] = _mm512_fmadd_ps(wf[i], _mm512_loadu_ps(x + t * kp + k + 16 * i), acc[t][i]);
    }
    const float s = scaled ? w.scale[r] : 1.f;
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]) * s;
  };
  for_rows_and_tiles<kMaxNTWiden>(r0, r1, a.T, row);
}

inline __m512 widen16(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }
}  // namespace

}  // namespace sl::avx512
