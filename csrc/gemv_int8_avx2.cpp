// Int8 per-output-channel GEMV, AVX2. W8A16 widens int8 -> fp32 and FMAs; W8A8 uses the
// maddubs sign trick (simd_avx2.h) for 32 int8 products per instruction.
#include <immintrin.h>

#include <cmath>

#include "common.h"
#include "simd_avx2.h"

namespace sl::avx2 {

void quantize_row(const float* x, int64_t n, int8_t* q, float* scale) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float amax = _mm_cvtss_f32(h);
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

static inline __m256 load8_i8_as_f32(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

void gemv_i8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* row = W + r * w.kp;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < w.kp; k += 32) {
      s0 = _mm256_fmadd_ps(load8_i8_as_f32(row + k + 0), _mm256_loadu_ps(a.x + k + 0), s0);
      s1 = _mm256_fmadd_ps(load8_i8_as_f32(row + k + 8), _mm256_loadu_ps(a.x + k + 8), s1);
      s2 = _mm256_fmadd_ps(load8_i8_as_f32(row + k + 16), _mm256_loadu_ps(a.x + k + 16), s2);
      s3 = _mm256_fmadd_ps(load8_i8_as_f32(row + k + 24), _mm256_loadu_ps(a.x + k + 24), s3);
    }
    y[r] = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) * w.scale[r];
  }
}

void gemv_i8a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  for (int64_t r = r0; r < r1; ++r) {
    const int8_t* row = W + r * w.kp;
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0;
    for (int64_t k = 0; k < w.kp; k += 64) {
      acc0 = dot_i8(acc0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + k)));
      acc1 = dot_i8(acc1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k + 32)),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + k + 32)));
    }
    y[r] = float(hsum_i32(_mm256_add_epi32(acc0, acc1))) * (a.xscale * w.scale[r]);
  }
}

}  // namespace sl::avx2
