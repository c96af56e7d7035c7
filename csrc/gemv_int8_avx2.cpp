// Int8 per-output-channel GEMV, AVX2. W8A16 widens int8 -> fp32 and FMAs; W8A8 uses the
// maddubs sign trick (simd_avx2.h) for 32 int8 products per instruction.
#include <immintrin.h>

#include "common.h"
#include "simd_avx2.h"

namespace sl::avx2 {

void quantize_row(const float* x, int64_t n, int8_t* q, float* scale) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
  const float amax = hmax(m);
  if (amax == 0.f) {
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    *scale = 0.f;
    return;
  }
  const __m256 inv = _mm256_set1_ps(127.0f / amax);
  for (int64_t i = 0; i < n; i += 32) {  // n is a multiple of 32 (padded rows)
    __m256i v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), inv),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // packs work per 128-bit lane; the permute restores column order.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), p);
  }
  *scale = amax / 127.0f;
}

void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_float_rows<int8_t, 4>(w, a, y, ldy, r0, r1, [](const int8_t* p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }, [&w](int64_t r) { return w.scale[r]; });
}

// W8A8: per 64 columns the two weight vectors and their absolute values are made once, then
// each token of the tile costs 2 x (sign, maddubs, madd, add); 2 int32 accumulators per token.
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* row = W + r * kp;
    const int8_t* xq = a.xq + t0 * kp;
    __m256i acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 64) {
      prefetch_ahead(row + k);
      __m256i wv[2], wa[2];
      for (int i = 0; i < 2; ++i) {
        wv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k + 32 * i));
        wa[i] = _mm256_sign_epi8(wv[i], wv[i]);
      }
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < 2; ++i) {
          const __m256i x =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * kp + k + 32 * i));
          acc[t][i] = dot_i8(acc[t][i], wa[i], wv[i], x);
        }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = float(hsum_i32(_mm256_add_epi32(acc[t][0], acc[t][1]))) *
                              (a.xscale[t0 + t] * w.scale[r]);
  });
}

}  // namespace sl::avx2
