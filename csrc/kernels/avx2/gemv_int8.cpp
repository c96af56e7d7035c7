// Int8 per-output-channel GEMV, AVX2. W8A16 widens int8 -> fp32 and FMAs; W8A8 widens both
// sides to int16 and multiplies with madd (exact for every int8, -128 included;
// kernels/avx2/simd.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "isa.h"
#include "kernels.h"
#include "kernels/avx2/simd.h"

namespace sl::avx2 {

void quantize_row(const float* x, int64_t n, int8_t* q, float* scale) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), absmask));
  const float amax = hmax(m);
  *scale = amax / 127.5f;  // compressed-tensors' grid (kernels/scalar/gemv_int8.cpp)
  if (*scale == 0.f) {  // all zeros (or so tiny that the scale underflows)
    for (int64_t i = 0; i < n; ++i) q[i] = 0;
    return;
  }
  const __m256 s = _mm256_set1_ps(*scale);
  for (int64_t i = 0; i < n; i += 32) {  // n is a multiple of 32 (padded rows)
    __m256i v[4];
    for (int j = 0; j < 4; ++j)
      v[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * j), s),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), pack_i8(v));  // (clamped)
  }
}

void gemv_i8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  gemv_float_rows<int8_t, 4>(w, a, y, ldy, r0, r1, [](const int8_t* p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }, [&w](int64_t r) { return w.scale[r]; });
}

// Weight-only int8 on x quantized per 32 columns (Gemv::group_int8: quantize_groups' codes,
// Acts::xgscale), as llama.cpp multiplies Q8_0 by Q8_0 activations: 32 byte products per
// vpmaddubsw, where gemv_i8 widens each weight to fp32 (W8A16, 4 FMAs per 32 weights). The codes
// lie in [-127, 127], so the sign trick is exact here: |w| (128 for -128) as unsigned bytes times
// x with w's sign, pair sums at most 2 * 128 * 127 < 2^15. Each group's int32 dot is scaled by
// x's group scale into fp32, even and odd groups in their own accumulators (an FMA's latency
// per group otherwise), and the row's sum by the weight's scale. 4 tokens per tile.
void gemv_i8_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int8_t* W = static_cast<const int8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / 32;  // kp: a multiple of 64, so ng is even
  const bool prefetch_one = prefetch_single_stream();  // at T == 1 too (tiles.h)
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t* row = W + r * kp;
    __m256 acc[NT][2];
    for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g += 2) {
      if (NT > 1 || prefetch_one) prefetch_ahead(row + 32 * g);
      for (int h = 0; h < 2; ++h) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 32 * (g + h)));
        const __m256i wabs = _mm256_abs_epi8(wv);
        for (int t = 0; t < NT; ++t) {
          const int64_t tg = (t0 + t) * ng + g + h;
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + 32 * tg));
          const __m256i dot =
              _mm256_madd_epi16(_mm256_maddubs_epi16(wabs, _mm256_sign_epi8(x, wv)), ones);
          acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(a.xgscale + tg),
                                      acc[t][h]);
        }
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) * w.scale[r];
  });
}

// W8A8 over the 16-row blocks of Fmt::I8_R16 (weight.h): per 4 columns, the block's 64 bytes
// (rows 0-15 x 4 columns) are widened to four int16 vectors of 4 rows each, once per tile; each
// token of the tile broadcasts its 4 activations (as int16) and costs 4 x (madd, add), exact
// for every int8 (see dot_i8). Each int32 lane holds 2 of a row's products: 2 lanes per row,
// joined by one hadd per 8 rows at the end. Two tokens per tile: 2 x 4 accumulators + the 4
// weight vectors fit the 16 ymm registers.
void gemv_i8a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t kp = w.kp;
  const bool prefetch_one = prefetch_single_stream();  // at T == 1 too (tiles.h)
  for_rows_and_tiles<2>(r0 / kRowBlock16, row_blocks16(r1), a.T, [&](auto nt, int64_t b,
                                                                     int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const int8_t* blk = r16_block(w, b);
    const int8_t* xq = a.xq + t0 * kp;
    __m256i acc[NT][4];  // [t][i]: rows 4i..4i+3, two lanes per row
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm256_setzero_si256();
    for (int64_t k = 0; k < kp; k += 4) {
      if (NT > 1 || prefetch_one) prefetch_ahead(blk + 16 * k);
      __m256i wv[4];
      for (int h = 0; h < 2; ++h) {
        const I16x32 w16 =
            widen_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 * k + 32 * h)));
        wv[2 * h] = w16.lo;
        wv[2 * h + 1] = w16.hi;
      }
      for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq + t * kp + k, 4);
        const __m256i x = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(x4)));
        for (int i = 0; i < 4; ++i)
          acc[t][i] = _mm256_add_epi32(acc[t][i], _mm256_madd_epi16(wv[i], x));
      }
    }
    // y = float(dot) * (xscale * scale): the scalar kernel's float operations, 8 rows at once.
    // hadd of rows 0-3 and 4-7 gives [r0 r1 r4 r5 | r2 r3 r6 r7]; the permute orders them.
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    const int64_t r = b * kRowBlock16, n = std::min(kRowBlock16, r1 - r);
    for (int t = 0; t < NT; ++t) {
      const __m256 xs = _mm256_set1_ps(a.xscale[t0 + t]);
      alignas(32) float out[16];
      for (int i = 0; i < 2; ++i) {
        const __m256i dot = _mm256_permutevar8x32_epi32(
            _mm256_hadd_epi32(acc[t][2 * i], acc[t][2 * i + 1]), order);
        const __m256 s = _mm256_mul_ps(xs, _mm256_loadu_ps(w.scale + r + 8 * i));
        _mm256_store_ps(out + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(dot), s));
      }
      std::memcpy(y + (t0 + t) * ldy + r, out, size_t(n) * sizeof(float));
    }
  });
}

}  // namespace sl::avx2
