// Small AVX2 helpers shared by the *_avx2.cpp kernels (only include from those files).
#pragma once
#include <immintrin.h>

namespace sl::avx2 {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Signed int8 x signed int8 dot product of 32 lanes, accumulated into 8 int32 lanes.
// AVX2 has only unsigned*signed byte multiplies (maddubs): move w's sign onto x, multiply
// |w| (<= 127, we never store -128) by sign(x, w). Pair sums are <= 2*127*127 < 32767, so the
// int16 stage never saturates.
inline __m256i dot_i8(__m256i acc, __m256i w, __m256i x) {
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

}  // namespace sl::avx2
