// Int4 group-wise GEMV (fp32 activations), AVX2. One 16-byte load gives 32 weights; nibbles are
// widened to fp32 and FMA'd against x; the per-group scale and zero point are applied once per
// group (see gemv_int4.cpp for the algebra). The group size is a compile-time constant
// (with_group): read at run time, the per-group loop's bookkeeping cost the W4A8 GEMV 13-23%
// and W4A16 6-48% of its weight bandwidth at T == 1 on AMD Zen 3 (TinyLlama-1.1B shapes,
// 2 threads, interleaved runs of kernels.bench's bench_gemv).
#include <immintrin.h>

#include "common.h"
#include "simd_avx2.h"
#include "tiles.h"

namespace sl::avx2 {

static inline __m128i load_u64(const uint8_t* p) {  // 8 bytes, in the low half
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}
static inline __m256 u8x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// sum_g s_g * z_g * gsum_g of row r for one token: the zero-point term, 8 groups per step
// (per group in scalar code it cost as much as the group's 32 weights).
static inline float zero_point_term(const Weight& w, int64_t r, const float* gsum) {
  const int64_t ng = w.kp / w.group;
  const float* s = w.scale + r * ng;
  const uint8_t* z = w.zero + r * ng;
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= ng; g += 8) {
    const __m256 zv = w.asym ? u8x8_to_f32(load_u64(z + g)) : _mm256_set1_ps(8.f);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(s + g), zv), _mm256_loadu_ps(gsum + g), acc);
  }
  float c = hsum(acc);
  for (; g < ng; ++g) c += s[g] * (w.asym ? float(z[g]) : 8.f) * gsum[g];
  return c;
}

template <int G>
static void i4_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  constexpr int64_t bpg = G / 32;
  const int64_t kp = w.kp, ng = kp / G;
  // 3 tokens per tile: 3 x (acc, g0, g1) + the block's 4 widened weight vectors.
  for_rows_and_tiles<3>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m256i low4x8 = _mm256_set1_epi32(0x0f);
    const uint8_t* row = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      __m256 g0[NT], g1[NT];
      for (int t = 0; t < NT; ++t) g0[t] = g1[t] = _mm256_setzero_ps();
      for (int64_t b = 0; b < bpg; ++b) {
        const int64_t blk = g * bpg + b;
        // Bytes 0..7 / 8..15 zero-extended to int32 hold columns 0..7 / 8..15 in their low
        // nibbles and 16..23 / 24..31 in their high ones: two shuffles per 32 weights, where
        // splitting the nibbles first and widening them in four took six (Zen 3 has two
        // shuffle pipes): TinyLlama-1.1B shape, 2 threads, decode 14.3 -> 20.4 tok/s (g32),
        // 17.3 -> 21.3 (g128), old and new builds in alternating fresh processes.
        const uint8_t* raw = row + blk * 16;
        const __m256i b0 = _mm256_cvtepu8_epi32(load_u64(raw)),
                      b1 = _mm256_cvtepu8_epi32(load_u64(raw + 8));
        const __m256 q[4] = {_mm256_cvtepi32_ps(_mm256_and_si256(b0, low4x8)),
                             _mm256_cvtepi32_ps(_mm256_and_si256(b1, low4x8)),
                             _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)),
                             _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4))};
        for (int t = 0; t < NT; ++t) {
          const float* x = a.x + (t0 + t) * kp + blk * 32;
          g0[t] = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(x), g0[t]);
          g1[t] = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), g1[t]);
          g0[t] = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), g0[t]);
          g1[t] = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), g1[t]);
        }
      }
      const __m256 s = _mm256_set1_ps(sc[g]);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_add_ps(g0[t], g1[t]), s, acc[t]);
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = hsum(acc[t]) - zero_point_term(w, r, a.gsum + (t0 + t) * ng);
  });
}

void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4_rows<decltype(g)::value>(w, a, y, ldy, r0, r1); });
}

// W4A8: unsigned nibbles x signed int8 activations is exactly what maddubs multiplies
// (pair sums <= 2*15*127, no saturation): ~10 instructions per 32 weights instead of ~18.
// The nibbles of a block are unpacked once for all tokens of the tile. GroupX: weight-only
// int4 with x quantized per weight group (Gemv::group_int8): each group's dot is scaled by
// the weight's and x's group scales (Acts::xgscale), where W8A8's per-token scale multiplies
// the row's sum once; a.gsum then holds each group's code sum times its scale.
template <int G, bool GroupX>
static void i4a8_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                      int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  constexpr int64_t bpg = G / 32;
  const int64_t kp = w.kp, ng = kp / G;
  const bool prefetch_one = prefetch_single_stream();  // at T == 1 too (tiles.h)
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m128i low4 = _mm_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* row = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    // Even and odd groups have their own accumulators: with one FMA chain, a group (32 weights
    // at g32) took at least its latency, 4 cycles on Zen 3 (hot 4.3 -> 3.9 cycles per 32
    // weights at T == 1; TinyLlama-1.1B decode 1.06x). For every T: a token's sum must not
    // depend on its tile.
    __m256 acc[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) acc[t] = acc1[t] = _mm256_setzero_ps();
    const auto group = [&](int64_t g, __m256* sums) {  // acc or acc1
      __m256i gi[NT];
      for (int t = 0; t < NT; ++t) gi[t] = _mm256_setzero_si256();
      for (int64_t b = 0; b < bpg; ++b) {
        const int64_t blk = g * bpg + b;
        if (blk % 4 == 0 && (NT > 1 || prefetch_one)) prefetch_ahead(row + blk * 16);
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + blk * 16));
        const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low4),
                                           _mm_and_si128(raw, low4));
        for (int t = 0; t < NT; ++t) {
          const __m256i x = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(a.xq + (t0 + t) * kp + blk * 32));
          gi[t] = _mm256_add_epi32(gi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones));
        }
      }
      for (int t = 0; t < NT; ++t) {
        const float s = GroupX ? sc[g] * a.xgscale[(t0 + t) * ng + g] : sc[g];
        sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(gi[t]), _mm256_set1_ps(s), sums[t]);
      }
    };
    int64_t g = 0;
    for (; g + 2 <= ng; g += 2) {
      group(g, acc);
      group(g + 1, acc1);
    }
    if (g < ng) group(g, acc);
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] =
          (hsum(_mm256_add_ps(acc[t], acc1[t])) - zero_point_term(w, r, a.gsum + (t0 + t) * ng)) *
          (GroupX ? 1.f : a.xscale[t0 + t]);
  });
}

void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4a8_rows<decltype(g)::value, false>(w, a, y, ldy, r0, r1); });
}

void gemv_i4_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4a8_rows<decltype(g)::value, true>(w, a, y, ldy, r0, r1); });
}

}  // namespace sl::avx2
