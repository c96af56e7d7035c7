// Int4 group-wise GEMV (fp32 activations), AVX2. One 16-byte load gives 32 weights; nibbles are
// widened to fp32 and FMA'd against x; the per-group scale and zero point are applied once per
// group (see gemv_int4.cpp for the algebra).
#include <immintrin.h>

#include "common.h"
#include "simd_avx2.h"

namespace sl::avx2 {

static inline __m256 u8x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

void gemv_i4(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t ng = w.kp / w.group, bpg = w.group / 32;
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W + r * (w.kp / 2);
    const float* sc = w.scale + r * ng;
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.f;  // sum_g s_g * z_g * gsum_g
    for (int64_t g = 0; g < ng; ++g) {
      __m256 g0 = _mm256_setzero_ps(), g1 = g0;
      for (int64_t b = 0; b < bpg; ++b) {
        const int64_t blk = g * bpg + b;
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + blk * 16));
        const __m128i lo = _mm_and_si128(raw, low4);                     // columns 0..15
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);  // columns 16..31
        const float* x = a.x + blk * 32;
        g0 = _mm256_fmadd_ps(u8x8_to_f32(lo), _mm256_loadu_ps(x), g0);
        g1 = _mm256_fmadd_ps(u8x8_to_f32(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), g1);
        g0 = _mm256_fmadd_ps(u8x8_to_f32(hi), _mm256_loadu_ps(x + 16), g0);
        g1 = _mm256_fmadd_ps(u8x8_to_f32(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), g1);
      }
      const float s = sc[g];
      acc = _mm256_fmadd_ps(_mm256_add_ps(g0, g1), _mm256_set1_ps(s), acc);
      const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
      corr += s * z * a.gsum[g];
    }
    y[r] = hsum(acc) - corr;
  }
}

// W4A8: unsigned nibbles x signed int8 activations is exactly what maddubs multiplies
// (pair sums <= 2*15*127, no saturation): ~10 instructions per 32 weights instead of ~18.
void gemv_i4a8(const Weight& w, const Act& a, float* y, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t ng = w.kp / w.group, bpg = w.group / 32;
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W + r * (w.kp / 2);
    const float* sc = w.scale + r * ng;
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.f;
    for (int64_t g = 0; g < ng; ++g) {
      __m256i gi = _mm256_setzero_si256();
      for (int64_t b = 0; b < bpg; ++b) {
        const int64_t blk = g * bpg + b;
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + blk * 16));
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4),
                                           _mm_and_si128(raw, low4));
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + blk * 32));
        gi = _mm256_add_epi32(gi, _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones));
      }
      const float s = sc[g];
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(gi), _mm256_set1_ps(s), acc);
      const float z = w.asym ? float(w.zero[r * ng + g]) : 8.f;
      corr += s * z * a.gsum[g];
    }
    y[r] = (hsum(acc) - corr) * a.xscale;
  }
}

}  // namespace sl::avx2
