// Row decoders, AVX-512 (F, VL, VBMI2): bitmask-sparse rows expanded 16 columns at a time. A
// mask's 16 bits place the next popcount values in their lanes (vexpandps / vpexpandb from a
// register: the values are loaded unaligned, the SIMD over-read padding after a weight's values
// covers the load past its last one), so a sparse panel decodes at about the speed of a dense
// one instead of one scalar store per kept weight. Values are exactly the scalar decoders'.
#include <immintrin.h>

#include <cstring>

#include "kernels.h"

namespace sl::avx512 {

static inline __mmask16 mask16(const uint8_t* mrow, int64_t c) {
  uint16_t m;
  std::memcpy(&m, mrow + 2 * c, 2);  // bit j: column 16 c + j (little bit order)
  return m;
}

void decode_rows_sp_f32(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const float* v = static_cast<const float*>(w.data) + w.row_off[r];
    float* o = out + (r - r0) * kp;
    for (int64_t c = 0; c < kp / 16; ++c) {
      const __mmask16 m = mask16(mrow, c);
      _mm512_storeu_ps(o + 16 * c, _mm512_maskz_expand_ps(m, _mm512_loadu_ps(v)));
      v += __builtin_popcount(m);
    }
  }
}

void decode_rows_sp_i8(const Weight& w, int64_t r0, int64_t r1, float* out) {
  const int64_t kp = w.kp;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* mrow = w.mask + r * (kp / 8);
    const int8_t* v = static_cast<const int8_t*>(w.data) + w.row_off[r];
    const __m512 s = _mm512_set1_ps(w.scale[r]);
    float* o = out + (r - r0) * kp;
    for (int64_t c = 0; c < kp / 16; ++c) {
      const __mmask16 m = mask16(mrow, c);
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v));
      const __m512i q = _mm512_cvtepi8_epi32(_mm_maskz_expand_epi8(m, packed));
      _mm512_storeu_ps(o + 16 * c, _mm512_mul_ps(_mm512_cvtepi32_ps(q), s));
      v += __builtin_popcount(m);
    }
  }
}

}  // namespace sl::avx512
