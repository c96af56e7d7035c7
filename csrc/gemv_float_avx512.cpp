// GEMVs on fp32 activations whose weights widen to fp32, AVX-512 (F, BW, VBMI2): weight-only
// int8 (W8A16), dense and bitmask-sparse, and bitmask-sparse fp32.
//
// A row is walked 64 columns at a time: the step yields four 16-lane fp32 weight vectors
// (int8: one widening vpmovsxbd and one conversion per 16; bitmask: the 64-bit mask word's
// kept values expanded to their columns first, vpexpandb / vexpandps, dropped columns 0), and
// every token of the tile FMAs them into its own four accumulators. On AVX2 the same rows took
// 8 columns per instruction and the bitmask ones a scalar-ish expansion: at TinyLlama-1.1B
// shapes out of cache, 2 threads, T == 1, int8 streamed 23.5 GB/s against W8A8's 27, bitmask
// int8 10.9 and bitmask fp32 16.5 (dense fp32: 30).
#include <immintrin.h>

#include <cstring>

#include "common.h"
#include "tiles.h"

namespace sl::avx512 {

namespace {
// 4 accumulators per token + 4 weight vectors: 5 tokens fill 24 of the 32 zmm registers (a
// speculative verification of 4 drafted tokens + 1 is one tile).
constexpr int kMaxNT = 5;

// y[t, r] = dot(W[r], x[t]) * scale(r) for rows [r0, r1): row64(r) returns the row's stream,
// a callable filling w[4] with the fp32 weights of its next 64 columns.
template <class Row64, class Scale>
inline void widen_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                       int64_t r1, Row64 row64, Scale scale) {
  const int64_t kp = w.kp;
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
    const float s = scale(r);
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(
          _mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3]))) * s;
  };
  for_rows_and_tiles<kMaxNT>(r0, r1, a.T, row);
}

inline __m512 widen16(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }

constexpr auto no_scale = [](int64_t) { return 1.f; };
}  // namespace

void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [q = W + r * w.kp](__m512* wf) mutable {
      prefetch_ahead(q);  // one cache line per step; faster at T == 1 as well (tiles.h)
      for (int i = 0; i < 4; ++i)
        wf[i] = widen16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * i)));
      q += 64;
    };
  }, [&](int64_t r) { return w.scale[r]; });
}

// The bitmask kernels read up to 63 bytes past a row's last value: the packed values end with
// 64 bytes of padding (formats._VALUE_PAD).
void gemv_sp_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* V = static_cast<const int8_t*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [v = V + w.row_off[r], m = w.mask + r * (w.kp / 8)](__m512* wf) mutable {
      prefetch_ahead(v);
      prefetch_ahead(m);
      uint64_t bits;
      std::memcpy(&bits, m, 8);
      const __m512i e = _mm512_maskz_expand_epi8(bits, _mm512_loadu_si512(v));
      wf[0] = widen16(_mm512_castsi512_si128(e));
      wf[1] = widen16(_mm512_extracti32x4_epi32(e, 1));
      wf[2] = widen16(_mm512_extracti32x4_epi32(e, 2));
      wf[3] = widen16(_mm512_extracti32x4_epi32(e, 3));
      v += __builtin_popcountll(bits);
      m += 8;
    };
  }, [&](int64_t r) { return w.scale[r]; });
}

void gemv_sp_f32(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const float* V = static_cast<const float*>(w.data);
  widen_rows(w, a, y, ldy, r0, r1, [&](int64_t r) {
    return [v = V + w.row_off[r], m = w.mask + r * (w.kp / 8)](__m512* wf) mutable {
      prefetch_ahead(v);
      prefetch_ahead(v + 16);
      prefetch_ahead(m);
      for (int i = 0; i < 4; ++i) {
        uint16_t bits;
        std::memcpy(&bits, m + 2 * i, 2);
        wf[i] = _mm512_maskz_expand_ps(bits, _mm512_loadu_ps(v));
        v += __builtin_popcount(bits);
      }
      m += 8;
    };
  }, no_scale);
}

}  // namespace sl::avx512
