// Small AVX-512 helpers shared by the kernels/avx512/ kernels (only include from those files).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

namespace sl::avx512 {

// In-register transpose of a 16 x 16 block: r[i] holds row i, afterwards column i.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

// The sum of a token's 4 accumulators (the fp32 GEMVs' independent FMA chains), in one fixed
// order, so a token's result does not depend on its tile.
inline float reduce_add4(const __m512 acc[4]) {
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

// The (up to) 64 nibbles of a bitmask int4 mask word, one per byte (0..15) in stream order,
// from the 32 bytes at `bytes` (a word starts on a byte): each byte widened to a 16-bit lane
// 0x00HL, then (lane | lane << 4) & 0x0f0f = 0x0H0L puts the low nibble in the lane's first
// byte. (Needs AVX512BW.)
inline __m512i word_nibbles(const uint8_t* bytes) {
  const __m512i w =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  return _mm512_ternarylogic_epi64(w, _mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0f0f),
                                   0xa8);  // (a | b) & c
}

// Dense int4 (weight.h's layout): the 64 unsigned nibbles (0..15) of two 16-byte blocks, one
// per byte in column order, with one broadcast load, one shift of the upper half by 4, an and,
// and one 128-bit lane shuffle ([low nibbles of block 0 | its high nibbles | block 1's]).
inline __m512i i4_columns64(const uint8_t* q) {
  const __m512i both = _mm512_broadcast_i64x4(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));  // [block 0 | 1 | 0 | 1]
  const __m512i v = _mm512_and_si512(
      _mm512_srlv_epi64(both, _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4)), _mm512_set1_epi8(0x0f));
  return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));  // [lo 0 | hi 0 | lo 1 | hi 1]
}

}  // namespace sl::avx512
