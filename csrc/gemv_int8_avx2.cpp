// Int8 per-output-channel GEMV, AVX2. W8A16 widens int8 -> fp32 and FMAs; W8A8 uses the
// maddubs sign trick (simd_avx2.h) for 32 int8 products per instruction.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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

// W8A8 over the 16-row blocks of Fmt::I8_R16 (common.h): per 4 columns, the block's two
// vectors (rows 0-7 and 8-15) and their absolute values are made once; each token of the tile
// broadcasts its 4 activations and costs 2 x (sign, maddubs, madd, add), which leaves 8 rows'
// dot products in each of its 2 accumulators.
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t kp = w.kp;
  for_rows_and_tiles<4>(r0 / kRowBlock16, row_blocks16(r1), a.T, [&](auto nt, int64_t b,
                                                                     int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* blk = r16_block(w, b);
    const int8_t* xq = a.xq + t0 * kp;
    __m256i acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 4) {
      if constexpr (NT > 1) prefetch_ahead(blk + 16 * k);
      __m256i wv[2], wa[2];
      for (int i = 0; i < 2; ++i) {
        wv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 * k + 32 * i));
        wa[i] = _mm256_sign_epi8(wv[i], wv[i]);
      }
      for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq + t * kp + k, 4);
        const __m256i x = _mm256_set1_epi32(x4);
        for (int i = 0; i < 2; ++i) acc[t][i] = dot_i8(acc[t][i], wa[i], wv[i], x);
      }
    }
    // y = float(dot) * (xscale * scale): the scalar kernel's float operations, 8 rows at once.
    const int64_t r = b * kRowBlock16, n = std::min(kRowBlock16, r1 - r);
    for (int t = 0; t < NT; ++t) {
      const __m256 xs = _mm256_set1_ps(a.xscale[t0 + t]);
      alignas(32) float out[16];
      for (int i = 0; i < 2; ++i) {
        const __m256 s = _mm256_mul_ps(xs, _mm256_loadu_ps(w.scale + r + 8 * i));
        _mm256_store_ps(out + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[t][i]), s));
      }
      std::memcpy(y + (t0 + t) * ldy + r, out, size_t(n) * sizeof(float));
    }
  });
}

}  // namespace sl::avx2
