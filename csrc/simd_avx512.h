// Small AVX-512 helpers shared by the *_avx512.cpp kernels (only include from those files).
#pragma once
#include <immintrin.h>

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

// Calls f(std::integral_constant<int, G>{}) for the weight's int4 group size: the int4 kernels
// take it as a compile-time constant (read at run time, it cost the sparse W4A8 loop a reload
// and two compares per word, 5% at T == 1, and the dense ones a division per step).
template <class F>
inline void with_group(int group, F&& f) {
  if (group == 32) return f(std::integral_constant<int, 32>{});
  if (group == 64) return f(std::integral_constant<int, 64>{});
  f(std::integral_constant<int, 128>{});
}

}  // namespace sl::avx512
