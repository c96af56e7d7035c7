// Dense fp32 / fp16 / bf16 GEMV, AVX2+FMA+F16C. Memory-bound: one pass over each row, four
// independent accumulators (32 columns per iteration) to cover the FMA latency.
#include <immintrin.h>

#include "common.h"
#include "simd_avx2.h"

namespace sl::avx2 {

template <typename Load8>
static inline void gemv_rows(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1,
                             Load8 load8) {
  const int64_t kp = w.kp;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t base = r * kp;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < kp; k += 32) {
      s0 = _mm256_fmadd_ps(load8(base + k + 0), _mm256_loadu_ps(a.x + k + 0), s0);
      s1 = _mm256_fmadd_ps(load8(base + k + 8), _mm256_loadu_ps(a.x + k + 8), s1);
      s2 = _mm256_fmadd_ps(load8(base + k + 16), _mm256_loadu_ps(a.x + k + 16), s2);
      s3 = _mm256_fmadd_ps(load8(base + k + 24), _mm256_loadu_ps(a.x + k + 24), s3);
    }
    y[r] = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  }
}

void gemv_f32(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const float* W = static_cast<const float*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) { return _mm256_loadu_ps(W + i); });
}

void gemv_f16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W + i)));
  });
}

void gemv_bf16(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint16_t* W = static_cast<const uint16_t*>(w.data);
  gemv_rows(w, a, y, r0, r1, [W](int64_t i) {
    // bf16 is the top half of an fp32: widen to 32 bits and shift into place.
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(W + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  });
}

}  // namespace sl::avx2
