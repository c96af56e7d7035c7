// Int4 group-wise GEMV (fp32 activations), AVX2. One 16-byte load gives 32 weights; nibbles are
// widened to fp32 and FMA'd against x; the per-group scale and zero point are applied once per
// group (see kernels/scalar/gemv_int4.cpp for the algebra). The group size is a compile-time
// constant (with_group): read at run time, the per-group loop's bookkeeping costs a large part of
// the weight bandwidth at T == 1. Fmt::I4K (Q4_K's form, weight.h) runs the same loops (K): its
// 8 group scales come from a superblock's codes times d, and its mins replace the zero points.
#include <immintrin.h>

#include "isa.h"
#include "aligned.h"
#include "kernels.h"
#include "kernels/avx2/simd.h"
#include "kernels/tiles.h"

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

// sum_g m_g * gsum_g of an I4K row (weight.h): 8 groups' min codes per superblock, times dmin.
static inline float i4k_min_term(const Weight& w, int64_t r, const float* gsum) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t g = 0; g < w.kp / 32; g += 8) {
    const __m256 m = _mm256_mul_ps(u8x8_to_f32(load_u64(i4k_codes(w, r, g) + 8)),
                                   _mm256_set1_ps(i4k_super(w, r, g)[1]));
    acc = _mm256_fmadd_ps(m, _mm256_loadu_ps(gsum + g), acc);
  }
  return hsum(acc);
}

// The 8 group scales d * sc of the I4K superblock holding group g.
static inline __m256 i4k_scales(const Weight& w, int64_t r, int64_t g) {
  return _mm256_mul_ps(u8x8_to_f32(load_u64(i4k_codes(w, r, g))),
                       _mm256_set1_ps(i4k_super(w, r, g)[0]));
}

// The zero-point (I4) or min (I4K) term of row r for one token.
template <bool K>
static inline float offset_term(const Weight& w, int64_t r, const float* gsum) {
  return K ? i4k_min_term(w, r, gsum) : zero_point_term(w, r, gsum);
}

template <int G, bool K>
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
        // splitting the nibbles first and widening them in four takes six (and AMD's cores
        // have two shuffle pipes).
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
      const __m256 s = _mm256_set1_ps(K ? i4k_scale(w, r, g) : sc[g]);
      for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_add_ps(g0[t], g1[t]), s, acc[t]);
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = hsum(acc[t]) - offset_term<K>(w, r, a.gsum + (t0 + t) * ng);
  });
}

void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4_rows<decltype(g)::value, false>(w, a, y, ldy, r0, r1); });
}

void gemv_i4k(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  i4_rows<32, true>(w, a, y, ldy, r0, r1);
}

// W4A8: unsigned nibbles x signed int8 activations is exactly what maddubs multiplies (pair
// sums <= 2 * 15 * 128, no saturation). GroupX: weight-only int4 with x quantized per weight
// group (Gemv::group_int8): each group's dot is scaled by the weight's and x's group scales
// (Acts::xgscale), where W8A8's per-token scale multiplies the row's sum once; a.gsum then holds
// each group's code sum times its scale.
//
// A step takes two 16-byte blocks (64 columns) with one 32-byte load: its low nibbles are
// columns 0..15 of both blocks, its high nibbles columns 16..31, so x is first laid out in that
// order once per call (pair_codes), and a step is one load, three ops to split the nibbles and
// two maddubs, with no lane crossing. The int16 sums of the two maddubs (<= 4 * 15 * 128) go to
// int32 by one madd: lanes 0..3 hold the first block's dot, 4..7 the second's. 32-column groups
// then join four steps by two levels of hadd, one group per lane, so that one convert and one
// FMA scale 8 groups; larger groups sum their steps as int32, then convert and scale once. The
// convert and FMA of every group, and the insert joining a block's nibble halves, were what kept
// a block at a time from the memory's speed at T == 1. The tokens of a tile share each step's
// nibbles.
// Codes (T, kp) in natural order -> per 64 columns [0..15, 32..47, 16..31, 48..63] (the order
// of a step's low then high nibbles), in a per-thread buffer.
static const int8_t* pair_codes(const int8_t* xq, int64_t T, int64_t kp) {
  thread_local AlignedVector<int8_t> buf;
  if (buf.size() < size_t(T * kp)) buf.resize(size_t(T * kp));
  for (int64_t i = 0; i < T * kp; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i + 32));
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf.data() + i),
                       _mm256_permute2x128_si256(a, b, 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf.data() + i + 32),
                       _mm256_permute2x128_si256(a, b, 0x31));
  }
  return buf.data();
}

template <int G, bool GroupX, bool K = false>
static void i4a8_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0,
                      int64_t r1) {
  static_assert(G % 32 == 0, "int4 groups are multiples of 32 columns");
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / G;  // kp: a multiple of 64 and of G
  const int8_t* xp = pair_codes(a.xq, a.T, kp);
  const bool prefetch_one = prefetch_single_stream();  // at T == 1 too (tiles.h)
  for_rows_and_tiles<4>(r0, r1, a.T, [&](auto nt, int64_t r, int64_t t0) {
    constexpr int NT = decltype(nt)::value;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const __m256i ones = _mm256_set1_epi16(1);
    const uint8_t* row = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    // The step's int32 dots (lanes 0..3: its first block, 4..7: its second) for each token.
    const auto step = [&](int64_t k, __m256i* dot) {  // k: the step's first column
      if (k % 128 == 0 && (NT > 1 || prefetch_one)) prefetch_ahead(row + k / 2);  // a line
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k / 2));
      const __m256i lo = _mm256_and_si256(raw, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      for (int t = 0; t < NT; ++t) {
        const __m256i* x = reinterpret_cast<const __m256i*>(xp + (t0 + t) * kp + k);
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256(x)),
                                             _mm256_maddubs_epi16(hi, _mm256_load_si256(x + 1)));
        dot[t] = _mm256_madd_epi16(s16, ones);
      }
    };
    // A group's (or, with 32-column groups, two groups') scale for token t.
    const auto scale = [&](int64_t g, int t) {
      if constexpr (G == 32) {
        __m128 s = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sc + g)));
        if constexpr (GroupX)
          s = _mm_mul_ps(s, _mm_castpd_ps(_mm_load_sd(
                                reinterpret_cast<const double*>(a.xgscale + (t0 + t) * ng + g))));
        return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s),
                                        _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
      } else {
        return _mm256_set1_ps(GroupX ? sc[g] * a.xgscale[(t0 + t) * ng + g] : sc[g]);
      }
    };
    // Two accumulators per token, for even and odd steps (with 32-column groups) or groups.
    __m256 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
    const auto add = [&](int64_t g, const __m256i* dot, __m256* sums) {  // acc0 or acc1
      for (int t = 0; t < NT; ++t)
        sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), scale(g, t), sums[t]);
    };
    if constexpr (G == 32) {
      // Four steps (8 groups) at once: two levels of hadd leave each group's dot in one lane
      // (lanes 0..3: groups 0, 2, 4, 6; 4..7: 1, 3, 5, 7), converted and scaled by one FMA
      // with the 8 scales in that order. The last < 8 groups go a step at a time.
      const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
      int64_t g = 0;
      for (; g + 8 <= ng; g += 8) {
        __m256i h[2][NT];
        for (int j = 0; j < 2; ++j) {
          __m256i da[NT], db[NT];
          step(32 * (g + 4 * j), da);
          step(32 * (g + 4 * j + 2), db);
          for (int t = 0; t < NT; ++t) h[j][t] = _mm256_hadd_epi32(da[t], db[t]);
        }
        for (int t = 0; t < NT; ++t) {
          const __m256i dots = _mm256_hadd_epi32(h[0][t], h[1][t]);
          __m256 s = K ? i4k_scales(w, r, g) : _mm256_loadu_ps(sc + g);
          if constexpr (GroupX)
            s = _mm256_mul_ps(s, _mm256_loadu_ps(a.xgscale + (t0 + t) * ng + g));
          acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_permutevar8x32_ps(s, order),
                                    acc0[t]);
        }
      }
      if constexpr (!K)  // (I4K: kp is a multiple of 256, 8 groups)
        for (; g < ng; g += 2) {  // two groups per step; kp: a multiple of 64
          __m256i dot[NT];
          step(32 * g, dot);
          add(g, dot, acc1);
        }
    } else {
      const auto group = [&](int64_t g, __m256* sums) {
        __m256i gi[NT];
        step(g * G, gi);
        for (int64_t k = g * G + 64; k < (g + 1) * G; k += 64) {
          __m256i dot[NT];
          step(k, dot);
          for (int t = 0; t < NT; ++t) gi[t] = _mm256_add_epi32(gi[t], dot[t]);
        }
        add(g, gi, sums);
      };
      for (int64_t g = 0; g < ng; g += 2) {
        group(g, acc0);
        if (g + 1 < ng) group(g + 1, acc1);
      }
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] =
          (hsum(_mm256_add_ps(acc0[t], acc1[t])) -
           offset_term<K>(w, r, a.gsum + (t0 + t) * ng)) *
          (GroupX ? 1.f : a.xscale[t0 + t]);
  });
}

void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4a8_rows<decltype(g)::value, false>(w, a, y, ldy, r0, r1); });
}

void gemv_i4_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) { i4a8_rows<decltype(g)::value, true>(w, a, y, ldy, r0, r1); });
}

void gemv_i4ka8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  i4a8_rows<32, false, true>(w, a, y, ldy, r0, r1);
}

void gemv_i4k_xg(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  i4a8_rows<32, true, true>(w, a, y, ldy, r0, r1);
}

}  // namespace sl::avx2
