// Int4 group-wise GEMV, AVX-512: fp32 activations (W4A16) and int8 activations (W4A8, VNNI).
// Compiled with this folder's flags; only called when runtime/cpu.cpp found
// AVX512F/BW/VL/VNNI/VBMI/VBMI2.
#include "kernels/avx512/gemv.h"

namespace sl::avx512 {

// Dense int4 with fp32 activations (W4A16). A group's 16 possible weights, (q - z) * s, are a
// 16-entry vpermps table built once per group, and the nibbles index it straight from the bytes: a
// 16-byte block's bytes zero-extended to dwords hold its low nibbles (columns 0..15) in their low 4
// bits, the only bits vpermps reads of an index, and the same dwords shifted right by 4 its high
// nibbles (columns 16..31). Per 32 columns: one widening, one shift, two vpermps and one FMA per
// token, against ~20 instructions in the AVX2 kernel's widen-convert-FMA chain, which bounds that
// below the DRAM stream. The group's scale and zero point live in the table, so no group sums.
namespace {

template <bool Asym, int G>
void i4_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const uint8_t* q = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    const uint8_t* zp = Asym ? w.zero + r * ng : nullptr;
    const float* x = a.x + t0 * kp;
    const auto table = [&](int64_t g) {  // (q - z) * s for q = 0..15
      const __m512 z = _mm512_set1_ps(Asym ? float(zp[g]) : 8.f);
      return _mm512_mul_ps(_mm512_sub_ps(iota, z), _mm512_set1_ps(sc[g]));
    };
    __m512 acc[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int i = 0; i < 4; ++i) acc[t][i] = _mm512_setzero_ps();
    __m512 tab0 = _mm512_setzero_ps(), tab1 = tab0;
    for (int64_t k = 0; k < kp; k += 64) {
      if ((k & 127) == 0) prefetch_ahead(q + k / 2);
      if constexpr (G == 32) {
        tab0 = table(k / 32);
        tab1 = table(k / 32 + 1);
      } else if (k % G == 0) {
        tab0 = tab1 = table(k / G);
      }
      const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + k / 2)));
      const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + k / 2 + 16)));
      const __m512 wf[4] = {_mm512_permutexvar_ps(b0, tab0),
                            _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), tab0),
                            _mm512_permutexvar_ps(b1, tab1),
                            _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), tab1)};
      for (int t = 0; t < NT; ++t)
        for (int i = 0; i < 4; ++i)
          acc[t][i] = _mm512_fmadd_ps(wf[i], _mm512_loadu_ps(x + t * kp + k + 16 * i), acc[t][i]);
    }
    for (int t = 0; t < NT; ++t)
      y[(t0 + t) * ldy + r] = reduce_add4(acc[t]);
  };
  for_rows_and_tiles<kMaxNTI4>(r0, r1, a.T, row);
}

}  // namespace

void gemv_i4(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) {  // group size and zero points as compile-time constants
    constexpr int G = decltype(g)::value;
    w.asym ? i4_rows<true, G>(w, a, y, ldy, r0, r1) : i4_rows<false, G>(w, a, y, ldy, r0, r1);
  });
}

// Dense int4 with int8 activations (W4A8), VNNI. Two 16-byte blocks (64 columns) become 64
// unsigned bytes in column order (i4_columns64, four instructions); vpdpbusd adds each token's
// 4-column products into 16 int32 lanes, exact over a group, which are converted and scaled
// at the group's end (per 64 columns when G == 32: lanes 0-7 and 8-15 are different groups).
// The zero points' share, sum_g s_g z_g (group sum of xq), is subtracted once per row and
// token (Acts::gsum).
namespace {
template <bool Asym, int G>
void i4a8_rows(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const uint8_t* W = static_cast<const uint8_t*>(w.data);
  const int64_t kp = w.kp, ng = kp / G;
  const auto row = [&](auto nt, int64_t r, int64_t t0) __attribute__((always_inline)) {
    constexpr int NT = decltype(nt)::value;
    const uint8_t* q = W + r * (kp / 2);
    const float* sc = w.scale + r * ng;
    const int8_t* xq = a.xq + t0 * kp;
    __m512 acc[NT];
    __m512i dot[NT];
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm512_setzero_ps();
      dot[t] = _mm512_setzero_si512();
    }
    for (int64_t k = 0; k < kp; k += 64) {
      if ((k & 127) == 0) prefetch_ahead(q + k / 2);
      const __m512i u = i4_columns64(q + k / 2);
      for (int t = 0; t < NT; ++t)
        dot[t] = _mm512_dpbusd_epi32(dot[t], u, _mm512_loadu_si512(xq + t * kp + k));
      if (G == 32 || (k + 64) % G == 0) scale_group_dots<G, NT>(sc, k, dot, acc);
    }
    const uint8_t* zp = Asym ? w.zero + r * ng : nullptr;
    for (int t = 0; t < NT; ++t) {
      const float* gs = a.gsum + (t0 + t) * ng;
      __m512 zero_term = _mm512_setzero_ps();  // sum_g s_g z_g gsum_g, 16 groups at a time
      for (int64_t g = 0; g < ng; g += 16) {
        const __mmask16 m = ng - g >= 16 ? 0xffff : (1u << (ng - g)) - 1;
        const __m512 z = Asym ? _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                    _mm_maskz_loadu_epi8(m, zp + g)))
                              : _mm512_set1_ps(8.f);
        zero_term = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + g), z),
                                    _mm512_maskz_loadu_ps(m, gs + g), zero_term);
      }
      y[(t0 + t) * ldy + r] =
          (_mm512_reduce_add_ps(acc[t]) - _mm512_reduce_add_ps(zero_term)) * a.xscale[t0 + t];
    }
  };
  for_rows_and_tiles<kMaxNT4>(r0, r1, a.T, row);
}

}  // namespace

void gemv_i4a8(const Weight& w, const Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  with_group(w.group, [&](auto g) {
    constexpr int G = decltype(g)::value;
    w.asym ? i4a8_rows<true, G>(w, a, y, ldy, r0, r1) : i4a8_rows<false, G>(w, a, y, ldy, r0, r1);
  });
}

}  // namespace sl::avx512
